"""The plan: every candidate of the space checked before it runs (settings, memory, context),
the rest evaluated in parallel (joblib here, or Ray) and resumable, one row per candidate."""
from __future__ import annotations

import collections
import math
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from sarathi_lab.plan import space as sp
from sarathi_lab.plan.evaluate import check, evaluate
from sarathi_lab.plan.prices import load_prices, price_of
from sarathi_lab.settings import ConfigError
from sarathi_lab.sweeps import capacity

BACKENDS = ("joblib", "ray", "serial")
METHODS = ("bisect", "exhaustive")


def check_plan(p: dict, user: list[str] = ()) -> None:
    """The plan's own settings; `user`: the dotted keys set on the command line, for the
    settings that the chosen backend does not read."""
    for key, allowed in (("method", METHODS), ("backend", BACKENDS)):
        if p.get(key) not in allowed:
            raise ConfigError(f"plan.{key}={p.get(key)!r}: must be one of {', '.join(allowed)}")
    for key, backend in (("plan.n_jobs", "joblib"), ("plan.ray_address", "ray")):
        if key in user and p["backend"] != backend:
            raise ConfigError(f"{key}: read only with plan.backend={backend} (it is "
                              f"{p['backend']})")
    top = p.get("top")
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise ConfigError(f"plan.top={top!r}: must be an integer >= 1 (rows printed)")
    load = p.get("load_qps")
    if load is not None and (isinstance(load, bool) or not isinstance(load, (int, float))
                             or not math.isfinite(load) or load <= 0):
        raise ConfigError(f"plan.load_qps={load!r}: must be a finite rate > 0 (req/s), or null "
                          "for the trace's own")
    for key, least in (("ttft", None), ("check", 0)):
        v = p.get(key)
        if key == "ttft" and v is None:
            continue
        ok = isinstance(v, int) and v >= 0 if key == "check" else \
            isinstance(v, (int, float)) and math.isfinite(v) and v > 0
        if isinstance(v, bool) or not ok:
            what = ("an integer >= 0 (0: no check)" if key == "check"
                    else "a finite time > 0 (s), or null")
            raise ConfigError(f"plan.{key}={v!r}: must be {what}")


def check_representable(c: dict, load: float) -> None:
    """Refuse a load no steady-state probe can cover: capacity.min_duration_s of arrivals at
    `load` would take more than capacity.max_requests requests (plan.load_qps=1e9 asks 1.2e11),
    so every probe would be too short to tell, and none could pass."""
    s = capacity.probe_settings(c["capacity"])
    if s["rule"] != "steady":
        return
    need = load * s["min_duration_s"]
    if need > s["max_requests"]:
        raise ConfigError(
            f"plan.load_qps={load:g}: a steady-state probe covers capacity.min_duration_s="
            f"{s['min_duration_s']:g} s of arrivals, {need:.3g} requests at this load, over "
            f"capacity.max_requests={s['max_requests']}: no probe of this load could tell a "
            "stable backlog from a growing one. Raise capacity.max_requests (the simulation "
            "grows with it) or plan a smaller load")


def with_ttft(p: dict, slo: dict, base: list[str]) -> list[str]:
    """`base` with plan.ttft as the SLO's per-request TTFT target when the SLO sets none (a
    TTFT-blind SLO, such as the paper-derived `<model>-strict`, would let the cheapest answer
    keep requests waiting for seconds): slo.ttft and a name saying so, in every candidate's
    config and command. sarathi_lab/docs/planning.md derives the default."""
    ttft = p.get("ttft")
    has = slo.get("ttft") is not None or any(
        (t or {}).get("ttft") is not None for t in (slo.get("classes") or {}).values())
    if ttft is None or has:
        return list(base)
    return list(base) + [f"slo.ttft={float(ttft)!r}",
                         f"slo.name={slo.get('name', 'slo')}+ttft{float(ttft):g}s"]


