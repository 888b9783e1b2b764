"""What a profile measures: its row columns, and the grids of points (cpu, gpu, tiny) per
operator."""
from __future__ import annotations

import itertools
from dataclasses import dataclass

# columns of a profile row (profiles.py documents their meaning)
COLUMNS = ("operator", "num_tokens", "chunk", "batch", "context", "decode_context", "place",
           "time_s", "time_p10_s", "time_p90_s", "repeats")


@dataclass(frozen=True)
class Grid:
    linear: tuple           # T: one prompt of T tokens at context 0
    prefill: tuple          # (chunk, context)
    decode: tuple           # (batch, context)
    mixed: tuple            # (chunk, context, batch, decode context): held-out iterations
    # T: a prompt of T tokens, then its request's decodes, each timed (`Harness.stream`): how
    # much slower the decodes right after a prompt step run than steady ones (decode_rewarm)
    rewarm: tuple = ()


def _prod(a, b):
    return tuple(itertools.product(a, b))


# the sizes (tokens of a prompt, requests of a decode batch) the cpu grid measures each of
SMALL = 8


GRIDS = {
    # a CPU, one thread: 25 s for experiments/fidelity's 5M-parameter Llama (52 s at a load of
    # 4); SmolLM2-135M does ~12k tokens a pass (~45 s on a quiet core, ~5 min for the 6 passes
    # by default, before the unmeasured step of each point added ~30% (19 -> 25 s on the 5M
    # Llama); measured 3.6 s a step, ~26 min, under a load average of 10 on 2 cores)
    # Every size up to SMALL is measured, not read between powers of two: on a CPU an odd
    # number of rows in a matrix multiply costs more than the even number above it (the
    # kernels block rows; a remainder takes a slower path). On experiments/fidelity's model,
    # steady streams: a 3-token forward's linear layers 2.86 ms against 2.75 for 4 tokens,
    # 3.11 for 5 against 2.84 for 6; a decode step of 3 requests 5.40 ms against 5.16 and 5.19
    # for 2 and 4. Read between 2 and 4, the real runs' decode steps of 3 requests took
    # 1.10-1.12x the prediction where those of 2 took 1.01-1.04x.
    "cpu": Grid(linear=(*range(1, SMALL + 1), 16, 32, 64, 128, 256, 384, 512, 1024, 2048),
                prefill=_prod((16, 64, 128, 256, 512), (0, 256, 512, 1024))
                + ((768, 0), (768, 256), (1024, 0)),
                decode=_prod((*range(1, SMALL + 1), 16, 32, 64), (16, 256, 512, 1024)),
                mixed=((64, 128, 4, 256), (128, 0, 8, 512), (256, 256, 16, 128),
                       (32, 512, 2, 64), (200, 100, 12, 300)),
                rewarm=(64, 128, 256, 512)),
    # a GPU: larger batches and contexts, finer steps; no rewarm points (a GPU's decode step
    # is not known to run slower after a prompt step; add prompt sizes to measure it)
    "gpu": Grid(linear=(1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768,
                        1024, 1536, 2048, 3072, 4096),
                prefill=_prod((16, 32, 64, 128, 256, 512, 1024, 2048, 4096),
                              (0, 512, 1024, 2048, 4096, 8192)),
                decode=_prod((1, 2, 4, 8, 16, 32, 64, 128, 256),
                             (16, 256, 512, 1024, 2048, 4096)),
                mixed=((256, 512, 32, 1024), (512, 0, 64, 2048), (1024, 2048, 128, 512),
                       (64, 4096, 16, 256), (2000, 1000, 100, 3000))),
    # tests: seconds with a tiny random Llama
    "tiny": Grid(linear=(1, 4, 16, 32, 64, 128),
                 prefill=_prod((8, 32, 64, 128), (0, 64, 192)),
                 decode=_prod((1, 4, 8, 16), (16, 128, 256)),
                 mixed=((48, 32, 4, 100), (24, 96, 8, 64), (100, 0, 12, 160)),
                 rewarm=(32, 128)),
}


def points(grid: Grid) -> list[tuple[str, tuple, list]]:
    """(kind, key, batch entries) for every point of the grid; the first three measure the
    attention's fixed cost per iteration."""
    chunk, decode = (16, 0), (1, 16)
    pts = [("floor", (), [chunk]), ("floor", (), [decode]), ("floor", (), [chunk, decode])]
    pts += [("linear", (T,), [(T, 0)]) for T in grid.linear]
    pts += [("prefill", (c, k), [(c, k)]) for c, k in grid.prefill]
    pts += [("decode", (b, k), [(1, k)] * b) for b, k in grid.decode]
    pts += [("mixed", (c, k, b, kd), [(c, k)] + [(1, kd)] * b) for c, k, b, kd in grid.mixed]
    pts += [("rewarm", (T,), [(T, 0)]) for T in grid.rewarm]
    return pts
