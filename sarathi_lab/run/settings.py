"""The run's own typed settings: the top-level keys (`RunConfig`), the capacity search, the SLO
and its classes, the fleet, and the loggers. The components' settings live with each
component (a policy's, an executor's, a trace's); `config.resolve` parses them all."""
from __future__ import annotations

from dataclasses import dataclass

from sarathi_lab.settings import ConfigError, parse, setting


@dataclass
class RunConfig:
    """The run itself (top-level keys of configs/config.yaml)."""
    seed: int = setting(0, ge=0, help="every random stream of the run")
    mode: str = setting("run", choices=("run", "capacity"),
                        help="run: one run | capacity: search the highest QPS within the SLO")
    fast_forward: bool = setting(True, help="skip steady decode runs in the simulator (exact)")
    progress: bool | str = setting("auto", help="auto | true | false")
    results_root: str = setting("outputs", help="every run and sweep lands under here")
    name: str = setting("", help="the sweep's name")
    resume: bool = setting(False, help="skip a job whose result is already there")
    num_threads: int | str = setting("auto", help="torch threads per job: auto | N >= 1")
    overlong: str = setting("reject", choices=("reject", "cap"),
                            help="a request whose prompt + output exceeds max_model_len: "
                                 "reject it, or cap its output (status length_capped)")

    def validate(self) -> None:
        if isinstance(self.progress, str) and self.progress != "auto":
            raise ValueError(f"progress={self.progress!r}: must be auto, true or false")
        if isinstance(self.num_threads, str) and self.num_threads != "auto":
            raise ValueError(f"num_threads={self.num_threads!r}: must be auto or an integer >= 1")
        if isinstance(self.num_threads, int) and self.num_threads < 1:
            raise ValueError(f"num_threads={self.num_threads}: must be auto or an integer >= 1")


@dataclass
class CapacityConfig:
    """mode=capacity: bisection over the arrival rate (probes replay trace.num_requests)."""
    criteria: list[str] = setting(["tbt", "attainment"],
                                  help="tbt (Sarathi-Serve) and/or attainment (DistServe)")
    arrivals: str = setting("poisson", choices=("poisson", "uniform", "trace"))
    qps_low: float = setting(0.25, gt=0, help="first bracket, req/s")
    qps_high: float = setting(8.0, gt=0, help="first bracket, req/s")
    precision: float = setting(0.02, gt=0, lt=1, help="stop when high - low <= precision x low")
    max_probes: int = setting(40, ge=2, help="per criterion, bracket widening included")
    save_probes: bool = setting(False, help="a full run directory per probe")
    # the steady-state rule (sarathi_lab/sweeps/steady.py; docs/sweeps.md, "Steady-state probes")
    rule: str = setting("steady", choices=("steady", "fixed"),
                        help="steady: probes long enough to tell a stable backlog, judged after "
                             "a warm-up | fixed: trace.num_requests per probe, no stability "
                             "test (the rule before issue 35)")
    min_duration_s: float = setting(120.0, gt=0, help="steady: least arrival span of a probe, "
                                                     "simulated s")
    time_constants: float = setting(10.0, gt=0, help="steady: least arrival span in mean "
                                                     "request latencies")
    warmup: float = setting(0.25, ge=0, lt=1, help="steady: share of the arrival span left out "
                                                   "of the statistics")
    windows: int = setting(8, ge=3, help="steady: windows of the trend test")
    max_growth: float = setting(0.02, gt=0, lt=1, help="steady: backlog or delay growth (s/s) "
                                                      "beyond which a probe is unstable")
    max_requests: int = setting(20000, ge=2, help="steady: most requests of a probe")
    max_extensions: int = setting(4, ge=0, help="steady: lengthenings of an undetermined probe")
    # 1000: a P99 of n arrivals settles within the true P98.4-P99.6 at n = 1000 (sweeps/steady.py,
    # above requests_for_measured); the 225-300 of a 120 s probe let cell C's P99 TBT pass 15%
    # above its capacity (docs/sweeps.md, "Steady-state probes")
    min_requests: int = setting(1000, ge=1, help="steady: least requests measured (after the "
                                                 "warm-up) in a probe")

    def validate(self) -> None:
        if self.qps_high <= self.qps_low:
            raise ValueError(f"qps_high={self.qps_high} must be > qps_low={self.qps_low}")
        bad = [c for c in self.criteria if c not in ("tbt", "attainment")]
        if not self.criteria or bad:
            raise ValueError(f"criteria={self.criteria}: must be a non-empty list of tbt, "
                             "attainment")
        # a probe of max_requests requests measures about (1 - warmup) of them
        if self.min_requests > (1 - self.warmup) * self.max_requests:
            raise ValueError(
                f"min_requests={self.min_requests}: over the (1 - warmup) x max_requests = "
                f"{(1 - self.warmup) * self.max_requests:g} requests the longest probe measures "
                "after its warm-up: every probe would be undetermined. Lower min_requests or "
                "raise max_requests")


