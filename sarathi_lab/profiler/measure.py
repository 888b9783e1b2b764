"""Measuring a grid in rounds (every point once per round, after a warm-up pass), one row per point:
the median (or min) of the rounds and their 10th/90th percentiles."""
from __future__ import annotations

import logging

import numpy as np

from sarathi_lab.profiler.grids import COLUMNS, Grid, points
from sarathi_lab.profiler.harness import Harness

log = logging.getLogger(__name__)


def _stats(x) -> tuple[float, float, float]:
    a = np.asarray(x, dtype=float)
    return float(np.median(a)), float(np.percentile(a, 10)), float(np.percentile(a, 90))


def _row(op, samples, stat, **cols) -> dict:
    med, p10, p90 = _stats(samples)
    if stat != "median":
        med = float(STATISTICS[stat](samples))
    row = dict.fromkeys(COLUMNS)
    row.update(operator=op, time_s=med, time_p10_s=p10, time_p90_s=p90, repeats=len(samples),
               **cols)
    return row


# what a row's time_s is over the rounds: the median (what a typical iteration takes, noise
# included), the minimum (the machine's own cost: on a shared machine, the noise of other jobs
# only ever adds time) or the mean (what an iteration takes on average: a latency is a sum of
# iterations, whose expectation is the sum of their means, and a step's time on a shared CPU is
# skewed to the right, so the median predicts every sum low)
STATISTICS = {"median": np.median, "min": np.min, "mean": np.mean}


# Unmeasured steps of a point's own shape run back to back before its steady measurement
# (`Harness.run`'s `warm`). A run decodes step after step, and on a CPU a decode step gets faster
# over the first steps of such a stream (the weights it streams stay in the caches): on
# experiments/fidelity's model, one decode at context ~250 took 4.63, 3.88, 3.60, 3.37, 3.19 ms
# in the first steps after its prompt and ~2.97 ms from the 10th on, at a load of ~2; the gain
# shrinks as other jobs share the caches (steady / second step 0.74 on a quiet machine, 0.86 at
# a load of 5, 0.94 at 7-9: experiments/fidelity/decode_warmth.py). Timed after one prime step, as the profile did, a
# decode point was the second step of its shape, and a real run's single-request decodes took
# 0.71-0.81 of the profile's prediction in every run of that study. 16 steps reach the steady
# time with room.
WARM_STEPS = 16

# Steps timed after a rewarm point's `warm` places, whose median is its steady time (place 0).
# A decode right after a prompt step runs slower than a steady one, and the step after that a
# little less so, over about as many steps as WARM_STEPS: on experiments/fidelity's model every
# part of the step (input preparation, the layers, the LM head, sampling) ran 1.6-2.0x its steady
# time right after a prompt of 256-512 tokens, 1.3x after one of 64, back to ~1.05 by the 8th
# decode (decode_rewarm rows; the profiled cost model charges them, `costmodels.rewarm`).
REWARM_STEADY = 8

# Decode steps of another request before a step timed as it comes (`_point`): by the rewarm
# rows, the 8th decode after a prompt step runs within ~5% of a steady one, the state a run's
# chunks, which come between decodes, find the machine in.
SETTLE_STEPS = 8


def measure(harness: Harness, grid: Grid, repeats: int = 5, warmup: int = 1,
            progress: bool = False, statistic: str = "median",
            warm: int = WARM_STEPS) -> list[dict]:
    """Profile rows for `grid`: a warm-up pass, then `repeats` rounds over every point. Each
    row's time_s is the `statistic` of the rounds (STATISTICS)."""
    if statistic not in STATISTICS:
        raise ValueError(f"statistic={statistic!r}: one of {', '.join(STATISTICS)}")
    return profile_rows(*rounds(harness, grid, repeats, warmup, progress, warm), statistic)


def _point(harness: Harness, kind: str, entries, warm: int) -> dict:
    """One measurement of a grid point, its parts' seconds. A decode batch is timed in a steady
    stream (`warm` decode steps before it), as a run decodes. A prompt at context 0 (a linear
    point) is timed both ways: as the first step of its shape, as a run's prefill chunks come
    (between decodes), for the attention of a chunk at context 0; and after `warm` repeats,
    "steady_" parts, for the linear layers, which the decode batches' attention is the rest
    of (a linear curve of first steps would take more than a steady decode's whole forward).
    Every linear point is timed so, not only those of a decode batch's size: a curve of one
    state at some T and another at others would move the step's cold cost between a chunk's
    linear layers and its attention (the rest of its forward) across T, and the attention
    surface's monotone fit would pool the chunks on one side down to those on the other.
    Every step timed as it comes (a linear point's first step, the floor and held-out mixed
    points) follows SETTLE_STEPS decodes of another request (with `warm` > 0;
    `Harness._settle`), as a run's first chunks come between decodes; a chunk after context,
    right after its previous chunk, which those decodes precede (`Harness.run`'s
    after_chunk), as a chunked prompt runs."""
    if kind == "decode":
        return harness.run(entries, warm=warm)
    if kind == "rewarm":   # the decodes after a prompt: places 1..warm, then the steady ones
        times = harness.stream(entries[0][0], warm + REWARM_STEADY)
        return {**{f"place_{p}": t for p, t in enumerate(times[:warm], 1)},
                "steady": float(np.median(times[warm:]))}
    if kind == "prefill" and entries[0][1] > 0 and warm:   # a chunk after its previous one
        return harness.run(entries, settle=SETTLE_STEPS, after_chunk=True)
    parts = harness.run(entries, settle=SETTLE_STEPS if warm else 0)
    if kind == "linear" and warm:
        parts.update({f"steady_{k}": v for k, v in harness.run(entries, warm=warm).items()})
    return parts


