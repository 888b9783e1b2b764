"""Measured operator profiles: loading them, and monotone interpolation over their grids.

Two formats load into one `Profile` (whole-model seconds per operator, on one GPU of the group):

**Project format** (a ``.csv`` or ``.parquet`` file, written by ``sarathi-lab-profile``): one row
per measured point, columns

    operator      linear | prefill_attention | decode_attention | lm_head | overhead |
                  decode_rewarm | iteration
    num_tokens    linear: tokens in the batch; lm_head: rows sampled; decode_rewarm: the
                  prompt step's tokens
    chunk         prefill_attention, iteration: new tokens of the (one) prefill chunk
    batch         decode_attention, iteration: decodes in the batch; overhead: requests in it
    context       prefill_attention, iteration: the chunk's tokens already in KV;
                  decode_attention: tokens in KV before each decode (the batch's mean)
    decode_context  iteration: tokens in KV before each decode
    time_s        seconds, whole model (all layers), median of the repeats
    time_p10_s, time_p90_s, repeats    the spread of the repeats (optional)
    model, dtype, device, tensor_parallel    metadata, the same on every row (in a Parquet
                  file they may instead sit in the file's key-value metadata, beside optional
                  n_head, n_kv_head, n_embd, n_expanded_embd: the model's shape, checked too)

    place         decode_rewarm: the decode's place after a prompt step of num_tokens
                  tokens (1: the first), 0 for the steady time (`costmodels.rewarm`)

``linear`` is everything that scales with the batch's tokens but attention and the LM head
(projections, MLP, norms, RoPE, residual adds, the per-layer dispatch of a forward);
``overhead`` is the measured CPU side of an iteration (input preparation, sampling): one row with
only time_s (a constant) or rows by ``batch`` (requests in the batch). ``iteration`` rows are
whole measured iterations of mixed batches, held out: never used to predict (`Profile.checks`).
``decode_rewarm`` rows (optional; a CPU profile's) say how much slower than steady the decodes
right after a prompt step run, which the profiled cost model charges by a run's step order
(`costmodels.rewarm`). Columns an operator does not use are left empty.

**Vidur format** (a directory ``.../compute/<device>/<org>/<model>/`` holding ``mlp.csv`` and,
optionally, ``attention.csv``, as in github.com/microsoft/vidur ``data/profiling``): per-layer
times in ms. Vidur's operators map to the project's as follows (times x num_layers, except the
embedding, once per iteration):

    linear             emb (once) + input_layernorm + attn_pre_proj + attn_rope + attn_post_proj
                       + post_attention_layernorm + mlp_up_proj + mlp_act + mlp_down_proj
                       + 2 x add (the two residual adds of a layer), by num_tokens
    prefill_attention  attn_prefill + attn_input_reshape + attn_output_reshape,
                       by prefill_chunk_size and kv_cache_size (rows is_prefill=True)
    decode_attention   attn_decode + attn_input_reshape + attn_output_reshape,
                       by batch_size and kv_cache_size (rows is_prefill=False)

Vidur's compute profiles have no LM head, all-reduce or CPU-overhead operator (its CPU-overhead
profiles are stored outside git, and its all-reduce ones, under ``network/``, are not read here):
the cost model takes those from the roofline, explicitly (`ProfiledCostModel.describe`).
A profile must have the operators every iteration needs (`REQUIRED`); one that lacks any is an
error naming the operator and the file (`missing_operators`), never priced by the roofline.
"""
from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from sarathi_lab.costmodels.profile_rows import ProfileError, monotone, number
from sarathi_lab.costmodels.rewarm import Rewarm

OPERATORS = ("linear", "prefill_attention", "decode_attention", "lm_head", "overhead",
             "decode_rewarm")
# what every mixed batch needs priced (the LM head, the all-reduce and the CPU side are the
# roofline's where a profile lacks them: no Vidur compute profile measures them)
REQUIRED = ("linear", "prefill_attention", "decode_attention")
HELD_OUT = ("iteration",)
_SHAPE_KEYS = ("n_head", "n_kv_head", "n_embd", "n_expanded_embd")

