"""Build a run from a config (its engines, topology and load), drive it, write the run
directory: build -> drive -> tables -> write, the same for every topology."""
from __future__ import annotations

import dataclasses
import logging
import os
import sys
import time
from pathlib import Path

from sarathi_lab.engine import Engine
from sarathi_lab.kv import KVCacheManager, WindowedKVCacheManager
from sarathi_lab.resources import check_run, output_tokens_held
from sarathi_lab.run import rundir
from sarathi_lab.run.config import Resolved, check_settings_act, resolve
from sarathi_lab.schedulers.whole_prompt import WholePromptPolicy
from sarathi_lab.settings import ConfigError, plain
from sarathi_lab.topology import Fleet, OpenLoop, Single, drive

log = logging.getLogger(__name__)


def build(cfg, resolved: Resolved | None = None):
    """(policy, executor) from a full config (Hydra DictConfig or nested dict), converted once
    by `config.resolve` (or already resolved)."""
    r = resolved or resolve(cfg)
    executor = r.executor_cls(r.executor_cfg, r.model, r.hardware)
    pc = r.policy_cfg
    model_len = executor.max_model_len() or r.model.get("max_model_len")
    if not model_len:
        raise ConfigError("model.max_model_len: unknown (the executor does not know the model's "
                          "length); set it")
    max_model_len = model_len
    if pc.max_model_len is not None:
        if pc.max_model_len > model_len:
            raise ConfigError(f"scheduler.max_model_len={pc.max_model_len}: exceeds the model's "
                              f"{model_len}")
        max_model_len = pc.max_model_len
    num_blocks = pc.num_kv_blocks or executor.num_kv_blocks(pc.block_size)
    if not num_blocks:
        raise ConfigError(f"executor {type(executor).__name__} cannot size the KV cache; "
                          "set scheduler.num_kv_blocks")
    executor.check_kv_memory(num_blocks, pc.block_size)
    cls = r.policy_cls
    try:
        num_host = cls.swap_blocks(pc, executor.kv_block_bytes(pc.block_size))
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if num_host:
        if not executor.supports_swap:
            raise ConfigError(f"scheduler.preemption_mode=swap: executor "
                              f"{type(executor).__name__} does not copy swapped KV blocks "
                              "(its supports_swap is False); use preemption_mode=recompute")
        executor.check_swap_memory(num_host, pc.block_size)
    window = {}
    if pc.sliding_window_kv:
        if cls.reserves_kv:
            raise ConfigError(f"scheduler.sliding_window_kv=true: policy {cls.name!r} reserves "
                              "each request's whole length up front; use a paged policy "
                              "(vllm, sarathi, ...)")
        window = {"window": window_of(r.model, executor)}
    try:
        kv_cls = WindowedKVCacheManager if window else KVCacheManager
        kv = kv_cls(num_blocks, pc.block_size, enable_prefix_caching=pc.enable_prefix_caching,
                    reserve=cls.reserves_kv, max_model_len=max_model_len,
                    num_host_blocks=num_host, **window)
    except ValueError as e:
        raise ConfigError(f"scheduler: {e}") from None
    # the smallest request must fit, or the configuration is useless
    if kv.blocks_needed(max_model_len if cls.reserves_kv else 2) > num_blocks:
        where = (f"scheduler.num_kv_blocks={num_blocks}" if pc.num_kv_blocks else
                 f"the {num_blocks} KV blocks that fit the executor's memory (see the executor's "
                 "memory settings, or set scheduler.num_kv_blocks)")
        what = (f"one request of max_model_len={max_model_len}, which {cls.name} reserves up "
                "front (lower scheduler.max_model_len)" if cls.reserves_kv else "one request")
        raise ConfigError(f"{where} (block_size={pc.block_size}) cannot hold {what}")
    try:
        policy = cls(pc, kv, r.queue_cls())
    except ValueError as e:
        raise ConfigError(str(e)) from None
    policy.bind_predictor(executor.predictor(), r.slo)   # for a budget controller
    if window:   # a request's chunks are at most a batch's tokens (its footprint: kv/window.py)
        kv.max_chunk = policy.token_limit() or max_model_len
    return policy, executor


