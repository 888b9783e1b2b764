"""The run's configuration, converted once: every component's settings typed and checked, and
nothing set that no chosen component reads.

`resolve(cfg)` takes the composed config (Hydra's, or a nested dict in code) and returns a
`Resolved`: the classes chosen (policy, queue, executor) with their typed settings, and the
settings of the run itself. It reads one concern at a time (the policy, the executor, the
hardware, the SLO and capacity search, the logger, the model, the fleet, the trace); the run's
own settings are in `run.settings`, the checks across components in `run.checks`. Errors
name the setting as typed on the command line. The builder (`runner.build`) and the CLI's check
both use it, so a configuration error is found before any run directory is made or any model
loaded.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from sarathi_lab.run.checks import (
    check_random_weight_keys,
    check_slo_model,
    check_speculation_keys,
    drop_unread_knobs,
)
from sarathi_lab.run.settings import (
    LOGGERS,
    STEADY_KEYS,
    CapacityConfig,
    ClusterConfig,
    RunConfig,
    SLOConfig,
)
from sarathi_lab.settings import ConfigError, parse, plain


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
    # cluster=disagg: a prefill pool and a decode pool (run.disagg.DisaggResolved); the fields above
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

    kept = notes if drop_unread else None   # where a multirun notes what it drops
    run = parse(RunConfig, {k: v for k, v in c.items() if k not in _GROUPS}, "", "the run")
    policy_cls, policy_cfg, queue_cls = _policy(c, user, unread, kept)
    executor_cls, executor_cfg = _executor(c, policy_cls, policy_cfg, user, unread)
    hardware = _hardware(c, executor_cls, user, unread)
    slo = parse(SLOConfig, _node(c, "slo"), "slo") if c.get("slo") else None
    capacity = _capacity(c, run, user, unread)
    logger = _logger(c)
    model = _model(c, slo, executor_cls, executor_cfg, overrides, user, unread)
    cluster, router_cls, router_cfg = _cluster(c, user, unread, kept)
    pp = getattr(executor_cfg, "pipeline_parallel", 1)
    if pp > 1 and cluster.num_replicas > 1:
        raise ConfigError(f"executor.pipeline_parallel={pp} with cluster.num_replicas="
                          f"{cluster.num_replicas}: a fleet of pipeline-parallel replicas is not "
                          "supported yet (one or the other)")
    trace = _trace(c, run, user, unread)
    return Resolved(run=run, policy_cls=policy_cls, policy_cfg=policy_cfg, queue_cls=queue_cls,
                    executor_cls=executor_cls, executor_cfg=executor_cfg, slo=slo,
                    capacity=capacity, logger=logger, model=model, hardware=hardware,
                    trace=trace, cluster=cluster, router_cls=router_cls, router_cfg=router_cfg,
                    notes=notes)


def _policy(c: dict, user: list[str], unread, notes: list[str] | None
            ) -> tuple[type, object, type]:
    """The policy's class and typed settings (its controller's among them), and its queue's
    class: the policy's own default queue when not set (edf's is edf)."""
    from sarathi_lab import registry
    p_name, p_node = _named(c, "scheduler")
    try:
        policy_cls = registry.policy_class(p_name)
    except ValueError as e:
        raise ConfigError(f"scheduler.name: {e}") from None
    drop_unread_knobs(p_node, policy_cls.setting_classes(p_node), "scheduler",
                      f"policy {p_name!r}", user, notes)
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
    try:
        queue_cls = registry.queue_class(policy_cfg.queue)
    except ValueError as e:
        raise ConfigError(f"scheduler.queue: {e}") from None
    return policy_cls, policy_cfg, queue_cls


def _executor(c: dict, policy_cls: type, policy_cfg, user: list[str], unread
              ) -> tuple[type, object]:
    """The executor's class and typed settings, and what the policy asks of it: pipeline
    stages, speculative decoding, a predictor of iteration time."""
    from sarathi_lab import registry
    e_name, e_node = _named(c, "executor")
    try:
        executor_cls = registry.executor_class(e_name)
    except ValueError as e:
        raise ConfigError(f"executor.name: {e}") from None
    if "pipeline_parallel" in e_node and not executor_cls.supports_pipeline:
        raise ConfigError(f"executor.pipeline_parallel: executor {e_name!r} does not run "
                          "pipeline stages (the simulator does: executor=sim)")
    executor_cfg = executor_cls.parse_config(e_node, "executor")
    check_speculation_keys(policy_cfg.num_speculative_tokens, executor_cls, executor_cfg, user,
                           unread)
    if (needs := policy_cls.needs_predictor(policy_cfg)) and not executor_cls.offers_predictor:
        raise ConfigError(f"{needs}: needs a predictor of iteration time, and executor "
                          f"{e_name!r} offers none (a simulator's cost model does: executor=sim)")
    return executor_cls, executor_cfg


def _hardware(c: dict, executor_cls: type, user: list[str], unread) -> dict | None:
    """The hardware preset, checked, for an executor that reads one; an executor that measures
    on its own machine reads none (a preset the user set is then unread)."""
    hardware = c.get("hardware") or None
    if hardware is not None and executor_cls.uses_hardware:
        from sarathi_lab.costmodels.roofline import HardwareSpec
        HardwareSpec.from_config(hardware)   # names and ranges of the preset's keys
    if hardware is not None and not executor_cls.uses_hardware:
        set_by_user = [k for k in user if k == "hardware" or k.startswith("hardware.")]
        if set_by_user:
            unread(set_by_user[0], f"executor {c['executor'].get('name')!r} measures time on "
                   "the machine it runs on and reads no hardware preset")
        hardware = None
    return hardware


def _capacity(c: dict, run: RunConfig, user: list[str], unread) -> CapacityConfig | None:
    """The capacity search's settings with mode=capacity (the steady rule's only with
    rule=steady); without, any capacity setting the user made is unread."""
    if run.mode != "capacity":
        cap_keys = [k for k in user if k.startswith("capacity.")]
        if cap_keys:
            unread(cap_keys[0], "read only with mode=capacity")
        return None
    capacity = parse(CapacityConfig, _node(c, "capacity"), "capacity")
    steady_keys = [k for k in user if k.split(".", 1)[-1] in STEADY_KEYS
                   and k.startswith("capacity.")]
    if capacity.rule == "fixed" and steady_keys:
        unread(steady_keys[0], "read only with capacity.rule=steady")
    return capacity


def _logger(c: dict):
    lg = _node(c, "logger") or {"name": "none"}
    lg_name = lg.get("name", "none")
    if lg_name not in LOGGERS:
        raise ConfigError(f"logger.name={lg_name!r}: must be one of {', '.join(LOGGERS)}")
    return parse(LOGGERS[lg_name], lg, "logger", f"logger {lg_name!r}")


def _model(c: dict, slo: SLOConfig | None, executor_cls: type, executor_cfg, overrides,
           user: list[str], unread) -> dict:
    """The model's shape (from a preset or a config.json), and what depends on it: the SLO
    chosen for this model, the executor's support, the model keys the executor reads."""
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
        check_slo_model(slo, model.get("name"), user)   # after the shape: model=hf names it
    executor_cls.check_model(executor_cfg, model)
    e_name = c["executor"].get("name")
    for k in user:
        if k.startswith("model.") and not executor_cls.reads_model_key(k.split(".")[1]):
            unread(k, f"executor {e_name!r} does not read it (it reads the model's shape)")
    check_random_weight_keys(model, user, unread)
    return model


def _trace(c: dict, run: RunConfig, user: list[str], unread) -> dict:
    """The trace node, checked against the run's mode: sessions and closed-loop users set
    their own pace, so a capacity search has no rate to search and arrival settings are
    unread."""
    from sarathi_lab.traces import parse_trace_config
    trace = _node(c, "trace")
    if not trace:   # a caller that passes its own requests may give no trace
        return trace
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
    return trace


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
    drop_unread_knobs(node, (router_cls.config_class,), "cluster",
                       f"router {cluster.router!r}", user, notes)
    return cluster, router_cls, router_cls.parse_config(node, "cluster")


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
