"""`sarathi-lab-serve`: a policy and the real executor behind an OpenAI-compatible HTTP server.

Configured as `sarathi-lab` is (configs/serve.yaml: its groups, executor=torch by default, and a
``serve`` node), built as a run is (`runner.build`), served until SIGINT or SIGTERM; then the
requests still in flight are aborted and the run directory is written as any run's
(requests.parquet, iterations.parquet, summary.json with ``served``), so `sarathi-lab-report`
reads a served session as it reads a simulated one. Exit status: 0, or 1 when the configuration
is refused, the engine failed or the run directory could not be written.
"""
from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

PROG = "sarathi-lab-serve"


class ServeError(SystemExit):
    """A reason to exit 1, said in one line (a SystemExit: Hydra passes it through)."""

    def __init__(self, message: str):
        super().__init__(f"{PROG}: error: {message}")


def check(c: dict, r) -> None:
    """What a served session cannot be: a simulation, a capacity search, several engines."""
    if r.executor_cls.simulated:
        raise ServeError(f"executor={c['executor']['name']}: {PROG} runs a real executor "
                         "(executor=torch); a simulator has no tokens to send")
    if r.run.mode != "run":
        raise ServeError(f"mode={r.run.mode}: {PROG} serves one engine (mode=run)")
    if r.disagg is not None or r.cluster.num_replicas != 1:
        raise ServeError(f"cluster: {PROG} serves one engine (cluster.num_replicas=1)")
    if c.get("trace"):
        raise ServeError("trace: a server's arrivals come from HTTP and it reads no trace "
                         "(drop trace=...; replay one against it with a client)")
    if getattr(r.executor_cfg, "pipeline_parallel", 1) != 1:
        raise ServeError(f"executor.pipeline_parallel: {PROG} serves one engine")


def configure(c: dict, overrides: list[str]):
    """(run config, `ServeConfig`, `Resolved`) from the composed configs/serve.yaml, checked
    before anything is built: every setting typed, none unread, nothing a server cannot be."""
    from sarathi_lab.config import resolve
    from sarathi_lab.serve.settings import ServeConfig
    from sarathi_lab.settings import ConfigError, parse
    try:
        sc = parse(ServeConfig, c.pop("serve", None) or {}, "serve")
        resolved = resolve(c, overrides)
        check(c, resolved)
    except ConfigError as e:
        raise ServeError(str(e)) from None
    return c, sc, resolved


async def _serve(server, sc, stop: asyncio.Event) -> None:
    from aiohttp import web
    runner = web.AppRunner(server.app(), handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, sc.host, sc.port)
    try:
        await site.start()
    except OSError as e:
        await runner.cleanup()
        raise ServeError(f"serve.host={sc.host} serve.port={sc.port}: cannot bind ({e})") \
            from None
    port = server.port = runner.addresses[0][1]
    print(f"{PROG}: serving {server.model_name!r} on http://{sc.host}:{port}/v1 "
          f"(policy {server.worker.engine.policy.name}); stop with Ctrl-C", flush=True)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    worker_gone = asyncio.ensure_future(asyncio.to_thread(server.worker.join))
    stopped = asyncio.ensure_future(stop.wait())
    await asyncio.wait({worker_gone, stopped}, return_when=asyncio.FIRST_COMPLETED)
    server.stopping = True
    server.worker.stop()   # in-flight requests end now, aborted; their handlers are told
    await worker_gone
    stopped.cancel()
    await runner.cleanup()


def serve(c: dict, resolved, run_dir: Path, sc) -> dict:
    """Build the engine, serve until stopped, write the run directory. Returns the summary."""
    from sarathi_lab.engine import Engine
    from sarathi_lab.runner import build, results, write_run
    from sarathi_lab.serve.app import Server
    from sarathi_lab.serve.text import StopWatch, load_tokenizer
    from sarathi_lab.serve.worker import Worker
    from sarathi_lab.topology import OpenLoop, Single
    t0 = time.perf_counter()
    tokenizer = load_tokenizer(sc.tokenizer, c["model"].get("path"))
    policy, executor = build(c, resolved)
    # a served request brings its own prompt: it ends at the model's EOS unless it asks not to
    engine = Engine(policy, executor, fast_forward=False, overlong=resolved.run.overlong,
                    why_not="a served session steps as its requests come")
    stop_watch = None if tokenizer is None else (lambda stops: StopWatch(tokenizer, stops))
    worker = Worker(engine, stop_watch)
    name = sc.model_name or str(c["model"].get("name"))
    server = Server(worker, name, sc.max_queue, tokenizer)
    worker.start()
    asyncio.run(_serve(server, sc, asyncio.Event()))
    if worker.error is None:
        try:   # the guard: nothing left queued or running, every KV block freed
            engine.finish()
        except RuntimeError as err:   # a bug: said, after what was served is written
            worker.error = err
    requests = worker.requests
    req_df, it_df, summary = results(c, resolved, Single(engine), OpenLoop(requests), requests,
                                     policy, executor, time.perf_counter() - t0)
    summary["load"] = {"mode": "served"}
    summary["executor"] = c["executor"]["name"]
    summary["served"] = {"host": sc.host, "port": server.port, "model_name": name,
                         "max_queue": sc.max_queue, "requests_accepted": len(requests),
                         "http_status": {str(k): v for k, v in sorted(server.counts.items())},
                         "engine_error": None if worker.error is None else
                         f"{type(worker.error).__name__}: {worker.error}"}
    write_run(run_dir, req_df, it_df, summary)
    if worker.error is not None:
        raise ServeError(f"the engine stopped: {type(worker.error).__name__}: {worker.error} "
                         f"(the run directory {run_dir} holds what it served)")
    return summary


@hydra.main(version_base="1.3", config_path="pkg://sarathi_lab.configs", config_name="serve")
def _main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig
    from sarathi_lab.summary_text import format_summary
    hc = HydraConfig.get()
    c, sc, resolved = configure(OmegaConf.to_container(cfg, resolve=True),
                                list(hc.overrides.task))
    n = c.get("num_threads", "auto")
    if isinstance(n, int):
        import torch
        torch.set_num_threads(n)
    run_dir = Path(hc.runtime.output_dir)
    try:
        summary = serve(c, resolved, run_dir, sc)
    except ValueError as e:   # a setting found wrong while building (memory, a model path)
        raise ServeError(str(e)) from None
    print(format_summary(summary))
    print(f"\nrun directory: {run_dir.resolve()}", flush=True)


def main() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import importlib.util
    # the optional extra, checked before a model is built; the help needs none of it
    helps = ("-h", "--help", "--hydra-help", "--info", "-i", "--cfg", "-c")
    if importlib.util.find_spec("aiohttp") is None and not set(sys.argv[1:]) & set(helps):
        sys.exit(f"{PROG}: error: aiohttp is not installed: pip install 'sarathi-lab[serve]'")
    if any(a in ("-m", "--multirun") for a in sys.argv[1:]):
        sys.exit(f"{PROG}: error: -m: a server serves one configuration (no multirun)")
    from sarathi_lab.sweeps import register_resolvers
    register_resolvers()
    _main()


if __name__ == "__main__":
    main()