_VIDUR_LINEAR = {"input_layernorm": 1, "attn_pre_proj": 1, "attn_rope": 1, "attn_post_proj": 1,
                 "post_attention_layernorm": 1, "mlp_up_proj": 1, "mlp_act": 1,
                 "mlp_down_proj": 1, "add": 2}
_VIDUR_ATTN_EXTRA = ("attn_input_reshape", "attn_output_reshape")


def subadditive_minorant(x, y) -> np.ndarray:
    """A nondecreasing s <= y on the sorted grid x with s(x_i) <= s(x_j) + s(x_i - x_j) for
    every x_j < x_i whose rest x_i - x_j lies in [x_0, x_(i-1)] (s read between points by linear
    interpolation), lowered from y only where a split is cheaper: splitting tokens over iterations
    never predicts less time than one piece, reached by LOWERING a point to the cheapest split
    the profile measured, never by raising one. A GEMM's time is a staircase in tokens (tiles and
    waves: Vidur's A100 Llama-2-70B TP2 linear layers cost 4.30 us a token a layer at 1024 tokens
    against 4.17 at 768 and 3.93 at 2048), so per-token cost is not monotone; lifting each point to
    the worst per-token cost of any larger size (the rule this replaces) priced 2048 tokens at
    4.17 and doubled chunking's measured overhead (chunks of 256 of a 4k prompt: +48% against
    +16% from the raw points; experiments/calibration/chunk_cost_three_way.py). Also kept
    nondecreasing (more tokens never predict less), by lowering, like the rest."""
    x, s = np.asarray(x, dtype=float), np.array(y, dtype=float)
    # On a sparse grid a lowered point can fall below a smaller one; lowering that one too
    # (a running minimum from the right) can open a cheaper split elsewhere: alternate the two
    # until neither lowers anything (each pass only lowers; a few passes on Vidur's grids).
    for _ in range(100):
        before = s.copy()
        for i in range(1, x.size):
            rest = x[i] - x[:i]
            # both pieces inside the points already settled (np.interp would read one beyond
            # x[i - 1] flat, not as measured)
            ok = (rest >= x[0]) & (rest <= x[i - 1])
            if ok.any():
                s[i] = min(s[i], float(np.min(s[:i][ok] + np.interp(rest[ok], x[:i], s[:i]))))
        s = np.minimum.accumulate(s[::-1])[::-1]
        if np.array_equal(s, before):
            return s
    raise ProfileError("subadditive_minorant: no fixed point after 100 passes over "
                       f"{x.size} points")


class Curve:
    """y(x) from measured points: made nondecreasing over the sorted grid (`monotone`: a larger
    x never predicts less; with `subadditive`, also y(a + b) <= y(a) + y(b) at the grid's points,
    by `subadditive_minorant`), linear between points,
    flat below the first point, and beyond the last one linear with the last segment's slope (or,
    where that is flat, proportional to x, the roofline's shape for a compute-bound operator)."""

    def __init__(self, x, y, what: str, subadditive: bool = False):
        x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
        if x.size == 0:
            raise ProfileError(f"{what}: no measured points")
        if not (np.all(np.isfinite(y)) and np.all(y >= 0) and np.all(np.isfinite(x))):
            raise ProfileError(f"{what}: times must be finite and >= 0")
        ux = np.unique(x)
        # repeated points: their median
        uy = np.array([np.median(y[x == v]) for v in ux])
        self.x, self.y = ux, monotone(uy)
        if subadditive:
            self.y = subadditive_minorant(ux, self.y)
        self.what = what
        if ux.size >= 2 and self.y[-1] > self.y[-2]:
            self.slope = (self.y[-1] - self.y[-2]) / (ux[-1] - ux[-2])
        else:
            self.slope = self.y[-1] / ux[-1] if ux[-1] > 0 else 0.0

    def __call__(self, v: float) -> float:
        if v > self.x[-1]:
            return float(self.y[-1] + self.slope * (v - self.x[-1]))
        return float(np.interp(v, self.x, self.y))

    def beyond(self, v: float) -> bool:
        return v > self.x[-1]


