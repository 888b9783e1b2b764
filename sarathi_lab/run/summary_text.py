"""The run summary as a person reads it at the end of `sarathi-lab`, and the check that a run
served anything at all."""
from __future__ import annotations

import re

TOP_REJECTIONS = 3   # reason kinds shown; summary.json has them all
MAX_GROUP_ROWS = 20  # SLO classes / tenants shown, the most requests first; summary.json has all


class NothingServed(ValueError):
    """Every request of the run was rejected: its latency and throughput figures mean nothing."""


def check_served(s: dict) -> None:
    """Raise NothingServed when every request of the run summary `s` was rejected."""
    n = s["num_requests"]
    if n and s["num_rejected"] == n:
        raise NothingServed(f"all {n} requests were rejected, none was served: "
                            f"{_top_rejections(s)} (per request: requests.parquet, "
                            "column rejection_reason)")


def _reason_text(kind: str, s: dict) -> str:
    """A rejection kind (its numbers replaced by N, `metrics.rejection_kind`) as printed: the
    context limit filled in from the run's settings, the requests' own lengths left out
    ("prompt + output exceeds max_model_len=4096", not "prompt of N + output of N tokens
    exceeds max_model_len=N")."""
    settings = s.get("settings") or {}
    known = {**(settings.get("model") or {}), **(settings.get("scheduler") or {})}

    def setting(m: re.Match) -> str:   # "block_size=N" -> "block_size=16"
        value = known.get(m[1])
        return m[0] if value is None else f"{m[1]}={value}"
    kind = re.sub(r"\b(\w+)=N\b", setting, kind)
    return re.sub(r" of N(?: tokens)?\b", "", kind)


def _top_rejections(s: dict) -> str:
    kinds = [(_reason_text(k, s), n) for k, n in (s.get("rejections") or {}).items()]
    text = "; ".join(f"{count} x {kind}" for kind, count in kinds[:TOP_REJECTIONS])
    if len(kinds) > TOP_REJECTIONS:
        text += f"; {len(kinds) - TOP_REJECTIONS} more kinds in summary.json"
    if re.search(r"\bN\b", text):
        text += " (N: numbers that differ by request; requests.parquet, column rejection_reason)"
    return text


def _missed_as_well(s: dict) -> str:
    """What the SLO attainment counts as missed besides the requests served too slowly: ""
    when every request was served whole."""
    parts = [f"{s['num_rejected']} rejected"] if s.get("num_rejected") else []
    if s.get("num_length_capped"):
        parts.append(f"{s['num_length_capped']} cut short")
    return f" (of all {s['num_requests']} requests: the {' and '.join(parts)} count as missed)" \
        if parts else ""


def _duration(v: float, digits: int = 3) -> str:
    if abs(v) >= 10 ** digits:   # no exponent: 8240 s, not 8.24e+03 s
        return f"{v:.0f} s"
    return f"{v * 1e3:.{digits}g} ms" if abs(v) < 1 else f"{v:.{digits}g} s"


def _share(v: float, digits: int = 3) -> str:
    return f"{v * 100:.{digits}g}%"


def _pair(fmt, value, limit) -> tuple[str, str]:
    """value and limit written with as many digits as it takes to tell them apart."""
    for digits in (3, 4, 5, 6):
        a, b = fmt(value, digits), fmt(limit, digits)
        if a != b or value == limit:
            break
    return a, b


_CRITERIA = {   # name: (label, how a value is written)
    "p99_tbt": ("P99 TBT", _duration),
    "median_scheduling_delay": ("median scheduling delay", _duration),
    "attainment": ("SLO attainment", _share),
}


def format_criterion(c: dict) -> str:
    """"P99 TBT 64 ms <= 100 ms met", "median scheduling delay 3.1 s > 2 s missed by 1.1 s"."""
    name, value, limit, met = c["name"], c["value"], c["limit"], c["met"]
    if name == "num_rejected":
        return f"rejected {value} requests ({'met' if met else 'missed'}: none may be)"
    label, fmt = _CRITERIA.get(name, (name, lambda v, d: f"{v:.{d}g}"))
    if value is None:
        return f"{label} undefined (no data) missed"
    at_least = name == "attainment"
    v, lim = _pair(fmt, value, limit)
    op = (">=" if met else "<") if at_least else ("<=" if met else ">")
    by = "" if met else f" by {fmt(abs(value - limit), 3)}"
    return f"{label} {v} {op} {lim} {'met' if met else 'missed'}{by}"