def window_of(model: dict, executor) -> int:
    """The sliding window whose out-of-reach blocks scheduler.sliding_window_kv frees: the
    model's, which must window every layer (a KV block holds every layer's KV, so one global
    layer needs them all), on an executor that never reads a freed block."""
    from sarathi_lab.models.shape import ModelShape
    key = "scheduler.sliding_window_kv=true"
    if not executor.supports_sliding_window_kv:
        raise ConfigError(f"{key}: executor {type(executor).__name__} does not support it: "
                          f"{executor.no_sliding_window_kv}")
    shape = ModelShape.from_config(model)
    if shape.sliding_window is None:
        raise ConfigError(f"{key}: model {shape.name!r} has no sliding window "
                          "(model.sliding_window is null): no block ever leaves one")
    if shape.full_attention_layers:
        raise ConfigError(
            f"{key}: model {shape.name!r} has {shape.full_attention_layers} global "
            f"(full-attention) layers of {shape.num_layers} (model.full_attention_layers): a "
            "KV block holds every layer's KV, and a global layer reads all of them, so none "
            "could be freed; separate block groups for local and global layers are not modelled")
    # GPT-OSS's attention sinks are a learned logit per head: no token's KV to keep
    return shape.sliding_window


def used_settings(r: Resolved, policy) -> dict:
    """The values the run actually used, defaults and derived values filled in."""
    eff = r.effective()
    sched = eff["scheduler"]
    sched.update(max_model_len=policy.max_model_len, num_kv_blocks=policy.kv.num_blocks)
    q = type(policy.waiting)   # a policy may order its queue itself (sarathi_priority's aging)
    sched["queue"] = f"{q.__module__}:{q.__qualname__}"
    if isinstance(policy, WholePromptPolicy):   # the batch cap it derived
        sched["max_num_batched_tokens"] = policy.token_limit()
    if policy.kv.num_host_blocks:
        sched["num_swap_blocks"] = policy.kv.num_host_blocks
        if policy.cfg.num_swap_blocks is None:
            from sarathi_lab.schedulers.base import DEFAULT_SWAP_SPACE_GIB
            sched["swap_space_gib"] = policy.cfg.swap_space_gib or DEFAULT_SWAP_SPACE_GIB
    if r.notes:
        eff["unread"] = list(r.notes)
    return eff


class ProgressLines:
    """Progress as log lines, where a bar cannot show (stderr is not a terminal, or CI): a
    first line once the run has taken `first_s` of wall time (a quick run logs none), then one
    every `every_s`."""

    def __init__(self, total: int, simulated: bool, first_s: float = 10.0,
                 every_s: float = 30.0):
        self.total, self.simulated, self.every_s = total, simulated, every_s
        self.t0 = time.perf_counter()
        self.next = self.t0 + first_s

    def __call__(self, num_done: int, num_tokens: int) -> None:
        now = time.perf_counter()
        if now < self.next:
            return
        self.next = now + self.every_s
        spent = now - self.t0
        tokens = "" if self.simulated else \
            f", {num_tokens:,} tokens computed ({num_tokens / spent:,.0f} tok/s)"
        log.info("%s: %d of %d requests done%s after %.0f s", "simulating" if self.simulated
                 else "real run", num_done, self.total, tokens, spent)


def _progress_bar(total: int, enabled, simulated: bool = True):
    """(bar, the engine's progress callable), or (None, None) when off. `enabled`: the
    `progress` setting. auto shows the bar on a terminal outside CI, and only once the run has
    taken 2 s (a quick run prints none), elsewhere log lines (`ProgressLines`, no bar); true
    shows the bar at once, anywhere. A real run's bar also counts the tokens computed; a
    simulation's does not (fast-forwarded decodes report none)."""
    if enabled not in ("auto", True, False):
        raise ValueError(f"progress={enabled!r}: must be auto, true or false")
    delay = 0.0
    if enabled == "auto":
        if not sys.stderr.isatty() or os.environ.get("CI"):
            return None, ProgressLines(total, simulated)
        delay = 2.0
    if not enabled:
        return None, None
    from tqdm import tqdm
    bar = tqdm(total=total, unit="req", desc="simulating" if simulated else "real run",
               mininterval=0.5, delay=delay, leave=False)
    t0 = time.perf_counter()

    def update(num_done: int, num_tokens: int) -> None:
        if not simulated:
            rate = num_tokens / max(time.perf_counter() - t0, 1e-9)
            bar.set_postfix_str(f"{num_tokens:,} tokens, {rate:,.0f} tok/s", refresh=False)
        bar.update(num_done - bar.n)
    return bar, update


def _pipelined(pp: int) -> str:
    return f"executor.pipeline_parallel={pp}: the pipeline places every batch"


