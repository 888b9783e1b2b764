"""Build a run from a config, execute it, write the run directory."""
from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path

from sarathi_lab import rundir
from sarathi_lab.config import Resolved, resolve
from sarathi_lab.engine import Engine
from sarathi_lab.kv import KVCacheManager
from sarathi_lab.metrics import iterations_table, requests_table, summarize
from sarathi_lab.settings import ConfigError, plain

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
    try:
        kv = KVCacheManager(num_blocks, pc.block_size,
                            enable_prefix_caching=pc.enable_prefix_caching,
                            reserve=cls.reserves_kv, max_model_len=max_model_len,
                            num_host_blocks=num_host)
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
    return policy, executor


def used_settings(r: Resolved, policy) -> dict:
    """The values the run actually used, defaults and derived values filled in."""
    eff = r.effective()
    sched = eff["scheduler"]
    sched.update(max_model_len=policy.max_model_len, num_kv_blocks=policy.kv.num_blocks)
    q = type(policy.waiting)   # a policy may order its queue itself (sarathi_priority's aging)
    sched["queue"] = f"{q.__module__}:{q.__qualname__}"
    if hasattr(policy, "token_cap"):
        sched["max_num_batched_tokens"] = policy.token_cap
    if policy.kv.num_host_blocks:
        sched["num_swap_blocks"] = policy.kv.num_host_blocks
        if policy.cfg.num_swap_blocks is None:
            from sarathi_lab.schedulers.base import DEFAULT_SWAP_SPACE_GIB
            sched["swap_space_gib"] = policy.cfg.swap_space_gib or DEFAULT_SWAP_SPACE_GIB
    if r.notes:
        eff["unread"] = list(r.notes)
    return eff


def _progress_bar(total: int, enabled, simulated: bool = True):
    """(bar, the engine's progress callable), or (None, None) when off. `enabled`: the
    `progress` setting. auto shows the bar on a terminal outside CI, and only once the run has
    taken 2 s (a quick run prints none); true shows it at once, anywhere. A real run's bar also
    counts the tokens computed; a simulation's does not (fast-forwarded decodes report none)."""
    if enabled not in ("auto", True, False):
        raise ValueError(f"progress={enabled!r}: must be auto, true or false")
    delay = 0.0
    if enabled == "auto":
        enabled = sys.stderr.isatty() and not os.environ.get("CI")
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


def drive(engine: Engine, requests, trace: dict) -> tuple[dict, list | None]:
    """Serve `requests` on `engine`: open-loop at their arrival times, or with `trace.clients`
    set, by that many closed-loop users (closed_loop.py). Returns the summary's `load` and,
    closed-loop, the user of each request (None open-loop)."""
    clients = (trace or {}).get("clients")
    if clients is None:
        engine.run(requests)
        return {"mode": "open"}, None
    import dataclasses

    from sarathi_lab.closed_loop import ThinkTime, run_closed_loop
    think = ThinkTime.from_spec(trace.get("think_time"))
    users = run_closed_loop(engine, requests, clients, think, seed=trace.get("seed", 0))
    return {"mode": "closed", "clients": clients, "think_time": dataclasses.asdict(think)}, users


def run(cfg, run_dir: str | Path | None, requests=None, write: bool = True,
        resolved: Resolved | None = None) -> dict:
    """Simulate or execute the configured run; write requests.parquet, iterations.parquet and
    summary.json (last, atomically: its presence marks a complete run). Returns the summary.
    write=False (capacity probes) returns the summary and writes nothing."""
    from sarathi_lab.traces import build_trace, to_requests
    c = plain(cfg)
    r = resolved or resolve(c)
    if write:
        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    policy, executor = build(c, r)
    if requests is None:
        trace = executor.prepare_trace(build_trace(c["trace"]), c["trace"])
        requests = to_requests(trace)
    bar, progress = _progress_bar(len(requests), r.run.progress, executor.simulated)
    # pipeline stages: one virtual engine per stage, each micro-batch placed (no fast-forward)
    pp = getattr(r.executor_cfg, "pipeline_parallel", 1)
    engine = Engine(policy, executor, fast_forward=r.run.fast_forward and pp == 1,
                    progress=progress, overlong=r.run.overlong)
    gpus = getattr(r.executor_cfg, "tensor_parallel", 1) * pp   # of one replica
    price = dict(price_per_gpu_hour=(r.hardware or {}).get("price_per_gpu_hour"), num_gpus=gpus)
    n = r.cluster.num_replicas
    pools = None
    if r.disagg is not None:   # a prefill pool and a decode pool (disagg/)
        from sarathi_lab.disagg import build_pools
        pools = build_pools(r, engine, progress)
        pools.run(requests)
        load, users = {"mode": "open"}, None
    elif pp > 1:
        from sarathi_lab.pipeline import PipelineReplica
        replica = PipelineReplica([engine] + [Engine(*build(c, r), fast_forward=False,
                                                     overlong=r.run.overlong)
                                              for _ in range(pp - 1)], progress=progress)
        replica.run(requests)
        load, users = {"mode": "open"}, None
    elif n > 1:   # a fleet: the same replica n times, behind the router
        from sarathi_lab.cluster import Cluster
        fleet = Cluster([engine] + [Engine(*build(c, r), fast_forward=r.run.fast_forward,
                                           overlong=r.run.overlong) for _ in range(n - 1)],
                        r.router_cls(r.router_cfg, n, r.run.seed), progress=progress)
        fleet.run(requests)
        load, users = {"mode": "open"}, None
    else:
        load, users = drive(engine, requests, r.trace)
    if bar is not None:
        bar.close()
    wall = time.perf_counter() - t0
    if pools is not None:
        req_df, it_df = pools.tables(requests)
        summary = pools.summarize(req_df, it_df, slo=c.get("slo"),
                                  price_per_gpu_hour=price["price_per_gpu_hour"])
    elif pp > 1:
        req_df, it_df = replica.tables(requests)
        summary = replica.summarize(req_df, it_df, slo=c.get("slo"), **price)
    elif n > 1:
        req_df, it_df = fleet.tables(requests)
        summary = fleet.summarize(req_df, it_df, slo=c.get("slo"), **price)
    else:
        req_df = requests_table(requests, engine.output_lens)
        if users is not None:
            req_df.insert(1, "client", users)   # closed loop: the user who sent it
        it_df = iterations_table(engine.iteration_columns())
        summary = summarize(req_df, it_df, slo=c.get("slo"),
                            kv_blocks_total=policy.kv.num_blocks,
                            block_size=policy.kv.block_size,
                            prefix_cache=policy.kv.prefix_cache_stats(),
                            swap_space=engine.swap_space(), **price)
    summary["load"] = load
    summary["wall_time_s"] = wall
    summary["simulated"] = executor.simulated
    summary["config"] = c
    summary["settings"] = used_settings(r, policy) if pools is None else \
        r.disagg.used_settings(policy, pools.decode[0].policy)
    if not write:
        return summary
    rundir.write_parquet(run_dir / rundir.REQUESTS, req_df)
    rundir.write_parquet(run_dir / rundir.ITERATIONS, it_df)
    rundir.write_json(run_dir / rundir.SUMMARY, summary)
    return summary