# the settings only the steady-state rule reads (capacity.rule=steady)
STEADY_KEYS = ("min_duration_s", "time_constants", "warmup", "windows", "max_growth",
               "max_requests", "max_extensions", "min_requests")


# The per-request targets: the top level of `slo` holds the default ones, `slo.classes.<class>`
# a class's own (metrics.slo_met).
TARGETS = ("ttft", "tpot", "request_p99_tbt", "e2e")


@dataclass
class SLOTargets:
    """One SLO class's per-request targets (``slo.classes.<class>``); null: no such target.
    They replace the top-level targets for the requests of that class, all four at once."""
    ttft: float | None = setting(None, gt=0, help="s, time to first token")
    tpot: float | None = setting(None, gt=0, help="s, time per output token after the first")
    request_p99_tbt: float | None = setting(None, gt=0, help="s, a request's own P99 TBT")
    e2e: float | None = setting(None, gt=0, help="s, arrival to last token")


@dataclass
class ClusterConfig:
    """A fleet of identical replicas behind a router (`cluster.py`); the ``cluster`` node's
    other keys are the router's settings."""
    num_replicas: int = setting(1, ge=1, help="engines, each with its own policy, KV cache "
                                              "and executor; 1: a single engine")
    router: str = setting("round_robin", help="who takes each arrival: a registered router "
                                              "or a dotted path (read with num_replicas > 1)")


@dataclass
class SLOConfig:
    name: str = setting("", help="label")
    model: str | None = setting(None, help="the model preset whose limits these are; null: any "
                                           "model (a run of another model needs slo= chosen)")
    p99_tbt: float | None = setting(None, gt=0, help="s, pooled P99 TBT (capacity criterion)")
    max_median_scheduling_delay: float = setting(2.0, gt=0, help="s, capacity criterion")
    request_p99_tbt: float | None = setting(None, gt=0, help="s, a request's own P99 TBT")
    ttft: float | None = setting(None, gt=0, help="s, per-request TTFT SLO")
    tpot: float | None = setting(None, gt=0, help="s, per-request TPOT SLO")
    e2e: float | None = setting(None, gt=0, help="s, per-request end-to-end SLO")
    attainment_target: float = setting(0.9, gt=0, le=1, help="share of requests (DistServe)")
    classes: dict = setting({}, help="slo_class -> {ttft, tpot, request_p99_tbt, e2e}: that "
                                     "class's targets, in place of the ones above")

    def validate(self) -> None:
        for name, node in self.classes.items():
            if not isinstance(name, str) or not name:
                raise ValueError(f"classes: {name!r} is not a class name (a non-empty string)")
            if node is not None and not isinstance(node, dict):
                raise ValueError(f"classes.{name}={node!r}: must be a mapping of targets "
                                 f"({', '.join(TARGETS)})")
            try:
                self.classes[name] = parse(SLOTargets, node or {},
                                           f"classes.{name}", f"SLO class {name!r}")
            except ConfigError as e:   # re-raised as ValueError: parse puts "slo." in front
                raise ValueError(str(e)) from None


@dataclass
class NoLogger:
    name: str = "none"


@dataclass
class CSVLogger:
    name: str = "csv"
    path: str = setting("outputs/runs.csv", help="one summary row per run")


@dataclass
class WandbLogger:
    name: str = "wandb"
    project: str = "sarathi-lab"
    entity: str | None = None
    group: str | None = None
    mode: str | None = setting(None, help="null: $WANDB_MODE, else offline | online | disabled")
    dir: str | None = None
    tags: list[str] = setting([])
    log_requests: bool = True
    log_plots: bool = True

    def validate(self) -> None:
        if self.mode not in (None, "offline", "online", "disabled"):
            raise ValueError(f"mode={self.mode!r}: must be null, offline, online or disabled")


LOGGERS = {"none": NoLogger, "csv": CSVLogger, "wandb": WandbLogger}