def build_topology(c: dict, r: Resolved, engine: Engine, progress=None):
    """The run's topology around `engine` (the first replica, already built): one engine, a
    fleet behind the router, a pipeline's virtual engines, or disaggregated pools; every other
    engine built as a single run's."""
    pp = getattr(r.executor_cfg, "pipeline_parallel", 1)
    ov = r.run.overlong
    if r.disagg is not None:   # a prefill pool and a decode pool
        return build_pools(r, engine, progress)
    if pp > 1:   # one virtual engine per stage, each micro-batch placed (no fast-forward)
        from sarathi_lab.topology.pipeline import PipelineReplica
        return PipelineReplica([engine] + [Engine(*build(c, r), fast_forward=False, overlong=ov,
                                                  why_not=_pipelined(pp))
                                           for _ in range(pp - 1)], progress=progress)
    n = r.cluster.num_replicas
    if n > 1:   # the same replica n times, behind the router
        return Fleet([engine] + [Engine(*build(c, r), fast_forward=r.run.fast_forward,
                                        overlong=ov) for _ in range(n - 1)],
                     r.router_cls(r.router_cfg, n, r.run.seed), progress=progress)
    return Single(engine)


def build_pools(r: Resolved, first: Engine | None = None, progress=None):
    """The two pools of a resolved ``cluster=disagg`` config (`Disaggregated`), each replica
    built as a single run's (`build`); `first`, if given, is prefill replica 0."""
    from sarathi_lab.topology.disagg import Disaggregated
    spec = r.disagg
    run = r.run

    def engines(pool, have: list):
        while len(have) < pool.num_replicas:
            have.append(Engine(*build(None, pool.resolved), fast_forward=run.fast_forward,
                               overlong=run.overlong))
        return have
    prefill = engines(spec.prefill, [first] if first is not None else [])
    decode = engines(spec.decode, [])
    return Disaggregated(prefill, decode, spec.prefill.router(run.seed),
                         spec.decode.router(run.seed), spec.transfer, progress=progress)


def build_load(requests, trace: dict | None, frame=None):
    """The run's load: the trace's arrivals (open loop), with `trace.clients` set that many
    closed-loop users, or multi-turn sessions (a trace node with ``turns``; `frame`, the trace
    the requests were made from, says each one's session and turn) (topology/clients.py)."""
    trace = trace or {}
    clients = trace.get("clients")
    from sarathi_lab.traces.clients import ThinkTime
    if "turns" in trace:
        if frame is None or "session" not in frame:
            raise ValueError("trace: multi-turn sessions (trace.turns) need the trace they were "
                             "built as, with each request's session and turn; requests given "
                             "without it would be sent open-loop, every turn at its session's "
                             "start")
        from sarathi_lab.topology.clients import Sessions
        return Sessions(requests, frame["session"].tolist(), frame["turn"].tolist(),
                        ThinkTime.from_spec(trace.get("think_time")), seed=trace.get("seed", 0))
    if clients is None:
        return OpenLoop(requests)
    from sarathi_lab.topology.clients import ClosedLoop
    return ClosedLoop(requests, clients, ThinkTime.from_spec(trace.get("think_time")),
                      seed=trace.get("seed", 0))


def disagg_settings(r: Resolved, prefill_policy, decode_policy) -> dict:
    """summary.json's `settings` with ``cluster=disagg``: the run's, and each pool's as used
    (derived values filled in, as `used_settings` does for one engine)."""
    spec = r.disagg
    eff = used_settings(spec.prefill.resolved, prefill_policy)
    dec = used_settings(spec.decode.resolved, decode_policy)
    pools = {}
    for pool, e in ((spec.prefill, eff), (spec.decode, dec)):
        pools[pool.name] = {"scheduler": e["scheduler"], "executor": e["executor"],
                            "cluster": pool.effective()["cluster"]}
    out = {k: v for k, v in eff.items() if k not in ("scheduler", "executor", "cluster")}
    out["disagg"] = {**dataclasses.asdict(spec.config), **spec.transfer.as_dict(), **pools}
    return out


