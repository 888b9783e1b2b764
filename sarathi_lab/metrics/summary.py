"""The run's summary: latency statistics, SLO attainment and goodput, per-class and per-tenant
service, queueing, swap and KV-transfer figures, offered load and cost."""
from __future__ import annotations

import numpy as np
import pandas as pd

from sarathi_lab.metrics.costs import offered_load, run_cost
from sarathi_lab.metrics.delays import queue_stats, stall_stats
from sarathi_lab.metrics.latency import slo_judged_by, slo_met, stats, tbt_gaps
from sarathi_lab.metrics.rejections import rejections
from sarathi_lab.metrics.service import group_metrics, tenant_service
from sarathi_lab.metrics.tables import token_times_flat


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


def speculation_stats(it_df: pd.DataFrame) -> dict:
    """Speculative decoding over a run (summary `speculation`), from the iterations' records:
    draft tokens proposed and accepted (accepted ones past a request's end included: they
    measure the draft), their ratio (null when none was proposed), the speculative decode steps
    (entries), and the tokens such a step emitted on average (1 + accepted, less any cut at a
    request's end) and the drafts it proposed on average."""
    proposed, accepted = int(it_df["spec_proposed"].sum()), int(it_df["spec_accepted"].sum())
    steps, tokens = int(it_df["spec_steps"].sum()), int(it_df["spec_tokens"].sum())
    return {"proposed": proposed, "accepted": accepted,
            "acceptance_rate": accepted / proposed if proposed else None,
            "steps": steps,
            "tokens_per_step": tokens / steps if steps else None,
            "drafts_per_step": proposed / steps if steps else None}


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
    gaps, owner, gap_ends = tbt_gaps(req_df, with_times=True, flat_owner=flat_owner)
    gaps_owner = gaps, owner
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
        "offered_load": offered_load(req_df),
        "rejections": rejections(req_df),
    }
    for col in ("ttft", "tpot", "e2e", "normalized_e2e", "scheduling_delay"):
        out[col] = stats(req_df[col])
    out["tbt"] = stats(gaps)
    out["stalls"] = stall_stats(gaps, gap_ends, it_df, stall_factor)
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
    out["queue"] = queue_stats(req_df, it_df, span)
    if "relegated_at" in req_df:   # a budget controller relegated some (requests table)
        rel = req_df["relegated_at"].notna()
        out["relegated"] = {"num_relegated": int(rel.sum()),
                            "num_finished": int((rel & (req_df["status"] == "finished")).sum())}
    if swap_space:
        out["swap"] = swap_stats(req_df, it_df, **swap_space)
    if "spec_proposed" in it_df:
        out["speculation"] = speculation_stats(it_df)
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
            # what attainment and goodput count: the per-request targets, in words
            "judged_by": slo_judged_by(slo),
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
        "bytes": stats(nbytes),
        "time_s": stats(moved["transfer_end"] - moved["transfer_start"]),
        "wait_s": stats(moved["transfer_start"] - moved["first_token_time"]),
    }
