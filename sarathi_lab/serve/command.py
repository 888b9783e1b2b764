"""`sarathi-lab-serve`: a policy and the real executor behind an OpenAI-compatible HTTP server.

Configured as `sarathi-lab` is (configs/serve.yaml: its groups, executor=torch by default, and a
``serve`` node), checked here, built as a run is (`runner.build`) in the engine process
(`engine_process`), served until SIGINT or SIGTERM; then the requests still in flight are
aborted and the run directory is written as any run's (requests.parquet, iterations.parquet,
summary.json with ``served``), so `sarathi-lab-report` reads a served session as it reads a
simulated one. Until then the requests that ended are in the run directory's journal
(`sarathi_lab.journal`), which a crash leaves for `sarathi-lab-report` to recover. Exit status:
0, or 1 when the configuration is refused, the engine failed or died, or the run directory
could not be written.
"""
from __future__ import annotations

import asyncio
import os
import signal
import sys
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
    client = server.worker
    client.attach(asyncio.get_running_loop())
    runner = web.AppRunner(server.app(), handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, sc.host, sc.port)
    try:
        await site.start()
    except OSError as e:
        await runner.cleanup()
        client.quit()
        raise ServeError(f"serve.host={sc.host} serve.port={sc.port}: cannot bind ({e})") \
            from None
    port = server.port = runner.addresses[0][1]
    print(f"{PROG}: serving {server.model_name!r} on http://{sc.host}:{port}/v1 "
          f"(policy {client.info['policy']}); stop with Ctrl-C", flush=True)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    halted = asyncio.ensure_future(client.halted.wait())
    stopped = asyncio.ensure_future(stop.wait())
    await asyncio.wait({halted, stopped}, return_when=asyncio.FIRST_COMPLETED)
    server.stopping = True
    client.stop()   # in-flight requests end now, aborted; their handlers are told
    await halted
    stopped.cancel()
    for _ in range(100):   # the handlers answer what they were told (counted below)
        if not server.in_flight:
            break
        await asyncio.sleep(0.05)
    client.finish({"port": port, "http_status": {str(k): v for k, v in
                                                 sorted(server.counts.items())}})
    await client.gone.wait()
    await runner.cleanup()


def serve(c: dict, overrides: list[str], run_dir: Path, sc, num_threads) -> None:
    """Start the engine process, serve until stopped; the engine process writes the run
    directory (`engine_process`) and this prints its summary."""
    from dataclasses import asdict
    from sarathi_lab.serve.app import Server
    from sarathi_lab.serve.engine_client import EngineClient, EngineFailed
    from sarathi_lab.serve.engine_process import start
    from sarathi_lab.serve.metrics import Metrics
    from sarathi_lab.serve.text import load_tokenizer
    tokenizer = load_tokenizer(sc.tokenizer, c["model"].get("path"))
    name = sc.model_name or str(c["model"].get("name"))
    proc, link = start(c, overrides, asdict(sc), run_dir, num_threads)
    client = EngineClient(proc, link)
    client.metrics = Metrics(name, lambda: client.stats)
    try:
        client.wait_ready()
    except EngineFailed as e:
        raise ServeError(str(e).removeprefix(f"{PROG}: error: ")) from None
    except KeyboardInterrupt:   # Ctrl-C while the model loads (the engine ignores SIGINT)
        proc.kill()
        raise ServeError("interrupted while the engine was being built") from None
    server = Server(client, name, sc.max_queue, tokenizer, client.metrics)
    try:
        asyncio.run(_serve(server, sc, asyncio.Event()))
    finally:
        proc.join(30)
        if proc.is_alive():   # it did not end after its pipe closed: never left behind
            proc.kill()
    if client.result is not None:
        print(client.result[0], flush=True)
    if client.error is not None:   # the engine's, or the engine process died
        raise ServeError(client.error)


@hydra.main(version_base="1.3", config_path="pkg://sarathi_lab.configs", config_name="serve")
def _main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig
    hc = HydraConfig.get()
    c, sc, resolved = configure(OmegaConf.to_container(cfg, resolve=True),
                                list(hc.overrides.task))
    run_dir = Path(hc.runtime.output_dir)
    try:
        serve(c, list(hc.overrides.task), run_dir, sc, c.get("num_threads", "auto"))
    except ValueError as e:   # a setting found wrong (a tokenizer path)
        raise ServeError(str(e)) from None


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