class Surface:
    """t(a, b) from points on a grid of a (chunk or batch) x b (context): one `Curve` in b per
    measured a, made monotone across a at each measured b (`monotone`) and then along b (a
    running maximum, which keeps the columns ordered), bilinear between grid points. Beyond the
    last b each row goes on with its edge slope, beyond the last a each column with its own
    (the last segment's slope, or, where that is flat, proportional to the variable: the
    roofline's shape for an operator whose work grows with it); each set of edge slopes is made
    nondecreasing across the other variable, so that the extrapolation stays monotone in both.
    Where a row was not measured at a b (outside its own range of b), its cell is taken across
    a from the rows measured there (`_fill`), not from its own row extended flat."""

    def __init__(self, a, b, t, what: str):
        a, b, t = (np.asarray(v, dtype=float) for v in (a, b, t))
        if a.size == 0:
            raise ProfileError(f"{what}: no measured points")
        ua = np.unique(a)
        rows = [Curve(b[a == v], t[a == v], f"{what} at {v:g}") for v in ua]
        # Every row is piecewise linear with knots on the union grid of b: tabulating the rows
        # there makes a query two columns' blend instead of one np.interp per row.
        ub = np.unique(b)
        table = np.array([[row(v) for v in ub] for row in rows])
        measured = np.array([[b[a == va].min() <= vb <= b[a == va].max() for vb in ub]
                             for va in ua])
        table = np.column_stack([_fill(ua, col, ok) for col, ok in zip(table.T, measured.T)])
        self._set(ua, ub, np.column_stack([monotone(col) for col in table.T]), what)

    @classmethod
    def from_table(cls, a, b, table, what: str) -> "Surface":
        """A surface over the grid a x b with these cells (made monotone by running maxima)."""
        s = cls.__new__(cls)
        s._set(np.asarray(a, dtype=float), np.asarray(b, dtype=float),
               np.asarray(table, dtype=float), what)
        return s

    def _set(self, a, b, table, what: str) -> None:
        # nondecreasing down every column and along every row (a running maximum along one axis
        # keeps the order along the other)
        table = np.maximum.accumulate(np.maximum.accumulate(table, axis=0), axis=1)
        self.a, self.b, self.table, self.what = a, b, table, what
        self.b_slopes = np.maximum.accumulate(_edge_slopes(b, table))      # per row
        self.a_slopes = np.maximum.accumulate(_edge_slopes(a, table.T))    # per column
        self.b_max = b[-1]

    def __call__(self, a: float, b: float) -> float:
        bs = self.b
        if b >= bs[-1]:
            vals = self.table[:, -1] + self.b_slopes * (b - bs[-1])
            s = self.a_slopes[-1]
        elif b <= bs[0]:
            vals, s = self.table[:, 0], self.a_slopes[0]
        else:   # a blend of two monotone columns is monotone
            j = int(np.searchsorted(bs, b, side="right"))
            w = (b - bs[j - 1]) / (bs[j] - bs[j - 1])
            vals = self.table[:, j - 1] * (1 - w) + self.table[:, j] * w
            s = self.a_slopes[j - 1] * (1 - w) + self.a_slopes[j] * w
        aa = self.a
        if a > aa[-1]:
            return float(vals[-1] + s * (a - aa[-1]))
        return float(np.interp(a, aa, vals))

    def at(self, a, b) -> np.ndarray:
        """__call__ over arrays of a and b (broadcast together)."""
        a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
        bs, aa, tab = self.b, self.a, self.table
        j0, j1, w = _cell(bs, b)
        s = self.a_slopes[j0] * (1 - w) + self.a_slopes[j1] * w     # flat beyond either end
        over_b = np.maximum(b - bs[-1], 0.0)
        i0, i1, v = _cell(aa, a)

        def row(i):   # rows i at b: their blend of two columns, or their extrapolation
            return tab[i, j0] * (1 - w) + tab[i, j1] * w + self.b_slopes[i] * over_b
        return row(i0) * (1 - v) + row(i1) * v + s * np.maximum(a - aa[-1], 0.0)

    def beyond(self, a: float, b: float) -> bool:
        return a > self.a[-1] or b > self.b_max