# each capacity criterion: its source, the parts it checks (summary["slo"]["criteria"])
_CRITERION_NAMES = {
    "tbt": ("Sarathi-Serve", "P99 TBT, median scheduling delay, no rejection"),
    "attainment": ("DistServe", "share of requests meeting the SLO"),
}


def _missed_parts(crit: list[dict], key: str) -> list[str]:
    """The labels of the parts of criterion `key` that missed ("median scheduling delay")."""
    return ["rejections" if c["name"] == "num_rejected"
            else _CRITERIA.get(c["name"], (c["name"],))[0]
            for c in crit if c["criterion"] == key and c["met"] is False]   # None: not observed


def _slo_lines(slo: dict, missed: str = "") -> list[str]:
    """The SLO's lines; `missed`: what the attainment counts as missed besides slow requests
    (`_missed_as_well`)."""
    per_gpu = slo.get("goodput_rps_per_gpu")
    per_gpu = "" if per_gpu is None or per_gpu == slo["goodput_rps"] else \
        f" ({per_gpu:.2f} per GPU)"
    judged = slo.get("judged_by")
    lines = [f"SLO {slo.get('name', '')}: attainment {slo['attainment']:.1%}{missed}, "
             f"goodput {slo['goodput_rps']:.2f} req/s{per_gpu}"
             + (f", judged by {judged}" if judged else "")]
    if slo.get("classes_without_targets"):
        lines.append("  classes without targets of their own (the top-level ones apply): "
                     + ", ".join(slo["classes_without_targets"]))
    crit = slo.get("criteria") or []
    for key, (who, checks) in _CRITERION_NAMES.items():
        parts = [format_criterion(c) for c in crit if c["criterion"] == key]
        if parts:
            missed = _missed_parts(crit, key)
            verdict = f"missed on {', '.join(missed)}" if missed else "met"
            lines.append(f"  {who} criterion ({checks}): {verdict}")
            lines += [f"    {p}" for p in parts]
        elif key == "tbt":
            lines.append(f"  {who} criterion ({checks}): not defined (slo.p99_tbt is not set)")
    return lines


def _offered_line(s: dict) -> str:
    off = s["offered_load"]
    if off["requests_per_s"] is None:
        return (f"offered load: {off['num_requests']} request(s) arriving at once "
                "(no arrival rate)")
    head = (f"offered load {off['requests_per_s']:.2f} req/s over "
            f"{off['arrival_span_s']:.1f} s of arrivals: {off['prompt_tokens_per_s']:.0f} prompt")
    if off["output_tokens_per_s"] is None:   # served: the model ends each request
        return f"{head} tok/s (output lengths not known in advance)"
    return f"{head} + {off['output_tokens_per_s']:.0f} output tok/s"


def _prefix_line(s: dict) -> str:
    pc = s["prefix_cache"]
    if pc["hit_rate"] is None:
        return "prefix cache: on, nothing looked up (the requests carry no token ids)"
    return (f"prefix cache: {pc['hit_rate']:.1%} of prompt tokens served from cache "
            f"({pc['hit_tokens']} of {pc['query_tokens']})")


def _ms(v) -> str:
    return "-" if v is None else f"{v * 1e3:.0f}"


def _group_lines(title: str, groups: dict, with_service: bool) -> list[str]:
    """One row per SLO class or tenant (shown when a run has more than one)."""
    slo = any("attainment" in g for g in groups.values())
    head = (f"{title:<14}{'reqs':>6}{'rej':>5}{'TTFT p50 ms':>12}{'p99 ms':>8}"
            f"{'TBT p99 ms':>11}{'E2E p99 s':>11}"
            + (f"{'SLO met':>9}{'goodput':>9}" if slo else "")
            + (f"{'service':>9}" if with_service else ""))
    lines = ["", head]
    shown = sorted(groups, key=lambda k: -groups[k]["num_requests"])[:MAX_GROUP_ROWS]
    for name in sorted(shown):
        g = groups[name]
        e2e = g["e2e"]["p99"]
        row = (f"{name[:13]:<14}{g['num_requests']:>6}{g['num_rejected']:>5}"
               f"{_ms(g['ttft']['p50']):>12}{_ms(g['ttft']['p99']):>8}{_ms(g['tbt']['p99']):>11}"
               f"{'-' if e2e is None else f'{e2e:.3g}':>11}")
        if slo:
            row += f"{_share(g['attainment']):>9}{g['goodput_rps']:>7.2f}/s"
        if with_service:
            share = g.get("service_share")
            row += f"{'-' if share is None else _share(share):>9}"
        lines.append(row)
    if len(groups) > len(shown):
        lines.append(f"... {len(groups) - len(shown)} more in summary.json (the {len(shown)} "
                     "with the most requests shown)")
    return lines


