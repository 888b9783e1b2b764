"""The run's configuration, converted once: every component's settings typed and checked, and
nothing set that no chosen component reads.

`resolve(cfg)` takes the composed config (Hydra's, or a nested dict in code) and returns a
`Resolved`: the classes chosen (policy, queue, executor) with their typed settings, and the
settings of the run itself. Errors name the setting as typed on the command line. The builder
(`runner.build`) and the CLI's check both use it, so a configuration error is found before any
run directory is made or any model loaded.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from sarathi_lab.settings import ConfigError, parse, plain, setting


def without_unread(c: dict, notes) -> dict:
    """A copy of the plain config `c` less the settings that a multirun's `resolve` left out as
    unread (`Resolved.notes`, each beginning with the setting's dotted key): for what resolves
    the config again, as a capacity search does for each probe."""
    import copy
    out = copy.deepcopy(c)
    for note in notes:
        *path, last = note.split(": ", 1)[0].split(".")
        node = out
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(last, None)
    return out


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
    # 1000: a P99 of n arrivals settles within the true P98.4-P99.6 at n = 1000 (steady.py,
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

# top-level keys that are config groups or the Hydra node, not RunConfig settings
_GROUPS = ("scheduler", "executor", "model", "hardware", "trace", "slo", "logger", "capacity",
           "cluster", "hydra", "experiment")


# what only open-loop arrivals read (a closed-loop run ignores the presets' values)
_OPEN_LOOP_KEYS = ("trace.qps", "trace.arrival", "trace.cv", "trace.on_s", "trace.off_s")


@dataclass
class Resolved:
    run: RunConfig
    policy_cls: type
    policy_cfg: object
    queue_cls: type
    executor_cls: type
    executor_cfg: object
    slo: SLOConfig | None
    capacity: CapacityConfig | None
    logger: object
    model: dict
    hardware: dict | None
    trace: dict
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    router_cls: type | None = None    # with cluster.num_replicas > 1
    router_cfg: object = None
    notes: list[str] = field(default_factory=list)   # settings dropped as unread (multirun)
    # cluster=disagg: a prefill pool and a decode pool (disagg_config.DisaggResolved); the fields above
    # are then the prefill pool's
    disagg: object = None

    def effective(self) -> dict:
        """What the run reads, as plain data: two configs with the same effective dict give
        the same run."""
        if self.disagg is not None:
            return self.disagg.effective()
        def cls_path(c):
            return f"{c.__module__}:{c.__qualname__}"
        fleet = {} if self.router_cls is None else {"cluster": {
            "num_replicas": self.cluster.num_replicas, "router": cls_path(self.router_cls),
            **dataclasses.asdict(self.router_cfg)}}
        return {
            "run": {k: v for k, v in dataclasses.asdict(self.run).items()
                    if k in ("seed", "mode", "fast_forward", "overlong")},
            "scheduler": {"class": cls_path(self.policy_cls), "queue": cls_path(self.queue_cls),
                          **dataclasses.asdict(self.policy_cfg)},
            "executor": {"class": cls_path(self.executor_cls),
                         **dataclasses.asdict(self.executor_cfg)},
            "model": self.model, "hardware": self.hardware, "trace": self.trace,
            "slo": dataclasses.asdict(self.slo) if self.slo else None,
            "capacity": dataclasses.asdict(self.capacity) if self.capacity else None,
            **fleet,
        }


def _node(c: dict, key: str) -> dict:
    v = c.get(key)
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise ConfigError(f"{key}={v!r}: must be a config group (e.g. {key}=<option>)")
    return dict(v)


def _named(c: dict, key: str) -> tuple[str, dict]:
    node = _node(c, key)
    name = node.pop("name", None)
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{key}.name={name!r}: must name a registered {key} or a dotted path "
                          f"(choose one with {key}=<option>)")
    return name, node


def _override_keys(overrides) -> list[str]:
    """The dotted keys (or group names) that command-line overrides set, e.g.
    ['scheduler.token_budget', 'hardware']."""
    keys = []
    for o in overrides or ():
        k = o.split("=", 1)[0].lstrip("+~")
        if "@" in k:
            k = k.split("@", 1)[0]
        keys.append(k.replace("/", "."))
    return keys


def follow_the_user(c: dict, overrides) -> None:
    """Edit the plain config `c` in place (before `resolve`; the run and summary.json read it)
    so that defaults follow what the user asked for: a trace file named with ``trace.path``
    keeps its own times and all its requests (`traces.own_trace_defaults`)."""
    from sarathi_lab.traces import own_trace_defaults
    if isinstance(c.get("trace"), dict):
        c["trace"] = own_trace_defaults(c["trace"], _override_keys(overrides))


def resolve(cfg, overrides=None, *, drop_unread: bool = False) -> Resolved:
    """Type and check every component's settings. `overrides`: the command line's, to tell
    settings a user made from defaults (a default of an unread group is simply left out).
    `drop_unread` (multirun): a user setting that no chosen component reads is noted in
    `Resolved.notes` and left out, instead of being an error."""
    from sarathi_lab import registry
    c = plain(cfg)
    notes: list[str] = []
    user = _override_keys(overrides)
    node = c.get("cluster")
    if isinstance(node, dict) and ("prefill" in node or "decode" in node):
        # two pools, each resolved as a run: by this function, handed down (not imported back)
        from sarathi_lab.run.disagg import resolve_disagg
        return resolve_disagg(c, user, resolve, drop_unread=drop_unread)

    def unread(key: str, why: str) -> None:
        if drop_unread:
            notes.append(f"{key}: {why}")
        else:
            raise ConfigError(f"{key}: {why}")

    run = parse(RunConfig, {k: v for k, v in c.items() if k not in _GROUPS}, "", "the run")

    p_name, p_node = _named(c, "scheduler")
    try:
        policy_cls = registry.policy_class(p_name)
    except ValueError as e:
        raise ConfigError(f"scheduler.name: {e}") from None
    _drop_unread_knobs(p_node, policy_cls.setting_classes(p_node), "scheduler",
                       f"policy {p_name!r}", user, notes if drop_unread else None)
    policy_cfg = policy_cls.parse_config(p_node, "scheduler")
    defaults = {f.name: f.default for f in dataclasses.fields(policy_cfg)}
    for k, why in policy_cls.unread_settings(policy_cfg).items():   # read only with others
        if f"scheduler.{k}" in user:
            unread(f"scheduler.{k}", why)
            if k in defaults:
                setattr(policy_cfg, k, defaults[k])
            else:   # its controller's (set flat under scheduler beside the policy's)
                ctl = policy_cfg.controller_settings
                setattr(ctl, k, getattr(type(ctl)(), k))
    try:   # the policy's own default when not set (edf's is edf)
        queue_cls = registry.queue_class(policy_cfg.queue)
    except ValueError as e:
        raise ConfigError(f"scheduler.queue: {e}") from None

    e_name, e_node = _named(c, "executor")
    try:
        executor_cls = registry.executor_class(e_name)
    except ValueError as e:
        raise ConfigError(f"executor.name: {e}") from None
    if "pipeline_parallel" in e_node and not executor_cls.supports_pipeline:
        raise ConfigError(f"executor.pipeline_parallel: executor {e_name!r} does not run "
                          "pipeline stages (the simulator does: executor=sim)")
    executor_cfg = executor_cls.parse_config(e_node, "executor")
    pp = getattr(executor_cfg, "pipeline_parallel", 1)
    _check_speculation(policy_cfg.num_speculative_tokens, executor_cls, executor_cfg, user, unread)
    if (needs := policy_cls.needs_predictor(policy_cfg)) and not executor_cls.offers_predictor:
        raise ConfigError(f"{needs}: needs a predictor of iteration time, and executor "
                          f"{e_name!r} offers none (a simulator's cost model does: executor=sim)")

    hardware = c.get("hardware") or None
    if hardware is not None and executor_cls.uses_hardware:
        from sarathi_lab.costmodels.roofline import HardwareSpec
        HardwareSpec.from_config(hardware)   # names and ranges of the preset's keys
    if hardware is not None and not executor_cls.uses_hardware:
        set_by_user = [k for k in user if k == "hardware" or k.startswith("hardware.")]
        if set_by_user:
            unread(set_by_user[0], f"executor {e_name!r} measures time on the machine it runs "
                   "on and reads no hardware preset")
        hardware = None

    slo = parse(SLOConfig, _node(c, "slo"), "slo") if c.get("slo") else None
    capacity = None
    if run.mode == "capacity":
        capacity = parse(CapacityConfig, _node(c, "capacity"), "capacity")
        steady_keys = [k for k in user if k.split(".", 1)[-1] in STEADY_KEYS
                       and k.startswith("capacity.")]
        if capacity.rule == "fixed" and steady_keys:
            unread(steady_keys[0], "read only with capacity.rule=steady")
    else:
        cap_keys = [k for k in user if k.startswith("capacity.")]
        if cap_keys:
            unread(cap_keys[0], "read only with mode=capacity")
    lg = _node(c, "logger") or {"name": "none"}
    lg_name = lg.get("name", "none")
    if lg_name not in LOGGERS:
        raise ConfigError(f"logger.name={lg_name!r}: must be one of {', '.join(LOGGERS)}")
    logger = parse(LOGGERS[lg_name], lg, "logger", f"logger {lg_name!r}")

    model = _node(c, "model")
    if not model:
        raise ConfigError("model: a model preset is needed (e.g. model=mistral-7b)")
    from sarathi_lab.models.shape import resolve_model
    try:   # model.hf_config: the shape from a config.json, for every executor alike
        model = resolve_model(model)
    except (ValueError, FileNotFoundError) as e:
        raise ConfigError(str(e)) from None
    if overrides is not None:
        # what the user chose is known only with the command line's overrides: a run resolved
        # again in-process (a capacity probe, a planned deployment) was checked with them
        # before, and its SLO may be one the user named for another model
        _check_slo_model(slo, model.get("name"), user)   # after the shape: model=hf names it
    executor_cls.check_model(executor_cfg, model)
    for k in user:
        if k.startswith("model.") and not executor_cls.reads_model_key(k.split(".")[1]):
            unread(k, f"executor {e_name!r} does not read it (it reads the model's shape)")
    _check_random_weight_keys(model, user, unread)
    cluster, router_cls, router_cfg = _cluster(c, user, unread, notes if drop_unread else None)
    if pp > 1 and cluster.num_replicas > 1:
        raise ConfigError(f"executor.pipeline_parallel={pp} with cluster.num_replicas="
                          f"{cluster.num_replicas}: a fleet of pipeline-parallel replicas is not "
                          "supported yet (one or the other)")
    from sarathi_lab.traces import parse_trace_config
    trace = _node(c, "trace")
    if trace:   # a caller that passes its own requests may give no trace
        tc = parse_trace_config(trace)
        if "turns" in trace and run.mode == "capacity":
            raise ConfigError("trace.turns: multi-turn sessions send each turn after the "
                              "previous answer, so there is no arrival rate for mode=capacity "
                              "to search (sweep trace.session_rate instead)")
        if tc.clients is not None:
            if run.mode == "capacity":
                raise ConfigError(f"trace.clients={tc.clients}: closed-loop users set their own "
                                  "pace, so there is no arrival rate for mode=capacity to search "
                                  "(use trace.clients=null)")
            for k in user:
                if k in _OPEN_LOOP_KEYS:
                    unread(k, "closed-loop users (trace.clients) send at their own pace; no "
                           "arrival setting is read")
    return Resolved(run=run, policy_cls=policy_cls, policy_cfg=policy_cfg, queue_cls=queue_cls,
                    executor_cls=executor_cls, executor_cfg=executor_cfg, slo=slo,
                    capacity=capacity, logger=logger, model=model, hardware=hardware,
                    trace=trace, cluster=cluster, router_cls=router_cls, router_cfg=router_cfg,
                    notes=notes)


def _cluster(c: dict, user: list[str], unread, notes: list[str] | None
             ) -> tuple[ClusterConfig, type | None, object]:
    """The fleet's settings, and its router's class and settings (None with one replica:
    then a router setting made by the user is unread). As in the scheduler node, a null
    router knob is another router's (or the router's own default) and is dropped."""
    from sarathi_lab import registry
    node = _node(c, "cluster")
    cluster = parse(ClusterConfig, {k: node.pop(k) for k in ("num_replicas", "router")
                                    if k in node}, "cluster")
    if cluster.num_replicas == 1:
        for k in user:
            if k.startswith("cluster.") and k != "cluster.num_replicas":
                unread(k, "read only with cluster.num_replicas > 1 (a fleet)")
        return cluster, None, None
    try:
        router_cls = registry.router_class(cluster.router)
    except ValueError as e:
        raise ConfigError(f"cluster.router: {e}") from None
    _drop_unread_knobs(node, (router_cls.config_class,), "cluster",
                       f"router {cluster.router!r}", user, notes)
    return cluster, router_cls, router_cls.parse_config(node, "cluster")


def _drop_unread_knobs(node: dict, config_classes: tuple[type, ...], where: str, who: str,
                       user: list[str], notes: list[str] | None) -> None:
    """Edit a plug-in's node (scheduler, cluster) before parsing. A null is a placeholder (as
    in configs/scheduler/common.yaml): another plug-in's knob, or (for a setting that takes no
    null) this one's own default, and is dropped. With `notes` (a multirun), a setting the user
    made that the plug-in does not read is noted and dropped; without, parsing will refuse it."""
    fields = {f.name: f for c in config_classes for f in dataclasses.fields(c)}
    for k, v in list(node.items()):
        if v is None and (k not in fields or fields[k].default is not None):
            if k in fields and f"{where}.{k}" in user:
                raise ConfigError(f"{where}.{k}=null: must be set (default "
                                  f"{fields[k].default!r})")
            node.pop(k)
    if notes is not None:
        for k in sorted(set(node) - set(fields)):
            if f"{where}.{k}" in user:
                notes.append(f"{where}.{k}: not read by {who}")
                node.pop(k)


def _check_speculation(k: int, executor_cls, executor_cfg, user: list[str], unread) -> None:
    """Speculative decoding: with k > 0 an executor that runs it, with settings that can; with
    k = 0 its speculation settings are unread."""
    from sarathi_lab.executors.base import check_speculation
    if check_speculation(k, executor_cls):
        executor_cls.check_speculation_settings(executor_cfg, k)
        return
    defaults = {f.name: f for f in dataclasses.fields(executor_cfg)}
    for key in executor_cls.speculation_settings:
        if f"executor.{key}" in user:
            unread(f"executor.{key}", "read only with scheduler.num_speculative_tokens > 0")
            f = defaults[key]   # a multirun leaves it at its default
            setattr(executor_cfg, key, f.default if f.default is not dataclasses.MISSING
                    else f.default_factory())


def _presets(group: str) -> set[str]:
    """The shipped options of a config group (configs/<group>/*.yaml)."""
    from importlib.resources import files
    return {p.name[:-5] for p in files("sarathi_lab.configs").joinpath(group).iterdir()
            if p.name.endswith(".yaml")}


def _check_slo_model(slo: SLOConfig | None, model: str | None, user: list[str]) -> None:
    """An SLO set for one model judges a run of another only when the user chose it (`slo=` on
    the command line): the default follows the model (configs/config.yaml: ``${model}-strict``),
    but an experiment's or a sweep's fixed SLO would otherwise judge another model silently.
    A model of the user's own (a `model.name` that is no preset) has no SLO of its own to offer
    instead, and is judged by the one composed."""
    if slo is not None and slo.model == "hf" and "slo" not in user:
        # model=hf is any config.json: no limits were set for it, so none is taken unasked
        raise ConfigError(
            f"slo={slo.name}: model=hf (a shape from any config.json) has no SLO of its own; "
            "choose one for this model's size with slo=<option> (configs/slo: e.g. "
            "slo=mistral-7b-strict for a ~7B dense model, slo=llama-2-70b-strict for ~70B), or "
            f"name slo={slo.name} on the command line to judge it by Mistral-7B's limits")
    if slo is None or slo.model is None or model is None or slo.model == model or "slo" in user:
        return
    if model not in _presets("model"):   # a model of the user's own: no SLO of its own to offer
        return
    raise ConfigError(
        f"slo={slo.name}: its limits were set for model {slo.model}, but this run's model is "
        f"{model}; choose this model's SLO (slo={model}-strict or slo={model}-relaxed, "
        f"configs/slo), or name slo={slo.name} on the command line to judge {model} by "
        f"{slo.model}'s limits anyway")


def check_settings_act(r: Resolved, requests, trace_name: str) -> None:
    """Settings that act only on something the requests carry, checked once they are built (the
    unread-settings rule of `resolve`, for what only the trace tells): deadline admission needs
    requests with a deadline."""
    cfgs = [r.policy_cfg] if r.disagg is None else \
        [p.resolved.policy_cfg for p in (r.disagg.prefill, r.disagg.decode)]
    if any(c.deadline_admission for c in cfgs) and \
            not any(q.deadline is not None for q in requests):
        raise ConfigError(
            f"scheduler.deadline_admission=true: no request of trace {trace_name} has a "
            "deadline, so admission by deadline cannot act; use a trace whose requests carry "
            "one (a deadline column or key, or a mix component's deadline, e.g. trace=chat) or "
            "leave deadline_admission off")


def _check_random_weight_keys(model: dict, user: list[str], unread) -> None:
    """The random weights' seed and scale act only without ``model.path`` (weights loaded)."""
    if not model.get("path"):
        return
    for k in ("model.init_seed", "model.init_std"):
        if k in user:
            unread(k, f"random weights only: the weights are loaded from model.path="
                      f"{model['path']}")
