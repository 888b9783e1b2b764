"""The run layer's part of disaggregated prefill/decode (``cluster=disagg``): each pool is
resolved as a run of its own, so its policy, executor and fleet are typed and checked by the code
that checks a single run's (`config.resolve`). The pools themselves, their driver and results are
`topology.disagg`; `runner` builds them."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from sarathi_lab import registry
from sarathi_lab.settings import ConfigError, parse
from sarathi_lab.topology.disagg.settings import POOLS, DisaggConfig
from sarathi_lab.topology.disagg.transfer import Link, Transfer
from sarathi_lab.topology.routers import RoundRobin, Router, RouterConfig


@dataclass
class Pool:
    """One pool as resolved: its run's settings (policy, executor, fleet size, router)."""
    name: str
    resolved: object     # config.Resolved

    @property
    def num_replicas(self) -> int:
        return self.resolved.cluster.num_replicas

    @property
    def tensor_parallel(self) -> int:
        return getattr(self.resolved.executor_cfg, "tensor_parallel", 1)

    def router(self, seed: int) -> Router:
        r = self.resolved
        if r.router_cls is None:   # one replica: every request goes to it
            return RoundRobin(RouterConfig(), 1, seed)
        return r.router_cls(r.router_cfg, self.num_replicas, seed)

    def effective(self) -> dict:
        e = self.resolved.effective()
        r = self.resolved
        fleet = {"num_replicas": self.num_replicas}
        if r.router_cls is not None:
            fleet.update(e["cluster"])
        return {"scheduler": e["scheduler"], "executor": e["executor"], "cluster": fleet}


@dataclass
class DisaggResolved:
    config: DisaggConfig
    prefill: Pool
    decode: Pool
    transfer: Transfer

    def effective(self) -> dict:
        base = self.prefill.resolved.effective()
        for k in ("scheduler", "executor", "cluster"):
            base.pop(k, None)
        return {**base, "disagg": {**dataclasses.asdict(self.config),
                                   "prefill": self.prefill.effective(),
                                   "decode": self.decode.effective()}}


# settings a pool's own node holds besides its fleet's (num_replicas, router, router knobs)
_POOL_NODES = ("scheduler", "executor")


