"""The serving overhead: the same requests run in process (`Engine`) and through
`sarathi-lab-serve` on the tiny random model, greedy, with one torch thread; each way timed
`--repeats` times after a warm-up request (the best time kept), the tokens checked equal.

    python -m sarathi_lab.serve.overhead --requests 16 --mode both

Modes: `sequential` (one request after another: the added latency of a round trip, whole and
streamed) and `burst` (all at once: the added cost under load). Prints one line per case.
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

OVERRIDES = ["executor=torch", "model=tiny-llama", "executor.device=cpu",
             "executor.kv_cache_gib=0.02"]


def _in_process(prompts, out_len: int, burst: bool):
    from sarathi_lab.engine import Engine
    from sarathi_lab.request import Request
    from sarathi_lab.run.runner import build
    from sarathi_lab.sweeps.bookkeeping import compose_config
    c = compose_config(OVERRIDES)
    policy, ex = build(c)
    e = Engine(policy, ex)
    n = len(prompts[0])
    e.run([Request(-1, 0.0, n, None, prompt_token_ids=prompts[0], max_tokens=out_len)])
    t0 = time.perf_counter()
    reqs = [Request(i, e.now, n, None, prompt_token_ids=p, max_tokens=out_len)
            for i, p in enumerate(prompts)]
    if burst:
        for r in reqs:
            e.add_request(r)
        while policy.has_work():
            e.advance()
    else:
        for r in reqs:
            e.add_request(r)
            while policy.has_work():
                e.advance()
    return time.perf_counter() - t0, [r.output_token_ids for r in reqs]


def _post(port: int, body: dict) -> list[int]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    conn.request("POST", "/v1/completions", json.dumps(body),
                 {"Content-Type": "application/json"})
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    if resp.status != 200:
        raise RuntimeError(f"the server answered {resp.status}: {data[:500]!r}")
    if not body.get("stream"):
        return json.loads(data)["choices"][0]["token_ids"]
    events = [json.loads(x[6:]) for x in data.decode().split("\n\n")
              if x and x != "data: [DONE]"]
    return [t for e in events for c in e["choices"] for t in c["token_ids"]]


def _served(prompts, out_len: int, burst: bool, stream: bool, cwd: str):
    proc = subprocess.Popen(
        [sys.executable, "-c", "from sarathi_lab.serve.command import main; main()",
         "serve.port=0", "num_threads=1", f"serve.max_queue={len(prompts)}", *OVERRIDES[1:],
         f"hydra.run.dir={cwd}/serve_overhead_{time.time_ns()}"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        for line in proc.stdout:
            if "serving" in line:
                port = int(line.split("127.0.0.1:")[1].split("/")[0])
                break
        else:
            raise RuntimeError("the server did not start")
        body = {"model": "tiny-llama", "max_tokens": out_len, "temperature": 0}
        _post(port, {**body, "prompt": prompts[0]})   # warm-up
        bodies = [{**body, "prompt": p, "stream": stream} for p in prompts]
        t0 = time.perf_counter()
        if burst:
            with ThreadPoolExecutor(len(bodies)) as pool:
                outs = list(pool.map(lambda b: _post(port, b), bodies))
        else:
            outs = [_post(port, b) for b in bodies]
        wall = time.perf_counter() - t0
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=300)
    return wall, outs


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--mode", choices=("sequential", "burst", "both"), default="both")
    ap.add_argument("--dir", default="outputs", help="where the servers' run directories go")
    a = ap.parse_args(argv)
    import numpy as np
    import torch
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, 512, a.prompt_len).tolist() for _ in range(a.requests)]
    os.makedirs(a.dir, exist_ok=True)
    for burst in {"sequential": [False], "burst": [True], "both": [False, True]}[a.mode]:
        runs = [_in_process(prompts, a.output_len, burst) for _ in range(a.repeats)]
        base, want = min(r[0] for r in runs), runs[0][1]
        for stream in (False, True):
            runs = [_served(prompts, a.output_len, burst, stream, os.path.abspath(a.dir))
                    for _ in range(a.repeats)]
            if any(r[1] != want for r in runs):
                raise RuntimeError("the served tokens differ from the in-process ones")
            wall = min(r[0] for r in runs)
            tokens = a.requests * a.output_len
            print(f"{'burst' if burst else 'sequential'}, {a.requests} requests of "
                  f"{a.prompt_len} + {a.output_len} tokens, stream={stream}: in process "
                  f"{base:.3f} s, served {wall:.3f} s: {wall - base:+.3f} s "
                  f"({(wall / base - 1) * 100:+.0f}%), {(wall - base) / a.requests * 1e3:+.1f} "
                  f"ms per request, {(wall - base) / tokens * 1e3:+.3f} ms per token", flush=True)


if __name__ == "__main__":
    main()
