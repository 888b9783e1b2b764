"""`sarathi-lab-profile`: measure the real (torch) executor on this machine and write a profile that
the profiled cost model reads (``executor.cost_model=profiled executor.profile=PATH``).

    sarathi-lab-profile model=tiny-llama --out profile.parquet [--grid cpu|gpu|tiny]
        [--repeats 5] [--warmup 2] [--threads N] [other executor/model overrides ...]

Every measured point is one real iteration through `TorchExecutor.execute` (input preparation,
the forward pass, sampling) on a synthetic batch whose requests sit at the wanted contexts in a
paged KV cache, timed after an unmeasured step that brings them there (`Harness._prime`). Inside
it, the attention kernels (KV write + paged attention) and the LM head are timed by wrapping
them, and the executor's own phase timers split the rest:

    linear(T)                 forward - attention - LM head, one prompt of T tokens at context 0
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

The grid is measured in rounds (every point once per round, after a warm-up pass) so that a burst
of load on a shared machine spreads over all points instead of spoiling one; each row holds the
median of the rounds and their 10th/90th percentiles. The file's metadata records the model,
dtype, device, torch threads, the clock (`executor.clock`: wall, or on a
CPU with one thread the thread's CPU time, steady on a busy machine) and library versions.
"""
from __future__ import annotations

import argparse
import itertools
import json
import logging
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

# columns of a profile row (profiles.py documents their meaning)
COLUMNS = ("operator", "num_tokens", "chunk", "batch", "context", "decode_context", "time_s",
           "time_p10_s", "time_p90_s", "repeats")


@dataclass(frozen=True)
class Grid:
    linear: tuple           # T: one prompt of T tokens at context 0
    prefill: tuple          # (chunk, context)
    decode: tuple           # (batch, context)
    mixed: tuple            # (chunk, context, batch, decode context): held-out iterations


def _prod(a, b):
    return tuple(itertools.product(a, b))


GRIDS = {
    # a CPU, one thread: 25 s for experiments/fidelity's 5M-parameter Llama (52 s at a load of
    # 4); SmolLM2-135M does ~12k tokens a pass (~45 s on a quiet core, ~5 min for the 6 passes
    # by default, before the unmeasured step of each point added ~30% (19 -> 25 s on the 5M
    # Llama); measured 3.6 s a step, ~26 min, under a load average of 10 on 2 cores)
    "cpu": Grid(linear=(1, 2, 4, 8, 16, 32, 64, 128, 256, 384, 512, 1024, 2048),
                prefill=_prod((16, 64, 128, 256, 512), (0, 256, 512, 1024))
                + ((768, 0), (768, 256), (1024, 0)),
                decode=_prod((1, 2, 4, 8, 16, 32, 64), (16, 256, 512, 1024)),
                mixed=((64, 128, 4, 256), (128, 0, 8, 512), (256, 256, 16, 128),
                       (32, 512, 2, 64), (200, 100, 12, 300))),
    # a GPU: larger batches and contexts, finer steps
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
                 mixed=((48, 32, 4, 100), (24, 96, 8, 64), (100, 0, 12, 160))),
}