def rounds(harness: Harness, grid: Grid, repeats: int = 5, warmup: int = 1,
           progress: bool = False, warm: int = WARM_STEPS) -> tuple[list, list]:
    """The grid's points and, per point, its parts' seconds in every round (arrays), for
    `profile_rows`: one measurement gives a profile of each statistic. `warm`: the steps a
    decode batch's stream runs before it is timed (WARM_STEPS; 0: one prime step only)."""
    if repeats < 1 or warmup < 0 or warm < 0:
        raise ValueError(f"repeats={repeats} must be >= 1, warmup={warmup} and warm={warm} "
                         ">= 0")
    # without a warm stream the decode points are not steady, and the rewarm points' factors
    # (over steady decodes) would not apply to them
    pts = [p for p in points(grid) if warm or p[0] != "rewarm"]
    longest = harness.ex.max_model_len()

    def tokens(kind, entries):   # the longest sequence a point holds, and all of them
        if kind == "rewarm":     # its prompt and the decodes after it
            n = entries[0][0] + warm + REWARM_STEADY + 1
            return n, n
        return max(n + k for n, k in entries), sum(n + k for n, k in entries)
    fits = [p for p in pts if tokens(p[0], p[2])[0] <= longest]
    if len(fits) < len(pts):
        log.warning("profile grid: %d of %d points hold a sequence longer than the model's "
                    "max_model_len=%d and are left out", len(pts) - len(fits), len(pts), longest)
    pts = fits
    # room for the decodes that settle the machine before a step (`Harness._settle`)
    from sarathi_lab.profiler.harness import SETTLE_PROMPT
    harness.bind(max(tokens(kind, e)[1] for kind, _, e in pts) + SETTLE_PROMPT + SETTLE_STEPS + 2)
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=len(pts) * (warmup + repeats), unit="step", desc="profiling",
                   mininterval=0.5)
    for _ in range(warmup):
        for kind, _, entries in pts:
            _point(harness, kind, entries, warm)
            bar and bar.update()
    got = [[] for _ in pts]
    for _ in range(repeats):
        # a step to take the cost of following the previous round's largest batch (freed
        # memory, cold caches), which would otherwise fall on the attention-floor points
        harness.run(pts[0][2], settle=SETTLE_STEPS if warm else 0)
        for i, (kind, _, entries) in enumerate(pts):
            got[i].append(_point(harness, kind, entries, warm))
            bar and bar.update()
    if bar is not None:
        bar.close()
    return pts, [{p: np.array([x[p] for x in got_i]) for p in got_i[0]} for got_i in got]


def profile_rows(pts, parts, statistic: str = "median") -> list[dict]:
    """Profile rows from `rounds`' measurements, each time_s the `statistic` of its rounds."""
    if statistic not in STATISTICS:
        raise ValueError(f"statistic={statistic!r}: one of {', '.join(STATISTICS)}")
    # the attention kernels' fixed cost per iteration
    a, b, ab = (x["attention"] for x in parts[:3])
    stat = STATISTICS[statistic]
    # a fixed cost no larger than either batch's whole attention
    floor = min(max(float(stat(a + b - ab)), 0.0), float(stat(a)), float(stat(b)))
    # the linear layers in a steady stream where measured so (`_point`)
    rows = [_row("linear", col.get("steady_linear", col["linear"]) + floor, statistic,
                 num_tokens=key[0])
            for (kind, key, _), col in zip(pts[3:], parts[3:]) if kind == "linear"]
    # the linear curve the profiled cost model will read (the same monotone fit)
    from sarathi_lab.costmodels.profiles import Curve
    linear = Curve([r["num_tokens"] for r in rows], [r["time_s"] for r in rows], "linear",
                   subadditive=True)

    def attention(col, tokens):
        # A step's attention is what its forward costs beyond the same tokens without KV: the
        # kernels, and what reading the KV costs the rest of the forward. On a CPU the second
        # is not small: the KV a decode batch reads evicts the weights from the cache (20 MB of
        # weights and a 32 MB L3 on experiments/fidelity's model), so its projections and MLP
        # run slower than a prompt's of as many tokens (the linear points, which read no KV):
        # 8 decodes at context 300 spent 8.5 ms outside attention and the LM head, an 8-token
        # prompt 5.3 ms. Attributing only the kernels' time to attention left that out.
        return np.maximum(col["forward"] - col["head"] - linear(tokens), 0.0)

    for (kind, key, _), col in zip(pts[3:], parts[3:]):
        if kind == "linear":
            if key[0] > 1:
                rows.append(_row("prefill_attention", attention(col, key[0]), statistic,
                                 chunk=key[0], context=0))
        elif kind == "prefill":
            rows.append(_row("prefill_attention", attention(col, key[0]), statistic,
                             chunk=key[0], context=key[1]))
        elif kind == "rewarm":
            T = key[0]
            rows.append(_row("decode_rewarm", col["steady"], statistic, num_tokens=T,
                             batch=1, decode_context=T, place=0))
            rows += [_row("decode_rewarm", col[f"place_{p}"], statistic, num_tokens=T,
                          batch=1, decode_context=T, place=p)
                     for p in range(1, sum(k.startswith("place_") for k in col) + 1)]
        elif kind == "decode":
            b, k = key
            rows.append(_row("decode_attention", attention(col, b), statistic, batch=b,
                             context=k))
            rows.append(_row("lm_head", col["head"], statistic, num_tokens=b))
            rows.append(_row("overhead", col["overhead"], statistic, batch=b))
        else:
            c, k, b, kd = key
            rows.append(_row("iteration", col["total"], statistic, chunk=c, context=k, batch=b,
                             decode_context=kd))
    return rows
