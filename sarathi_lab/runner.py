"""Build a run from a config, execute it, write the run directory."""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import time
from pathlib import Path

from sarathi_lab.config import plain
from sarathi_lab.engine import Engine
from sarathi_lab.files import atomic_write
from sarathi_lab.kv import KVCacheManager
from sarathi_lab.metrics import iterations_table, requests_table, summarize
from sarathi_lab.registry import executor_class, policy_class
from sarathi_lab.schedulers.base import SchedulerConfig

log = logging.getLogger(__name__)
_FIELDS = {f.name for f in dataclasses.fields(SchedulerConfig)} - {"extra"}


def scheduler_config(sched: dict, model_max_len: int) -> SchedulerConfig:
    sc = SchedulerConfig(**{k: v for k, v in sched.items() if k in _FIELDS},
                         extra={k: v for k, v in sched.items() if k not in _FIELDS})
    sc.validate()
    if sc.max_model_len is None or sc.max_model_len > model_max_len:
        if sc.max_model_len is not None:
            log.warning("scheduler.max_model_len=%d exceeds the model's %d; using %d",
                        sc.max_model_len, model_max_len, model_max_len)
        sc.max_model_len = model_max_len
    if sc.max_num_batched_tokens is None:
        sc.max_num_batched_tokens = max(sc.max_model_len, 2048)
    return sc


def build(cfg):
    """(policy, executor) from a full config (Hydra DictConfig or nested dict)."""
    c = plain(cfg)
    ex_cfg = c["executor"]
    executor = executor_class(ex_cfg["name"])(c["model"], c.get("hardware"), ex_cfg)
    sc = scheduler_config(c["scheduler"], executor.max_model_len() or c["model"]["max_model_len"])
    cls = policy_class(sc.name)
    num_blocks = sc.num_kv_blocks or executor.num_kv_blocks(sc.block_size)
    if not num_blocks:
        raise ValueError(f"executor {ex_cfg['name']!r} cannot size the KV cache; "
                         "set scheduler.num_kv_blocks")
    kv = KVCacheManager(num_blocks, sc.block_size, enable_prefix_caching=sc.enable_prefix_caching,
                        reserve=cls.reserves_kv, max_model_len=sc.max_model_len)
    # the smallest request must fit, or the configuration is useless
    if kv.blocks_needed(sc.max_model_len if cls.reserves_kv else 2) > num_blocks:
        where = (f"scheduler.num_kv_blocks={num_blocks}" if sc.num_kv_blocks else
                 f"the {num_blocks} KV blocks that fit the executor's memory (see the executor's "
                 "memory settings, or set scheduler.num_kv_blocks)")
        what = (f"one request of max_model_len={sc.max_model_len}, which {sc.name} reserves up "
                "front (lower scheduler.max_model_len)" if cls.reserves_kv else "one request")
        raise ValueError(f"{where} (block_size={sc.block_size}) cannot hold {what}")
    executor.bind(kv)
    return cls(sc, kv), executor


def _progress_bar(total: int, enabled):
    if enabled == "auto":
        enabled = sys.stderr.isatty() and not os.environ.get("CI")
    if not enabled:
        return None, None
    from tqdm import tqdm
    bar = tqdm(total=total, unit="req", desc="simulating", mininterval=0.5, leave=False)

    def update(n):
        bar.update(n - bar.n)
    return bar, update


def run(cfg, run_dir: str | Path | None, requests=None, write: bool = True) -> dict:
    """Simulate or execute the configured run; write requests.parquet, iterations.parquet and
    summary.json (last, atomically: its presence marks a complete run). Returns the summary.
    write=False (capacity probes) returns the summary and writes nothing."""
    from sarathi_lab.traces import build_trace, to_requests
    c = plain(cfg)
    if write:
        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    policy, executor = build(c)
    if requests is None:
        trace = build_trace(c["trace"])
        if hasattr(executor, "prepare_trace"):   # real models need prompt token ids
            trace = executor.prepare_trace(trace, c["trace"])
        requests = to_requests(trace)
    bar, progress = _progress_bar(len(requests), c.get("progress", "auto"))
    engine = Engine(policy, executor, fast_forward=c.get("fast_forward", True), progress=progress)
    engine.run(requests)
    if bar is not None:
        bar.close()
    wall = time.perf_counter() - t0
    req_df, it_df = requests_table(requests), iterations_table(engine.iterations())
    summary = summarize(req_df, it_df, slo=c.get("slo"), kv_blocks_total=policy.kv.num_blocks,
                        block_size=policy.kv.block_size)
    summary["wall_time_s"] = wall
    summary["config"] = c
    if not write:
        return summary
    atomic_write(run_dir / "requests.parquet", lambda p: req_df.to_parquet(p, index=False))
    atomic_write(run_dir / "iterations.parquet", lambda p: it_df.to_parquet(p, index=False))
    atomic_write(run_dir / "summary.json",
                 lambda p: p.write_text(json.dumps(summary, indent=2, default=str)))
    return summary


def format_summary(s: dict) -> str:
    cfg = s.get("config", {})
    ex = cfg.get("executor") or {}
    sim = ex.get("name", "sim") == "sim"
    where = (f"simulated {(cfg.get('hardware') or {}).get('name', '?')}" if sim else
             f"executor {ex.get('name')} ({ex.get('device', '?')})")
    head = (f"{cfg.get('scheduler', {}).get('name', '?')} | {cfg.get('model', {}).get('name', '?')}"
            f" on {where} | trace {cfg.get('trace', {}).get('name', '?')}")
    lines = [head, f"requests {s['num_finished']} finished, {s['num_rejected']} rejected, "
             f"{s['preemptions']} preemptions; {s['num_iterations']} iterations; "
             f"makespan {s['makespan_s']:.1f} s ({'simulated' if sim else 'run'} in "
             f"{s['wall_time_s']:.2f} s of wall time)",
             f"throughput {s['throughput_rps']:.2f} req/s, {s['throughput_tok_s']:.0f} output tok/s",
             "", f"{'metric (s)':<18}{'p50':>10}{'p90':>10}{'p99':>10}{'max':>10}"]
    for key in ("ttft", "tbt", "tpot", "e2e", "scheduling_delay"):
        st = s[key]
        cells = "".join(f"{st[k]:>10.4f}" if st[k] is not None else f"{'-':>10}"
                        for k in ("p50", "p90", "p99", "max"))
        lines.append(f"{key:<18}{cells}")
    st = s["stalls"]
    lines.append(f"\nstalls (gaps > {st['threshold_s'] * 1e3:.1f} ms): {st['count']}, "
                 f"worst {st['worst_s'] * 1e3:.1f} ms")
    if "kv" in s:
        kv = s["kv"]
        lines.append(f"KV: {kv['blocks_total']} blocks, utilisation mean "
                     f"{kv['utilization_mean']:.1%} max {kv['utilization_max']:.1%}, "
                     f"internal waste {kv['internal_waste_mean']:.1%}")
    if "slo" in s:
        slo = s["slo"]
        lines.append(f"SLO {slo.get('name', '')}: attainment {slo['attainment']:.1%}, goodput "
                     f"{slo['goodput_rps']:.2f} req/s, P99-TBT criterion "
                     f"{'met' if slo['meets_tbt_slo'] else 'missed'}")
    return "\n".join(lines)
