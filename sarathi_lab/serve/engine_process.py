"""The engine in a process of its own (vLLM V1's design): the HTTP process never shares an
interpreter lock with the engine, whose steps then take as long as offline.

`start` spawns it (the ``spawn`` context: torch, threads and fork do not mix) with the
configuration, not live objects; there `main` builds the engine as a run does
(`runner.build`), says ``ready`` (or ``failed`` with the reason), steps it (`worker.Worker`)
until told to stop, then writes the run directory and says ``stopped``. Messages are lists
encoded with msgspec's MessagePack (pickle where msgspec is not installed) over a
`multiprocessing` pipe:

- HTTP -> engine: ``["add", rid, generation fields]``, ``["abort", rid]``, ``["quit"]`` (the
  server could not bind: leave nothing), ``["stop"]``, and
  once the engine has halted and every client is answered, ``["finish", the HTTP side's
  record for the summary]``;
- engine -> HTTP: ``["ready", info]`` or ``["failed", message]``; after each step (and each
  batch of messages) ``["step", clock, tokens, firsts, ends, errors, stats]``; ``["halted",
  error or None]`` when its loop ends (told to stop, or the engine failed: in-flight requests
  have had their errors); at the end ``["stopped", text to print, error or None]``.

The engine process ignores SIGINT (Ctrl-C reaches the whole process group; the HTTP process
stops it in order) and exits when the HTTP process goes away (its pipe closes): the journal
(`sarathi_lab.run.journal`) keeps what had ended.
"""
from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import sys
import time
import traceback
from pathlib import Path

try:   # the serve extra's fast serializer; pickle where it is missing
    import msgspec
    _enc, _dec = msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder()
    encode, decode = _enc.encode, _dec.decode
except ImportError:   # pragma: no cover - the extra installs it
    import pickle
    encode, decode = pickle.dumps, pickle.loads

log = logging.getLogger(__name__)


class Link:
    """One end of the pipe, speaking messages."""

    def __init__(self, conn):
        self.conn = conn

    def send(self, msg) -> None:
        self.conn.send_bytes(encode(msg))

    def recv(self):
        return decode(self.conn.recv_bytes())

    def poll(self, timeout: float | None = 0) -> bool:
        return self.conn.poll(timeout)

    def fileno(self) -> int:
        return self.conn.fileno()

    def close(self) -> None:
        self.conn.close()


def start(c: dict, overrides: list[str], sc: dict, run_dir: Path, num_threads,
          served: dict):
    """(process, `Link`) of a new engine process; it answers ``ready`` or ``failed`` first.
    `served`: what the HTTP side knows at start for the summary's ``served``."""
    ctx = multiprocessing.get_context("spawn")
    ours, theirs = ctx.Pipe(duplex=True)
    # daemon: a server that exits on an error takes it along (multiprocessing ends it at exit)
    proc = ctx.Process(target=main, name="sarathi-lab-engine", daemon=True,
                       args=(theirs, c, overrides, sc, str(run_dir), num_threads, served))
    proc.start()
    theirs.close()   # the child's end: our reads see EOF when the child dies
    return proc, Link(ours)


def _info(engine, policy, executor) -> dict:
    """What the HTTP side checks requests against."""
    ex = executor
    return {"policy": policy.name, "max_model_len": policy.max_model_len,
            "vocab_size": ex.args.vocab_size, "executor": type(ex).__name__,
            "defaults": [getattr(ex, "temperature", 0.0), getattr(ex, "top_p", 1.0)],
            "per_request_sampling": hasattr(ex, "set_sampling"),
            "greedy_only": bool(getattr(ex, "greedy_only", False)),
            "kv_blocks_total": engine.kv.num_blocks, "device": device_label(ex)}


def device_label(executor) -> str | None:
    """The device the executor runs on as it resolved it (executor.device=auto is cpu or
    cuda): ``cpu``, ``cuda (NVIDIA H200)``; None for an executor with no `device`."""
    dev = getattr(executor, "device", None)
    if dev is None:
        return None
    if getattr(dev, "type", None) == "cuda":
        import torch
        return f"{dev} ({torch.cuda.get_device_name(dev)})"
    return str(dev)