def plan_load(p: dict, c: dict, trace) -> float:
    """The load to serve: plan.load_qps, else the trace's rate (trace.qps, or a file's own)."""
    from sarathi_lab.metrics import offered_load
    if p.get("load_qps") is not None:
        return float(p["load_qps"])
    if c["trace"].get("qps"):
        return float(c["trace"]["qps"])
    rate = offered_load(trace)["requests_per_s"]
    if not rate:
        raise ConfigError("plan.load_qps: the trace has no arrival rate of its own; set one")
    return float(rate)


def _reads_budget(composer: sp.Composer, hardware: str) -> Callable[[str], bool]:
    import dataclasses

    from sarathi_lab import registry

    def reads(policy: str) -> bool:
        c = composer.composed([f"hardware={hardware}", f"scheduler={policy}"])
        try:
            cls = registry.policy_class(c["scheduler"]["name"])
        except ValueError as e:
            raise ConfigError(f"plan.space.policy: {policy}: {e}") from None
        return "token_budget" in {f.name for f in dataclasses.fields(cls.config_class)}
    return reads


def requests_per_unit(tc: dict, unit_trace, most: int) -> int:
    """The requests one unit's probes replay: trace.num_requests, or with null the whole trace
    (`unit_trace`, built from `tc`, the trace node). A deployment of k units replays k times as
    many (`evaluate`), so the trace must hold them for the most units the plan may probe
    (`most`): a shorter one is refused, naming both ways out, rather than probed with fewer."""
    from sarathi_lab.traces import build_trace
    n = tc.get("num_requests") or len(unit_trace)
    need = n * most
    got = len(unit_trace) if need == len(unit_trace) else \
        len(build_trace({**tc, "num_requests": need}))
    if got >= need:
        return int(n)
    per = "null: the whole trace" if tc.get("num_requests") is None else str(n)
    name = unit_trace.attrs.get("name", "?")
    filtered = " after its length filters" if unit_trace.attrs.get("dropped") else ""
    fix = f"lower trace.num_requests to {got // most} or less" if got >= most else \
        f"the trace cannot give {most} units one request each"
    if n <= got and most > 1:
        fix += f", or plan.space.max_replicas to {got // n} or less"
    raise ConfigError(
        f"trace {name}: holds {got} requests{filtered}, but plan.space.max_replicas={most} "
        f"units at trace.num_requests={per} ({n} per unit) need {need}: a deployment of k "
        f"units replays k x one unit's requests, so that each of its replicas sees as many as "
        f"one alone; {fix}")


def _prune(c: dict, overrides: list[str], trace) -> str:
    """Why the candidate cannot run at all ("" when it can): a setting its components refuse,
    weights and one request's KV that do not fit the GPU (the simulator's own KV sizing,
    `runner.build`), or requests longer than its context."""
    from sarathi_lab.run.config import follow_the_user, resolve
    try:
        follow_the_user(c, overrides)
        resolve(c, overrides)
        capacity.check_context(c, trace)   # builds the policy and executor: sizes the KV cache
    except ValueError as e:   # ConfigError, and the roofline's "does not fit"
        return str(e)
    return ""


