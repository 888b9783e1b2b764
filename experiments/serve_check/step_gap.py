"""What the engine process adds between two steps: the serve worker (`serve.worker.Worker`) stepping
serve_check's model in this process, its messages sent over a real `multiprocessing` pipe to a
process that only reads them ("pipe") or dropped ("no send"), against the same requests run
offline (`Engine.run`). Each side: the median decode step, the median time between two
back-to-back decode steps; served, the median time of the worker's own per-step calls (taking
messages, handing out tokens, building the message; the send left out), of the `send` of one
step's message (pipe), and of a step's wall time beyond the duration it reports (the
executor's work outside its timer: offline it is spent too, but the engine's clock does not
count it, so the offline gap leaves it out).

    python experiments/serve_check/step_gap.py               # 3 requests x 300 tokens, ~30 s
    python experiments/serve_check/step_gap.py --requests 1 --rounds 3

No HTTP process and no client: what remains of the served run's gap beyond these is theirs.
"""
from __future__ import annotations

import argparse
import importlib.util
import multiprocessing as mp
import os
import statistics as st
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from sarathi_lab.engine import Engine
from sarathi_lab.request import Request
from sarathi_lab.run import runner
from sarathi_lab.run.config import resolve
from sarathi_lab.serve.engine_process import Link
from sarathi_lab.serve.protocol import Generation
from sarathi_lab.serve.worker import Worker

_spec = importlib.util.spec_from_file_location("serve_check_run",
                                               Path(__file__).with_name("run.py"))
_run = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_run)
ENGINE = [*_run.SCALES["full"]["model"], "executor=torch", "executor.device=cpu",
          "executor.clock=wall", "scheduler=sarathi", "scheduler.token_budget=128",
          f"scheduler.num_kv_blocks={_run.SCALES['full']['kv_blocks']}"]


def _engine() -> Engine:
    import torch
    torch.set_num_threads(1)
    with initialize_config_module("sarathi_lab.configs", version_base="1.3"):
        c = OmegaConf.to_container(compose("config", overrides=ENGINE), resolve=True)
    policy, ex = runner.build(c, resolve(c))
    return Engine(policy, ex, fast_forward=False)


def _reader(conn) -> None:
    while True:
        try:
            conn.recv_bytes()
        except EOFError:
            return


class _Link:
    """The HTTP process's side in process: the adds are waiting at once, and a stop follows the
    message that ends the last request. The worker's messages are timed and sent down `conn`
    (None: dropped)."""

    def __init__(self, msgs, conn):
        self.inbox, self.left = list(msgs), len(msgs)
        self.out = Link(conn) if conn is not None else None
        self.sends: list[float] = []

    def poll(self, timeout=0):
        return bool(self.inbox)

    def recv(self):
        return self.inbox.pop(0)

    def send(self, msg):
        if self.out is not None:
            t = time.perf_counter()
            self.out.send(msg)
            self.sends.append(time.perf_counter() - t)
        self.left -= len(msg[4])   # ["step", clock, tokens, firsts, ends, errors, stats]
        if msg[5]:
            raise RuntimeError(f"the engine refused a request: {msg[5]}")
        if self.left == 0 and msg[4]:
            self.inbox.append(["stop"])


def decode_figures(e: Engine) -> tuple[float, float]:
    """(median decode step, median gap between back-to-back decode steps of one batch size), s."""
    it = e.iteration_columns()
    dec = it["prefill_tokens"] == 0
    n = it["num_requests"]
    gap = it["start"][1:] - (it["start"] + it["duration"])[:-1]
    same = dec[1:] & dec[:-1] & (n[1:] == n[:-1])
    return float(np.median(it["duration"][dec])), float(np.median(gap[same]))


def served(prompts, out: int, pipe: bool) -> dict:
    e = _engine()
    msgs = [["add", i + 1, asdict(Generation(prompt_ids=p, max_tokens=out, ignore_eos=True))]
            for i, p in enumerate(prompts)]
    proc = ours = None
    if pipe:
        ctx = mp.get_context("spawn")
        ours, theirs = ctx.Pipe()
        proc = ctx.Process(target=_reader, args=(theirs,))
        proc.start()
        theirs.close()
    link = _Link(msgs, ours)
    w = Worker(e, link)
    spent: dict[str, list[float]] = {}
    for name in ("_drain", "_deliver", "_flush"):   # the worker's own, per loop
        setattr(w, name, _timed(getattr(w, name), spent.setdefault(name, [])))
    ex = e.executor   # the wall time of a step beyond the duration it reports
    ex.execute = _timed(ex.execute, spent.setdefault("execute", []))
    w.run()
    if pipe:
        ours.close()
        proc.join()
    step, gap = decode_figures(e)
    own = sum(st.median(spent[k]) for k in ("_drain", "_deliver", "_flush"))
    if link.sends:   # the send is inside _flush
        own -= st.median(link.sends)
    durations = e.iteration_columns()["duration"]
    untimed = np.median(np.array(spent["execute"]) - durations[-len(spent["execute"]):])
    return {"step": step, "gap": gap, "send": st.median(link.sends) if link.sends else None,
            "own": own, "untimed": float(untimed)}


def _timed(f, into: list):
    def timed(*a, **k):
        t = time.perf_counter()
        out = f(*a, **k)
        into.append(time.perf_counter() - t)
        return out
    return timed


def offline(prompts, out: int) -> dict:
    e = _engine()
    reqs = [Request(i, 0.0, len(p), None, prompt_token_ids=p, max_tokens=out)
            for i, p in enumerate(prompts)]
    for r in reqs:   # as the served requests: to max_tokens
        e.executor.set_sampling(r.request_id, 0.0, 1.0, None, True)
    e.run(reqs)
    step, gap = decode_figures(e)
    return {"step": step, "gap": gap, "send": None}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=3, help="decoding together")
    ap.add_argument("--tokens", type=int, default=300, help="output tokens per request")
    ap.add_argument("--rounds", type=int, default=2, help="each side this often, interleaved")
    a = ap.parse_args(argv)
    prompts = [[5 + i] * 32 for i in range(a.requests)]
    print(f"load average (1 min) {os.getloadavg()[0]:.2f}")
    for r in range(a.rounds):
        for name, f in (("offline", lambda: offline(prompts, a.tokens)),
                        ("no send", lambda: served(prompts, a.tokens, False)),
                        ("pipe", lambda: served(prompts, a.tokens, True))):
            x = f()
            send = "" if x["send"] is None else f", send {x['send'] * 1e6:.1f} us"
            if "own" in x:
                send += (f", worker's own loop {x['own'] * 1e6:.1f} us, a step's wall time "
                         f"beyond its duration {x['untimed'] * 1e6:.1f} us")
            print(f"round {r + 1} {name:8s}: decode step {x['step'] * 1e3:.3f} ms, gap "
                  f"{x['gap'] * 1e3:.3f} ms{send}")
    print(f"load average (1 min) {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
