"""Per-request and per-iteration tables, and the summary (definitions: sarathi_lab/DESIGN.md).

TTFT  first output token - arrival            TBT  every gap between consecutive output tokens,
TPOT  (E2E - TTFT) / (output tokens - 1)           pooled across requests for percentiles
E2E   finish - arrival                         scheduling delay  first scheduled - arrival

Offered load  (n - 1) / (last arrival - first arrival) requests/s over all n requests, rejected
              ones included: the mean arrival rate (n evenly spaced arrivals at q req/s give
              exactly q). Token rates are that rate times the mean prompt (output) length, output
              being the trace's length. None with fewer than two requests or all arriving at once.
"""
from __future__ import annotations

import itertools
import re

import numpy as np
import pandas as pd

from sarathi_lab.engine import FLOAT_COLUMNS, ITER_COLUMNS
from sarathi_lab.request import Request

PCTS = (50, 90, 99)


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
    if any(r.prompt_token_ids is not None for r in reqs):
        df["prompt_token_ids"] = [r.prompt_token_ids for r in reqs]
        df["output_token_ids"] = [r.output_token_ids for r in reqs]
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
        assert list(rows) == list(ITER_COLUMNS), f"columns {list(rows)}, not {ITER_COLUMNS}"
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


def tbt_gaps(req_df: pd.DataFrame, with_times: bool = False,
             flat_owner=None) -> tuple[np.ndarray, ...]:
    """All TBT gaps pooled, and the request row each belongs to (non-decreasing); with_times
    adds when each gap ends (the time of its later token). `token_times` entries may be lists
    or arrays (as requests_table and a parquet file give them). `flat_owner`:
    token_times_flat(req_df), if already computed."""
    flat, owner = flat_owner if flat_owner is not None else token_times_flat(req_df)
    gaps = np.diff(flat)
    same = owner[1:] == owner[:-1]
    if with_times:
        return gaps[same], owner[1:][same], flat[1:][same]
    return gaps[same], owner[1:][same]


def request_p99_tbt(req_df: pd.DataFrame, gaps_owner=None) -> np.ndarray:
    """Each request's own P99 TBT (linear interpolation, as numpy's percentile); NaN with
    fewer than two tokens. `gaps_owner`: tbt_gaps(req_df), if already computed."""
    gaps, owner = gaps_owner if gaps_owner is not None else tbt_gaps(req_df)
    out = np.full(len(req_df), np.nan)
    if not len(gaps):
        return out
    assert (owner[1:] >= owner[:-1]).all(), "gaps must come grouped by request, as tbt_gaps"
    start = np.flatnonzero(np.r_[True, owner[1:] != owner[:-1]])
    count = np.diff(np.r_[start, len(owner)])
    pos = 0.99 * (count - 1)
    lo = np.floor(pos).astype(np.int64)
    hi = np.minimum(lo + 1, count - 1)
    at_lo, at_hi = np.empty(len(start)), np.empty(len(start))
    # the requests with as many gaps as each other, as the rows of one matrix, partitioned in
    # one call: a few hundred distinct counts, where a call per request would be thousands
    order = np.argsort(count, kind="stable")
    by_count = count[order]
    edges = np.flatnonzero(np.r_[True, by_count[1:] != by_count[:-1], True]).tolist()
    for a, b in zip(edges[:-1], edges[1:]):
        rows = order[a:b]
        c, k_lo, k_hi = int(by_count[a]), int(lo[rows[0]]), int(hi[rows[0]])
        m = gaps[start[rows][:, None] + np.arange(c)]
        if c > 1:
            m = np.partition(m, (k_lo, k_hi), axis=1)
        at_lo[rows], at_hi[rows] = m[:, k_lo], m[:, k_hi]
    out[owner[start]] = at_lo + (at_hi - at_lo) * (pos - lo)
    return out


def _stats(x) -> dict:
    x = np.asarray(x, float)
    nan = np.isnan(x)
    if nan.any():   # most columns have none: no copy of millions of TBT gaps
        x = x[~nan]
    if not len(x):
        return {"mean": None, **{f"p{p}": None for p in PCTS}, "max": None}
    q = np.percentile(x, PCTS)
    return {"mean": float(x.mean()), **{f"p{p}": float(v) for p, v in zip(PCTS, q)},
            "max": float(x.max())}