def prepare(p: dict, base: list[str], out_dir: Path, log=print, user: list[str] = ()
            ) -> tuple[list[dict], list[dict]]:
    """(jobs to evaluate, rows of the candidates pruned before running). `user`: the plan's
    keys set on the command line (plan.n_jobs, ...)."""
    from sarathi_lab.run.config import follow_the_user
    from sarathi_lab.traces import build_trace
    check_plan(p, user)
    prices_where = p.get("prices") or "the shipped price table"
    prices = load_prices(p.get("prices"), p.get("price_overrides") or {})
    space = p.get("space") or {}
    composer = sp.Composer(base)
    hw0 = sp._list(space, "hardware")[0]
    c0 = dict(composer.composed([f"hardware={hw0}",
                                 f"scheduler={sp._list(space, 'policy')[0]}"]))
    # the trace every candidate runs (`_prune` does the same to each): a file named with
    # trace.path keeps its own times and all its requests unless the user set them
    follow_the_user(c0, base)
    reads_budget = _reads_budget(composer, hw0)
    cands = sp.candidates(space, reads_budget, set(c0["executor"]))
    if "plan.space.token_budget" in user and not any(map(reads_budget, space["policy"])):
        raise ConfigError(f"plan.space.token_budget: none of the policies {space['policy']} "
                          "reads scheduler.token_budget")
    for hw in dict.fromkeys(c.hardware for c in cands):
        price_of(prices, hw, prices_where)
    slo = c0.get("slo") or {}
    base = with_ttft(p, slo, base)
    if base != list(composer.base):
        composer = sp.Composer(base)
        c0 = dict(composer.composed([f"hardware={hw0}",
                                     f"scheduler={sp._list(space, 'policy')[0]}"]))
        follow_the_user(c0, base)
        slo = c0.get("slo") or {}
    criteria = [k for k in c0["capacity"]["criteria"] if capacity.criterion_defined(slo, k)]
    if not criteria:
        raise ConfigError(f"slo={slo.get('name')!r}: defines none of capacity.criteria="
                          f"{list(c0['capacity']['criteria'])}, so no capacity can be judged")
    trace = build_trace(c0["trace"])
    load = plan_load(p, c0, trace)
    check_representable(c0, load)
    # the cost per token at the load: the output lengths the probes draw (steady rule: the
    # whole trace's, `capacity.length_pool`), not only the first trace.num_requests rows
    ps = capacity.probe_settings(c0["capacity"])
    lengths = capacity.length_pool(c0["trace"], ps) if ps["rule"] == "steady" else trace
    mean_out = float(np.maximum(lengths["num_output_tokens"].to_numpy(), 1).mean())
    per_unit = requests_per_unit(c0["trace"], trace, space["max_replicas"])
    settings_keys = {k for c in cands for k, _ in c.settings(1, 1.0)} | {
        "cluster.prefill.num_replicas", "cluster.decode.num_replicas", "cluster.num_replicas"}
    for o in base:
        key = o.split("=", 1)[0].lstrip("+~")
        if key == "hardware.price_per_gpu_hour":
            raise ConfigError(f"{o}: the plan prices hardware from its price table "
                              "(+plan.price_overrides.HARDWARE=USD, or plan.prices=PATH)")
        if key in settings_keys:
            raise ConfigError(f"{o}: set by the plan's space (plan.space), not on the command "
                              "line")
    jobs, pruned = [], []
    for cand in cands:
        price = price_of(prices, cand.hardware, prices_where)
        c, overrides = composer.config(cand, 1, price)
        row = {"candidate": cand.label(), "hardware": cand.hardware, **dict(cand.layout),
               "split": "colocated" if cand.split is None else f"{cand.split[0]}:{cand.split[1]}",
               "policy": cand.policy, "token_budget": cand.token_budget,
               "price_per_gpu_hour": price}
        why = _prune(c, overrides, trace)
        if why:
            pruned.append({**row, "status": "pruned", "reason": why, "load_qps": load})
            continue
        # the settings a deployment of k units has k times of: its replicas and its requests
        scaled = [(k, v) for k, v in cand.settings(1, price) if k.endswith("num_replicas")] \
            + [("trace.num_requests", per_unit)]
        fp = sp.fingerprint(c, load, p["method"], per_unit)
        d = out_dir / "evals" / f"{sp.slug(cand)}-{fp}"
        jobs.append({"row": row, "dir": str(d.resolve()), "c": c, "overrides": overrides,
                     "per_unit": scaled, "replicas_per_unit": cand.replicas(1),
                     "load": load, "method": p["method"],
                     "max_units": space["max_replicas"], "criteria": criteria,
                     "price": price, "mean_output_tokens": mean_out})
    if not jobs:
        reasons = collections.Counter(r["reason"] for r in pruned)
        raise ConfigError(
            f"plan.space: none of its {len(cands)} configurations can run: "
            + " | ".join(f"{n} x {why}" for why, n in reasons.most_common(4)))
    log(f"plan: {len(cands)} configurations, {len(pruned)} pruned before running "
        f"(memory, context or settings), {len(jobs)} to evaluate at {load:.4g} req/s "
        f"({', '.join(criteria)}; {p['method']}, {p['backend']}; {per_unit} requests per "
        f"unit, k units replaying k x as many); SLO {capacity.ttft_label(slo)}")
    return jobs, pruned


