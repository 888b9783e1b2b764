"""Capacity: the highest arrival rate a configuration serves within its SLO, found by bisection.

Two criteria (sarathi_lab/DESIGN.md, Metrics):
  tbt         Sarathi-Serve: P99 TBT <= slo.p99_tbt and median scheduling delay
              <= slo.max_median_scheduling_delay, nothing rejected (summary["slo"]["meets_tbt_slo"])
  attainment  DistServe: >= slo.attainment_target of the requests meet every per-request SLO
              that is set: TTFT, TPOT, own P99 TBT (summary["slo"]["meets_attainment"]);
              defined only for an SLO with a TTFT or TPOT target

Every probe replays the same requests (the trace's lengths) with the same arrival pattern,
stretched to the probed rate: arrival_i = u_i / qps for one fixed unit-rate sequence u. Common
random numbers make the criteria (nearly) monotone in qps, which bisection relies on, and let
the searches for both criteria share probes. Probes run in memory; `save_probes` writes each as a
full run directory.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd

from sarathi_lab.run import rundir
from sarathi_lab.run.summary_text import format_criterion
from sarathi_lab.settings import ConfigError
from sarathi_lab.sweeps import steady

CRITERIA = {
    "tbt": ("meets_tbt_slo", "Sarathi-Serve"),
    "attainment": ("meets_attainment", "DistServe"),
}


def criterion_defined(slo: dict, crit: str) -> bool:
    if crit == "tbt":
        return slo.get("p99_tbt") is not None
    # DistServe's goodput is about TTFT and TPOT; an own-P99-TBT target alone ignores queueing
    # (a request that waits a minute for its first token still streams smoothly) and would
    # make any load "pass". An E2E target counts the queue too; so do an SLO class's targets.
    queued = ("ttft", "tpot", "e2e")
    return any(slo.get(k) is not None for k in queued) or \
        any((t or {}).get(k) is not None for t in (slo.get("classes") or {}).values()
            for k in queued)


def describe(slo: dict, crit: str) -> str:
    """What criterion `crit` checks, each part with its limit."""
    from sarathi_lab.metrics import slo_judged_by
    if crit == "tbt":
        return (f"P99 TBT <= {slo.get('p99_tbt')} s, median scheduling delay <= "
                f"{slo.get('max_median_scheduling_delay', 2.0)} s and no request rejected")
    return (f">= {slo.get('attainment_target', 0.9):.0%} of requests meet "
            + slo_judged_by(slo))


def unit_arrivals(n: int, kind: str, seed: int, trace_times: np.ndarray | None) -> np.ndarray:
    """n arrival times at mean rate 1 req/s, the first at 0."""
    if kind == "uniform":
        return np.arange(n, dtype=float)
    if kind == "trace":
        t = np.asarray(trace_times, float)
        t = t - t[0]
        return t * ((n - 1) / t[-1]) if n > 1 and t[-1] > 0 else np.arange(n, dtype=float)
    gaps = np.random.default_rng([int(seed), 0xCA9]).exponential(1.0, n - 1)
    return np.concatenate([[0.0], np.cumsum(gaps)])


def never_served(prompt: np.ndarray, output: np.ndarray, max_model_len: int,
                 overlong: str) -> np.ndarray:
    """Which requests are rejected for their length at any rate (the engine's rules): a prompt
    with no room for one token within max_model_len, and with overlong=reject also a prompt plus
    output beyond it (an output of 0 runs as 1 token)."""
    prompt = np.asarray(prompt, np.int64)
    never = prompt + 1 > max_model_len
    if overlong == "reject":
        never |= prompt + np.maximum(np.asarray(output, np.int64), 1) > max_model_len
    return never


def check_context(c: dict, trace) -> None:
    """Refuse a search over a trace holding requests longer than the context in force: they
    would be rejected at every rate, and as Sarathi-Serve's criterion allows no rejection (and
    DistServe's counts them as misses), the search would report a capacity of 0, or one that
    leaves requests unserved. The error says what to do instead."""
    from sarathi_lab.run.runner import build
    policy, _ = build(c)
    limit, mode = policy.max_model_len, c.get("overlong", "reject")
    never = never_served(trace["num_prompt_tokens"].to_numpy(),
                         trace["num_output_tokens"].to_numpy(), limit, mode)
    if not never.any():
        return
    longest = int((trace["num_prompt_tokens"] + trace["num_output_tokens"]).max())
    model = (c.get("model") or {}).get("name", "?")
    raise ConfigError(
        f"capacity: {int(never.sum())} of the {len(trace)} requests of trace "
        f"{trace.attrs.get('name', '?')} do not fit max_model_len={limit} (model {model}; the "
        f"longest holds {longest} tokens): they would be rejected at every rate, and a capacity "
        "search allows no rejection. Raise the context (model.max_model_len=N, or "
        "scheduler.max_model_len=N up to the model's), drop them from the trace "
        f"(trace.max_total_tokens={limit}; capacity.json records how many), or serve them cut "
        "short (overlong=cap)")


def missed(slo: dict, key: str) -> str:
    """The parts of criterion `key` a probe missed, each with its value and limit ("median
    scheduling delay 3.1 s > 2 s missed by 1.1 s"); "" when it met them all."""
    return "; ".join(format_criterion(c) for c in slo.get("criteria") or []
                     if c["criterion"] == key and c["met"] is False)


def _probe_row(qps: float, s: dict, wall: float) -> dict:
    slo = s.get("slo") or {}
    return {
        "qps": qps,
        "meets_tbt_slo": bool(slo.get("meets_tbt_slo", False)),
        "meets_attainment": bool(slo.get("meets_attainment", False)),
        "tbt_missed": missed(slo, "tbt"), "attainment_missed": missed(slo, "attainment"),
        "tbt_p99": s["tbt"]["p99"], "scheduling_delay_p50": s["scheduling_delay"]["p50"],
        "ttft_p50": s["ttft"]["p50"], "ttft_p99": s["ttft"]["p99"],
        "tpot_p50": s["tpot"]["p50"], "tpot_p99": s["tpot"]["p99"],
        "attainment": slo.get("attainment"), "goodput_rps": slo.get("goodput_rps"),
        "throughput_rps": s["throughput_rps"], "num_rejected": s["num_rejected"],
        "num_gpus": s.get("num_gpus", 1),
        "preemptions": s["preemptions"], "stalls": s["stalls"]["count"],
        "wall_s": wall,
    }


def probe_settings(cap: dict) -> dict:
    """The capacity node's settings, typed (run.settings.CapacityConfig: names, ranges, defaults)."""
    from sarathi_lab.run.settings import CapacityConfig
    from sarathi_lab.settings import parse, to_dict
    return to_dict(parse(CapacityConfig, cap, "capacity"))


def length_pool(tc: dict, s: dict):
    """The rows a steady-state probe draws its lengths from (`steady.draw_order`): a generated
    trace draws capacity.max_requests of them (i.i.d., so any n of them is a sample of its
    distribution); a trace file gives all its rows (after its length filters), not its first
    trace.num_requests; a mix, the rows its node builds."""
    from sarathi_lab.traces import build_trace
    tc = {**tc, "qps": 1.0}   # arrivals are replaced; 1 req/s keeps a trace's own pattern
    if "components" not in tc and "turns" not in tc:
        tc["num_requests"] = int(s["max_requests"]) if tc.get("path") is None else None
    return build_trace(tc)


class Prober:
    """Runs (and remembers) probes of one configuration at given rates. With capacity.rule=
    steady (the default) each probe is as long as the steady-state rule asks (`steady.probe`)
    and its statistics leave out the warm-up; one that is not *stable* fails every criterion.
    With rule=fixed each replays trace.num_requests requests, judged on all of them."""

    def __init__(self, c: dict, out_dir: Path):
        from sarathi_lab.traces import build_trace
        self.s = probe_settings(c["capacity"])
        self.c, self.out_dir, self.save = c, Path(out_dir), bool(self.s["save_probes"])
        self.steady = self.s["rule"] == "steady"
        if self.steady:
            trace = length_pool(c["trace"], self.s)
            self.floor = int(c["trace"].get("num_requests") or 1)
        else:
            trace = build_trace({**c["trace"], "qps": 1.0})
        self.trace = trace
        check_context(c, trace)
        self.kind = self.s["arrivals"]
        self.unit = None if self.steady else unit_arrivals(
            len(trace), self.kind, c.get("seed", 0), trace["arrival_time"].to_numpy())
        self.probes: list[dict] = []
        self.pool_policies: dict | None = None
        self._seen: dict[float, dict] = {}

    def _arrivals(self, n: int) -> np.ndarray:
        """The first n unit-rate arrivals of the steady rule's one sequence (a prefix of a
        longer probe's): the trace's own gaps, cycled, for arrivals=trace."""
        if self.kind != "trace":
            return unit_arrivals(n, self.kind, self.c.get("seed", 0), None)
        gaps = np.diff(np.sort(self.trace["arrival_time"].to_numpy(float)))
        if len(gaps) == 0 or gaps.sum() <= 0:
            return np.arange(n, dtype=float)
        gaps = np.resize(gaps / gaps.mean(), max(n - 1, 0))
        return np.concatenate([[0.0], np.cumsum(gaps)])

    def _run(self, qps: float, df, n: int, keep: dict | None = None) -> dict:
        from sarathi_lab.run.runner import run
        from sarathi_lab.traces import to_requests
        c = {**self.c, "trace": {**self.c["trace"], "qps": qps, "num_requests": n}}
        return run({**c, "progress": False}, self.out_dir / "probes" / f"qps={qps:.4g}",
                   requests=to_requests(df), write=self.save, keep=keep)

    def __call__(self, qps: float, criterion: str) -> dict:
        key = round(qps, 9)
        if key in self._seen:
            return self._seen[key]
        t0 = time.perf_counter()
        if self.steady:
            s, extra = self._steady(qps)
        else:
            df = self.trace.copy()
            df["arrival_time"] = self.unit / qps
            s, extra = self._run(qps, df, len(df)), {"rule": "fixed", "stability": None}
        row = {"probe": len(self.probes) + 1, "criterion": criterion,
               **_probe_row(qps, s, time.perf_counter() - t0), **extra}
        if row["stability"] not in (None, steady.STABLE):
            # a growing or unresolved backlog fails, whatever its percentiles say
            why = f"{row['stability']}: {row['stability_why']}"
            for k, (flag, _) in CRITERIA.items():
                row[flag] = False
                row[f"{k}_missed"] = "; ".join(x for x in (why, row[f"{k}_missed"]) if x)
        self.probes.append(row)
        if "pools" in s:   # disaggregated: each pool may run another policy
            self.pool_policies = {name: p["policy"] for name, p in s["pools"].items()}
        self._seen[key] = row
        return row

    def _steady(self, qps: float) -> tuple[dict, dict]:
        """A steady-state probe at `qps`: (the summary of its measured interval, the verdict's
        columns)."""
        seed = int(self.c.get("seed", 0))

        def run_n(n: int):
            df = self.trace.iloc[steady.draw_order(len(self.trace), n, seed)].reset_index(
                drop=True)
            df["arrival_time"] = self._arrivals(n) / qps
            keep: dict = {}
            self._run(qps, df, n, keep)
            rq = keep["requests"]
            return keep, (rq["arrival_time"].to_numpy(float),
                          rq["first_scheduled_time"].to_numpy(float),
                          rq["finish_time"].to_numpy(float))

        keep, v = steady.probe(run_n, qps, self.floor, self.s)
        rq, it = keep["requests"], keep["iterations"]
        t0 = float(rq["arrival_time"].min()) + v["warmup_s"]
        measured = keep["summarize"](rq[rq["arrival_time"] >= t0].reset_index(drop=True),
                                     it[it["start"] >= t0].reset_index(drop=True))
        return measured, {"rule": "steady", "stability": v["verdict"], "stability_why": v["why"],
                          "probe_requests": v["requests"],
                          "measured_requests": v["measured_requests"],
                          "min_requests": int(self.s["min_requests"]),
                          "extensions": v["extensions"],
                          "span_s": v["span_s"], "warmup_s": v["warmup_s"],
                          "time_constant_s": v["time_constant_s"],
                          "backlog_growth": v["backlog_growth"],
                          "delay_growth": v["delay_growth"], "served_ratio": v["served_ratio"]}


def bisect(passes, lo: float, hi: float, precision: float, max_probes: int,
           max_widen: int = 5) -> dict:
    """Highest rate where `passes(rate)` holds, assuming it holds below some rate and not above.
    Widens [lo, hi] by halving / doubling (at most `max_widen` times each way) until it
    brackets, then bisects until hi - lo <= precision * lo."""
    n = 0

    def check(q):
        nonlocal n
        n += 1
        return passes(q)
    widen = 0
    while not check(lo):              # even the low end fails: look lower
        hi, lo, widen = lo, lo / 2, widen + 1
        if n >= max_probes or widen > max_widen:
            return {"capacity_qps": 0.0, "fails_at_qps": hi, "bracketed": False, "probes": n,
                    "note": f"fails even at {hi:.4g} req/s; lower capacity.qps_low"}
    widen = 0
    while check(hi):                  # even the high end passes: look higher
        lo, hi, widen = hi, hi * 2, widen + 1
        if n >= max_probes or widen > max_widen:
            # with few requests a queue never builds up: more of them may be needed too
            return {"capacity_qps": lo, "fails_at_qps": None, "bracketed": False, "probes": n,
                    "note": f"passes at {lo:.4g} req/s; raise capacity.qps_high "
                            "(or trace.num_requests)"}
    note = ""
    while hi - lo > precision * lo:
        if n >= max_probes:
            note = f"stopped after {n} probes (capacity.max_probes)"
            break
        mid = (lo + hi) / 2
        if check(mid):
            lo = mid
        else:
            hi = mid
    return {"capacity_qps": lo, "fails_at_qps": hi, "bracketed": True, "probes": n,
            "note": note}


def search(c: dict, out_dir) -> dict:
    """Capacity of the configuration `c` under each applicable criterion; writes capacity.json
    (last, atomically: the marker of a finished search) and capacity_probes.csv in `out_dir`."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cap, slo = c["capacity"], dict(c.get("slo") or {})
    prober = Prober(c, out_dir)
    results, skipped = {}, {}
    for crit in cap["criteria"]:
        if not criterion_defined(slo, crit):
            what = "p99_tbt" if crit == "tbt" else "ttft or tpot"
            skipped[crit] = f"SLO {slo.get('name', '?')} sets no {what}"
            continue
        flag = CRITERIA[crit][0]
        r = bisect(lambda q, crit=crit: prober(q, crit)[flag], cap["qps_low"], cap["qps_high"],
                   cap["precision"], cap["max_probes"])
        # every GPU of the configuration (all replicas, both pools when disaggregated)
        gpus = prober.probes[-1]["num_gpus"] if prober.probes else None
        per_gpu = {} if gpus is None else {
            "num_gpus": gpus, "capacity_qps_per_gpu": r["capacity_qps"] / gpus}
        results[crit] = {**r, **per_gpu, "source": CRITERIA[crit][1],
                         "definition": describe(slo, crit), **how_found(prober, r),
                         **_cost_at_capacity(c, prober.trace, r["capacity_qps"], gpus)}
    if not results:
        raise ValueError(f"slo={slo.get('name')!r}: defines none of capacity.criteria="
                         f"{list(cap['criteria'])} ({'; '.join(skipped.values())})")
    out = {
        "mode": "capacity",
        "name": c.get("name"),
        "policy": c["scheduler"]["name"],
        "pool_policies": prober.pool_policies,
        "model": c["model"].get("name"),
        "hardware": (c.get("hardware") or {}).get("name"),
        "trace": c["trace"].get("name"),
        "num_requests": len(prober.trace),
        # requests the trace's length filters left out (trace.max_total_tokens, ...)
        "trace_dropped": int(prober.trace.attrs.get("dropped", 0)),
        "arrivals": cap.get("arrivals", "poisson"),
        "rule": prober.s["rule"],
        "slo": slo,
        "criteria": results,
        "skipped_criteria": skipped,
        "probes": prober.probes,
        "config": c,
    }
    probes = pd.DataFrame(prober.probes)
    rundir.atomic_write(out_dir / rundir.CAPACITY_PROBES, lambda p: probes.to_csv(p, index=False))
    rundir.write_json(out_dir / rundir.CAPACITY, out)
    return out


def how_found(prober: Prober, r: dict) -> dict:
    """What a criterion's answer rests on: the rule its probes ran under, how it was found, and
    the probe at the capacity (its P99 TTFT, whatever the SLO judges; its length and verdict)."""
    at = probe_at(prober.probes, r["capacity_qps"]) or {}
    if prober.steady:
        s = prober.s
        method = (f"bisection over the rate; each probe at least {s['min_duration_s']:g} s and "
                  f"{s['time_constants']:g} mean latencies of arrivals (trace lengths drawn over "
                  f"the whole trace), the first {s['warmup']:.0%} left out and at least "
                  f"{s['min_requests']} requests after it, stable when neither "
                  f"backlog nor scheduling delay grows over {s['max_growth']:g} s/s across "
                  f"{s['windows']} windows; unstable or undetermined probes fail")
    else:
        method = (f"bisection over the rate; each probe the trace's first "
                  f"{len(prober.trace)} requests, no stability test (capacity.rule=fixed)")
    return {"rule": prober.s["rule"], "method": method,
            "ttft_p99": at.get("ttft_p99"), "ttft_p50": at.get("ttft_p50"),
            "probe_requests": at.get("probe_requests", len(prober.trace)),
            "probe_measured_requests": at.get("measured_requests"),
            "probe_span_s": at.get("span_s"), "stability": at.get("stability")}


def probe_at(probes: list[dict], qps: float | None) -> dict | None:
    """The probe run at `qps` (None: none)."""
    if qps is None:
        return None
    return next((p for p in probes if round(p["qps"], 9) == round(qps, 9)), None)


def ttft_label(slo: dict) -> str:
    """The SLO's name as printed: "(no TTFT target)" after one that sets none (the paper-derived
    `<model>-strict` and `-relaxed` SLOs judge TBT and the median scheduling delay only)."""
    has = slo.get("ttft") is not None or any(
        (t or {}).get("ttft") is not None for t in (slo.get("classes") or {}).values())
    return f"{slo.get('name', '?')}" + ("" if has else " (no TTFT target)")


def _cost_at_capacity(c: dict, trace, qps: float, gpus: int | None = None) -> dict:
    """Dollars per 1M output tokens and per request when serving at `qps` (the hardware
    preset's price_per_gpu_hour, on `gpus` GPUs: the run's, as its probes counted them; by
    default a replica's: tensor x pipeline stages); {} without a price."""
    from sarathi_lab.metrics import cost_at_rate
    price = (c.get("hardware") or {}).get("price_per_gpu_hour")
    if price is None or not qps:
        return {}
    if gpus is None:
        ex = c.get("executor") or {}
        gpus = ex.get("tensor_parallel", 1) * (ex.get("expert_parallel") or 1) \
            * ex.get("pipeline_parallel", 1)
    mean_out = float(np.maximum(trace["num_output_tokens"].to_numpy(), 1).mean())
    return cost_at_rate(qps, mean_out, price, gpus)


def _qps(r: dict) -> str:
    if r["bracketed"]:
        return f"{r['capacity_qps']:.4g} req/s"
    if r['capacity_qps']:
        return f">= {r['capacity_qps']:.4g} req/s"
    return f"< {r['fails_at_qps']:.4g} req/s"


def short_answer(result: dict) -> str:
    return " | ".join(f"capacity ({CRITERIA[k][1]}) {_qps(r)}"
                      for k, r in result["criteria"].items())


def format_result(result: dict) -> str:
    slo = result["slo"]
    dropped = result.get("trace_dropped")
    pools = result.get("pool_policies") or {}
    policy = ", ".join(f"{k} pool {v}" for k, v in pools.items()) \
        if len(set(pools.values())) > 1 else result["policy"]
    lines = [f"capacity of {policy} | {result['model']} on {result['hardware']} | "
             f"trace {result['trace']} ("
             + ("lengths drawn from its " if result.get("rule") == "steady" else "")
             + f"{result['num_requests']} requests"
             + (f", {dropped} longer ones dropped" if dropped else "")
             + f", {result['arrivals']} arrivals) | SLO {ttft_label(slo)}"]
    for k, r in result["criteria"].items():
        hi = "-" if r["fails_at_qps"] is None else f"{r['fails_at_qps']:.4g}"
        ttft = "P99 TTFT " + ("-" if r.get("ttft_p99") is None else f"{r['ttft_p99']:.3g} s")
        lines.append(f"  {r['source']:<14} {_qps(r):>12}   (fails at {hi}; {r['probes']} probes;"
                     f" {ttft})  {r['definition']}" + (f"  [{r['note']}]" if r["note"] else "")
                     + (f"  ${r['usd_per_1m_output_tokens']:.3g} per 1M output tokens"
                        if r.get("usd_per_1m_output_tokens") else ""))
        if r.get("rule") == "steady":
            lines.append(f"  {'':<14} steady-state probes: {r.get('probe_requests')} requests "
                         f"({r.get('probe_span_s') or 0:.4g} s of arrivals) at the capacity")
        elif r.get("rule") == "fixed":
            lines.append(f"  {'':<14} capacity.rule=fixed: {r.get('probe_requests')} requests "
                         "per probe, no stability test (may overstate the steady state)")
        failed = _failing_probe(result["probes"], k, r["fails_at_qps"])
        if failed:
            lines.append(f"  {'':<14} at {r['fails_at_qps']:.4g} req/s it missed: {failed}")
    for k, why in result["skipped_criteria"].items():
        lines.append(f"  {CRITERIA[k][1]:<14} {'n/a':>12}   {why}")
    lines.append(f"  {len(result['probes'])} simulations in "
                 f"{sum(p['wall_s'] for p in result['probes']):.1f} s")
    return "\n".join(lines)


def _failing_probe(probes: list[dict], crit: str, qps: float | None) -> str:
    """What the probe at `qps` (the lowest failing rate) missed of criterion `crit`."""
    if qps is None:
        return ""
    return (probe_at(probes, qps) or {}).get(f"{crit}_missed", "")


def capacity_rows(result: dict) -> list[dict]:
    """Flat rows (one per criterion) for tables, reports and loggers."""
    return [{"policy": result["policy"], "slo": result["slo"].get("name"), "criterion": k,
             "source": r["source"], "capacity_qps": r["capacity_qps"],
             "fails_at_qps": r["fails_at_qps"], "bracketed": r["bracketed"],
             "probes": r["probes"], "model": result["model"], "hardware": result["hardware"],
             "trace": result["trace"], "num_requests": result["num_requests"],
             "usd_per_1m_output_tokens": r.get("usd_per_1m_output_tokens"),
             "ttft_p99": r.get("ttft_p99"), "rule": r.get("rule")}
            for k, r in result["criteria"].items()]