def _cell(grid, x):
    """For each x: the grid cell (i0, i1 = i0 + 1) it falls in and its weight on i1, clamped
    to the grid's ends (weight 0 below the first point, 1 beyond the last)."""
    if grid.size == 1:
        zero = np.zeros(np.shape(x), dtype=int)
        return zero, zero, np.zeros(np.shape(x))
    i1 = np.clip(np.searchsorted(grid, x, side="right"), 1, grid.size - 1)
    i0 = i1 - 1
    return i0, i1, np.clip((x - grid[i0]) / (grid[i1] - grid[i0]), 0.0, 1.0)


def _edge_slopes(x, rows) -> np.ndarray:
    """Per row of `rows` (values over the grid x): the slope its extrapolation beyond x[-1]
    takes: the secant over the upper half of the grid (from the last point at or below x[-1] / 2;
    on a dense grid, as Vidur's batches 1-128, the last segment alone is one noisy difference),
    or where that is flat (or x has one point), y/x at the end."""
    rows = np.atleast_2d(rows)
    prop = rows[:, -1] / x[-1] if x[-1] > 0 else np.zeros(len(rows))
    if x.size < 2:
        return prop
    j = max(int(np.searchsorted(x, x[-1] / 2, side="right")) - 1, 0)
    j = min(j, x.size - 2)
    secant = (rows[:, -1] - rows[:, j]) / (x[-1] - x[j])
    return np.where(secant > 0, secant, prop)


def _surface(op: str, a, context, t, what: str) -> Surface:
    """The surface of an attention operator; of decode attention, with the largest context per
    request measured (`context_max`, what the out-of-range warning compares with)."""
    surf = Surface(a, context, t, what)
    surf.context_max = surf.b_max
    return surf


def _fill(a, col, ok) -> np.ndarray:
    """One column of a surface (one b): the cells of rows measured there (`ok`) kept; the
    others, whose rows were measured only at other b (e.g. a prompt of a chunks timed only at
    context 0) and would otherwise read their row extended flat, interpolated in a between the
    nearest measured rows, or, beyond them, no lower than the largest (no higher than the
    smallest) measured one. A flat cell would be far below its measured neighbours (the prompt of
    32 tokens at context 0 next to a chunk of 16 at context 512), and the column's monotone fit
    would pool the measured cells down to it."""
    col = np.array(col, dtype=float)
    if ok.all() or not ok.any():
        return col
    xs, ys = a[ok], col[ok]
    for i in np.flatnonzero(~ok):
        if xs[0] < a[i] < xs[-1]:
            col[i] = np.interp(a[i], xs, ys)
        elif a[i] > xs[-1]:
            col[i] = max(col[i], ys[-1])
        else:
            col[i] = min(col[i], ys[0])
    return col


@dataclass
class Profile:
    """Whole-model seconds per operator, and what the profile was measured for."""
    source: str
    model: str                      # a model name (or Hugging Face name)
    dtype: str | None
    device: str
    tensor_parallel: int
    linear: Curve | None = None
    lm_head: Curve | None = None
    prefill_attention: Surface | None = None
    decode_attention: Surface | None = None
    overhead_s: float | None = None             # a constant overhead, or
    overhead: Curve | None = None               # one by requests in the batch
    rewarm: object = None                       # costmodels.rewarm.Rewarm, or None
    shape: dict = field(default_factory=dict)   # the model's geometry, checked against the run's
    checks: list = field(default_factory=list)  # held-out whole iterations (rows, as read)
    meta: dict = field(default_factory=dict)    # a Parquet profile's key-value metadata


def missing_operators(prof: Profile) -> str | None:
    """What a profile lacks of `REQUIRED`, as a sentence naming the operators and the file
    (None: nothing)."""
    missing = [op for op in REQUIRED if getattr(prof, op) is None]
    if not missing:
        return None
    where = f"profile {prof.source}"
    if prof.meta.get("format") == "vidur":
        attn = Path(prof.source) / "attention.csv"
        where += (f" (a Vidur directory; {attn} " + ("has no rows of these operators" if
                  attn.is_file() else "does not exist") + ")")
    return (f"{where} has no {' and no '.join(missing)} rows; the profiled cost model needs "
            f"{', '.join(REQUIRED)} measured (it does not price a missing one by the roofline)")


