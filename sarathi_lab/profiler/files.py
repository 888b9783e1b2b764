"""Profile files: the metadata a profile records (model, dtype, device, threads, clock, versions),
writing one, merging several, and reading the metadata back."""
from __future__ import annotations

import json
import platform
import time
from pathlib import Path

import numpy as np

from sarathi_lab.profiler.grids import COLUMNS


def versions() -> dict:
    import torch

    import sarathi_lab
    v = {"python": platform.python_version(), "torch": torch.__version__,
         "numpy": np.__version__, "sarathi_lab": getattr(sarathi_lab, "__version__", "")}
    try:
        import transformers
        v["transformers"] = transformers.__version__
    except ImportError:
        pass
    return v


def device_name(device) -> str:
    """The profile's device: ``cpu``, or the hardware preset whose name a GPU's name contains
    (``NVIDIA H200`` -> ``h200``), or else the GPU's name in lower case with dashes."""
    if device.type != "cuda":
        return "cpu"
    import torch
    gpu = torch.cuda.get_device_name(device).lower()
    from importlib.resources import files
    presets = sorted(p.name[:-5] for p in files("sarathi_lab.configs").joinpath("hardware")
                     .iterdir() if p.name.endswith(".yaml"))
    for p in presets:
        if p.split("-")[0] in gpu:
            return p
    return "-".join(gpu.replace("nvidia", "").split())


def metadata(executor, model_cfg: dict, grid_name: str, repeats: int, warmup: int,
             statistic: str = "median", warm: int | None = None) -> dict:
    """What a profile records of how it was measured; `warm`: the steps a decode batch's stream
    ran before it was timed (`measure.WARM_STEPS` if None)."""
    import torch

    from sarathi_lab.profiler.measure import WARM_STEPS
    warm = WARM_STEPS if warm is None else warm
    a = executor.args
    return {
        "model": str(model_cfg.get("name") or a.name), "dtype": str(executor.dtype)
        .removeprefix("torch."), "device": device_name(executor.device), "tensor_parallel": "1",
        "threads": str(torch.get_num_threads()), "n_head": str(a.num_heads),
        "n_kv_head": str(a.num_kv_heads), "n_embd": str(a.hidden_size),
        "n_expanded_embd": str(a.intermediate_size), "num_layers": str(a.num_layers),
        "head_dim": str(a.head_dim), "vocab_size": str(a.vocab_size),
        "max_model_len": str(a.max_model_len),
        "attention_backend": executor.backend, "grid": grid_name, "repeats": str(repeats),
        "warmup": str(warmup), "statistic": statistic, "warm_steps": str(warm),
        "clock": executor.cfg.clock,
        "processor": platform.processor() or platform.machine(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "versions": json.dumps(versions()),
    }


def write(rows: list[dict], meta: dict, path) -> Path:
    """The rows as a Parquet file with `meta` in its key-value metadata (atomically)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    path = Path(path)
    if path.suffix != ".parquet":
        raise ValueError(f"--out {path}: the profile is written as a .parquet file")
    types = {"operator": pa.string(), "repeats": pa.int64()}
    cols = {c: pa.array([r[c] for r in rows], types.get(c, pa.float64())) for c in COLUMNS}
    table = pa.table(cols).replace_schema_metadata({k: str(v) for k, v in meta.items()})
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".parquet.tmp")
    pq.write_table(table, tmp)
    tmp.replace(path)
    return path


def merge(paths, out) -> Path:
    """One profile from several of the same grid, model and machine, measured at different
    times: each point's time (the mean of the parts' in a profile of means, else their
    median), p10 and p90 are the medians of the parts' (the spread of a step at one time, not
    the drift between parts), its repeats their sum. A study spreads its
    profile's parts over the runs it predicts, so that the machine's drift over minutes touches
    both alike."""
    import pyarrow.parquet as pq
    paths = [Path(x) for x in paths]
    if not paths:
        raise ValueError("merge: no profiles given")
    metas = [profile_meta(x) for x in paths]
    keep = ("created", "repeats", "parts")
    first = {k: v for k, v in metas[0].items() if k not in keep}
    for x, m in zip(paths[1:], metas[1:]):
        diff = sorted(k for k in set(first) | set(m) if k not in keep and first.get(k) != m.get(k))
        if diff:
            raise ValueError(f"merge: {x} differs from {paths[0]} in {', '.join(diff)}")
    key_cols = [c for c in COLUMNS if c not in ("time_s", "time_p10_s", "time_p90_s", "repeats")]
    tables = [pq.read_table(x).to_pylist() for x in paths]

    def key(r):   # NaN marks a column the operator has not (None: one the file has not)
        return tuple(None if isinstance(r.get(c), float) and r[c] != r[c] else r.get(c)
                     for c in key_cols)
    keys = [[key(r) for r in t] for t in tables]
    if any(k != keys[0] for k in keys[1:]):
        raise ValueError(f"merge: the profiles {', '.join(map(str, paths))} hold different points")
    # a mean profile's parts, of as many rounds each, average to the mean of all their rounds
    center = np.mean if first.get("statistic") == "mean" else np.median
    rows = []
    for i, base in enumerate(tables[0]):
        parts = [t[i] for t in tables]
        rows.append({**base, "time_s": float(center([r["time_s"] for r in parts])),
                     "time_p10_s": float(np.median([r["time_p10_s"] for r in parts])),
                     "time_p90_s": float(np.median([r["time_p90_s"] for r in parts])),
                     "repeats": sum(r["repeats"] for r in parts)})
    meta = {**first, "created": metas[-1].get("created"), "parts": len(paths),
            "repeats": sum(int(m.get("repeats", 0)) for m in metas)}
    return write(rows, meta, out)


def profile_meta(path) -> dict:
    """A Parquet profile's key-value metadata, as strings."""
    import pyarrow.parquet as pq
    return {k.decode(): v.decode() for k, v in (pq.read_schema(path).metadata or {}).items()
            if not k.startswith((b"pandas", b"ARROW"))}


def model_of(meta: dict) -> dict:
    """The model preset a profile was measured for, from its metadata."""
    try:
        return {"name": meta["model"], "num_layers": int(meta["num_layers"]),
                "hidden_size": int(meta["n_embd"]),
                "intermediate_size": int(meta["n_expanded_embd"]),
                "num_heads": int(meta["n_head"]), "num_kv_heads": int(meta["n_kv_head"]),
                "head_dim": int(meta["head_dim"]), "vocab_size": int(meta["vocab_size"]),
                "max_model_len": int(meta["max_model_len"]), "dtype": meta["dtype"]}
    except (KeyError, ValueError) as e:
        raise ValueError(f"the profile's metadata lacks the model's shape ({e}): not written by "
                         "sarathi-lab-profile") from None
