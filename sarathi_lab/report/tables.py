"""The report's tables: one row per run (`run_table`) or per capacity search and criterion
(`capacity_table`), the swept settings from each job's `.hydra/overrides.yaml` (one column per
overridden key), the metrics from the summary, flattened (`tbt_p99`, `ttft_p50`,
`slo_goodput_rps`, ...); `saved_table` reads back one the report wrote."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd

from sarathi_lab.report.cells import plain
from sarathi_lab.report.seeds import config_ids, is_seed_key
from sarathi_lab.run import rundir
from sarathi_lab.settings import missing

POLICY_ORDER = ("request_level", "orca", "vllm", "sarathi")
# what is not a "setting that varies" when labelling runs: the policy is named anyway
_POLICY_KEYS = frozenset({"scheduler", "scheduler.name"})


def flat_metrics(summary: dict, prefix: str = "") -> dict:
    """{"tbt": {"p99": x}} -> {"tbt_p99": x}; the embedded config is left out."""
    out = {}
    for k, v in summary.items():
        if k == "config" and not prefix:
            continue
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flat_metrics(v, key + "_"))
        elif isinstance(v, (list, tuple)):
            out[key] = json.dumps(v)
        else:
            out[key] = v
    return out


def find(paths, filename: str) -> list[Path]:
    """Directories below `paths` that hold `filename` (a path may also name the file itself)."""
    found = set()
    for p in map(Path, paths):
        if p.is_file() and p.name == filename:
            found.add(p.parent.resolve())
        elif p.is_dir():
            found.update(f.parent.resolve() for f in p.rglob(filename)
                         if "probes" not in f.relative_to(p).parts[:-2])
    return sorted(found)


def _value(text: str):
    import yaml
    try:
        v = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    return v if isinstance(v, (int, float, str, bool)) or v is None else text


# how a job was run, not what it ran (as hydra.job.config.override_dirname.exclude_keys)
_BOOKKEEPING = frozenset({"resume", "progress", "results_root", "name", "num_threads"})


def read_overrides(run_dir: Path) -> dict:
    """The job's command-line settings, {key: value} (numbers as numbers), bookkeeping left out."""
    out = {}
    for item in rundir.overrides(run_dir):
        key, _, val = item.partition("=")
        key = key.lstrip("+~")
        if key in _BOOKKEEPING or key.split(".")[0] in ("logger", "hydra"):
            continue
        out[key] = _value(val)
    return out


def _offered_qps(cfg_qps, run_dir: Path):
    """The configured rate, or (a trace replayed at its own times) the measured one."""
    if cfg_qps is not None:
        return float(cfg_qps)
    try:
        t = pd.read_parquet(run_dir / rundir.REQUESTS, columns=["arrival_time"])["arrival_time"]
    except Exception:
        return np.nan
    span = t.max() - t.min()
    return (len(t) - 1) / span if len(t) > 1 and span > 0 else np.nan


def identity(cfg: dict) -> dict:
    """What a run ran, from its config: policy and its budgets, model, hardware, trace, SLO."""
    sch, tr = cfg.get("scheduler") or {}, cfg.get("trace") or {}
    return {
        "policy": sch.get("name"), "token_budget": sch.get("token_budget"),
        "max_num_batched_tokens": sch.get("max_num_batched_tokens"),
        "max_num_seqs": sch.get("max_num_seqs"),
        "model": (cfg.get("model") or {}).get("name"),
        "hardware": (cfg.get("hardware") or {}).get("name"),
        "tensor_parallel": (cfg.get("executor") or {}).get("tensor_parallel"),
        "pipeline_parallel": (cfg.get("executor") or {}).get("pipeline_parallel"),
        "trace": tr.get("name"), "qps": None if tr.get("clients") else tr.get("qps"),
        "clients": tr.get("clients"),
        "slo": (cfg.get("slo") or {}).get("name"),
    }


def relative(p: Path, roots) -> str:
    """`p` below one of `roots`, as ROOT_NAME/..., else as it is."""
    for r in roots:
        try:
            rel = p.relative_to(Path(r).resolve())
            return str(Path(Path(r).resolve().name) / rel)
        except ValueError:
            continue
    return str(p)


def _policy_rank(p) -> int:
    return POLICY_ORDER.index(p) if p in POLICY_ORDER else len(POLICY_ORDER)


def _labels(df: pd.DataFrame, keys) -> pd.Series:
    """The policy and the values of `keys` where the row has one."""
    def label(row):
        extra = ", ".join(f"{k.rsplit('.', 1)[-1]}={plain(row[k])}" for k in keys
                          if not pd.isna(row[k]))
        return f"{row['policy']} ({extra})" if extra else str(row["policy"])
    return df.apply(label, axis=1)


