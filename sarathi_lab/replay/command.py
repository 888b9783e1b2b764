"""The `sarathi-lab-replay` command: the trace and SLO composed from Hydra overrides (the keys
of `sarathi-lab`'s `trace` and `slo` groups, and `seed`), replayed against the endpoint, written
as a run directory."""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

from sarathi_lab import rundir
from sarathi_lab.replay.loads import Endpoint, replay
from sarathi_lab.replay.prompts import with_prompt_ids
from sarathi_lab.replay.results import remote_section, requests_frame, write
from sarathi_lab.settings import ConfigError

READ = ("trace", "slo", "seed")   # the config keys a replay reads


def compose(overrides: list[str]) -> dict:
    """{trace, slo, seed} of `sarathi-lab <overrides>`; an override of any other key is an error
    (no component of a replay would read it)."""
    from sarathi_lab.sweeps import compose_config
    for o in overrides:
        key = o.split("=", 1)[0].lstrip("+~")
        if "=" not in o or key.split(".")[0].split("/")[0] not in READ:
            raise ConfigError(f"{o}: sarathi-lab-replay reads only overrides of "
                              f"{', '.join(READ)} (trace=..., trace.KEY=..., slo=..., seed=N)")
    c = compose_config(overrides)
    return {k: c[k] for k in READ}