def _fairness_line(f: dict) -> str:
    w = f["service_weights"]
    jain = "-" if f["jain"] is None else f"{f['jain']:.3f}"
    served = "-" if f["jain_of_demand_served"] is None else f"{f['jain_of_demand_served']:.3f}"
    early = "-" if f["jain_by_last_arrival"] is None else f"{f['jain_by_last_arrival']:.3f}"
    return (f"fairness over {f['num_tenants']} tenants (service = {w['prompt']:g} x prompt + "
            f"{w['output']:g} x output tokens): Jain's index {jain} of service ({early} by the "
            f"last arrival), {served} of the share of demand served")


def _cost_line(s: dict) -> str:
    c = s["cost"]
    per_tok = "-" if c["usd_per_1m_output_tokens"] is None else \
        f"${c['usd_per_1m_output_tokens']:.3g}"
    per_req = "-" if c["usd_per_request"] is None else f"${c['usd_per_request']:.3g}"
    return (f"cost at ${c['price_per_gpu_hour']:.3g}/GPU-hour x {c['num_gpus']} GPU(s) over the "
            f"makespan: {per_tok} per 1M output tokens, {per_req} per request "
            f"(${c['usd']:.3g} for the run)")


def _pipeline_line(p: dict) -> str:
    stages = ", ".join(f"stage {i} {_share(f)}" for i, f in enumerate(p["bubble_fraction"]))
    return (f"pipeline: {p['stages']} stages ({'+'.join(map(str, p['layers']))} layers), "
            f"{p['virtual_engines']} virtual engines (requests "
            f"{', '.join(map(str, p['requests_per_engine']))}); bubbles "
            f"{_share(p['bubble_fraction_total'])} of stage time ({stages})")


def _load_line(s: dict) -> str | None:
    load = s.get("load") or {}
    if load.get("mode") not in ("closed", "sessions"):
        return None
    t = load["think_time"]
    if t["dist"] == "constant":
        think = f"{t['mean']:g} s"
    elif t["dist"] == "uniform":
        think = f"uniform {t['low']:g}-{t['high']:g} s"
    else:
        think = f"{t['dist']}, mean {t['mean']:g} s" + \
            (f", sigma {t['sigma']:g}" if t["dist"] == "lognormal" else "")
    if load["mode"] == "sessions":
        return f"multi-turn sessions: {load['sessions']}, think time {think} between turns"
    return f"closed loop: {load['clients']} users, think time {think}"


def _pool_lines(s: dict) -> list[str]:
    """Disaggregated prefill/decode: each pool, the link and the KV it carried."""
    lines = []
    for name, p in s["pools"].items():
        per = ", ".join(map(str, p["requests_per_replica"]))
        lines.append(f"{name} pool: {p['num_replicas']} x TP{p['tensor_parallel']} "
                     f"({p['policy']}, router {p['router']}), busy {p['utilization']:.0%}, KV "
                     f"max {p['kv']['utilization_max']:.0%}; requests per replica {per}")
    tr, t = s["transfer"], s["transfers"]
    link = tr["link"]
    gb = link["bandwidth"] * link["eff"] / 1e9
    line = (f"link {link['kind']}: {gb:.3g} GB/s per GPU, {link['latency_s'] * 1e6:.3g} us, "
            f"{tr['mode']}, TP{tr['tp_prefill']} -> TP{tr['tp_decode']}; "
            f"{t['num_transfers']} KV transfers (one per request moved), "
            f"{_bytes(t['bytes_total'])} in total")
    if t["num_transfers"]:
        b = t["bytes"]
        line += (f"; per request {_bytes(b['mean'])} on average ({_bytes(b['p50'])} median, "
                 f"{_bytes(b['max'])} max), {_duration(t['time_s']['p50'])} on the link median "
                 f"({_duration(t['time_s']['max'])} max), waited "
                 f"{_duration(t['wait_s']['p50'])} median ({_duration(t['wait_s']['max'])} max)")
    return lines + [line]


