"""`sarathi-lab-serve`: a policy and the real executor behind an OpenAI-compatible HTTP server.

Configured as `sarathi-lab` is (configs/serve.yaml: its groups, executor=torch by default, and a
``serve`` node), checked here, built as a run is (`runner.build`) in the engine process
(`engine_process`), served until SIGINT or SIGTERM; then the requests still in flight are
aborted and the run directory is written as any run's (requests.parquet, iterations.parquet,
summary.json with ``served``), so `sarathi-lab-report` reads a served session as it reads a
simulated one. Until then the requests that ended are in the run directory's journal
(`sarathi_lab.run.journal`), which a crash leaves for `sarathi-lab-report` to recover. Exit status:
0, or 1 when the configuration is refused, the engine failed or died, or the run directory
could not be written.
"""
from __future__ import annotations

import asyncio
import ipaddress
import os
import signal
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from sarathi_lab.serve.configure import PROG, ServeError, configure

API_KEY_ENV = "SARATHI_LAB_API_KEY"

HELP = f"""usage: {PROG} [KEY=VALUE ...]

Serve one scheduling policy and the real PyTorch executor behind an OpenAI-compatible HTTP
server (/v1/completions, /v1/chat/completions, /v1/models, /health, /metrics), until Ctrl-C or
SIGTERM; then write the run directory (requests.parquet, iterations.parquet, summary.json) that
sarathi-lab-report reads. Configured as sarathi-lab is, from configs/serve.yaml: its groups
(scheduler=, model=, executor=, slo=) and any key as KEY=VALUE; executor=torch and
model=tiny-llama (random weights: token-id prompts) by default.

serve settings:
{{settings}}
  {API_KEY_ENV} (environment): the API key when serve.api_key is null

main keys of the run:
  scheduler=NAME            the policy: sarathi, vllm, orca, ... or a plug-in's name
  model=NAME | model.path=DIR model.name=NAME   a preset, or a local checkpoint
  executor.device=cpu|cuda  executor.temperature=0  executor.top_p=1
  num_threads=N             torch's CPU threads

examples:
  {PROG} serve.port=0              # tiny-llama on a free port
  {PROG} model.path=~/.cache/sarathi_lab/models/smollm2 model.name=smollm2 scheduler=vllm
  {API_KEY_ENV}=secret {PROG} serve.host=0.0.0.0   # other machines, with a key

More: sarathi_lab/docs/serving.md (routes, fields, errors, the run directory) and
settings.md (every key). Hydra's own help: --hydra-help; the composed config: --cfg job."""


def help_text() -> str:
    """HELP with the ``serve`` keys, each with its default and help line (ServeConfig's)."""
    import textwrap
    from dataclasses import fields

    from sarathi_lab.serve.settings import ServeConfig
    rows = []
    for f in fields(ServeConfig):
        key = f"serve.{f.name}={'null' if f.default is None else f.default}"
        rows.append(textwrap.fill(f.metadata.get("help", ""), 96, initial_indent=f"  {key:<26}",
                                  subsequent_indent=" " * 28))
    return HELP.format(settings="\n".join(rows))


def api_key(sc) -> tuple[str | None, str]:
    """(the key, where it came from): serve.api_key, else $SARATHI_LAB_API_KEY, else none. The
    setting wins, as a command-line flag wins over an environment variable elsewhere."""
    if sc.api_key is not None:
        if not sc.api_key.strip():
            raise ServeError("serve.api_key: an empty key (null: no key)")
        return sc.api_key, "serve.api_key"
    env = os.environ.get(API_KEY_ENV, "").strip()
    return (env, API_KEY_ENV) if env else (None, "")


def is_loopback(host: str) -> bool:
    """Whether `host` binds only this machine (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:   # a name: it may resolve to any address
        return False


def exposure_warning(host: str, key: str | None) -> str | None:
    """The start-up warning for an address other machines reach, served without a key."""
    if key is not None or is_loopback(host):
        return None
    return (f"{PROG}: warning: serve.host={host} is reachable from other machines and no API "
            f"key is set (serve.api_key or {API_KEY_ENV}): anyone who reaches the port can use "
            "the model")


def redact(run_dir: Path, secret: str) -> None:
    """Blank a key given as serve.api_key out of the .hydra files Hydra wrote (the config and
    the overrides), so that a run directory that is shared or committed holds no secret."""
    for f in (run_dir / ".hydra").glob("*.yaml"):
        text = f.read_text()
        if secret in text:
            f.write_text(text.replace(secret, "<redacted>"))


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
    warning = exposure_warning(sc.host, server.api_key)
    if warning:
        print(warning, file=sys.stderr, flush=True)
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


def serve(c: dict, overrides: list[str], run_dir: Path, sc, num_threads,
          key: str | None = None) -> None:
    """Start the engine process, serve until stopped; the engine process writes the run
    directory (`engine_process`) and this prints its summary. `key`: the API key, or None."""
    from dataclasses import asdict

    from sarathi_lab.serve.app import Server
    from sarathi_lab.serve.engine_client import EngineClient, EngineFailed
    from sarathi_lab.serve.engine_process import start
    from sarathi_lab.serve.metrics import Metrics
    from sarathi_lab.serve.text import load_tokenizer
    tokenizer = load_tokenizer(sc.tokenizer, c["model"].get("path"))
    name = sc.model_name or str(c["model"].get("name"))
    # the key stays here: the engine process records only whether there is one
    proc, link = start(c, overrides, {**asdict(sc), "api_key": None}, run_dir, num_threads,
                       {"api_key": key is not None})
    client = EngineClient(proc, link)
    client.metrics = Metrics(name, lambda: client.stats)
    try:
        client.wait_ready()
    except EngineFailed as e:
        raise ServeError(str(e).removeprefix(f"{PROG}: error: ")) from None
    except KeyboardInterrupt:   # Ctrl-C while the model loads (the engine ignores SIGINT)
        proc.kill()
        raise ServeError("interrupted while the engine was being built") from None
    server = Server(client, name, sc.max_queue, tokenizer, api_key=key, metrics=client.metrics)
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
    key, source = api_key(sc)
    if source == "serve.api_key":
        redact(run_dir, key)
    if key is not None:
        print(f"{PROG}: every route but /health asks for the API key ({source})", flush=True)
    try:
        serve(c, list(hc.overrides.task), run_dir, sc, c.get("num_threads", "auto"), key)
    except ValueError as e:   # a setting found wrong (a tokenizer path)
        raise ServeError(str(e)) from None


def main() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if any(a in ("-h", "--help") for a in sys.argv[1:]):
        print(help_text())
        return
    import importlib.util
    # the optional extra, checked before a model is built; the help needs none of it
    helps = ("-h", "--help", "--hydra-help", "--info", "-i", "--cfg", "-c")
    if importlib.util.find_spec("aiohttp") is None and not set(sys.argv[1:]) & set(helps):
        sys.exit(f"{PROG}: error: aiohttp is not installed: pip install 'sarathi-lab[serve]'")
    if any(a in ("-m", "--multirun") for a in sys.argv[1:]):
        sys.exit(f"{PROG}: error: -m: a server serves one configuration (no multirun)")
    from sarathi_lab.sweeps.bookkeeping import register_resolvers
    register_resolvers()
    _main()


if __name__ == "__main__":
    main()