def labelled(df: pd.DataFrame) -> pd.DataFrame:
    """Order the rows and give every run a short label naming what distinguishes it (`label`)
    and its configuration one without its seeds (`config`, see report.seeds)."""
    if df.empty:
        return df
    keys = df.attrs.get("override_keys", [])
    df = df.assign(_rank=df["policy"].map(_policy_rank))
    sort = ["_rank", "policy"] + [c for c in ("trace", "offered_qps", "token_budget", "slo")
                                  if c in df] + [k for k in keys if is_seed_key(k)]
    df = df.sort_values(sort, kind="stable").drop(columns="_rank").reset_index(drop=True)
    varying = [k for k in keys if k not in _POLICY_KEYS and df[k].map(str).nunique() > 1]
    if "endpoint" in df and df["endpoint"].dropna().nunique() > 1:   # replays of two servers
        varying.append("endpoint")
    label = _labels(df, varying)
    # the same label for different runs (a capacity search has a row per criterion)
    dup = df.groupby(label)["run_dir"].transform("nunique") > 1
    label[dup] = label[dup] + " [" + df.loc[dup, "run_dir"].map(lambda p: Path(p).name) + "]"
    config = _labels(df, [k for k in varying if not is_seed_key(k)])
    ids = config_ids(df)
    clash = ids.groupby(config).transform("nunique") > 1
    config[clash] = config[clash] + " [#" + (ids[clash] + 1).astype(str) + "]"
    # joined in one step, not inserted: a sorted table of a run's ~550 settings and metrics is
    # in over 100 pandas blocks, and inserting a column into such a frame warns (fragmented)
    out = pd.concat([pd.DataFrame({"label": label, "config": config}), df], axis=1)
    out.attrs = {**df.attrs, "varying": varying}
    return out


def run_table(paths) -> pd.DataFrame:
    """One row per run below `paths`."""
    rows, keys = [], []
    for d in find(paths, rundir.SUMMARY):
        s = rundir.read_json(d / rundir.SUMMARY)
        cfg = s.get("config") or {}
        # a multirun leaves out settings the run's components do not read: so does its label
        unread = {n.split(":", 1)[0] for n in (s.get("settings") or {}).get("unread", [])}
        ov = {k: v for k, v in read_overrides(d).items() if k not in unread}
        keys += [k for k in ov if k not in keys]
        ident = identity(cfg)
        # a replay ran on a server: two servers are two configurations (report.seeds)
        ex = cfg.get("executor") or {}
        ident["endpoint"] = ex.get("base_url") if ex.get("name") == "remote" else None
        for k in unread:
            if k.startswith("scheduler.") and k.split(".", 1)[1] in ident:
                ident[k.split(".", 1)[1]] = None
        rows.append({"run_dir": str(d), "overrides": ",".join(f"{k}={v}" for k, v in ov.items()),
                     **ident, "offered_qps": _offered_qps(ident["qps"], d), **ov,
                     **flat_metrics(s)})
    df = pd.DataFrame(rows)
    df.attrs["override_keys"] = keys
    return labelled(df)


def capacity_table(paths) -> pd.DataFrame:
    """One row per (capacity search, criterion) below `paths`."""
    from sarathi_lab.sweeps.capacity import capacity_rows
    rows, keys = [], []
    for d in find(paths, rundir.CAPACITY):
        res = rundir.read_json(d / rundir.CAPACITY)
        ov = read_overrides(d)
        keys += [k for k in ov if k not in keys]
        for r in capacity_rows(res):
            rows.append({"run_dir": str(d),
                         "overrides": ",".join(f"{k}={v}" for k, v in ov.items()), **ov, **r})
    df = pd.DataFrame(rows)
    df.attrs["override_keys"] = keys
    return labelled(df)


def write_tables(df: pd.DataFrame, out: Path, stem: str, roots) -> list[Path]:
    df = df.copy()
    if "run_dir" in df:
        df["run_dir"] = df["run_dir"].map(lambda p: relative(Path(p), roots))
    if "run_dirs" in df:   # a configuration's runs
        df["run_dirs"] = df["run_dirs"].map(
            lambda ps: ";".join(relative(Path(p), roots) for p in ps.split(";")))
    df.attrs = {}
    # mixed-type object columns (e.g. an override that is a number in one job, null in another)
    # must be one type for Parquet
    for c in df.columns[df.dtypes == object]:
        if df[c].map(type).nunique() > 1:
            df[c] = df[c].map(lambda v: None if missing(v) else str(v))
    files = [out / f"{stem}.csv", out / f"{stem}.parquet"]
    rundir.atomic_write(files[0], lambda p: df.to_csv(p, index=False))
    rundir.atomic_write(files[1], lambda p: df.to_parquet(p, index=False))
    return files




def saved_tables(paths, stem: str) -> pd.DataFrame:
    """The tables `stem` ("summary", "capacity") that earlier reports wrote below `paths`
    (.parquet, else .csv), as run_table or capacity_table return them: the swept settings are
    the columns that the `overrides` column names; labels and order are made as before."""
    parts = []
    for d in sorted(set(find(paths, f"{stem}.parquet")) | set(find(paths, f"{stem}.csv"))):
        f = d / f"{stem}.parquet"
        f = f if f.exists() else d / f"{stem}.csv"
        df = pd.read_parquet(f) if f.suffix == ".parquet" else pd.read_csv(f)
        if df.empty or "policy" not in df or "run_dir" not in df:
            raise ValueError(f"{f}: not a table of sarathi-lab-report (no rows, or no policy "
                             "or run_dir column)")
        parts.append(df)
    if not parts:
        return pd.DataFrame()
    df = pd.concat(parts, ignore_index=True)
    texts = df["overrides"].dropna().astype(str) if "overrides" in df else []
    # in the order of the table's columns, which is the order run_table found them in
    keys = [c for c in df.columns if any(re.search(rf"(?:^|,){re.escape(c)}=", t)
                                         for t in texts)]
    df = df.drop(columns=["label", "config"], errors="ignore")
    df.attrs["override_keys"] = keys
    return labelled(df)