def slo_limits(req_df: pd.DataFrame, slo: dict, target: str) -> np.ndarray:
    """Per request, the limit of one per-request target (config.TARGETS): its SLO class's
    (`slo.classes.<class>`) if the class has an entry, else the top-level one; NaN: none."""
    top = slo.get(target)
    limit = np.full(len(req_df), np.nan if top is None else float(top))
    classes = slo.get("classes") or {}
    if classes:
        cls = _labels(req_df, "slo_class")
        for name, targets in classes.items():
            value = (targets or {}).get(target)
            limit[cls == name] = np.nan if value is None else float(value)
    return limit


def slo_met(req_df: pd.DataFrame, slo: dict, gaps_owner=None) -> np.ndarray:
    """Per request: meets every per-request target of its class that is set (rejected ones
    never do)."""
    ok = (req_df["status"] == "finished").to_numpy().copy()
    # a one-token request has no TPOT nor TBT; it cannot miss them
    values = {"ttft": lambda: req_df["ttft"].to_numpy(float),
              "tpot": lambda: req_df["tpot"].fillna(0).to_numpy(float),
              "request_p99_tbt": lambda: np.nan_to_num(request_p99_tbt(req_df, gaps_owner),
                                                       nan=0.0),
              "e2e": lambda: req_df["e2e"].to_numpy(float)}
    for target, value in values.items():
        limit = slo_limits(req_df, slo, target)
        has = ~np.isnan(limit)
        if has.any():
            with np.errstate(invalid="ignore"):
                ok &= ~has | (value() <= limit)
    return ok


def _labels(req_df: pd.DataFrame, col: str) -> np.ndarray:
    """A service column as strings; a table without it (an older run) is all "default"."""
    if col not in req_df:
        return np.full(len(req_df), "default", dtype=object)
    return req_df[col].astype(str).to_numpy(dtype=object)


# Service weights of prompt and output tokens (Sheng et al., "Fairness in Serving Large
# Language Models", OSDI'24: w_p = 1, w_q = 2, an output token costing about twice an input one).
SERVICE_WEIGHTS = {"prompt": 1.0, "output": 2.0}


def service_tokens(req_df: pd.DataFrame, weights=None, until: float | None = None,
                   flat_owner=None) -> tuple[np.ndarray, np.ndarray]:
    """Per request (service received, service asked for) in weighted tokens. Received: the
    prompt once its first token came out, plus every output token (with `until`, only those
    out by then); recompute after a preemption is the server's loss, not service. Asked: the
    prompt plus the workload's output length. `flat_owner`: token_times_flat(req_df), if
    already computed."""
    w = weights or SERVICE_WEIGHTS
    prompt = req_df["num_prompt_tokens"].to_numpy(float)
    out = req_df["num_output_tokens"].to_numpy(float)
    started = out > 0
    if until is not None:
        flat, owner = flat_owner if flat_owner is not None else token_times_flat(req_df)
        out = np.bincount(owner[flat <= until], minlength=len(req_df)).astype(float)
        started = out > 0
    target = req_df["target_output_tokens"].to_numpy(float)
    got = w["prompt"] * np.where(started, prompt, 0.0) + w["output"] * out
    asked = w["prompt"] * prompt + w["output"] * np.nan_to_num(target, nan=0.0)
    return got, asked


def jain(x) -> float | None:
    """Jain's fairness index (sum x)^2 / (n sum x^2): 1 when all shares are equal, 1/n when
    one holds everything; None with nothing to share."""
    x = np.asarray(x, float)
    sq = float((x * x).sum())
    return float(x.sum()) ** 2 / (len(x) * sq) if len(x) and sq > 0 else None


