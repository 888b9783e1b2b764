"""The `sarathi-lab-replay` command: the trace and SLO composed from Hydra overrides (the keys
of `sarathi-lab`'s `trace` and `slo` groups, and `seed`), replayed against the endpoint, written
as a run directory. An SLO is judged only when an override names one (`slo=NAME`, `slo.KEY=...`):
the default model's SLO says nothing about an endpoint's model; `slo=none` judges none."""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

from sarathi_lab.replay.loads import Endpoint, replay
from sarathi_lab.replay.prompts import APIS, PROMPTS, prompts
from sarathi_lab.replay.results import remote_section, requests_frame, write
from sarathi_lab.run import rundir
from sarathi_lab.settings import ConfigError

READ = ("trace", "slo", "seed")   # the config keys a replay reads


def _names_slo(o: str) -> bool:
    return o.split("=", 1)[0].lstrip("+~").split(".")[0].split("/")[0] == "slo"


def compose(overrides: list[str]) -> dict:
    """{trace, slo, seed} of `sarathi-lab <overrides>`; an override of any other key is an error
    (no component of a replay would read it). `slo` is None unless an override names one;
    `slo=none` (or `slo=null`, `~slo`) names none."""
    from sarathi_lab.sweeps.bookkeeping import compose_config
    for o in overrides:
        key = o.split("=", 1)[0].lstrip("+~")
        if ("=" not in o and not o.startswith("~")) or \
                key.split(".")[0].split("/")[0] not in READ:
            raise ConfigError(f"{o}: sarathi-lab-replay reads only overrides of "
                              f"{', '.join(READ)} (trace=..., trace.KEY=..., slo=..., seed=N)")
    named = [o for o in overrides if _names_slo(o)]
    none = [o for o in named if o in ("slo=none", "slo=null", "~slo") or o.startswith("~slo=")]
    if none and len(named) > len(none):
        raise ConfigError(f"{' '.join(named)}: {none[0]} judges no SLO; drop the other slo "
                          "overrides or it")
    rest = [o for o in overrides if o not in none]
    c = compose_config(rest + (["slo=none"] if none or not named else []))
    return {k: c.get(k) for k in READ}


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
               vocab_size: int | None = None, progress="auto", prompt: str = "ids",
               tokenizer=None, warmup: int = 0) -> dict:
    """Replay the configured trace against `ep` and write the run directory `out`; returns the
    summary. `prompt`: ids or text (replay.prompts); `warmup`: copies of the trace's first N
    requests sent before it, not measured."""
    from sarathi_lab.traces import build_trace, to_requests
    from sarathi_lab.traces.clients import ThinkTime
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
    if prompt not in PROMPTS:
        raise ConfigError(f"--prompt {prompt}: expected one of {', '.join(PROMPTS)}")
    if ep.api not in APIS:
        raise ConfigError(f"--api {ep.api}: expected one of {', '.join(APIS)}")
    if ep.api == "chat" and prompt != "text":
        raise ConfigError("--api chat: a chat message is text; give --prompt text")
    trace = build_trace(trace_cfg)
    texts, source = prompts(trace, prompt, vocab_size=vocab_size, tokenizer=tokenizer,
                            seed=trace_cfg.get("seed", 0))
    requests = to_requests(trace)
    for r in requests:   # the trace's output length, asked of the server
        r.max_tokens = r.take_output_len()
    if not 0 <= warmup <= len(requests):
        raise ConfigError(f"--warmup {warmup}: between 0 and the trace's {len(requests)} "
                          "requests")
    warm = None
    if warmup:
        warm = to_requests(trace.iloc[:warmup])
        for r in warm:
            r.max_tokens = r.take_output_len()
        warm = (warm, texts[:warmup])
    key = os.environ.get(api_key_env)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    clients = trace_cfg.get("clients")
    think = ThinkTime.from_spec(trace_cfg.get("think_time")) if clients else None
    t0 = time.perf_counter()
    if clients and ep.max_concurrency:
        raise ConfigError("--max-concurrency: an open-loop option; trace.clients already "
                          "bounds a closed loop's requests in flight")
    outcomes, users, warm_out = replay(requests, texts, ep, headers, clients=clients,
                                       think=think, seed=trace_cfg.get("seed", 0),
                                       progress=progress, warmup=warm)
    wall = time.perf_counter() - t0
    df = requests_frame(requests, outcomes, users if clients else None)
    endpoint = {"base_url": ep.base_url, "model": ep.model, "api": ep.api,
                "api_key_env": api_key_env, "api_key_sent": bool(key)}
    settings = {"timeout": ep.timeout, "stall_timeout": ep.stall_timeout,
                "max_connections": ep.max_connections, "ignore_eos": ep.ignore_eos,
                "vocab_size": vocab_size, "prompt": prompt,
                "tokenizer": None if tokenizer is None else str(tokenizer),
                "prompt_ids": source, "max_concurrency": ep.max_concurrency,
                "warmup": warmup}
    load = {"mode": "open"} if not clients else \
        {"mode": "closed", "clients": clients, "think_time": vars(think)}
    if ep.max_concurrency:
        load["max_concurrency"] = ep.max_concurrency
    extra = {
        "executor": "remote", "endpoint": endpoint, "remote": remote_section(df, ep.ignore_eos),
        "load": load, "wall_time_s": wall, "simulated": False, "cost_model": None,
        "warmup": {"num_requests": warmup,
                   "num_finished": sum(o.status == "finished" for o in warm_out)},
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


def _nonnegative(text):
    try:
        v = int(text)
    except ValueError:
        v = -1
    if v < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected an integer >= 0")
    return v


def main(argv=None) -> None:
    p = argparse.ArgumentParser(
        prog="sarathi-lab-replay",
        description="Replay a trace against an OpenAI-compatible endpoint (streamed "
                    "/v1/completions or /v1/chat/completions) and write a run directory that sarathi-lab-report reads.",
        epilog="Overrides are those of sarathi-lab's trace and slo groups and seed, e.g. "
               "trace=azure_conv trace.num_requests=200 trace.qps=4 (open loop), "
               "trace.clients=8 (closed loop), slo=llama-2-7b-relaxed (an SLO is judged only "
               "when named). "
               "See sarathi_lab/docs/replay.md.")
    p.add_argument("overrides", nargs="*", help="config overrides (key=value)")
    p.add_argument("--base-url", required=True, help="the API root, e.g. http://127.0.0.1:8000/v1")
    p.add_argument("--model", required=True, help="the model name the endpoint serves")
    p.add_argument("--api-key-env", default="OPENAI_API_KEY", metavar="VAR",
                   help="environment variable holding the API key, sent as a bearer token if "
                        "set (default OPENAI_API_KEY); never written")
    p.add_argument("--out", help="the run directory (default outputs/runs/TIME_replay)")
    p.add_argument("--api", choices=tuple(APIS), default="completions",
                   help="completions: /v1/completions (default) | chat: /v1/chat/completions, "
                        "the prompt as the user's message (needs --prompt text)")
    p.add_argument("--prompt", choices=PROMPTS, default="ids",
                   help="ids: token-id prompts (default) | text: the trace's text, or text "
                        "synthesized with --tokenizer to the trace's prompt lengths")
    p.add_argument("--tokenizer", metavar="DIR", default=None,
                   help="--prompt text, a trace without text: the endpoint model's tokenizer "
                        "(a local directory)")
    p.add_argument("--vocab-size", type=_positive(int), default=None,
                   help="--prompt ids, a length-only trace: random prompt ids are drawn below "
                        "this")
    p.add_argument("--max-concurrency", type=_positive(int), default=None, metavar="N",
                   help="open loop: at most N requests in flight; a request due while N are "
                        "waits, its times counted from its send (as vllm bench serve)")
    p.add_argument("--warmup", type=_nonnegative, default=0, metavar="N",
                   help="send copies of the trace's first N requests first and wait for them; "
                        "not measured (default 0)")
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
                  a.ignore_eos, a.api, a.max_concurrency)
    progress = {"auto": "auto", "true": True, "false": False}[a.progress]
    try:
        s = run_replay(a.overrides, ep, out, api_key_env=a.api_key_env,
                       vocab_size=a.vocab_size, progress=progress, prompt=a.prompt,
                       tokenizer=a.tokenizer, warmup=a.warmup)
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