def run(cfg, run_dir: str | Path | None, requests=None, write: bool = True,
        resolved: Resolved | None = None, keep: dict | None = None) -> dict:
    """Simulate or execute the configured run; write requests.parquet, iterations.parquet and
    summary.json (last, atomically: its presence marks a complete run). Returns the summary.
    write=False (capacity probes) returns the summary and writes nothing. `keep`, a dict,
    receives the tables ("requests", "iterations") and "summarize": the summary of a part of
    them (a steady-state probe's measured interval, `capacity.Prober`)."""
    from sarathi_lab.traces import build_trace, describe_trace, to_requests
    c = plain(cfg)
    r = resolved or resolve(c)
    if write:
        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    # what the run will hold, refused before it is built if it cannot fit (resources.py)
    check_run(r, None if requests is not None else (c.get("trace") or {}).get("num_requests"))
    policy, executor = build(c, r)
    output_tokens = 0
    served = None   # what was done to the trace file (summary.json's trace)
    frame = None    # the trace the requests were made from, when made here
    if requests is None:
        built = build_trace(c["trace"])
        served = describe_trace(built)
        trace = frame = executor.prepare_trace(built, c["trace"])
        requests = to_requests(trace)
        output_tokens = output_tokens_held(trace["num_prompt_tokens"],
                                           trace["num_output_tokens"], policy.max_model_len)
    check_run(r, len(requests), output_tokens)
    check_settings_act(r, requests, (c.get("trace") or {}).get("name", "?"))
    bar, progress = _progress_bar(len(requests), r.run.progress, executor.simulated)
    pp = getattr(r.executor_cfg, "pipeline_parallel", 1)
    engine = Engine(policy, executor, fast_forward=r.run.fast_forward and pp == 1,
                    progress=progress, overlong=r.run.overlong,
                    why_not="run.fast_forward=false" if pp == 1 else _pipelined(pp))
    topology = build_topology(c, r, engine, progress)
    load = build_load(requests, r.trace, frame)
    drive(topology, load)
    if bar is not None:
        bar.close()
    wall = time.perf_counter() - t0
    req_df, it_df, summary = results(c, r, topology, load, requests, policy, executor, wall,
                                     trace_record=served)
    if keep is not None:
        keep.update(requests=req_df, iterations=it_df, summarize=lambda rq, it: (
            topology.summarize(rq, it, slo=c.get("slo"),
                               price_per_gpu_hour=(r.hardware or {}).get("price_per_gpu_hour"))))
    if write:
        write_run(run_dir, req_df, it_df, summary)
    return summary


def results(c: dict, r: Resolved, topology, load, requests, policy, executor, wall: float,
            trace_record: dict | None = None):
    """(requests table, iterations table, summary) of a driven run: the topology's tables and
    summary with the load's columns and record, what was done to the trace file
    (`trace_record`, if any), the wall time and the settings used (also for a served session:
    `sarathi_lab/serve`)."""
    req_df, it_df = topology.tables(requests)
    for i, (name, values) in enumerate(load.columns().items()):
        req_df.insert(1 + i, name, values)   # closed loop: the user who sent each request
    summary = topology.summarize(req_df, it_df, slo=c.get("slo"),
                                 price_per_gpu_hour=(r.hardware or {}).get("price_per_gpu_hour"))
    summary["load"] = load.describe()
    if trace_record is not None:
        summary["trace"] = trace_record
    summary["wall_time_s"] = wall
    summary["simulated"] = executor.simulated
    summary["cost_model"] = executor.cost_model_record()
    summary["fast_forward"] = fast_forward_record(topology)
    summary["predictor"] = predictor_record(topology)
    summary["config"] = c
    summary["settings"] = used_settings(r, policy) if r.disagg is None else \
        disagg_settings(r, policy, topology.decode[0].policy)
    used = summary["settings"].get("executor") or {}
    if used.get("device") == "auto" and getattr(executor, "device", None) is not None:
        used["device"] = str(executor.device)   # as it resolved (cpu, cuda), not the setting
    return req_df, it_df, summary


def fast_forward_record(topology) -> dict:
    """Whether the run's engines skipped through steady runs (`run.fast_forward`, exact either
    way, faster where on), and why not where they did not: the setting is on by default, and a
    profile's decode_rewarm rows, step jitter, speculation, pipeline stages, a real executor or
    a policy without the declaration turn it off."""
    off = sorted({e.fast_forward_off for _, e in topology.named_engines()} - {None})
    return {"enabled": not off, "why_not": "; ".join(off) or None}


def predictor_record(topology) -> dict | None:
    """What priced the budget controller's batches (schedulers/controllers/predictor.py): the
    engine's record, or one per engine by name (a fleet, a pipeline, disaggregated pools);
    None where no controller predicts."""
    recs = {name: rec for name, e in topology.named_engines()
            if (rec := getattr(e.policy, "predictor_record", lambda: None)()) is not None}
    if len(recs) == 1 and len(topology.named_engines()) == 1:
        return next(iter(recs.values()))
    return recs or None


def write_run(run_dir: Path, req_df, it_df, summary: dict) -> None:
    """The run directory's files; summary.json last (its presence marks a complete run)."""
    rundir.write_parquet(run_dir / rundir.REQUESTS, req_df)
    rundir.write_parquet(run_dir / rundir.ITERATIONS, it_df)
    rundir.write_json(run_dir / rundir.SUMMARY, summary)
