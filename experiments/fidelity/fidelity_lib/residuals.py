"""Per-iteration residuals: every real step's batch recorded as the cost model reads it
(`recording_batches`), priced by the cost model on that very batch (`residuals`: free of the
feedback through the queue), and grouped by batch composition, by place in a run of
single-request decodes and by batch size for the host time."""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd


@contextmanager
def recording_batches():
    """Every real step's batch as the cost model reads it ((chunk, context) prefills, decode
    contexts, sampled: `costmodels.base.batch_shape`), appended to the yielded list, one per
    iteration in order. Recorded after the step returns, between the executor's clock reads and
    the engine's (`Engine.step`), so that neither the step's duration nor its host_s holds it."""
    from sarathi_lab.costmodels.base import batch_shape
    from sarathi_lab.executors.torch_exec import TorchExecutor
    shapes, execute = [], TorchExecutor.execute

    def recorded(self, out):
        res = execute(self, out)
        shapes.append(batch_shape(out.reqs, out.num_new_tokens))
        return res
    TorchExecutor.execute = recorded
    try:
        yield shapes
    finally:
        TorchExecutor.execute = execute


# decode batch sizes (requests) and prefill chunk sizes (tokens) the residuals are grouped by
DECODE_BINS = ((1, 1), (2, 4), (5, 8), (9, 10 ** 9))


CHUNK_BINS = ((1, 128), (129, 512), (513, 10 ** 9))


def _bin(lo, hi) -> str:
    return f"{lo}" if lo == hi else (f"{lo}+" if hi >= 10 ** 9 else f"{lo}-{hi}")


def composition(shape) -> str:
    """A batch's kind: decode-only by requests, prefill-only by tokens, or mixed."""
    prefills, decodes, _ = shape
    if prefills and decodes:
        return "mixed"
    n, bins, kind = ((len(decodes), DECODE_BINS, "decode b=") if decodes else
                     (sum(c for c, _ in prefills), CHUNK_BINS, "prefill c="))
    return kind + next(_bin(lo, hi) for lo, hi in bins if lo <= n <= hi)


def residuals(run_dirs, shapes, cost_model) -> pd.DataFrame:
    """One row per real iteration: its composition, measured duration and host time, and the
    cost model's prediction on the very batch it ran (free of the feedback through the queue),
    times the factor of its place after the run's last prompt step where the profile has
    decode_rewarm rows, as the simulation prices it (`costmodels.rewarm`)."""
    frames = []
    for d, sh in zip(run_dirs, shapes):
        warmth = cost_model.rewarm.track() if cost_model.rewarm is not None else None
        factor = [warmth.step(sum(c for c, _ in x[0])) if warmth else 1.0 for x in sh]
        it = pd.read_parquet(Path(d) / "iterations.parquet")
        if len(it) != len(sh):
            raise ValueError(f"{d}: {len(it)} iterations but {len(sh)} recorded batches")
        comp = [composition(x) for x in sh]
        frames.append(pd.DataFrame({
            "run": str(d), "composition": comp, "stream_pos": stream_positions(comp),
            "requests": it["num_requests"].to_numpy(), "measured_s": it["duration"].to_numpy(),
            "host_s": it["host_s"].to_numpy(),
            "predicted_s": [cost_model.iteration_time(*x) * f for x, f in zip(sh, factor)],
            "rewarm_factor": factor,
            "prefill_tokens": [sum(c for c, _ in x[0]) for x in sh],
            "prefill_context": [sum(k for _, k in x[0]) for x in sh],
            "decodes": [len(x[1]) for x in sh],
            "decode_context": [float(np.mean(x[1])) if x[1] else 0.0 for x in sh]}))
    return pd.concat(frames, ignore_index=True)


def stream_positions(comps) -> list[int]:
    """Per iteration of a run (its compositions in order): its place in a run of consecutive
    single-request decodes (1: the first after a step of another kind), 0 for other steps."""
    out, n = [], 0
    for c in comps:
        n = n + 1 if c == "decode b=1" else 0
        out.append(n)
    return out