def group_metrics(req_df: pd.DataFrame, col: str, gaps_owner, span: float,
                  met: np.ndarray | None = None, whole: dict | None = None) -> dict:
    """{value of `col` (slo_class, tenant): its requests' counts, TTFT, TBT (its requests' gaps,
    pooled) and E2E, and with an SLO its attainment (over all its requests, rejected ones
    included) and goodput (requests meeting the SLO / the run's makespan, so that the groups'
    goodputs add up to the run's)}. `whole`: the run's own "ttft", "tbt" and "e2e" figures,
    if already computed: a group that holds every request has exactly those."""
    gaps, owner = gaps_owner
    names, code = _group_codes(req_df, col)
    status = req_df["status"].to_numpy()
    ttft, e2e = req_df["ttft"].to_numpy(), req_df["e2e"].to_numpy()
    # one sort of the requests and one of the gaps by group: many tenants stay cheap
    rows_of, gaps_of = _split(code, len(names)), _split(code[owner], len(names))
    out = {}
    for i, name in enumerate(names):
        rows = rows_of[i]
        if whole is not None and len(rows) == len(status):
            # every request, in order: the same values as the run's figures came from
            figures = {k: dict(whole[k]) for k in ("ttft", "tbt", "e2e")}
        else:
            figures = {"ttft": _stats(ttft[rows]), "tbt": _stats(gaps[gaps_of[i]]),
                       "e2e": _stats(e2e[rows])}
        g = {"num_requests": len(rows),
             "num_finished": int((status[rows] == "finished").sum()),
             "num_rejected": int((status[rows] == "rejected").sum()),
             **figures}
        if met is not None:
            g["attainment"] = float(met[rows].mean())
            g["goodput_rps"] = float(met[rows].sum()) / span if span > 0 else 0.0
        out[name] = g
    return out


def _group_codes(req_df: pd.DataFrame, col: str) -> tuple[list[str], np.ndarray]:
    """The sorted values of a service column and each request's index among them."""
    names, code = np.unique(_labels(req_df, col).astype(str), return_inverse=True)
    return names.tolist(), code


def _split(code: np.ndarray, n: int) -> list[np.ndarray]:
    """The positions holding each code 0..n-1, in order."""
    if n == 1:   # what the stable sort below gives, without sorting millions of gaps
        return [np.arange(len(code))]
    order = np.argsort(code, kind="stable")
    return np.split(order, np.searchsorted(code[order], np.arange(1, n)))


def tenant_service(req_df: pd.DataFrame, tenants: dict, weights=None,
                   flat_owner=None) -> dict:
    """Adds each tenant's service received and asked for (weighted tokens), its share of all
    service, and the service it had received by the last arrival to `tenants` (group_metrics
    by tenant); returns the fairness figures: Jain's index over the tenants' service (`jain`),
    over the share of its demand each was served (`jain_of_demand_served`) and over the
    service by the last arrival (`jain_by_last_arrival`: while requests still come, before the
    run drains whatever is left). `flat_owner`: token_times_flat(req_df), if already computed."""
    got, asked = service_tokens(req_df, weights)
    last = float(req_df["arrival_time"].max()) if len(req_df) else 0.0
    early, _ = service_tokens(req_df, weights, until=last, flat_owner=flat_owner)
    names, code = _group_codes(req_df, "tenant")
    assert names == list(tenants), "tenants must be group_metrics(req_df, 'tenant', ...)"
    sums = [np.bincount(code, weights=x, minlength=len(names)) for x in (got, asked, early)]
    total = float(got.sum())
    served, ratio, by_last = [], [], []
    for i, g in enumerate(tenants.values()):
        s, d, e = (float(x[i]) for x in sums)
        g.update(service_tokens=s, demand_tokens=d,
                 service_share=s / total if total > 0 else None,
                 service_tokens_by_last_arrival=e)
        served.append(s)
        ratio.append(s / d if d > 0 else 0.0)
        by_last.append(e)
    return {"service_weights": dict(weights or SERVICE_WEIGHTS), "num_tenants": len(tenants),
            "jain": jain(served), "jain_of_demand_served": jain(ratio),
            "jain_by_last_arrival": jain(by_last)}


def queue_stats(it_df: pd.DataFrame) -> dict | None:
    """Waiting requests at the end of each iteration: the mean weighted by the iterations'
    durations (the mean over time while the server works; a plain mean if no iteration took
    time) and the maximum. None for an iteration table without the column."""
    if "num_waiting" not in it_df:
        return None
    q = it_df["num_waiting"].to_numpy(float)
    if not len(q):
        return {"mean": 0.0, "max": 0}
    d = it_df["duration"].to_numpy(float)
    mean = float((q * d).sum() / d.sum()) if d.sum() > 0 else float(q.mean())
    return {"mean": mean, "max": int(q.max())}