def resolve_disagg(c: dict, user: list[str], resolve, *, drop_unread: bool = False):
    """`config.resolve` for ``cluster=disagg``: each pool is resolved as a run of its own (the
    run's scheduler and executor nodes with the pool's overrides, its fleet from the pool's
    node), so every setting is typed and checked by the code that checks a single run's. A
    setting neither pool reads is an error (a multirun notes it). `resolve`: `config.resolve`,
    passed in so that this module sits below `config`. Returns the prefill pool's `Resolved`
    with `disagg` set."""
    node = _mapping(c, "cluster")
    pools = {p: node.pop(p, None) or {} for p in POOLS}
    for p, pn in pools.items():
        if not isinstance(pn, dict):
            raise ConfigError(f"cluster.{p}={pn!r}: must be a mapping (num_replicas, router, "
                              "scheduler, executor)")
    cfg = parse(DisaggConfig, node, "cluster", "disaggregated prefill/decode")
    base_sched = _mapping(c, "scheduler")
    user_sched = [k.split(".", 1)[1] for k in user if k.startswith("scheduler.")]
    resolved, readers = {}, {}
    for p in POOLS:
        pn = dict(pools[p])
        own = {}
        for k in _POOL_NODES:
            v = pn.pop(k, None)
            if v is not None and not isinstance(v, dict):
                raise ConfigError(f"cluster.{p}.{k}={v!r}: must be a mapping of {k} settings "
                                  f"(cluster.{p}.{k}.KEY=VALUE)")
            own[k] = dict(v or {})
        sched = {k: v for k, v in own["scheduler"].items() if v is not None}
        node_s = dict(base_sched)
        name = sched.get("name")
        if name is not None and name != base_sched.get("name"):
            # another policy than the run's: keep only the run's settings it reads
            try:
                fields = {f.name for f in dataclasses.fields(
                    registry.policy_class(name).config_class)}
            except (ValueError, TypeError) as e:
                raise ConfigError(f"cluster.{p}.scheduler.name: {e}") from None
            node_s = {k: v for k, v in node_s.items() if k in fields or k == "name"}
        node_s.update(sched)
        readers[p] = set(node_s)
        node_e = {**_mapping(c, "executor"),
                  **{k: v for k, v in own["executor"].items() if v is not None}}
        pool_c = {**c, "scheduler": node_s, "executor": node_e, "cluster": pn}
        try:
            resolved[p] = resolve(pool_c, _pool_overrides(user, p), drop_unread=drop_unread)
        except ConfigError as e:
            raise ConfigError(_pool_error(str(e), p, own)) from None
        r = resolved[p]
        if not r.executor_cls.simulated:
            raise ConfigError(f"executor.name: {r.executor_cls.__qualname__} runs a real model; "
                              "disaggregated pools need a simulated executor (executor=sim), "
                              "since a decode replica would need the prefill replica's KV")
        pp = getattr(r.executor_cfg, "pipeline_parallel", 1)
        if pp > 1:
            raise ConfigError(f"executor.pipeline_parallel={pp} (in the {p} pool): disaggregated "
                              "pools run one engine per replica, without pipeline stages; use "
                              "tensor_parallel for a pool's parallelism")
    dec = resolved["decode"]
    if dec.policy_cfg.enable_prefix_caching:
        raise ConfigError("cluster.decode.scheduler.enable_prefix_caching=true: the decode pool "
                          "receives its KV from the prefill pool and keeps no prefix cache (set "
                          "it false for the decode pool)")
    for p in ("prefill", "decode"):
        if resolved[p].policy_cfg.sliding_window_kv:
            raise ConfigError(f"cluster.{p}.scheduler.sliding_window_kv=true: a disaggregated "
                              "handoff copies a request's whole KV, which a sliding-window "
                              "cache no longer holds; not supported (set it false)")
    unread = [k for k in user_sched if k.split(".")[0] not in readers["prefill"] | readers["decode"]]
    notes = []
    for k in unread:
        msg = f"scheduler.{k}: read by neither pool's policy"
        if not drop_unread:
            raise ConfigError(msg)
        notes.append(msg)
    pre = resolved["prefill"]
    link = Link.from_hardware(pre.hardware, cfg.link, cfg.link_bandwidth, cfg.link_eff,
                              cfg.link_latency_s)
    transfer = Transfer.for_model(pre.model, link, _tp(pre), _tp(dec), cfg.transfer)
    spec = DisaggResolved(cfg, Pool("prefill", pre), Pool("decode", dec), transfer)
    seen = set()
    all_notes = [n for n in pre.notes + dec.notes + notes if not (n in seen or seen.add(n))]
    return dataclasses.replace(pre, disagg=spec, notes=all_notes)


def _mapping(c: dict, key: str) -> dict:
    """A copy of the config node `key` ({} if unset); `config.resolve` has checked its kind."""
    return dict(c.get(key) or {})


def _tp(r) -> int:
    return getattr(r.executor_cfg, "tensor_parallel", 1)


def _pool_overrides(user: list[str], pool: str) -> list[str]:
    """The command line's keys as one pool's run sees them: ``cluster.<pool>.scheduler.X`` is
    its ``scheduler.X``, ``cluster.<pool>.X`` its fleet's ``cluster.X``; the other pool's and
    the link's keys are not its own."""
    head, out = f"cluster.{pool}.", []
    for k in user:
        if k.startswith(head):
            rest = k[len(head):]
            out.append(rest if rest.split(".")[0] in _POOL_NODES else f"cluster.{rest}")
        elif k != "cluster" and not k.startswith("cluster."):
            out.append(k)
    return [f"{k}=" for k in out]


def _pool_error(msg: str, pool: str, own: dict) -> str:
    """A pool's configuration error, naming the setting as the user typed it."""
    key = msg.split(":", 1)[0].split("=", 1)[0]
    first = key.split(".")[0]
    if first == "cluster":
        return msg.replace("cluster.", f"cluster.{pool}.")
    if first in _POOL_NODES and own.get(first, {}).get(key.split(".", 1)[-1]) is not None:
        return f"cluster.{pool}.{msg}"
    return f"{msg} (in the {pool} pool)"
