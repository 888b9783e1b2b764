"""A run directory: the files a job leaves there, the overrides it was launched with, and how
results are written into it (atomically, so a reader never sees half a file)."""
from __future__ import annotations

import contextlib
import json
import math
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


def read_json(path) -> dict:
    """A result file (summary.json, capacity.json, sweep.json) read back; one that is not a
    JSON object (cut short by a copy, edited by hand: the CLI writes them whole) is a
    ValueError naming the file."""
    path = Path(path)
    try:
        obj = json.loads(path.read_text())
    except ValueError as e:   # JSONDecodeError, or bytes that are not UTF-8
        raise ValueError(f"{path}: not valid JSON ({e}); remove it and run its job again "
                         "(resume=true runs only the jobs without a result)") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(obj).__name__}")
    return obj


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


def _float_arrays(col) -> bool:
    """Whether every entry of an object column is a 1-d float64 array (the per-token times)."""
    import numpy as np
    return len(col) > 0 and all(type(v) is np.ndarray and v.dtype == np.float64 and v.ndim == 1
                                for v in col)


def to_arrow(df):
    """`df` as `pyarrow.Table.from_pandas(df, preserve_index=False)` makes it (the same columns,
    types and pandas metadata), but a column whose entries are all float arrays (the per-token
    times: millions of values in thousands of arrays) becomes one list array over their
    concatenation instead of being converted array by array."""
    import numpy as np
    import pyarrow as pa
    names = list(df.columns)
    lists = [c for c in names if df[c].dtype == object and _float_arrays(df[c].to_numpy())] \
        if all(type(c) is str for c in names) and len(set(names)) == len(names) else []
    if not lists:
        return pa.Table.from_pandas(df, preserve_index=False)
    rest = pa.Table.from_pandas(df.drop(columns=lists), preserve_index=False)
    meta = json.loads(rest.schema.metadata[b"pandas"])
    entry = {c["name"]: c for c in meta["columns"]}
    arrays, fields, entries = [], [], []
    for name in names:
        if name in lists:
            values = df[name].to_numpy()
            lens = np.fromiter(map(len, values), np.int64, len(values))
            if lens.sum() >= 2**31:   # beyond a list array's 32-bit offsets: pyarrow's own way
                return pa.Table.from_pandas(df, preserve_index=False)
            offsets = np.zeros(len(values) + 1, np.int32)
            np.cumsum(lens, out=offsets[1:])
            column = pa.ListArray.from_arrays(pa.array(offsets),
                                              pa.array(np.concatenate(values), pa.float64()))
            entries.append({"name": name, "field_name": name, "pandas_type": "list[float64]",
                            "numpy_type": "object", "metadata": None})
            fields.append(pa.field(name, column.type))
        else:
            column = rest.column(name)
            entries.append(entry[name])
            fields.append(rest.schema.field(name))
        arrays.append(column)
    meta["columns"] = entries
    return pa.Table.from_arrays(arrays, schema=pa.schema(
        fields, metadata={**rest.schema.metadata, b"pandas": json.dumps(meta).encode()}))


def write_parquet(path, df) -> None:
    """A table as parquet, atomically. Dictionary encoding only for columns that are not
    floating point: times and durations are nearly all distinct, and trying a dictionary on
    each of their pages (pyarrow's default) costs more than the rest of the writing."""
    import pyarrow as pa

    def floating(t) -> bool:
        return pa.types.is_floating(t) or (pa.types.is_list(t) and floating(t.value_type))
    table = to_arrow(df)
    dictionary = [f.name for f in table.schema if not floating(f.type)]

    def write(p):
        import pyarrow.parquet as pq
        pq.write_table(table, p, use_dictionary=dictionary)
    atomic_write(path, write)


def write_json(path, obj) -> None:
    """`obj` as indented JSON, atomically; values JSON cannot hold are written as their str()."""
    text = json.dumps(obj, indent=2, default=str)
    atomic_write(path, lambda p: p.write_text(text))


def json_differences(a, b, path: str = "", sides: tuple[str, str] = ("a", "b")) -> list[str]:
    """Where two JSON values (two runs' summary.json, say) differ, as 'path: a != b' lines; NaN
    equals NaN, and 1 differs from 1.0. `sides` names the two in 'only in' lines. Used by
    tests/test_reference_runs.py and experiments/bench/bench_identical.py."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{path}.{k}: only in {sides[0] if k in a else sides[1]}"
               for k in sorted(set(a) ^ set(b))]
        for k in sorted(set(a) & set(b)):
            out += json_differences(a[k], b[k], f"{path}.{k}", sides)
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b))
                for d in json_differences(x, y, f"{path}[{i}]", sides)]
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return []
    return [] if a == b and type(a) is type(b) else [f"{path}: {a!r} != {b!r}"]
