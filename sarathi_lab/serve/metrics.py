"""Prometheus metrics (`GET /metrics`), under vLLM's names so that dashboards made for vLLM
read them (sarathi_lab/docs/serving.md lists them). prometheus_client (the ``serve`` extra) is
imported here only.

The latencies are the engine's own times, the ones the run directory records: TTFT (arrival to
first token), each gap between a request's tokens (a step's tokens share its time: the gaps
inside one step are 0, as in the run directory's TBT) and E2E (arrival to the last token),
observed as the engine reports them. The counters count what the run directory holds: prompt
tokens of requests that emitted a token, every token emitted, requests ended by reason.
"""
from __future__ import annotations

from sarathi_lab.serve.protocol import FINISH

# vLLM's buckets (vllm/v1/metrics/loggers.py), with finer ones below 10 ms for the inter-token
# gaps: a small model's step on a CPU or a GPU takes a few milliseconds
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
               0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
               120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)


class Metrics:
    """The server's metrics for `model_name`; `stats()` returns the engine's state (the
    `EngineClient.stats` dict) when scraped."""

    def __init__(self, model_name: str, stats):
        from prometheus_client import CollectorRegistry, Counter, Histogram
        self.registry = reg = CollectorRegistry(auto_describe=True)
        self.model_name, self._stats = model_name, stats
        lab = ["model_name"]

        def hist(name, doc, buckets):
            return Histogram(name, doc, lab, registry=reg, buckets=buckets).labels(model_name)
        self.ttft = hist("vllm:time_to_first_token_seconds", "Time to first token (engine).",
                         TTFT_BUCKETS)
        self.itl = hist("vllm:inter_token_latency_seconds", "Gap between a request's tokens.",
                        ITL_BUCKETS)
        self.e2e = hist("vllm:e2e_request_latency_seconds", "Arrival to last token.",
                        E2E_BUCKETS)
        self.prompt = Counter("vllm:prompt_tokens", "Prompt tokens prefilled.", lab,
                              registry=reg).labels(model_name)
        self.generation = Counter("vllm:generation_tokens", "Tokens generated.", lab,
                                  registry=reg).labels(model_name)
        self.success = Counter("vllm:request_success", "Requests ended, by finish reason "
                               "(stop, length, abort).", lab + ["finished_reason"], registry=reg)
        self.failure = Counter("sarathi_lab:request_failure", "Requests refused or failed "
                               "in the engine, by error code.", lab + ["code"], registry=reg)
        reg.register(_EngineState(self))
        self._last: dict[int, float] = {}   # request id -> the time of its last token

    # -- from the engine's messages (`EngineClient`) ----------------------------------------------
    def tokens(self, rid: int, clock: float, n: int) -> None:
        self.generation.inc(n)
        last = self._last.get(rid)
        if last is not None:
            self.itl.observe(clock - last)
        for _ in range(n - 1):   # the step's other tokens: at the same time
            self.itl.observe(0.0)
        self._last[rid] = clock

    def first(self, rid: int, ttft: float, n_prompt: int) -> None:
        self.ttft.observe(ttft)
        self.prompt.inc(n_prompt)

    def end(self, rid: int, reason: str, e2e: float) -> None:
        self._last.pop(rid, None)
        if reason != "abort":
            self.e2e.observe(e2e)
        self.success.labels(self.model_name, FINISH.get(reason, reason)).inc()

    def failed(self, rid: int, code: str) -> None:
        self._last.pop(rid, None)
        self.failure.labels(self.model_name, code).inc()

    def render(self) -> tuple[bytes, str]:
        """(body, content type) of a scrape."""
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class _EngineState:
    """The gauges (and the preemption counter) read from the engine's last reported state."""

    def __init__(self, m: Metrics):
        self.m = m

    def describe(self):
        return []

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
        s, name = self.m._stats(), self.m.model_name

        def one(family, metric, doc, value):
            f = family(metric, doc, labels=["model_name"])
            f.add_metric([name], value)
            return f
        total = s.get("kv_blocks_total") or 0
        usage = s.get("kv_blocks_used", 0) / total if total else 0.0
        yield one(GaugeMetricFamily, "vllm:num_requests_running", "Requests in the running "
                  "batch.", s.get("running", 0))
        yield one(GaugeMetricFamily, "vllm:num_requests_waiting", "Requests queued.",
                  s.get("waiting", 0))
        yield one(GaugeMetricFamily, "vllm:num_requests_swapped", "Requests preempted to "
                  "host memory.", s.get("swapped", 0))
        yield one(GaugeMetricFamily, "vllm:kv_cache_usage_perc", "KV blocks in use, a "
                  "fraction (1 = full).", usage)
        yield one(GaugeMetricFamily, "vllm:gpu_cache_usage_perc", "KV blocks in use, a "
                  "fraction (vLLM's older name).", usage)
        yield one(CounterMetricFamily, "vllm:num_preemptions", "Preemptions so far.",
                  s.get("preemptions", 0))