def main(conn, c: dict, overrides: list[str], sc_values: dict, run_dir: str,
         num_threads, served: dict) -> None:
    """The engine process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    link = Link(conn)
    try:
        built = _build(link, c, overrides, sc_values, Path(run_dir), num_threads, served)
    except (Exception, SystemExit) as e:   # a setting found wrong while building: in one line
        detail = str(e) if isinstance(e, (ValueError, SystemExit)) else \
            f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
        link.send(["failed", detail])
        link.close()
        sys.exit(1)
    worker, journal, finish = built
    link.send(["ready", _info(worker.engine, worker.engine.policy, worker.executor)])
    worker.run()
    if worker.quit:   # the server could not start serving: nothing to write
        journal.close(remove=True)
        sys.exit(0)
    served = None if worker.orphaned else _halt(link, worker)
    if served is None:   # no one to tell: the journal holds what ended
        journal.close()
        os._exit(1)
    text, error = finish(worker, served)
    journal.close(remove=True)
    link.send(["stopped", text, error])
    link.close()
    sys.exit(0 if error is None else 1)


def _halt(link: Link, worker) -> dict | None:
    """The loop is over (told to stop, or the engine failed): say so, answer what still comes
    with the stopping error, and return the HTTP side's record (``finish``) once its clients
    are answered; None if it went away."""
    err = worker.error
    link.send(["halted", None if err is None else f"{type(err).__name__}: {err}"])
    while True:
        try:
            msg = link.recv()
        except EOFError:
            return None
        if msg[0] == "finish":
            return msg[1]
        if msg[0] == "add":
            worker.refuse(msg[1])


def _build(link, c, overrides, sc_values, run_dir: Path, num_threads, served_base: dict):
    """(worker, journal, finish(worker) -> (text, error or None))."""
    from sarathi_lab.engine import Engine
    from sarathi_lab.run.journal import Journal
    from sarathi_lab.run.runner import build, results, write_run
    from sarathi_lab.run.summary_text import format_summary
    from sarathi_lab.serve.configure import configure
    from sarathi_lab.serve.text import StopWatch, load_tokenizer
    from sarathi_lab.serve.worker import Worker
    from sarathi_lab.topology import OpenLoop, Single
    from sarathi_lab.topology.results import replica_gpus
    t0 = time.perf_counter()
    if isinstance(num_threads, int):
        import torch
        torch.set_num_threads(num_threads)
    c, sc, resolved = configure({**c, "serve": sc_values}, overrides)
    tokenizer = load_tokenizer(sc.tokenizer, c["model"].get("path"))
    policy, executor = build(c, resolved)
    # a served request brings its own prompt: it ends at the model's EOS unless it asks not to
    engine = Engine(policy, executor, fast_forward=False, overlong=resolved.run.overlong,
                    why_not="a served session steps as its requests come")
    stop_watch = None if tokenizer is None else (lambda stops: StopWatch(tokenizer, stops))
    name = sc.model_name or str(c["model"].get("name"))
    topo = Single(engine)
    device = device_label(executor)

    def summary_of(requests, served: dict) -> tuple:
        req_df, it_df, summary = results(c, resolved, topo, OpenLoop(requests), requests,
                                          policy, executor, time.perf_counter() - t0)
        summary["load"] = {"mode": "served"}
        summary["executor"] = c["executor"]["name"]
        summary["served"] = {"host": sc.host, "model_name": name, "max_queue": sc.max_queue,
                             "device": device, **served_base,
                             "requests_accepted": len(requests), **served}
        return req_df, it_df, summary

    journal = Journal(run_dir)
    _, it0, base = summary_of([], {"port": None, "http_status": {}, "engine_error": None})
    journal.start(base, {"slo": c.get("slo"), "kv_blocks_total": engine.kv.num_blocks,
                         "block_size": engine.kv.block_size, "swap_space": engine.swap_space(),
                         "price_per_gpu_hour": (resolved.hardware or {}).get(
                             "price_per_gpu_hour"), "num_gpus": replica_gpus(engine)},
                  {k: str(v) for k, v in it0.dtypes.items()})

    def finish(worker, served: dict) -> tuple:
        if worker.error is None:
            try:   # the guard: nothing left queued or running, every KV block freed
                engine.finish()
            except RuntimeError as err:   # a bug: said, after what was served is written
                worker.error = err
        err = worker.error
        req_df, it_df, summary = summary_of(worker.requests, {
            **served, "engine_error": None if err is None else
            f"{type(err).__name__}: {err}"})
        write_run(run_dir, req_df, it_df, summary)
        text = format_summary(summary) + f"\n\nrun directory: {run_dir.resolve()}"
        if err is not None:
            return text, (f"the engine stopped: {type(err).__name__}: {err} (the run "
                          f"directory {run_dir} holds what it served)")
        return text, None

    return Worker(engine, link, stop_watch, journal), journal, finish