def cost_at_rate(requests_per_s: float, mean_output_tokens: float, price_per_gpu_hour: float,
                 num_gpus: int) -> dict:
    """Cost of serving a steady `requests_per_s` (e.g. a capacity) on `num_gpus` GPUs rented
    at `price_per_gpu_hour`: dollars per 1M output tokens and per request."""
    usd_per_s = price_per_gpu_hour * num_gpus / 3600.0
    tok_s = requests_per_s * mean_output_tokens
    return {"usd_per_1m_output_tokens": usd_per_s / tok_s * 1e6 if tok_s > 0 else None,
            "usd_per_request": usd_per_s / requests_per_s if requests_per_s > 0 else None}


def run_cost(req_df: pd.DataFrame, span: float, price_per_gpu_hour: float,
             num_gpus: int) -> dict:
    """Cost of the run at its own load: `num_gpus` GPUs rented for the makespan, whatever
    their use, divided over the output tokens and requests that finished."""
    fin = req_df["status"] == "finished"
    tokens = float(req_df.loc[fin, "num_output_tokens"].sum())
    n = int(fin.sum())
    gpu_hours = span / 3600.0 * num_gpus
    usd = gpu_hours * price_per_gpu_hour
    return {"price_per_gpu_hour": float(price_per_gpu_hour), "num_gpus": int(num_gpus),
            "gpu_hours": gpu_hours, "usd": usd,
            "usd_per_1m_output_tokens": usd / tokens * 1e6 if tokens else None,
            "usd_per_request": usd / n if n else None}


def offered_load(req_df: pd.DataFrame) -> dict:
    """What the trace asked of the server (see the module docstring)."""
    arrival = req_df["arrival_time"].to_numpy(float)
    n = len(arrival)
    span = float(arrival.max() - arrival.min()) if n else 0.0
    rate = (n - 1) / span if n > 1 and span > 0 else None

    def tok_s(col):
        return None if rate is None else rate * float(req_df[col].mean())
    return {"num_requests": n, "arrival_span_s": span, "requests_per_s": rate,
            "prompt_tokens_per_s": tok_s("num_prompt_tokens"),
            "output_tokens_per_s": tok_s("target_output_tokens")}


_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def rejection_kind(reason: str | None) -> str:
    """A rejection reason with its numbers replaced by N: reasons that differ only in lengths
    and sizes fall in one kind ("prompt of N tokens leaves no room ... max_model_len=N")."""
    if not reason:
        return "no reason given"
    return _NUMBER.sub("N", reason)


def rejections(req_df: pd.DataFrame) -> dict[str, int]:
    """Rejected requests per reason kind, the most frequent first."""
    rej = req_df.loc[req_df["status"] == "rejected", "rejection_reason"]
    counts = rej.map(rejection_kind).value_counts(sort=False)
    return {k: int(v) for k, v in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))}


def slo_criteria(out: dict, slo: dict, attainment: float) -> list[dict]:
    """Each capacity criterion's parts: name, value, limit, met, and the verdict it belongs to
    (`tbt`: Sarathi-Serve's, only when slo.p99_tbt is set; `attainment`: DistServe's). A value
    of None (no TBT gap at all, say) misses."""
    def check(criterion, name, value, limit, at_least=False):
        met = value is not None and (value >= limit if at_least else value <= limit)
        return {"criterion": criterion, "name": name, "value": value, "limit": limit,
                "met": bool(met)}
    crit = []
    if slo.get("p99_tbt") is not None:
        crit += [check("tbt", "p99_tbt", out["tbt"]["p99"], slo["p99_tbt"]),
                 check("tbt", "median_scheduling_delay", out["scheduling_delay"]["p50"],
                       slo.get("max_median_scheduling_delay", 2.0)),
                 check("tbt", "num_rejected", out["num_rejected"], 0)]
    crit.append(check("attainment", "attainment", attainment if out["num_requests"] else None,
                      slo.get("attainment_target", 0.9), at_least=True))
    return crit


