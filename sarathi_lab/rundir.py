"""A run directory: the files a job leaves there, the overrides it was launched with, and how
results are written into it (atomically, so a reader never sees half a file)."""
from __future__ import annotations

import contextlib
import json
import os
import secrets
from pathlib import Path
from typing import Callable

REQUESTS = "requests.parquet"      # one row per request
ITERATIONS = "iterations.parquet"  # one row per engine iteration
SUMMARY = "summary.json"           # written last: its presence marks a finished run
CAPACITY = "capacity.json"         # written last by a capacity search
CAPACITY_PROBES = "capacity_probes.csv"
MERGED = "merged.json"             # a multirun job that ran as another (same effective settings)
OVERRIDES = Path(".hydra") / "overrides.yaml"


def overrides(run_dir) -> list[str]:
    """The job's command-line overrides as Hydra recorded them ("key=value" strings); [] for a
    directory that Hydra did not make."""
    import yaml
    p = Path(run_dir) / OVERRIDES
    try:
        text = p.read_text()
    except FileNotFoundError:
        return []
    try:
        items = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ValueError(f"{p}: not valid YAML ({e})") from None
    if items is None:
        return []
    if not isinstance(items, list):
        raise ValueError(f"{p}: expected a list of overrides, got {type(items).__name__}")
    return [str(i) for i in items]


def atomic_write(path, write: Callable[[Path], object]) -> None:
    """`write(tmp)` writes the content to a temporary file next to `path`, which then replaces
    `path` in one step. The temporary name is unique to this writer (pid and a random suffix), so
    parallel jobs never share one; it is removed if writing fails."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):   # the original error is the one worth reporting
            tmp.unlink(missing_ok=True)
        raise


def write_parquet(path, df) -> None:
    """A table as parquet, atomically. Dictionary encoding only for columns that are not
    floating point: times and durations are nearly all distinct, and trying a dictionary on
    each of their pages (pyarrow's default) costs more than the rest of the writing."""
    import pyarrow as pa

    def floating(t) -> bool:
        return pa.types.is_floating(t) or (pa.types.is_list(t) and floating(t.value_type))
    table = pa.Table.from_pandas(df, preserve_index=False)
    dictionary = [f.name for f in table.schema if not floating(f.type)]

    def write(p):
        import pyarrow.parquet as pq
        pq.write_table(table, p, use_dictionary=dictionary)
    atomic_write(path, write)


def write_json(path, obj) -> None:
    """`obj` as indented JSON, atomically; values JSON cannot hold are written as their str()."""
    text = json.dumps(obj, indent=2, default=str)
    atomic_write(path, lambda p: p.write_text(text))
