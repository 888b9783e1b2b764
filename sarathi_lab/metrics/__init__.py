"""Per-request and per-iteration tables, and the summary (definitions: sarathi_lab/DESIGN.md).

TTFT  first output token - arrival            TBT  every gap between a request's successive
TPOT  (E2E - TTFT) / (output tokens - 1)           emission events (tokens emitted in one
                                                   iteration arrive together), pooled
E2E   finish - arrival                         scheduling delay  first scheduled - arrival

Offered load  (n - 1) / (last arrival - first arrival) requests/s over all n requests, rejected
              ones included: the mean arrival rate (n evenly spaced arrivals at q req/s give
              exactly q). Token rates are that rate times the mean prompt (output) length, output
              being the trace's length. None with fewer than two requests or all arriving at once.

Modules, each importing only those above it: tables (requests_table, iterations_table), latency
(TBT gaps, per-request P99 TBT, SLOs), service (classes, tenants, fairness), costs (offered load,
cost), delays (stalls, the queue), rejections, summary (summarize). The package sits just above
the engine, whose record columns its tables read.
"""
from sarathi_lab.metrics.costs import cost_at_rate, offered_load, run_cost
from sarathi_lab.metrics.delays import queue_stats, stall_stats
from sarathi_lab.metrics.latency import (
                                         PCTS,
                                         request_p99_tbt,
                                         slo_judged_by,
                                         slo_limits,
                                         slo_met,
                                         tbt_gaps,
)
from sarathi_lab.metrics.rejections import rejection_kind, rejections
from sarathi_lab.metrics.service import (
                                         SERVICE_WEIGHTS,
                                         group_metrics,
                                         jain,
                                         service_tokens,
                                         tenant_service,
)
from sarathi_lab.metrics.summary import (
                                         slo_criteria,
                                         speculation_stats,
                                         summarize,
                                         swap_stats,
                                         transfer_stats,
)
from sarathi_lab.metrics.tables import iterations_table, requests_table, token_times_flat

__all__ = ["PCTS", "SERVICE_WEIGHTS", "cost_at_rate", "group_metrics", "iterations_table", "jain",
           "offered_load", "queue_stats", "rejection_kind", "rejections", "request_p99_tbt",
           "requests_table", "run_cost", "service_tokens", "slo_criteria", "slo_judged_by",
           "slo_limits", "slo_met", "speculation_stats", "stall_stats", "summarize", "swap_stats",
           "tbt_gaps",
           "tenant_service", "token_times_flat", "transfer_stats"]