def load(path, num_layers: int, tensor_parallel: int) -> Profile:
    """A profile at `path`: a Vidur directory or a project-format .csv/.parquet file.
    `num_layers` scales Vidur's per-layer times to the whole model; of a Vidur profile, the rows
    measured at `tensor_parallel` are kept."""
    p = Path(path)
    if p.is_dir():
        return _load_vidur(p, num_layers, tensor_parallel)
    if not p.is_file():
        raise ProfileError(f"executor.profile={path}: no such file or directory")
    if p.suffix == ".csv":
        rows, meta = _read_csv(p), {}
    elif p.suffix == ".parquet":
        import pyarrow.parquet as pq
        table = pq.read_table(p)
        rows = table.to_pylist()
        meta = {k.decode(): v.decode() for k, v in (table.schema.metadata or {}).items()
                if not k.startswith(b"pandas") and not k.startswith(b"ARROW")}
    else:
        raise ProfileError(f"executor.profile={path}: expected a .csv or .parquet file or a "
                           "Vidur profile directory")
    return _from_rows(rows, meta, str(p))


def peek(path) -> dict | None:
    """What a profile at `path` was measured for, read cheaply (the path of a Vidur directory, a
    Parquet file's metadata, a CSV file's first row): model, dtype, device, tensor_parallel
    (None where only the rows say, as Vidur's TP). None: not a profile (a CSV without an
    ``operator`` column, a directory without mlp.csv, another kind of file)."""
    p = Path(path)
    if p.is_dir():
        if not (p / "mlp.csv").is_file():
            return None
        parts = p.resolve().parts
        return {"model": "/".join(parts[-2:]), "dtype": None, "device": parts[-3],
                "tensor_parallel": None}
    if p.suffix == ".parquet":
        import pyarrow.parquet as pq
        meta = {k.decode(): v.decode() for k, v in (pq.read_schema(p).metadata or {}).items()}
    elif p.suffix == ".csv":
        with open(p, newline="") as f:
            meta = next(csv.DictReader(f), None) or {}
        if "operator" not in meta:
            return None
    else:
        return None
    if not all(meta.get(k) not in (None, "") for k in ("model", "device", "tensor_parallel")):
        return None
    return {"model": meta["model"], "dtype": meta.get("dtype") or None,
            "device": meta["device"], "tensor_parallel": int(float(meta["tensor_parallel"]))}


