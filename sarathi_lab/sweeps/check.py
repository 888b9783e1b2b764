"""Before a sweep's first job starts: the sweep directory is not one that another grid filled
(its runs would be pooled into this sweep's report), and every job's configuration composes and
passes `config.resolve`, so that one bad value fails the sweep at once, naming the job, rather
than that job alone when its turn comes (hours later, on a cluster)."""
from __future__ import annotations

import json
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from sarathi_lab.settings import ConfigError


def _grid_ignores(config: DictConfig) -> set[str]:
    """Keys that say how a sweep runs, not what: Hydra's override_dirname leaves them out of
    run-directory names (config.yaml), and so does the grid; but an `experiment` preset
    decides what runs, so it stays in."""
    keys = config.hydra.job.config.override_dirname.get("exclude_keys") or []
    return {str(k) for k in keys} - {"experiment"}


def _what(overrides, ignore: set[str]) -> list[str]:
    return [o for o in overrides if o.split("=", 1)[0].lstrip("+~") not in ignore]


def grid(config: DictConfig) -> list[str]:
    """What a sweep runs, without the keys that only say how: its jobs (each one's overrides,
    sorted and joined by ","), sorted, so that the order of keys or values does not matter;
    for a sweeper whose jobs are not known up front, the overrides as given, sorted."""
    ignore = _grid_ignores(config)
    jobs = job_overrides(config)
    if jobs is None:
        params = [f"{k}={v}" for k, v in (config.hydra.sweeper.get("params") or {}).items()]
        return sorted(_what(params + [str(o) for o in config.hydra.overrides.task], ignore))
    return sorted(",".join(sorted(_what(job, ignore))) for job in jobs)


def refuse_other_grid(sweep_dir: Path, name: str, mine: list[str]) -> str | None:
    """The reason this sweep may not run in `sweep_dir`: a sweep of the same name with another
    grid ran there (its runs would be reported as this one's). None if none did, or the same
    grid did (resume=true, or a rerun). A note (returned with the prefix "note: ") for a
    sweep.json written before grids were recorded, which cannot be compared."""
    try:
        earlier = json.loads((sweep_dir / "sweep.json").read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        return f"{sweep_dir / 'sweep.json'} cannot be read ({e}); give this sweep another name="
    if "grid" not in earlier:
        return (f"note: {sweep_dir} holds an earlier sweep {name} whose grid was not recorded; "
                "its runs are reported with this one's")
    if earlier["grid"] == mine:
        return None
    gone = [o for o in earlier["grid"] if o not in mine]
    new = [o for o in mine if o not in earlier["grid"]]

    def some(jobs):
        return "; ".join(jobs[:2]) + (f"; and {len(jobs) - 2} more" if len(jobs) > 2 else "") \
            if jobs else "none"
    return (f"sweep {name} already ran in {sweep_dir} with another grid (jobs only there: "
            f"{some(gone)}; only here: {some(new)}), and its runs would be reported with this "
            "one's; give this sweep another name=, or remove that directory")


def job_overrides(config: DictConfig) -> list[list[str]] | None:
    """Every job's overrides as the basic sweeper will launch them (its split_arguments, with
    the public override parser: each key's values, a later key replacing an earlier one, the
    product over keys), or None for another sweeper, whose jobs are known only as it runs them,
    or a sweep it cannot enumerate (an interval), which it reports itself."""
    import itertools

    from hydra.core.override_parser.overrides_parser import OverridesParser
    if not str(config.hydra.sweeper.get("_target_", "")).endswith(".BasicSweeper"):
        return None
    params = [f"{k}={v}" for k, v in (config.hydra.sweeper.get("params") or {}).items()]
    values: dict[str, list[str]] = {}
    try:
        for o in OverridesParser.create().parse_overrides(
                params + list(config.hydra.overrides.task)):
            key = o.get_key_element()
            if o.is_sweep_override():
                if not o.is_discrete_sweep():
                    return None
                values[key] = [f"{key}={v}" for v in o.sweep_string_iterator()]
            else:
                values[key] = [f"{key}={o.get_value_element_as_str()}"]
    except Exception:   # hydra.errors.HydraException and kin (a glob needs the config
        return None     # loader): the sweeper reports those itself
    return [list(job) for job in itertools.product(*values.values())]


def check_jobs(config: DictConfig) -> str | None:
    """Compose each job's configuration as its launcher will (Hydra's config loader, from the
    sweep's own) and check it as the job will (`config.resolve`, leaving out the settings the
    job's components do not read, as in any multirun). The first failure, as
    "job i/n (overrides): why", or None when every job passes, or when the jobs are unknown
    (another sweeper)."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    from sarathi_lab.resources import check_run
    from sarathi_lab.run.config import resolve
    from sarathi_lab.run.hydra_errors import explain
    jobs = job_overrides(config)
    if not jobs:
        return None
    ignore = _grid_ignores(config)
    loader = GlobalHydra.instance().config_loader()
    master = HydraConfig.instance().cfg
    try:
        for i, overrides in enumerate(jobs, 1):
            label = ",".join(_what(overrides, ignore)) or "(defaults)"
            try:
                cfg = loader.load_sweep_config(config, list(overrides))
                HydraConfig.instance().set_config(cfg)   # what ${hydra:...} reads, as in the job
                with read_write(cfg), open_dict(cfg):
                    del cfg["hydra"]   # as run_job gives the job its config
                c = OmegaConf.to_container(cfg, resolve=True)
                r = resolve(c, list(overrides), drop_unread=True)
                # what the job would hold in memory, as the run checks it (resources.py)
                check_run(r, (c.get("trace") or {}).get("num_requests"))
            except (ConfigError, ValueError) as e:
                return f"job {i}/{len(jobs)} ({label}): {e}"
            except Exception as e:   # Hydra's: a group option or key that does not exist
                return f"job {i}/{len(jobs)} ({label}): {explain(e, list(overrides)) or e}"
    finally:
        if master is not None:
            HydraConfig.instance().set_config(master)
    return None