def swap_stats(req_df: pd.DataFrame, it_df: pd.DataFrame, host_blocks_total: int,
               kv_block_bytes: int | None) -> dict:
    """Preemption by swap over a run (summary `swap`): swap-outs and swap-ins (requests),
    preemptions by recompute (fallbacks included), swaps the policy chose that fell back to
    recompute, KV blocks and bytes moved each way (bytes per GPU of the tensor-parallel group:
    each GPU moves its own share over its own link; null when the executor does not know a
    block's bytes), the seconds the executor spent on them and their share of the run's
    iteration time, and the host swap space held at most."""
    outs, ins = int(req_df["num_swap_outs"].sum()), int(req_df["num_swap_ins"].sum())
    b_out, b_in = int(it_df["swap_out_blocks"].sum()), int(it_df["swap_in_blocks"].sum())
    t, busy = float(it_df["swap_s"].sum()), float(it_df["duration"].sum())
    host = it_df["host_blocks_used"].to_numpy(float)
    return {
        "host_blocks_total": int(host_blocks_total),
        "kv_block_bytes": kv_block_bytes,
        "swap_outs": outs, "swap_ins": ins,
        "recompute_preemptions": int(req_df["num_preemptions"].sum()) - outs,
        "fallbacks_to_recompute": int(req_df["num_swap_fallbacks"].sum()),
        "blocks_out": b_out, "blocks_in": b_in,
        "bytes_out": None if kv_block_bytes is None else b_out * kv_block_bytes,
        "bytes_in": None if kv_block_bytes is None else b_in * kv_block_bytes,
        "time_s": t, "time_share": t / busy if busy > 0 else 0.0,
        "host_utilization_max": float(host.max()) / host_blocks_total
        if len(host) and host_blocks_total else 0.0,
    }