def _trace_text(s: dict) -> str:
    """"my.csv (its own arrival times, all 500 requests)", "sharegpt (arrivals drawn at 2 req/s,
    first 1000 requests)": the trace and what was done to it (summary.json's trace)."""
    t = s.get("trace")
    if (s.get("load") or {}).get("mode") == "served":   # sarathi-lab-serve: no trace
        return "arrivals over HTTP (served)"
    if not t:   # requests given by the caller (a capacity probe), or an older summary
        return str((s.get("config", {}).get("trace") or {}).get("name", "?"))
    if t["arrivals"] == "mix":
        return str(t["name"])
    if t["arrivals"] == "sessions":
        return (f"{t['name']} ({t['sessions']} sessions started at {t['session_rate']:g}/s, "
                f"{t['num_requests']} turns)")
    rate = "" if t.get("qps") is None else f" {t['qps']:g} req/s"
    how = {"own": "its own arrival times", "retimed": f"re-timed to{rate}",
           "drawn": f"arrivals drawn at{rate}"}.get(t["arrivals"], t["arrivals"])
    n = (f"first {t['cut_to']} requests" if t.get("cut_to") else
         f"all {t['num_requests']} requests")
    return f"{t['name']} ({how}, {n})"


def _bytes(n: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} B"


def _policy(s: dict, cfg: dict) -> str:
    """The run's policy; with disaggregated pools each pool's (they may differ)."""
    if "pools" in s:
        names = {p["policy"] for p in s["pools"].values()}
        if len(names) > 1:
            return ", ".join(f"{name} pool {p['policy']}" for name, p in s["pools"].items())
        return names.pop()
    return cfg.get("scheduler", {}).get("name", "?")


def _stall_line(st: dict) -> str:
    return (f"stalls (TBT gaps > {st['factor']:g}x a decode-only step of the same batch size): "
            f"{st['count']}, worst {_duration(st['worst_s'])}; "
            f"{_duration(st['time_lost_s'])} of decode time lost "
            f"({_share(st['time_lost_share'])} of all TBT gaps)")


def _queue_line(q: dict) -> str:
    line = (f"queue (arrived, not yet scheduled): {q['mean']:.2f} requests on average over the "
            f"makespan, at most {q['max']}")
    if "iteration_end_mean" in q:
        line += (f"; the policy's waiting queue after each iteration: "
                 f"{q['iteration_end_mean']:.2f} on average, at most {q['iteration_end_max']}")
    return line


