"""Delays the latency percentiles hide: stalls (TBT gaps far above a decode step of the same
batch size, and the decode time they lose) and the queue of requests waiting for their first
iteration. Definitions: sarathi_lab/docs/metrics.md (Stalls, Queue length)."""
from __future__ import annotations

import numpy as np
import pandas as pd


def decode_steps(it_df: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(batch sizes, median duration of a decode-only iteration of that many requests), sorted
    by batch size. A decode-only iteration has no prefill token; with none in the run, every
    iteration counts (a run of prefills alone still has a step time to compare with)."""
    dec = it_df["prefill_tokens"].to_numpy() == 0
    if not dec.any():
        dec = np.ones(len(it_df), bool)
    med = pd.Series(it_df["duration"].to_numpy(float)[dec]) \
        .groupby(it_df["num_requests"].to_numpy()[dec]).median()
    return med.index.to_numpy(float), med.to_numpy(float)


def batch_at(it_df: pd.DataFrame, times: np.ndarray) -> np.ndarray:
    """Per time, the requests in the batch of the iteration that ended then: the last iteration
    ending by that time (a token's time is its iteration's end; a small tolerance absorbs the
    rounding of start + duration)."""
    ends = (it_df["start"].to_numpy(float) + it_df["duration"].to_numpy(float))
    order = np.argsort(ends, kind="stable")
    ends = ends[order]
    tol = 1e-9 * np.maximum(1.0, np.abs(times))
    idx = np.clip(np.searchsorted(ends, times + tol, side="right") - 1, 0, len(ends) - 1)
    return it_df["num_requests"].to_numpy(float)[order][idx]


def stall_stats(gaps: np.ndarray, gap_ends: np.ndarray, it_df: pd.DataFrame,
                factor: float) -> dict:
    """`stalls`: a TBT gap is a stall when it exceeds `factor` x the decode step of the batch
    that emitted its later token (`decode_steps` at that batch size, interpolated between the
    sizes the run had, the nearest one beyond them). `time_lost_s`: over the stalls, the gap
    minus that decode step (the time the request's generation stood still);
    `time_lost_share`: that over the sum of every TBT gap (all decode time)."""
    out = {"factor": float(factor), "count": 0, "worst_s": 0.0, "time_lost_s": 0.0,
           "time_lost_share": 0.0}
    if not len(gaps) or not len(it_df):
        return out
    sizes, steps = decode_steps(it_df)
    step = np.interp(batch_at(it_df, gap_ends), sizes, steps)
    stall = gaps > factor * step
    lost = float((gaps - step)[stall].sum())
    total = float(gaps.sum())
    out.update(count=int(stall.sum()), worst_s=float(gaps.max()), time_lost_s=lost,
               time_lost_share=lost / total if total > 0 else 0.0)
    return out


def queue_stats(req_df: pd.DataFrame, it_df: pd.DataFrame, span: float) -> dict:
    """`queue`: requests that have arrived and not yet been scheduled (arrival to
    `first_scheduled_time`), as a step function of time: `mean` = its integral (the sum of
    the scheduling delays) over the makespan `span` (0 when nothing finished), `max` = its
    peak (a request scheduled at the instant another arrives leaves first). Rejected requests
    that never ran are not counted (the tables hold no time for their rejection). Beside it,
    `iteration_end_mean` and `iteration_end_max`: the policy's waiting queue at the end of
    each iteration (`num_waiting`, preempted requests included), weighted by the iterations'
    durations (a plain mean if none took time); it misses the requests that arrive during an
    iteration and are admitted at the next, all of them under vLLM."""
    ran = req_df["first_scheduled_time"].notna().to_numpy()
    arrive = req_df["arrival_time"].to_numpy(float)[ran]
    start = req_df["first_scheduled_time"].to_numpy(float)[ran]
    times = np.concatenate([start, arrive])
    steps = np.concatenate([-np.ones(len(start)), np.ones(len(arrive))])
    order = np.lexsort((steps, times))   # at a tie, a leaving request goes first
    peak = int(np.cumsum(steps[order]).max()) if len(order) else 0
    out = {"mean": float((start - arrive).sum()) / span if span > 0 else 0.0,
           "max": max(peak, 0)}
    if "num_waiting" in it_df:
        q = it_df["num_waiting"].to_numpy(float)
        d = it_df["duration"].to_numpy(float)
        out["iteration_end_mean"] = float((q * d).sum() / d.sum()) if d.sum() > 0 else \
            float(q.mean()) if len(q) else 0.0
        out["iteration_end_max"] = int(q.max()) if len(q) else 0
    return out