# places in a run of single-request decodes the residuals are grouped by
STREAM_BINS = ((1, 1), (2, 2), (3, 4), (5, 8), (9, 16), (17, 10 ** 9))


def stream_table(res: pd.DataFrame) -> pd.DataFrame:
    """Single-request decodes by their place in a run of them: iterations, measured / predicted
    median and ratio of sums, the measured median (ms). A decode gets faster over the first steps
    of such a run on a CPU (experiments/fidelity/decode_warmth.py); a profile that times its
    decodes in another state misses them by where they fall."""
    rows = []
    for lo, hi in STREAM_BINS:
        g = res[(res["stream_pos"] >= lo) & (res["stream_pos"] <= hi)]
        if len(g):
            rows.append({"place": _bin(lo, hi), "iterations": len(g),
                         "ratio_p50": (g["measured_s"] / g["predicted_s"]).median(),
                         "ratio_of_sums": g["measured_s"].sum() / g["predicted_s"].sum(),
                         "measured_ms_p50": g["measured_s"].median() * 1e3})
    return pd.DataFrame(rows)


def residual_table(res: pd.DataFrame) -> pd.DataFrame:
    """Per composition: iterations, share of the measured step time, the residual (measured -
    predicted, ms) median and p10/p90, the ratio measured / predicted median and p10/p90, and
    the ratio of the sums (what a latency, a sum of step times, sees)."""
    rows = []
    for comp, g in res.groupby("composition"):
        r = (g["measured_s"] - g["predicted_s"]) * 1e3
        q = g["measured_s"] / g["predicted_s"]
        rows.append({"composition": comp, "iterations": len(g),
                     "time_share": g["measured_s"].sum() / res["measured_s"].sum(),
                     "resid_ms_p10": r.quantile(0.1), "resid_ms_p50": r.median(),
                     "resid_ms_p90": r.quantile(0.9), "ratio_p10": q.quantile(0.1),
                     "ratio_p50": q.median(), "ratio_p90": q.quantile(0.9),
                     "ratio_of_sums": g["measured_s"].sum() / g["predicted_s"].sum()})
    order = {c: i for i, c in enumerate(
        [f"decode b={_bin(*b)}" for b in DECODE_BINS] + [f"prefill c={_bin(*b)}"
                                                          for b in CHUNK_BINS] + ["mixed"])}
    return pd.DataFrame(rows).sort_values("composition", key=lambda c: c.map(order),
                                          ignore_index=True)


def host_table(res: pd.DataFrame) -> pd.DataFrame:
    """Host time per iteration (the iterations' host_s) by requests in the batch: median and
    p90 (µs), and its share of the step time over those iterations."""
    rows = []
    for lo, hi in DECODE_BINS:
        g = res[(res["requests"] >= lo) & (res["requests"] <= hi)]
        if len(g):
            rows.append({"requests": _bin(lo, hi), "iterations": len(g),
                         "host_us_p50": g["host_s"].median() * 1e6,
                         "host_us_p90": g["host_s"].quantile(0.9) * 1e6,
                         "host_share": g["host_s"].sum() / g["measured_s"].sum()})
    return pd.DataFrame(rows)


def policy_table(res: pd.DataFrame) -> pd.DataFrame:
    """Per policy (every iteration, policies in their order in `res`): iterations,
    measured / predicted median and ratio of sums, and the host time outside the steps
    (host_s) as a share of the step time."""
    return pd.DataFrame([
        {"policy": p, "iterations": len(g),
         "ratio_p50": (g["measured_s"] / g["predicted_s"]).median(),
         "ratio_of_sums": g["measured_s"].sum() / g["predicted_s"].sum(),
         "host_share": g["host_s"].sum() / g["measured_s"].sum()}
        for p, g in res.groupby("policy", sort=False)])
