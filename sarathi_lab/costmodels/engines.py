"""Engine presets (``executor.engine``): the CPU side of an iteration that the serving engine
being simulated charges on top of the GPU's time.

A synchronous engine loop (vLLM v0) schedules, prepares inputs, samples and processes outputs
between two forward passes, so the GPU waits for that host work every iteration: the cost
models add ``iteration_overhead_s + B x request_overhead_s`` (B requests in the batch) to the
GPU's time. Engines that overlap the host work of step n with the GPU work of step n + 1
(TensorRT-LLM's overlap scheduler, SGLang's zero-overhead batch scheduler, vLLM V1's async
scheduling) hide it while it is shorter than the GPU step. Their host times are not published
as per-iteration and per-request figures, so there is no preset with numbers for them (none is
made up); ``none`` is the bound such an engine approaches: no host time charged.

| preset    | per iteration              | per request                | source |
|-----------|----------------------------|----------------------------|--------|
| `vllm-v0` | the hardware preset's      | the hardware preset's      | Vidur's measurements of vLLM v0 on A100 (1.4 ms, 0.1 ms: configs/hardware/*.yaml) |
| `none`    | 0                          | 0                          | a host side wholly overlapped with the GPU (a bound, not a measurement) |

``vllm-v0`` is the default: every calibration and committed result of this project prices the
host side with it, and it is the engine the seed papers (Sarathi-Serve, vLLM, Vidur) measured.
"""
from __future__ import annotations

#: preset -> (iteration_overhead_s, request_overhead_s); None: the hardware preset's own
ENGINES: dict[str, tuple[float, float] | None] = {
    "vllm-v0": None,
    "none": (0.0, 0.0),
}
DEFAULT = "vllm-v0"

#: the cost-model settings an engine preset fills, as the engine's own terms
HOST_TERMS = ("iteration_overhead_s", "request_overhead_s")


def host_terms(engine: str) -> tuple[float, float] | None:
    """The preset's (per iteration, per request) seconds; None: the hardware preset's."""
    if engine not in ENGINES:
        raise ValueError(f"engine={engine!r}: one of {', '.join(ENGINES)}")
    return ENGINES[engine]


def engine_hardware(engine: str, hardware: dict) -> dict:
    """The hardware preset with its host-side terms replaced by the engine's (a copy; the
    preset itself unchanged when the engine takes the preset's own)."""
    terms = host_terms(engine)
    if terms is None:
        return hardware
    return {**hardware, **dict(zip(HOST_TERMS, terms))}
