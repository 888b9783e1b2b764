"""The per-request and per-iteration tables, from the engine's requests and records."""
from __future__ import annotations

import itertools

import numpy as np
import pandas as pd

from sarathi_lab.engine import FLOAT_COLUMNS, HOST_COLUMN, ITER_COLUMNS, SPEC_COLUMNS
from sarathi_lab.request import Request
from sarathi_lab.schedulers.controllers.consult import RELEGATED


def requests_table(reqs: list[Request], output_lens: dict | None = None) -> pd.DataFrame:
    """One row per request; `output_lens` (request id -> the workload's output length, as the
    engine recorded it) fills `target_output_tokens`. `token_times` holds one float array per
    request, all views into one flat array: the layout a parquet list column has, so that
    `tbt_gaps` and the parquet writer take it without converting millions of Python floats."""
    n = len(reqs)
    lens = output_lens or {}
    token_times, first = _token_times([r.token_times for r in reqs])
    arrival = np.array([r.arrival_time for r in reqs], float)
    finish = np.array([np.nan if r.finish_time is None else r.finish_time for r in reqs], float)
    sched = np.array([np.nan if r.first_scheduled_time is None else r.first_scheduled_time
                      for r in reqs], float)
    n_out = np.array([r.num_output_tokens for r in reqs], np.int64)
    e2e = finish - arrival
    ttft = first - arrival
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(n_out > 1, (e2e - ttft) / (n_out - 1), np.nan)
        norm_e2e = np.where(n_out > 0, e2e / n_out, np.nan)
    df = pd.DataFrame({
        "request_id": [r.request_id for r in reqs],
        # a request that stopped only because max_model_len ran out (overlong=cap) is marked
        "status": ["length_capped" if r.finish_reason == "max_model_len" else r.status.name.lower()
                   for r in reqs],
        "rejection_reason": [r.rejection_reason for r in reqs],
        "arrival_time": arrival,
        "num_prompt_tokens": np.array([r.num_prompt_tokens for r in reqs], np.int64),
        "num_output_tokens": n_out,
        "target_output_tokens": np.array(
            [np.nan if lens.get(r.request_id) is None else lens[r.request_id] for r in reqs],
            float),
        "finish_reason": [r.finish_reason for r in reqs],
        "first_scheduled_time": sched,
        "first_token_time": first,
        "finish_time": finish,
        "ttft": ttft,
        "tpot": tpot,
        "e2e": e2e,
        "normalized_e2e": norm_e2e,
        "scheduling_delay": sched - arrival,
        "num_preemptions": np.array([r.num_preemptions for r in reqs], np.int64),
        "num_swap_outs": np.array([r.num_swap_outs for r in reqs], np.int64),
        "num_swap_ins": np.array([r.num_swap_ins for r in reqs], np.int64),
        "num_swap_fallbacks": np.array([r.num_swap_fallbacks for r in reqs], np.int64),
        "num_swapped_blocks": np.array([r.num_swapped_blocks for r in reqs], np.int64),
        "swap_time_s": np.array([r.swap_time_s for r in reqs], float),
        "priority": np.array([r.priority for r in reqs], np.int64),
        "tenant": [r.tenant for r in reqs],
        "slo_class": [r.slo_class for r in reqs],
        "deadline": np.array([np.nan if r.deadline is None else r.deadline for r in reqs], float),
        "token_times": token_times,
    }, index=pd.RangeIndex(n))
    if any(r.spec_proposed for r in reqs):   # speculative decoding proposed drafts
        df["spec_proposed"] = np.array([r.spec_proposed for r in reqs], np.int64)
        df["spec_accepted"] = np.array([r.spec_accepted for r in reqs], np.int64)
    if any(r.prompt_token_ids is not None for r in reqs):
        df["prompt_token_ids"] = [r.prompt_token_ids for r in reqs]
        df["output_token_ids"] = [r.output_token_ids for r in reqs]
    # when a budget controller relegated a request (schedulers/controllers/slack.py): a column
    # only in runs where one was relegated
    relegated = [r.extra.get(RELEGATED) for r in reqs]
    if any(t is not None for t in relegated):
        df[RELEGATED] = np.array([np.nan if t is None else t for t in relegated], float)
    return df


def _token_times(times: list) -> tuple[np.ndarray, np.ndarray]:
    """(object array of one float array per request, views into one flat array; each
    request's first token time, NaN without one)."""
    lens = np.fromiter(map(len, times), np.int64, len(times))
    flat = np.fromiter(itertools.chain.from_iterable(times), float, int(lens.sum()))
    ends = np.cumsum(lens)
    starts = ends - lens
    first = np.full(len(times), np.nan)
    has = lens > 0
    first[has] = flat[starts[has]]
    col = np.empty(len(times), object)
    for i, (a, b) in enumerate(zip(starts.tolist(), ends.tolist())):
        col[i] = flat[a:b]
    return col, first


# the columns before preemption by swap added its own: records of that width get zeros for those
_NO_SWAP_COLUMNS = ITER_COLUMNS.index("swap_outs")


def iterations_table(rows) -> pd.DataFrame:
    """One row per iteration from the engine's records: `Engine.iteration_columns()` (taken as
    they are: the arrays are the caller's), or rows (`Engine.iterations()`, or tuples with the
    fields of ITER_COLUMNS; tuples of only the fields before `swap_outs` mean no swap)."""
    if isinstance(rows, dict):
        assert list(rows)[:len(ITER_COLUMNS)] == list(ITER_COLUMNS) and set(rows).issubset(
            (*ITER_COLUMNS, HOST_COLUMN, *SPEC_COLUMNS)), \
            f"columns {list(rows)}, not {ITER_COLUMNS}"
        return pd.DataFrame(rows, copy=False)
    a = np.asarray(rows, dtype=float)
    if a.ndim == 2 and a.shape[1] == _NO_SWAP_COLUMNS:
        a = np.hstack([a, np.zeros((len(a), len(ITER_COLUMNS) - _NO_SWAP_COLUMNS))])
    a = a.reshape(-1, len(ITER_COLUMNS))
    # every column a new array of its own (the float ones copied: `rows` may be the engine's
    # cache), so that the frame can take them as they are: consolidating a million rows into
    # pandas' two-dimensional blocks would copy them all again
    return pd.DataFrame({c: a[:, i].copy() if c in FLOAT_COLUMNS else a[:, i].astype(np.int64)
                         for i, c in enumerate(ITER_COLUMNS)}, copy=False)


def token_times_flat(req_df: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Every output token's time, request after request, and the request row of each."""
    times = req_df["token_times"].to_numpy()
    lens = np.fromiter(map(len, times), np.int64, len(times))
    if len(times) and all(isinstance(t, np.ndarray) for t in times):
        flat = np.concatenate(times).astype(float, copy=False)
    else:
        flat = np.fromiter(itertools.chain.from_iterable(times), float, int(lens.sum()))
    return flat, np.repeat(np.arange(len(lens)), lens)
