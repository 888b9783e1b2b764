"""`sarathi-lab-profile`: measure the real (torch) executor on this machine and write a profile that
the profiled cost model reads (``executor.cost_model=profiled executor.profile=PATH``).

    sarathi-lab-profile model=tiny-llama --out profile.parquet [--grid cpu|gpu|tiny]
        [--repeats 5] [--warmup 2] [--threads N] [--warm-steps 16] [other overrides ...]

Every measured point is one real iteration through `TorchExecutor.execute` (input preparation,
the forward pass, sampling) on a synthetic batch whose requests sit at the wanted contexts in a
paged KV cache, timed after an unmeasured step that brings them there (`Harness._prime`); a decode
batch after a stream of `--warm-steps` decode steps of its own (`measure.WARM_STEPS`), as a run
decodes, and the linear layers after as many repeats of their prompt. Inside
it, the attention kernels (KV write + paged attention) and the LM head are timed by wrapping
them, and the executor's own phase timers split the rest:

    linear(T)                 forward - attention - LM head, one prompt of T tokens at context 0
                              after repeats of it (its first step, before them, gives
                              prefill_attention(T, 0): a first chunk comes alone in a run)
    prefill_attention(c, k)   forward - LM head - linear(c) of one chunk of c tokens after k in
                              KV: the kernels, and what reading the KV costs the rest of the
                              forward (the cache it takes from the weights)
    decode_attention(b, k)    forward - LM head - linear(b) of b decodes, each after k in KV
    (the attention kernels' fixed cost per iteration, which an iteration pays once however many
    chunks and decodes it holds, is moved from the attention rows to linear: summing a chunk's
    and the decodes' attention would otherwise count it twice. It is measured as
    A(chunk) + A(decode) - A(chunk with the decode), three small batches of the grid.)
    lm_head(S)                the LM head on S sampled rows (from the decode batches)
    overhead(B)               input preparation + sampling of a batch of B requests: the
                              iteration minus its operators (B = 1: a one-token batch)
    iteration                 whole iterations of mixed batches (one chunk + decodes), held out:
                              never used to predict, only to check the fit (`check`)
    decode_rewarm(T, p)       the whole step of the p-th decode after a prompt step of T tokens
                              (its own request's), p = 1..--warm-steps, and p = 0 the steady
                              one (the median of the 8 after them): on a CPU the first decodes
                              after a prompt step run slower (the grid's `rewarm` sizes; none
                              with --warm-steps 0; `costmodels.rewarm`)

The grid is measured in rounds (every point once per round, after a warm-up pass) so that a burst
of load on a shared machine spreads over all points instead of spoiling one; each row holds the
median of the rounds and their 10th/90th percentiles. The file's metadata records the model,
dtype, device, torch threads, the clock (`executor.clock`: wall, or on a
CPU with one thread the thread's CPU time, steady on a busy machine) and library versions.

Modules: grids (what is measured), harness (one timed iteration), measure (rounds, rows), files
(metadata, write, merge, read back), check (held-out iterations), command (the command).
"""
from sarathi_lab.profiler.check import check
from sarathi_lab.profiler.command import build_executor, host_hardware, main, profile
from sarathi_lab.profiler.files import (
           device_name,
           merge,
           metadata,
           model_of,
           profile_meta,
           versions,
           write,
)
from sarathi_lab.profiler.grids import COLUMNS, GRIDS, Grid
from sarathi_lab.profiler.harness import Harness
from sarathi_lab.profiler.measure import STATISTICS, WARM_STEPS, measure

__all__ = ["COLUMNS", "GRIDS", "Grid", "Harness", "STATISTICS", "WARM_STEPS", "build_executor",
           "check", "device_name", "host_hardware", "main", "measure", "merge", "metadata",
           "model_of", "profile", "profile_meta", "versions", "write"]
