"""Optional extras, checked from the command line before Hydra composes anything: a choice that
needs a package that is not installed fails at once with the line that installs it, not after
the jobs have run (wandb) or with Hydra's "could not find hydra/launcher/joblib" (launchers).

Only what the command line chooses is checked (`logger=wandb`, `logger.name=wandb`,
`hydra/launcher=parallel`, sweeps over them included); a preset that picks an extra is not.
"""
from __future__ import annotations

import importlib.util

# (setting, choice) -> (module that must be importable, its package, the extra of
# pyproject.toml that installs it)
_WANDB = ("wandb", "wandb", "wandb")
_JOBLIB = ("hydra_plugins.hydra_joblib_launcher", "hydra-joblib-launcher", "joblib")
_SUBMITIT = ("hydra_plugins.hydra_submitit_launcher", "hydra-submitit-launcher", "slurm")
_RAY = ("hydra_plugins.hydra_ray_launcher", "hydra-ray-launcher", "ray")
NEEDS = {
    ("logger", "wandb"): _WANDB,
    ("logger.name", "wandb"): _WANDB,
    ("hydra/launcher", "parallel"): _JOBLIB,
    ("hydra/launcher", "joblib"): _JOBLIB,
    ("hydra/launcher", "slurm"): _SUBMITIT,
    ("hydra/launcher", "submitit_slurm"): _SUBMITIT,
    ("hydra/launcher", "submitit_local"): _SUBMITIT,
    ("hydra/launcher", "ray"): _RAY,
    ("hydra/launcher", "ray_aws"): _RAY,
}


class MissingExtra(ImportError):
    """A chosen option needs an optional package that is not installed."""


def installed(module: str) -> bool:
    """Importable, without importing it (wandb alone takes a second to import)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):   # a parent package missing, or a broken __spec__
        return False


def choices(argv: list[str]) -> set[tuple[str, str]]:
    """(setting, value) pairs the command-line overrides choose, every value of a sweep
    included. Arguments Hydra cannot parse are left for Hydra to report."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    parser = OverridesParser.create()
    out = set()
    for arg in argv:
        if arg.startswith("-") or "=" not in arg:
            continue   # a flag (-m, --cfg job) or a flag's value (-cn NAME)
        try:
            (o,) = parser.parse_overrides([arg])
            if o.is_delete():
                continue
            values = (list(o.sweep_string_iterator()) if o.is_sweep_override()
                      else [o.get_value_element_as_str()])
        except Exception:   # malformed, or a sweep (glob) only Hydra can expand
            continue
        out.update((o.key_or_group, str(v)) for v in values)
    return out


def check_extras(argv: list[str]) -> None:
    """Raise MissingExtra naming every chosen option whose package is missing, with the
    `pip install` line that fixes it."""
    missing = {}
    for setting, value in sorted(choices(argv)):
        need = NEEDS.get((setting, value))
        if need is not None and not installed(need[0]):
            missing.setdefault(need, []).append(f"{setting}={value}")
    if not missing:
        return
    lines = [f"{', '.join(chosen)} needs the optional package {package}, which is not "
             f"installed: pip install 'sarathi-lab[{extra}]' (from a checkout: "
             f"pip install -e '.[{extra}]')" for (_, package, extra), chosen in missing.items()]
    raise MissingExtra("\n".join(lines))
