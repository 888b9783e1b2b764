"""A served session's configuration, checked before anything is built: what `sarathi-lab-serve`
(HTTP process) and the engine process (`engine_process`) both read, below both."""
from __future__ import annotations

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
    from sarathi_lab.run.config import resolve
    from sarathi_lab.serve.settings import ServeConfig
    from sarathi_lab.settings import ConfigError, parse
    try:
        sc = parse(ServeConfig, c.pop("serve", None) or {}, "serve")
        resolved = resolve(c, overrides)
        check(c, resolved)
    except ConfigError as e:
        raise ServeError(str(e)) from None
    return c, sc, resolved