def format_summary(s: dict) -> str:
    cfg = s.get("config", {})
    ex = cfg.get("executor") or {}
    sim = s.get("simulated", ex.get("name", "sim") == "sim")
    # the hardware the run read (none for an executor that reads no preset)
    hw = (s.get("settings") or {}).get("hardware", cfg.get("hardware")) or {}
    # the device as resolved (a served session names the GPU too; a run records cpu or cuda
    # for executor.device=auto), else as set
    used_ex = (s.get("settings") or {}).get("executor") or {}
    device = (s.get("served") or {}).get("device") or used_ex.get("device") \
        or ex.get("device", "?")
    where = (f"simulated {hw.get('name', '(no hardware preset)')}" if sim else
             f"executor {ex.get('name')} ({device})")
    # the model as resolved: model=hf names itself after its config.json (name: null)
    model = (s.get("settings") or {}).get("model", cfg.get("model")) or {}
    head = (f"{_policy(s, cfg)} | {model.get('name') or '?'}"
            f" on {where} | trace {_trace_text(s)}")
    lines = [head]
    if "replicas" in s:
        per = ", ".join(str(p["num_requests"]) for p in s["replicas"])
        lines.append(f"fleet of {s['num_replicas']} replicas, router {s['router']}: requests "
                     f"per replica {per}")
    if "pipeline" in s:
        lines.append(_pipeline_line(s["pipeline"]))
    if "pools" in s:
        lines += _pool_lines(s)
    n, n_rej = s["num_requests"], s["num_rejected"]
    bar = "!" * 78
    if n and n_rej == n:
        lines += [bar, f"!!! ALL {n} REQUESTS WERE REJECTED: nothing was served, every figure "
                  "below is empty", bar]
    elif n and n_rej * 2 >= n:
        lines += [bar, f"!!! MOST REQUESTS WERE REJECTED: {n_rej} of {n} ({_share(n_rej / n)}) "
                  f"never served; the latencies below are the {n - n_rej} others'", bar]
    closed = _load_line(s)
    if closed:
        lines.append(closed)
    lines += [_offered_line(s),
              f"requests {s['num_finished']} finished, {n_rej} rejected, "
              + (f"{s['num_length_capped']} cut short at max_model_len, "
                 if s.get("num_length_capped") else "") +
              f"{s['preemptions']} preemptions; {s['num_iterations']} iterations; "
              f"makespan {s['makespan_s']:.1f} s ({'simulated' if sim else 'run'} in "
              f"{s['wall_time_s']:.2f} s of wall time)"]
    if n_rej:
        lines.append(f"  REJECTED {n_rej} of {n} requests ({_share(n_rej / n)}), never served "
                     f"(no latency; missed in the SLO attainment): {_top_rejections(s)}")
    lines += [f"throughput {s['throughput_rps']:.2f} req/s, {s['throughput_tok_s']:.0f} "
              "output tok/s",
              "", f"{'metric (s)':<18}{'p50':>10}{'p90':>10}{'p99':>10}{'max':>10}"]
    for key in ("ttft", "tbt", "tpot", "e2e", "scheduling_delay"):
        st = s[key]
        cells = "".join(f"{st[k]:>10.4f}" if st[k] is not None else f"{'-':>10}"
                        for k in ("p50", "p90", "p99", "max"))
        lines.append(f"{key:<18}{cells}")
    lines.append("\n" + _stall_line(s["stalls"]))
    if "kv" in s:
        kv = s["kv"]
        lines.append(f"KV: {kv['blocks_total']} blocks, utilisation mean "
                     f"{kv['utilization_mean']:.1%} max {kv['utilization_max']:.1%}, "
                     f"internal waste {kv['internal_waste_mean']:.1%}")
    if "prefix_cache" in s:
        lines.append(_prefix_line(s))
    if s.get("swap"):
        sw = s["swap"]
        gb = "" if sw["bytes_out"] is None else f" ({sw['bytes_out'] / 1e9:.2f} GB per GPU)"
        lines.append(f"swap: {sw['swap_outs']} swapped out and {sw['swap_ins']} in, "
                     f"{sw['recompute_preemptions']} recomputed ({sw['fallbacks_to_recompute']} "
                     f"for want of host space); {sw['blocks_out']} blocks out{gb}, "
                     f"{sw['time_s']:.3f} s copying ({sw['time_share']:.2%} of the run); host "
                     f"space {sw['host_blocks_total']} blocks, at most "
                     f"{sw['host_utilization_max']:.1%} used")
    if s.get("speculation"):
        sp = s["speculation"]
        rate = "n/a" if sp["acceptance_rate"] is None else f"{sp['acceptance_rate']:.1%}"
        per = "n/a" if sp["tokens_per_step"] is None else f"{sp['tokens_per_step']:.2f}"
        lines.append(f"speculation: {sp['accepted']} of {sp['proposed']} draft tokens accepted "
                     f"({rate}); {sp['steps']} speculative decode steps, {per} tokens each")
    if s.get("queue") is not None:
        lines.append(_queue_line(s["queue"]))
    if "cost" in s:
        lines.append(_cost_line(s))
    if "slo" in s:
        lines += _slo_lines(s["slo"], _missed_as_well(s))
    if len(s.get("classes") or {}) > 1:
        lines += _group_lines("SLO class", s["classes"], False)
    if len(s.get("tenants") or {}) > 1:
        lines += _group_lines("tenant", s["tenants"], True)
        lines.append(_fairness_line(s["fairness"]))
    return "\n".join(lines)