def dispatch(jobs: list[dict], p: dict) -> Iterator[dict]:
    """Each job's row, as they finish."""
    backend = p["backend"]
    if backend == "serial" or len(jobs) == 1:
        for j in jobs:
            yield evaluate(j)
    elif backend == "joblib":
        from joblib import Parallel, delayed
        yield from Parallel(n_jobs=p.get("n_jobs", -1), return_as="generator_unordered")(
            delayed(evaluate)(j) for j in jobs)
    else:
        yield from _on_ray(jobs, p.get("ray_address"))


def _on_ray(jobs: list[dict], address) -> Iterator[dict]:
    """On the Ray cluster at `address` (null: a local one), joined as hydra/launcher=ray joins
    it (`sweeps._start_ray`: its checks and messages); one task per candidate, one CPU each."""
    try:
        import ray
    except ImportError:
        raise ConfigError("plan.backend=ray: ray is not installed (pip install -e \".[ray]\")") \
            from None
    from omegaconf import OmegaConf

    from sarathi_lab.sweeps.bookkeeping import _start_ray
    _start_ray(OmegaConf.create({"address": address}))
    task = ray.remote(num_cpus=1, max_retries=0)(evaluate)
    pending = [task.remote(j) for j in jobs]
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        yield ray.get(done[0])


def run_plan(p: dict, base: list[str], out_dir: Path, log=print, user: list[str] = ()
             ) -> list[dict]:
    """Every candidate's row (pruned, infeasible or feasible), in no particular order."""
    out_dir = Path(out_dir)
    jobs, rows = prepare(p, base, out_dir, log, user)
    for i, row in enumerate(dispatch(jobs, p), 1):
        rows.append(row)
        log(f"  [{i}/{len(jobs)}] {_line(row)}")
    check_cheapest(rows, jobs, p.get("check", 0), log)
    return rows


def check_cheapest(rows: list[dict], jobs: list[dict], factor: int, log=print) -> dict | None:
    """The long independent run of the cheapest feasible row (`evaluate.check`: `factor` x its
    probe's requests), its `check_*` columns set on that row; None when `factor` is 0 or no row
    is feasible. Cheapest as `table.ranked` orders them: $ per 1M output tokens, then fewer
    GPUs, more capacity, the label."""
    feasible = [r for r in rows if r["status"] == "feasible"]
    if not factor or not feasible:
        return None
    best = min(feasible, key=lambda r: (r["usd_per_1m_output_tokens"], r["gpus"],
                                        -r["capacity_qps"], r["candidate"]))
    job = next(j for j in jobs if str(Path(j["dir"])) == str(Path(best["dir"])))
    best.update(check(job, best, int(factor)))
    log(f"check of the cheapest ({best['candidate']}): {best['check_requests']} requests at "
        f"{best['load_qps']:.4g} req/s ({factor} x its probe's): "
        + ("held" if best["check_held"] else "DID NOT HOLD")
        + f" (P99 TTFT {best['check_ttft_p99']:.3g} s, P99 TBT {best['check_tbt_p99']:.3g} s, "
        f"{best['check_stability']}"
        + (f"; missed: {best['check_missed']}" if best["check_missed"] else "") + ")\n"
        f"  {best['check_command']}")
    return best


def _line(r: dict) -> str:
    what = "(done before) " if r.get("resumed") else ""
    if r["status"] != "feasible":
        return f"{r['candidate']}: {what}{r['status']}: {r['reason']}"
    return (f"{r['candidate']}: {what}{r['replicas']} replicas, {r['gpus']} GPUs, "
            f"${r['usd_per_1m_output_tokens']:.3g}/1M output tokens, capacity "
            f"{r['capacity_qps']:.4g} req/s, P99 TTFT {r['ttft_p99']:.3g} s at the load "
            f"({r['simulations']} simulations, {r['wall_s']:.1f} s)")