class _Blocks:
    """The part of a KV-cache manager the executor reads: block tables of requests set to their
    contexts. Each request gets its own blocks while the cache holds them (a real batch reads
    distinct memory), then ids wrap around. No swap space: nothing is preempted."""

    num_host_blocks = 0

    def __init__(self, num_blocks: int, block_size: int, max_model_len: int):
        self.num_blocks, self.block_size, self.max_model_len = num_blocks, block_size, max_model_len
        self.tables: dict = {}

    def assign(self, reqs) -> None:
        self.tables.clear()
        nxt = 0
        for r in reqs:
            n = -(-r.num_tokens // self.block_size)
            self.tables[r.request_id] = [(nxt + i) % self.num_blocks for i in range(n)]
            nxt += n

    def block_table(self, req):
        return self.tables[req.request_id]


def _batch(entries, vocab: int, rng):
    """Requests and a scheduled batch for entries (new tokens n, context k): a decode after k
    tokens if n == 1 and k > 0, else the last chunk of a prompt of k + n tokens. Every entry
    samples."""
    from sarathi_lab.request import Request
    from sarathi_lab.schedulers.output import SchedulerOutput
    out = SchedulerOutput()
    for i, (n, k) in enumerate(entries):
        if n == 1 and k > 0:
            r = Request(i, 0.0, k, prompt_token_ids=rng.integers(0, vocab, k).tolist())
            r.output_token_ids.append(int(rng.integers(0, vocab)))
            r.num_output_tokens = 1
        else:
            r = Request(i, 0.0, k + n, prompt_token_ids=rng.integers(0, vocab, k + n).tolist())
        r.num_computed_tokens = k
        out.add(r, n)
    return out


class _Spans:
    """Seconds spent inside wrapped calls during one iteration (CUDA events on a GPU, read after
    the iteration's own synchronisation; `clock` on a CPU, where calls are synchronous)."""

    def __init__(self, cuda: bool, clock=time.perf_counter):
        self.cuda, self.items, self.clock = cuda, [], clock

    def wrap(self, fn):
        import torch
        if self.cuda:
            def run(*a, **kw):
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                res = fn(*a, **kw)
                e.record()
                self.items.append((s, e))
                return res
        else:
            clock = self.clock

            def run(*a, **kw):
                t = clock()
                res = fn(*a, **kw)
                self.items.append(clock() - t)
                return res
        return run

    def take(self) -> float:
        if self.cuda:
            import torch
            torch.cuda.synchronize()
            total = sum(s.elapsed_time(e) for s, e in self.items) * 1e-3
        else:
            total = sum(self.items)
        self.items = []
        return total


class Harness:
    """A torch executor instrumented to split an iteration into the profile's operators. The
    parts are read on the executor's own clock (`executor.clock`), as its steps are."""

    def __init__(self, executor, seed: int = 0):
        import torch
        from torch import nn
        self.ex = executor
        self.cuda = executor.device.type == "cuda"
        self.attn, self.head = (_Spans(self.cuda, executor.now) for _ in range(2))
        model = executor.model
        model.kernels = tuple(self.attn.wrap(k) for k in model.kernels)
        head, spans = model.lm_head, self.head

        class TimedHead(nn.Module):
            def forward(self, x):
                return spans.wrap(head)(x)
        model.lm_head = TimedHead()
        self.rng = np.random.default_rng(seed)
        self.torch = torch

    def bind(self, max_tokens: int, block_size: int = 16, max_blocks: int | None = None) -> None:
        """A KV cache for batches of up to `max_tokens` tokens in all (capped at `max_blocks`)."""
        need = -(-max_tokens // block_size) + 1
        n = min(need, max_blocks) if max_blocks else need
        self.ex.bind(_Blocks(n, block_size, self.ex.max_model_len()))

    def run(self, entries) -> dict:
        """One iteration of `entries`: seconds of the whole step and of each part. An unmeasured
        step first brings every sequence to its context (`_prime`), as its earlier steps would
        have in a real run."""
        out = _batch(entries, self.ex.args.vocab_size, self.rng)
        self.ex.kv.assign(out.reqs)
        for r in out.reqs:
            self.ex.add_request(r, None)
        self._prime(out, entries)
        tm = self.ex.timers
        before = dict(tm)
        step = self.ex.execute(out)
        parts = {k: tm[k] - before[k] for k in ("prepare", "forward", "sample")}
        parts.update(total=step.duration, attention=self.attn.take(), head=self.head.take())
        parts["linear"] = parts["forward"] - parts["attention"] - parts["head"]
        parts["overhead"] = parts["prepare"] + parts["sample"]
        return parts


    def _prime(self, out, entries) -> None:
        """Run, unmeasured, the step before `out` on the same requests and block tables: each
        decode's last context token, each chunk's context as one piece. In a real run a request
        at context k has computed those k tokens in earlier steps, so the torch backend's copy of
        its KV (`kernels/sequence_kv.py`) already holds them and a decode copies one new token out
        of the paged cache; measured without this step, it would first gather all k tokens in
        every layer (and list their slots in `prepare`), which a steady decode never does. A
        decode batch's prime has its shape, so the caches also hold what the step reads, as
        between a run's consecutive decode steps."""
        from sarathi_lab.schedulers.output import SchedulerOutput
        prime = SchedulerOutput()
        for r, (n, k) in zip(out.reqs, entries):
            if k > 0:
                r.num_computed_tokens = k - 1 if n == 1 else 0
                prime.add(r, 1 if n == 1 else k)
        if len(prime):
            self.ex.execute(prime)
            self.attn.take(), self.head.take()
            for r, (_, k) in zip(out.reqs, entries):
                r.num_computed_tokens = k


def _points(grid: Grid) -> list[tuple[str, tuple, list]]:
    """(kind, key, batch entries) for every point of the grid; the first three measure the
    attention's fixed cost per iteration."""
    chunk, decode = (16, 0), (1, 16)
    pts = [("floor", (), [chunk]), ("floor", (), [decode]), ("floor", (), [chunk, decode])]
    pts += [("linear", (T,), [(T, 0)]) for T in grid.linear]
    pts += [("prefill", (c, k), [(c, k)]) for c, k in grid.prefill]
    pts += [("decode", (b, k), [(1, k)] * b) for b, k in grid.decode]
    pts += [("mixed", (c, k, b, kd), [(c, k)] + [(1, kd)] * b) for c, k, b, kd in grid.mixed]
    return pts


def _stats(x) -> tuple[float, float, float]:
    a = np.asarray(x, dtype=float)
    return float(np.median(a)), float(np.percentile(a, 10)), float(np.percentile(a, 90))


def _row(op, samples, stat, **cols) -> dict:
    med, p10, p90 = _stats(samples)
    if stat == "min":
        med = float(np.min(samples))
    row = dict.fromkeys(COLUMNS)
    row.update(operator=op, time_s=med, time_p10_s=p10, time_p90_s=p90, repeats=len(samples),
               **cols)
    return row


STATISTICS = ("median", "min")


def measure(harness: Harness, grid: Grid, repeats: int = 5, warmup: int = 1,
            progress: bool = False, statistic: str = "median") -> list[dict]:
    """Profile rows for `grid`: a warm-up pass, then `repeats` rounds over every point. Each
    row's time_s is the `statistic` of the rounds: the median (what a typical iteration takes,
    noise included) or the minimum (the machine's own cost: on a shared machine, the noise of
    other jobs only ever adds time)."""
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats={repeats} must be >= 1 and warmup={warmup} >= 0")
    if statistic not in STATISTICS:
        raise ValueError(f"statistic={statistic!r}: one of {', '.join(STATISTICS)}")
    pts = _points(grid)
    longest = harness.ex.max_model_len()
    fits = [p for p in pts if all(n + k <= longest for n, k in p[2])]
    if len(fits) < len(pts):
        log.warning("profile grid: %d of %d points hold a sequence longer than the model's "
                    "max_model_len=%d and are left out", len(pts) - len(fits), len(pts), longest)
    pts = fits
    harness.bind(max(sum(n + k for n, k in e) for _, _, e in pts))
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=len(pts) * (warmup + repeats), unit="step", desc="profiling",
                   mininterval=0.5)
    for _ in range(warmup):
        for _, _, entries in pts:
            harness.run(entries)
            bar and bar.update()
    got = [[] for _ in pts]
    for _ in range(repeats):
        # a step to take the cost of following the previous round's largest batch (freed
        # memory, cold caches), which would otherwise fall on the attention-floor points
        harness.run(pts[0][2])
        for i, (_, _, entries) in enumerate(pts):
            got[i].append(harness.run(entries))
            bar and bar.update()
    if bar is not None:
        bar.close()
    parts = [{p: np.array([x[p] for x in got_i]) for p in got_i[0]} for got_i in got]
    # the attention kernels' fixed cost per iteration
    a, b, ab = (x["attention"] for x in parts[:3])
    stat = np.median if statistic == "median" else np.min
    # a fixed cost no larger than either batch's whole attention
    floor = min(max(float(stat(a + b - ab)), 0.0), float(stat(a)), float(stat(b)))
    rows = [_row("linear", col["linear"] + floor, statistic, num_tokens=key[0])
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


def versions() -> dict:
    import torch
    import sarathi_lab
    v = {"python": platform.python_version(), "torch": torch.__version__,
         "numpy": np.__version__, "sarathi_lab": getattr(sarathi_lab, "__version__", "")}
    try:
        import transformers
        v["transformers"] = transformers.__version__
    except ImportError:
        pass
    return v


def device_name(device) -> str:
    """The profile's device: ``cpu``, or the hardware preset whose name a GPU's name contains
    (``NVIDIA H200`` -> ``h200``), or else the GPU's name in lower case with dashes."""
    if device.type != "cuda":
        return "cpu"
    import torch
    gpu = torch.cuda.get_device_name(device).lower()
    from importlib.resources import files
    presets = sorted(p.name[:-5] for p in files("sarathi_lab.configs").joinpath("hardware")
                     .iterdir() if p.name.endswith(".yaml"))
    for p in presets:
        if p.split("-")[0] in gpu:
            return p
    return "-".join(gpu.replace("nvidia", "").split())


def metadata(executor, model_cfg: dict, grid_name: str, repeats: int, warmup: int,
             statistic: str = "median") -> dict:
    import torch
    a = executor.args
    return {
        "model": str(model_cfg.get("name") or a.name), "dtype": str(executor.dtype)
        .removeprefix("torch."), "device": device_name(executor.device), "tensor_parallel": "1",
        "threads": str(torch.get_num_threads()), "n_head": str(a.num_heads),
        "n_kv_head": str(a.num_kv_heads), "n_embd": str(a.hidden_size),
        "n_expanded_embd": str(a.intermediate_size), "num_layers": str(a.num_layers),
        "head_dim": str(a.head_dim), "vocab_size": str(a.vocab_size),
        "max_model_len": str(a.max_model_len),
        "attention_backend": executor.backend, "grid": grid_name, "repeats": str(repeats),
        "warmup": str(warmup), "statistic": statistic, "clock": executor.cfg.clock,
        "processor": platform.processor() or platform.machine(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "versions": json.dumps(versions()),
    }


def write(rows: list[dict], meta: dict, path) -> Path:
    """The rows as a Parquet file with `meta` in its key-value metadata (atomically)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    path = Path(path)
    if path.suffix != ".parquet":
        raise ValueError(f"--out {path}: the profile is written as a .parquet file")
    types = {"operator": pa.string(), "repeats": pa.int64()}
    cols = {c: pa.array([r[c] for r in rows], types.get(c, pa.float64())) for c in COLUMNS}
    table = pa.table(cols).replace_schema_metadata({k: str(v) for k, v in meta.items()})
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".parquet.tmp")
    pq.write_table(table, tmp)
    tmp.replace(path)
    return path


def merge(paths, out) -> Path:
    """One profile from several of the same grid, model and machine, measured at different
    times: each point's time, p10 and p90 are the medians of the parts' (the spread of a step
    at one time, not the drift between parts), its repeats their sum. A study spreads its
    profile's parts over the runs it predicts, so that the machine's drift over minutes touches
    both alike."""
    import pyarrow.parquet as pq
    paths = [Path(x) for x in paths]
    if not paths:
        raise ValueError("merge: no profiles given")
    metas = [profile_meta(x) for x in paths]
    keep = ("created", "repeats", "parts")
    first = {k: v for k, v in metas[0].items() if k not in keep}
    for x, m in zip(paths[1:], metas[1:]):
        diff = sorted(k for k in set(first) | set(m) if k not in keep and first.get(k) != m.get(k))
        if diff:
            raise ValueError(f"merge: {x} differs from {paths[0]} in {', '.join(diff)}")
    key_cols = [c for c in COLUMNS if c not in ("time_s", "time_p10_s", "time_p90_s", "repeats")]
    tables = [pq.read_table(x).to_pylist() for x in paths]

    def key(r):   # NaN marks a column the operator has not
        return tuple(None if isinstance(r[c], float) and r[c] != r[c] else r[c] for c in key_cols)
    keys = [[key(r) for r in t] for t in tables]
    if any(k != keys[0] for k in keys[1:]):
        raise ValueError(f"merge: the profiles {', '.join(map(str, paths))} hold different points")
    rows = []
    for i, base in enumerate(tables[0]):
        parts = [t[i] for t in tables]
        rows.append({**base, "time_s": float(np.median([r["time_s"] for r in parts])),
                     "time_p10_s": float(np.median([r["time_p10_s"] for r in parts])),
                     "time_p90_s": float(np.median([r["time_p90_s"] for r in parts])),
                     "repeats": sum(r["repeats"] for r in parts)})
    meta = {**first, "created": metas[-1].get("created"), "parts": len(paths),
            "repeats": sum(int(m.get("repeats", 0)) for m in metas)}
    return write(rows, meta, out)


def check(profile_path, model: dict, hardware: dict) -> list[dict]:
    """The profiled cost model's predictions of the profile's held-out iterations: rows of
    (chunk, context, batch, decode_context, measured_s, predicted_s, error)."""
    import pyarrow.parquet as pq
    from sarathi_lab.costmodels.profiled import ProfiledConfig, ProfiledCostModel
    cm = ProfiledCostModel(model, hardware, 1, ProfiledConfig(profile=str(profile_path)))
    out = []
    for r in pq.read_table(profile_path).to_pylist():
        if r["operator"] != "iteration":
            continue
        c, k, b, kd = (int(r[x]) for x in ("chunk", "context", "batch", "decode_context"))
        pred = cm.iteration_time([(c, k)], [kd] * b, b + 1)
        out.append({"chunk": c, "context": k, "batch": b, "decode_context": kd,
                    "measured_s": r["time_s"], "predicted_s": pred,
                    "error": pred / r["time_s"] - 1})
    return out


def host_hardware(name: str) -> dict:
    """A hardware preset for simulating the profiled host: the profiled cost model takes every
    operator from the profile; the roofline behind it (memory sizing, operators a profile lacks)
    gets nominal numbers, so runs on it should set scheduler.num_kv_blocks."""
    from importlib.resources import files
    import yaml
    base = yaml.safe_load(files("sarathi_lab.configs").joinpath("hardware", "h200.yaml")
                          .read_text())
    return {**base, "name": name}


def build_executor(overrides: list[str]):
    """The torch executor and model preset of `sarathi-lab executor=torch <overrides>`."""
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf
    from sarathi_lab.config import resolve
    from sarathi_lab.settings import ConfigError
    from sarathi_lab.sweeps import register_resolvers
    from hydra.errors import HydraException
    register_resolvers()
    try:
        with initialize_config_module("sarathi_lab.configs", version_base="1.3"):
            cfg = compose("config", overrides=["executor=torch", *overrides])
    except HydraException as e:
        raise ConfigError(f"{' '.join(overrides)}: {e}") from None
    c = OmegaConf.to_container(cfg, resolve=True)
    c.pop("hydra", None)
    r = resolve(c, ["executor=torch", *overrides])
    if r.executor_cls.__name__ != "TorchExecutor":
        raise ConfigError("sarathi-lab-profile measures the torch executor (executor=torch)")
    return r.executor_cls(r.executor_cfg, r.model, None), r.model


def profile(overrides: list[str], out, grid: str = "cpu", repeats: int = 5, warmup: int = 1,
            threads: int | None = None, progress: bool = True,
            statistic: str = "median") -> Path:
    """Measure the executor of `overrides` over a named grid and write the profile to `out`."""
    import torch
    if grid not in GRIDS:
        raise ValueError(f"--grid {grid!r}: one of {', '.join(GRIDS)}")
    if Path(out).suffix != ".parquet":
        raise ValueError(f"--out {out}: the profile is written as a .parquet file")
    if threads is not None:
        if threads < 1:
            raise ValueError(f"--threads {threads}: must be >= 1")
        torch.set_num_threads(threads)
    executor, model = build_executor(overrides)
    harness = Harness(executor)
    rows = measure(harness, GRIDS[grid], repeats, warmup, progress, statistic)
    return write(rows, metadata(executor, model, grid, repeats, warmup, statistic), out)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(
        prog="sarathi-lab-profile", description=__doc__.split("\n\n")[0],
        epilog="Overrides are those of `sarathi-lab executor=torch`, e.g. model=tiny-llama, "
               "model.path=DIR model.name=smollm2, executor.dtype=float32.")
    p.add_argument("overrides", nargs="*", help="config overrides (key=value)")
    p.add_argument("--out", required=True, help="the profile, a .parquet file")
    p.add_argument("--grid", default="cpu", choices=sorted(GRIDS))
    p.add_argument("--repeats", type=int, default=5, help="rounds over the grid (median)")
    p.add_argument("--warmup", type=int, default=1, help="warm-up passes over the grid")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads (default: torch's own); recorded in the profile")
    p.add_argument("--statistic", default="median", choices=STATISTICS,
                   help="of the rounds: median (a typical iteration) or min (noise removed)")
    p.add_argument("--no-progress", action="store_true")
    a = p.parse_args(argv)
    from sarathi_lab.costmodels.profiles import ProfileError
    from sarathi_lab.settings import ConfigError
    try:
        t0 = time.perf_counter()
        path = profile(a.overrides, a.out, a.grid, a.repeats, a.warmup, a.threads,
                       not a.no_progress, a.statistic)
        meta = profile_meta(path)
        res = check(path, model_of(meta), host_hardware(meta["device"]))
    except (ConfigError, ProfileError, ValueError, FileNotFoundError) as e:
        sys.exit(f"sarathi-lab-profile: {e}")
    print(f"wrote {path} in {time.perf_counter() - t0:.0f} s")
    if res:
        errs = np.abs([r["error"] for r in res])
        print(f"held-out mixed iterations: |predicted/measured - 1| median {np.median(errs):.1%},"
              f" max {errs.max():.1%} over {len(res)}")


def profile_meta(path) -> dict:
    """A Parquet profile's key-value metadata, as strings."""
    import pyarrow.parquet as pq
    return {k.decode(): v.decode() for k, v in (pq.read_schema(path).metadata or {}).items()
            if not k.startswith((b"pandas", b"ARROW"))}


def model_of(meta: dict) -> dict:
    """The model preset a profile was measured for, from its metadata."""
    try:
        return {"name": meta["model"], "num_layers": int(meta["num_layers"]),
                "hidden_size": int(meta["n_embd"]),
                "intermediate_size": int(meta["n_expanded_embd"]),
                "num_heads": int(meta["n_head"]), "num_kv_heads": int(meta["n_kv_head"]),
                "head_dim": int(meta["head_dim"]), "vocab_size": int(meta["vocab_size"]),
                "max_model_len": int(meta["max_model_len"]), "dtype": meta["dtype"]}
    except (KeyError, ValueError) as e:
        raise ValueError(f"the profile's metadata lacks the model's shape ({e}): not written by "
                         "sarathi-lab-profile") from None


if __name__ == "__main__":
    main()
