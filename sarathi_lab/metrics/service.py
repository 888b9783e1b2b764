"""Service per class and per tenant: weighted tokens received and asked for (the VTC paper's
weights), Jain's fairness index, per-group latency figures."""
from __future__ import annotations

import numpy as np
import pandas as pd

from sarathi_lab.metrics.latency import column_labels, stats
from sarathi_lab.metrics.tables import token_times_flat

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
            figures = {"ttft": stats(ttft[rows]), "tbt": stats(gaps[gaps_of[i]]),
                       "e2e": stats(e2e[rows])}
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
    names, code = np.unique(column_labels(req_df, col).astype(str), return_inverse=True)
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