def summarize(req_df: pd.DataFrame, it_df: pd.DataFrame, *, slo: dict | None = None,
              kv_blocks_total: int = 0, block_size: int = 16, stall_factor: float = 5.0,
              prefix_cache: dict | None = None, price_per_gpu_hour: float | None = None,
              num_gpus: int = 1, swap_space: dict | None = None) -> dict:
    """The run's figures (summary.json). `prefix_cache`: the KV manager's
    `prefix_cache_stats()`, given when prefix caching is on. `price_per_gpu_hour` (the
    hardware preset's) gives the `cost` section; `num_gpus`, every GPU of the run (a replica's
    tensor x pipeline stages, times the replicas; every pool's with disaggregation), its cost
    and the goodput per GPU (`slo.goodput_rps_per_gpu`). `swap_space` ({"host_blocks_total",
    "kv_block_bytes"}), given with preemption by swap, gives the `swap` section."""
    slo = dict(slo or {})
    fin = req_df[req_df["status"] == "finished"]
    flat_owner = token_times_flat(req_df)
    gaps_owner = tbt_gaps(req_df, flat_owner=flat_owner)
    gaps = gaps_owner[0]
    span = float(np.nanmax(req_df["finish_time"]) - req_df["arrival_time"].min()) \
        if len(fin) else 0.0
    out = {
        "num_requests": int(len(req_df)),
        "num_finished": int(len(fin)),
        "num_rejected": int((req_df["status"] == "rejected").sum()),
        "num_length_capped": int((req_df["status"] == "length_capped").sum()),
        "num_iterations": int(len(it_df)),
        "num_gpus": int(num_gpus),
        "makespan_s": span,
        "throughput_rps": len(fin) / span if span > 0 else 0.0,
        "throughput_tok_s": float(fin["num_output_tokens"].sum()) / span if span > 0 else 0.0,
        "preemptions": int(req_df["num_preemptions"].sum()),
        "num_gpus": int(num_gpus),
        "offered_load": offered_load(req_df),
        "rejections": rejections(req_df),
    }
    for col in ("ttft", "tpot", "e2e", "normalized_e2e", "scheduling_delay"):
        out[col] = _stats(req_df[col])
    out["tbt"] = _stats(gaps)
    # stall: a gap far above the time of a decode-only iteration
    dec_only = it_df.loc[it_df["prefill_tokens"] == 0, "duration"]
    base = float(dec_only.median()) if len(dec_only) else \
        float(it_df["duration"].median()) if len(it_df) else 0.0   # no NaN in summary.json
    thresh = stall_factor * base
    out["stalls"] = {"threshold_s": thresh, "count": int((gaps > thresh).sum()),
                     "worst_s": float(gaps.max()) if len(gaps) else 0.0}
    # requests per batch: vLLM's (SOSP'23) "average number of batched requests"
    batch = it_df["num_requests"].to_numpy(float)
    out["batch"] = {"requests_mean": float(batch.mean()) if len(batch) else 0.0,
                    "requests_max": int(batch.max()) if len(batch) else 0}
    if kv_blocks_total:
        used = it_df["kv_blocks_used"].to_numpy(float)
        slots = used * block_size
        with np.errstate(invalid="ignore", divide="ignore"):
            waste = np.where(slots > 0, 1 - it_df["kv_tokens_stored"] / slots, np.nan)
        out["kv"] = {"blocks_total": kv_blocks_total,
                     "utilization_mean": float(used.mean() / kv_blocks_total) if len(used) else 0.0,
                     "utilization_max": float(used.max() / kv_blocks_total) if len(used) else 0.0,
                     "internal_waste_mean": float(np.nanmean(np.clip(waste, 0, 1)))
                     if np.isfinite(waste).any() else 0.0,
                     # the share of the whole cache's slots holding a token
                     "token_share_mean": float(it_df["kv_tokens_stored"].mean()
                                               / (kv_blocks_total * block_size))
                     if len(used) else 0.0}
    if prefix_cache is not None:
        hit, query = int(prefix_cache["hit_tokens"]), int(prefix_cache["query_tokens"])
        out["prefix_cache"] = {"hit_tokens": hit, "query_tokens": query,
                               "hit_rate": hit / query if query else None}
    queue = queue_stats(it_df)
    if queue is not None:
        out["queue"] = queue
    if swap_space:
        out["swap"] = swap_stats(req_df, it_df, **swap_space)
    met = slo_met(req_df, slo, gaps_owner) if slo else None
    out["classes"] = group_metrics(req_df, "slo_class", gaps_owner, span, met, whole=out)
    out["tenants"] = group_metrics(req_df, "tenant", gaps_owner, span, met, whole=out)
    out["fairness"] = tenant_service(req_df, out["tenants"], flat_owner=flat_owner)
    if price_per_gpu_hour is not None:
        out["cost"] = run_cost(req_df, span, price_per_gpu_hour, num_gpus)
    if slo:
        attainment = float(met.mean()) if len(req_df) else 0.0
        crit = slo_criteria(out, slo, attainment)
        tbt = [c["met"] for c in crit if c["criterion"] == "tbt"]
        out["slo"] = {
            **slo,
            "attainment": attainment,
            "goodput_rps": float(met.sum()) / span if span > 0 else 0.0,
            # DistServe's per-GPU view: every GPU of the run (all replicas, all pools)
            "goodput_rps_per_gpu": float(met.sum()) / span / num_gpus if span > 0 else 0.0,
            # Sarathi-Serve's capacity criterion for this run (undefined without slo.p99_tbt)
            "meets_tbt_slo": bool(tbt) and all(tbt),
            # DistServe's: share of requests meeting every per-request SLO that is set
            "meets_attainment": all(c["met"] for c in crit if c["criterion"] == "attainment"),
            "criteria": crit,
        }
        if slo.get("classes"):
            # a class the SLO does not list (a typo, or "default") gets the top-level targets
            out["slo"]["classes_without_targets"] = sorted(
                set(out["classes"]) - set(slo["classes"]))
    return out


def transfer_stats(req_df: pd.DataFrame) -> dict:
    """`transfers` (disaggregated prefill/decode): the requests whose KV moved from a prefill to
    a decode replica (`transfer_end` set): how many, the bytes moved, each transfer's time on
    the link, and how long the KV waited on the prefill side, from the first token to the
    transfer's start (for room on the decode replica, or a free link)."""
    moved = req_df[req_df["transfer_end"].notna()]
    nbytes = moved["transfer_bytes"].to_numpy(float)
    return {
        "num_transfers": int(len(moved)),
        "bytes_total": int(nbytes.sum()),
        "bytes": _stats(nbytes),
        "time_s": _stats(moved["transfer_end"] - moved["transfer_start"]),
        "wait_s": _stats(moved["transfer_start"] - moved["first_token_time"]),
    }