def _from_rows(rows, meta, source) -> Profile:
    if not rows:
        raise ProfileError(f"{source}: no rows")
    for key in ("model", "dtype", "device", "tensor_parallel"):
        vals = {str(r[key]) for r in rows if r.get(key) not in (None, "")}
        if len(vals) > 1:
            raise ProfileError(f"{source}: column {key!r} differs between rows: {sorted(vals)}")
        if vals:
            meta[key] = vals.pop()
        if key not in meta:
            raise ProfileError(f"{source}: metadata {key!r} missing (a column or Parquet metadata)")
    by_op = {op: [] for op in OPERATORS + HELD_OUT}
    for i, r in enumerate(rows):
        op = r.get("operator")
        if op not in by_op:
            raise ProfileError(f"{source} row {i + 1}: operator {op!r} is not one of "
                               f"{OPERATORS + HELD_OUT}")
        by_op[op].append(r)
    w = source
    prof = Profile(source, meta["model"], meta["dtype"], meta["device"],
                   int(float(meta["tensor_parallel"])), checks=by_op["iteration"], meta=meta)
    try:
        prof.shape = {k: int(meta[k]) for k in _SHAPE_KEYS if k in meta}
    except ValueError:
        raise ProfileError(f"{source}: the shape metadata {_SHAPE_KEYS} must be integers, got "
                           f"{ {k: meta[k] for k in _SHAPE_KEYS if k in meta} }") from None
    if by_op["linear"]:
        r = by_op["linear"]
        prof.linear = Curve([number(x, "num_tokens", w) for x in r],
                            [number(x, "time_s", w) for x in r], f"{w}: linear", subadditive=True)
    if by_op["lm_head"]:
        r = by_op["lm_head"]
        prof.lm_head = Curve([number(x, "num_tokens", w) for x in r],
                             [number(x, "time_s", w) for x in r], f"{w}: lm_head")
    for op, a in (("prefill_attention", "chunk"), ("decode_attention", "batch")):
        if by_op[op]:
            r = by_op[op]
            setattr(prof, op, _surface(op, [number(x, a, w) for x in r],
                                       [number(x, "context", w) for x in r],
                                       [number(x, "time_s", w) for x in r], f"{w}: {op}"))
    r = by_op["overhead"]
    with_batch = [x for x in r if x.get("batch") not in (None, "")]
    if with_batch and len(with_batch) < len(r):
        raise ProfileError(f"{w}: overhead rows must all have a batch or none may")
    if with_batch:
        prof.overhead = Curve([number(x, "batch", w) for x in r],
                              [number(x, "time_s", w) for x in r], f"{w}: overhead")
    elif r:
        prof.overhead_s = float(np.median([number(x, "time_s", w) for x in r]))
    if by_op["decode_rewarm"]:
        prof.rewarm = Rewarm.from_rows(by_op["decode_rewarm"], w)
    return prof


def _median(row, op):
    v = row.get(f"time_stats.{op}.median", "")
    return float(v) if v not in ("", None) else 0.0


def _read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _rows_at_tp(rows, tp, what, source):
    sel = [r for r in rows if int(r["num_tensor_parallel_workers"]) == tp]
    if rows and not sel:
        have = sorted({int(r["num_tensor_parallel_workers"]) for r in rows})
        raise ProfileError(f"profile {source}: {what} has no rows for tensor_parallel={tp} "
                           f"(it was measured at {have}); the run has "
                           f"executor.tensor_parallel={tp}")
    return sel


def _load_vidur(d: Path, num_layers: int, tp: int) -> Profile:
    mlp = d / "mlp.csv"
    if not mlp.is_file():
        raise ProfileError(f"executor.profile={d}: a directory must hold Vidur's mlp.csv")
    parts = d.resolve().parts
    # Vidur's layout: .../<device>/<org>/<model>/mlp.csv
    prof = Profile(str(d), "/".join(parts[-2:]), None, parts[-3], tp,
                   meta={"format": "vidur"})
    all_rows = _read_csv(mlp)
    if not all_rows:
        raise ProfileError(f"{mlp}: no rows")
    prof.shape = {k: int(all_rows[0][k]) for k in _SHAPE_KEYS}
    rows = _rows_at_tp(all_rows, tp, "mlp.csv", d)
    L, ms = num_layers, 1e-3
    tokens = [int(r["num_tokens"]) for r in rows]
    times = [ms * (_median(r, "emb") + L * sum(n * _median(r, op)
                                              for op, n in _VIDUR_LINEAR.items()))
             for r in rows]
    prof.linear = Curve(tokens, times, f"{d}: linear", subadditive=True)
    attn = d / "attention.csv"
    attn_rows = _rows_at_tp(_read_csv(attn), tp, "attention.csv", d) if attn.is_file() else []
    for op, is_pre, a in (("prefill_attention", "True", "prefill_chunk_size"),
                          ("decode_attention", "False", "batch_size")):
        sel = [r for r in attn_rows if r["is_prefill"] == is_pre]
        if sel:
            key = "attn_prefill" if is_pre == "True" else "attn_decode"
            t = [ms * L * (_median(r, key) + sum(_median(r, x) for x in _VIDUR_ATTN_EXTRA))
                 for r in sel]
            setattr(prof, op, _surface(op, [int(r[a]) for r in sel],
                                       [int(r["kv_cache_size"]) for r in sel], t, f"{d}: {op}"))
    return prof
