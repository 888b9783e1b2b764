"""The pieces of a topology's results written once: the requests table over engines, the
iterations of several engines in one table, the prefix cache pooled over engines, and the
"replicas" a fleet and a pipeline share."""
from __future__ import annotations

import numpy as np

from sarathi_lab.metrics import iterations_table, requests_table


def requests_frame(requests, engines, lens: dict | None = None):
    """The requests table, each request's workload output length taken from the engine that
    served it (`lens`, if given: the topology's own)."""
    if lens is None:
        lens = {}
        for e in engines:
            lens.update(e.output_lens)
    return requests_table(requests, lens)


def iterations_frame(parts):
    """Every engine's iterations in one table, in order of start (the order of `parts` among
    equal starts); `parts`: (engine, {column: value}) with the columns that name it."""
    import pandas as pd
    frames = []
    for e, cols in parts:
        it = iterations_table(e.iteration_columns())
        for c, v in cols.items():
            it[c] = v if isinstance(v, str) else np.full(len(it), v, np.int64)
        frames.append(it)
    it_df = pd.concat(frames, ignore_index=True)
    return it_df.sort_values("start", kind="stable", ignore_index=True)


def pooled_prefix(kvs) -> dict | None:
    """The prefix caches' hits and queries summed over engines (None without a prefix cache)."""
    stats = [kv.prefix_cache_stats() for kv in kvs]
    if stats[0] is None:
        return None
    return {k: sum(s[k] for s in stats) for k in ("hit_tokens", "query_tokens")}


def one_kv_size(kvs) -> tuple[int, int]:
    """(blocks, block size) every engine shares: utilisation per iteration is counted against
    one cache size."""
    sizes = {(kv.num_blocks, kv.block_size) for kv in kvs}
    assert len(sizes) == 1, "utilization per iteration assumes one KV size for the engines"
    return sizes.pop()


def replica_column(requests, replica_of: dict) -> np.ndarray:
    """Each request's replica (-1: none took it)."""
    return np.fromiter((replica_of.get(id(r), -1) for r in requests), np.int64, len(requests))


def replica_gpus(engine) -> int:
    """The GPUs of one replica, as its executor's settings say: tensor x expert x pipeline
    parallel (1 each where an executor has no such setting; the expert-parallel groups are the
    roofline's setting)."""
    cfg = getattr(engine.executor, "cfg", None)
    return getattr(cfg, "tensor_parallel", 1) * expert_parallel(engine) \
        * getattr(cfg, "pipeline_parallel", 1)


def expert_parallel(engine) -> int:
    """The expert-parallel groups of one replica (1 where its executor has no such setting)."""
    cfg = getattr(engine.executor, "cfg", None)
    return getattr(getattr(cfg, "cost_model_settings", None), "expert_parallel", None) or 1