def check_url(url: str) -> str:
    """The base URL as given, once checked: http(s), a host, no credentials in it (the key comes
    from the environment and is never written)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"--base-url {url}: expected http(s)://HOST[:PORT]/v1")
    if parts.username or parts.password:
        raise ConfigError("--base-url: credentials in the URL would be written to "
                          "summary.json; give the key in an environment variable (--api-key-env)")
    return url


def run_replay(overrides: list[str], ep: Endpoint, out: Path, *, api_key_env: str = "OPENAI_API_KEY",
               vocab_size: int | None = None, progress="auto") -> dict:
    """Replay the configured trace against `ep` and write the run directory `out`; returns the
    summary."""
    from sarathi_lab.closed_loop import ThinkTime
    from sarathi_lab.traces import build_trace, to_requests
    check_url(ep.base_url)
    if (Path(out) / rundir.SUMMARY).exists():
        raise ConfigError(f"--out {out}: already holds a run ({rundir.SUMMARY}); give another "
                          "directory")
    c = compose(overrides)
    trace_cfg, seed = c["trace"], c["seed"]
    if "turns" in trace_cfg:
        raise ConfigError("trace.turns: multi-turn sessions are not replayed against a server "
                          "(each turn waits for the previous answer, which this client does not "
                          "feed back); simulate them with sarathi-lab")
    trace, source = with_prompt_ids(build_trace(trace_cfg), vocab_size, trace_cfg.get("seed", 0))
    requests = to_requests(trace)
    for r in requests:   # the trace's output length, asked of the server
        r.max_tokens = r.take_output_len()
    key = os.environ.get(api_key_env)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    clients = trace_cfg.get("clients")
    think = ThinkTime.from_spec(trace_cfg.get("think_time")) if clients else None
    t0 = time.perf_counter()
    outcomes, users = replay(requests, ep, headers, clients=clients, think=think,
                             seed=trace_cfg.get("seed", 0), progress=progress)
    wall = time.perf_counter() - t0
    df = requests_frame(requests, outcomes, users if clients else None)
    endpoint = {"base_url": ep.base_url, "model": ep.model, "api": "completions",
                "api_key_env": api_key_env, "api_key_sent": bool(key)}
    settings = {"timeout": ep.timeout, "stall_timeout": ep.stall_timeout,
                "max_connections": ep.max_connections, "ignore_eos": ep.ignore_eos,
                "vocab_size": vocab_size, "prompt_ids": source}
    load = {"mode": "open"} if not clients else \
        {"mode": "closed", "clients": clients, "think_time": vars(think)}
    extra = {
        "executor": "remote", "endpoint": endpoint, "remote": remote_section(df, ep.ignore_eos),
        "load": load, "wall_time_s": wall, "simulated": False, "cost_model": None,
        # as a simulated run's config, so that the report reads it the same way; the policy
        # is the endpoint's own, named `remote`
        "config": {"executor": {"name": "remote", **endpoint, **settings},
                   "scheduler": {"name": "remote"}, "model": {"name": ep.model},
                   "trace": trace_cfg, "slo": c["slo"], "seed": seed},
        "settings": {"replay": settings},
    }
    return write(Path(out), df, slo=c["slo"], extra=extra)


def _positive(kind):
    def parse(text):
        try:
            v = kind(text)
        except ValueError:
            v = 0
        if not v > 0:
            raise argparse.ArgumentTypeError(f"{text!r}: expected a number > 0")
        return v
    return parse


def main(argv=None) -> None:
    p = argparse.ArgumentParser(
        prog="sarathi-lab-replay",
        description="Replay a trace against an OpenAI-compatible endpoint (streamed "
                    "/v1/completions) and write a run directory that sarathi-lab-report reads.",
        epilog="Overrides are those of sarathi-lab's trace and slo groups and seed, e.g. "
               "trace=azure_conv trace.num_requests=200 trace.qps=4 (open loop), "
               "trace.clients=8 (closed loop), slo=llama-2-7b-relaxed. "
               "See sarathi_lab/docs/replay.md.")
    p.add_argument("overrides", nargs="*", help="config overrides (key=value)")
    p.add_argument("--base-url", required=True, help="the API root, e.g. http://127.0.0.1:8000/v1")
    p.add_argument("--model", required=True, help="the model name the endpoint serves")
    p.add_argument("--api-key-env", default="OPENAI_API_KEY", metavar="VAR",
                   help="environment variable holding the API key, sent as a bearer token if "
                        "set (default OPENAI_API_KEY); never written")
    p.add_argument("--out", help="the run directory (default outputs/runs/TIME_replay)")
    p.add_argument("--vocab-size", type=_positive(int), default=None,
                   help="a length-only trace: random prompt ids are drawn below this")
    p.add_argument("--timeout", type=_positive(float), default=600.0, metavar="S",
                   help="seconds one request may take in all (default 600)")
    p.add_argument("--stall-timeout", type=_positive(float), default=60.0, metavar="S",
                   help="seconds to wait for the response or its next chunk (default 60)")
    p.add_argument("--max-connections", type=_positive(int), default=256, metavar="N",
                   help="connections open at once (default 256); more requests wait for one")
    p.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false",
                   help="do not send ignore_eos (for servers that refuse it)")
    p.add_argument("--progress", choices=("auto", "true", "false"), default="auto")
    a = p.parse_args(argv)
    from sarathi_lab.extras import installed
    if not installed("aiohttp"):
        sys.exit("sarathi-lab-replay: error: needs aiohttp: pip install 'sarathi-lab[serve]'")
    out = Path(a.out) if a.out else \
        Path("outputs/runs") / f"{time.strftime('%Y-%m-%d_%H-%M-%S')}_replay"
    ep = Endpoint(a.base_url, a.model, a.timeout, a.stall_timeout, a.max_connections,
                  a.ignore_eos)
    progress = {"auto": "auto", "true": True, "false": False}[a.progress]
    try:
        s = run_replay(a.overrides, ep, out, api_key_env=a.api_key_env,
                       vocab_size=a.vocab_size, progress=progress)
    except (ConfigError, ValueError, FileNotFoundError) as e:
        sys.exit(f"sarathi-lab-replay: error: {e}")
    r = s["remote"]
    print(f"{s['num_requests']} requests: {s['num_finished']} finished, {s['num_rejected']} "
          f"rejected (HTTP 429), {r['num_errors']} errors, {r['num_timeouts']} timeouts")
    if s["num_finished"]:
        print(f"TTFT p50 {s['ttft']['p50']:.3f} s, p99 {s['ttft']['p99']:.3f} s; "
              f"E2E p50 {s['e2e']['p50']:.3f} s")
    if r["output_length_enforced"] is False:
        print(f"the server did not honour max_tokens/ignore_eos: {r['num_short']} requests got "
              f"fewer tokens than asked, {r['num_long']} more")
    print(f"\nrun directory: {out.resolve()}")
