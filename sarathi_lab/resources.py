"""Up-front bounds on what a run holds in memory: refuse, before building it, a run that cannot
fit this machine, naming the setting that asks for it, the estimate and the limit.

A run holds every request (its record, and one time per output token) and every engine (its
policy, executor, KV bookkeeping and its share of the summary) until its tables are written. The
bytes of each, measured once on a whole run's traced peak
(`experiments/calibration/measure_resources.py`, rounded up):

    a request            ~1,011 bytes + ~64 per output token   -> REQUEST_BYTES, TOKEN_BYTES
    an engine (replica)  ~431 KB (Mistral-7B on an A100)        -> ENGINE_BYTES

A generated trace that carries token ids (multi-turn sessions) holds them in Python lists: an
8-byte pointer and a 28-byte int each (`sys.getsizeof(32000)`)          -> ID_BYTES

KV blocks cost nothing until used (`kv.block_pool` makes them on first use), so neither
`scheduler.num_kv_blocks` nor the simulator's swap space is counted here; the swap space is bounded
by the host memory it would take (`Executor.check_swap_memory`). The limit is the memory
available when the run starts (Linux's MemAvailable), or ``SARATHI_LAB_MEMORY_GIB`` if set (a
machine's property, not the experiment's: it is not recorded in the run).
"""
from __future__ import annotations

import os

from sarathi_lab.settings import ConfigError

REQUEST_BYTES = 1_100
TOKEN_BYTES = 70
ENGINE_BYTES = 450_000
ID_BYTES = 36
LIMIT_ENV = "SARATHI_LAB_MEMORY_GIB"


def available_memory() -> int | None:
    """Bytes of host memory available now (Linux's MemAvailable), or None if unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def memory_limit() -> tuple[int | None, str]:
    """(bytes a run may hold, where that limit comes from); None: unknown, nothing checked."""
    given = os.environ.get(LIMIT_ENV)
    if given:
        try:
            gib = float(given)
        except ValueError:
            gib = -1.0
        if not gib > 0:
            raise ConfigError(f"{LIMIT_ENV}={given!r}: must be a number of GiB > 0")
        return int(gib * 2**30), f"{LIMIT_ENV}={given}"
    return available_memory(), f"the memory available now; {LIMIT_ENV}=GiB sets another"


def check_memory(parts: list[tuple[str, int, int, str]]) -> None:
    """ConfigError if the parts' bytes exceed the limit. `parts`: (setting as the user wrote
    it, count, bytes each, what one is), e.g. ("cluster.num_replicas=2000", 2000,
    ENGINE_BYTES, "engine"); the message names the largest part's setting to lower."""
    need = sum(n * each for _, n, each, _ in parts)
    limit, source = memory_limit()
    if limit is None or need <= limit:
        return
    gib = 2**30
    items = ", ".join(f"{setting}: {n:,} x "
                      f"{f'{each / 1e3:,.1f} kB' if each >= 1000 else f'{each} bytes'} per {what}"
                      for setting, n, each, what in parts if n)
    worst = max(parts, key=lambda p: p[1] * p[2])[0].split("=")[0]
    raise ConfigError(f"{worst}: the run would hold about {need / gib:,.1f} GiB ({items}; "
                      f"measured per item, sarathi_lab/resources.py) but {limit / gib:,.1f} GiB "
                      f"is the limit ({source}); lower {worst}")


def engines_setting(resolved) -> tuple[str, int]:
    """(the setting that sets the run's engine count, as written, and that count): a fleet's
    replicas, a pipeline's virtual engines or both disaggregated pools."""
    if resolved.disagg is not None:
        p, d = resolved.disagg.prefill.num_replicas, resolved.disagg.decode.num_replicas
        return (f"cluster.prefill.num_replicas={p} + cluster.decode.num_replicas={d}", p + d)
    pp = getattr(resolved.executor_cfg, "pipeline_parallel", 1)
    if pp > 1:
        return f"executor.pipeline_parallel={pp}", pp
    n = resolved.cluster.num_replicas
    return f"cluster.num_replicas={n}", n


def output_tokens_held(prompt, output, max_model_len: int) -> int:
    """The most output tokens the requests can hold (for `check_run`): no request emits past
    max_model_len, whether it is rejected (overlong=reject) or served cut short
    (overlong=cap), so a trace row asking for 1e12 tokens counts for what fits, and the engine
    rejects that request alone with its reason."""
    import numpy as np
    room = np.maximum(max_model_len - np.asarray(prompt, np.int64), 0)
    return int(np.minimum(np.asarray(output, np.int64), room).sum())


def check_run(resolved, num_requests: int | None, output_tokens: int = 0) -> None:
    """Before a run is built: its engines and requests (`num_requests`: None when unknown
    before its trace is read; `output_tokens`: the workload's, once known) fit the limit."""
    setting, engines = engines_setting(resolved)
    parts = [(setting, engines, ENGINE_BYTES, "engine")]
    if num_requests is not None:
        parts.append((f"trace.num_requests={num_requests}", num_requests, REQUEST_BYTES,
                      "request"))
        parts.append((f"trace.num_requests={num_requests} (their output tokens)",
                      output_tokens, TOKEN_BYTES, "output token"))
    check_memory(parts)
