"""Profiled cost model: an iteration's time interpolated from measured operator times.

``executor.cost_model=profiled executor.profile=PATH`` (a project-format .csv/.parquet profile, as
``sarathi-lab-profile`` writes, or a Vidur profile directory; formats and Vidur's operator mapping
in `costmodels.profiles`), or ``executor.cost_model=auto`` (`executors.sim`: a matching profile
found under ``executor.profile_dirs``, else the roofline). An iteration of T scheduled tokens for
B requests, S of them sampled, costs

    overhead(B)                       executor.iteration_overhead_s if set, else the profile's
                                      ``overhead`` rows (a constant, or by requests in the
                                      batch), else the roofline's CPU side (the hardware
                                      preset's iteration_overhead_s + B x request_overhead_s:
                                      vLLM v0 as measured by Vidur), recorded in describe()
  + linear(T)                         interpolated by tokens
  + sum over prefill chunks of prefill_attention(chunk, context), at least the largest increment
                                      prefill_attention(k' + chunk, 0) - prefill_attention(k', 0)
                                      over k' <= context, so that chunking a prompt is never
                                      cheaper than one piece and a chunk never costs less after
                                      more context
  + decode_attention(j, mean context of the j longest decodes), the largest over j = 1..b
  + lm_head(S)                        the profile's if it has one, else the roofline's
  + allreduce(T)                      the roofline's (tp > 1; no profile read here measures it)

and a decode-only step right after a step with prompt chunks, times the profile's
``decode_rewarm`` factor for its place after that step, where the profile has those rows (a CPU
profile's; `costmodels.rewarm`: the sim executor follows the step order to charge it).

A profile lacking linear, prefill or decode attention rows is an error naming what is missing
(`profiles.missing_operators`). The roofline for the same model and hardware also sizes memory
(num_kv_blocks) and gives max_model_len. Every term is monotone, inside and beyond the profiled range
(`profiles.Surface`): more tokens in a chunk, more context for any request, or one more request
(at any context) never predict less time.
Beyond it, the surfaces extrapolate linearly; the first batch that falls outside logs one
warning per run saying how far, and describe() records the furthest extent seen.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass

import numpy as np

from sarathi_lab.costmodels.base import CostModel, CostModelConfig
from sarathi_lab.costmodels.profiles import ProfileError, load, missing_operators
from sarathi_lab.costmodels.roofline import RooflineCostModel
from sarathi_lab.models.dtypes import dtype_name
from sarathi_lab.models.shape import ModelShape
from sarathi_lab.settings import setting

log = logging.getLogger(__name__)


@dataclass
class ProfiledConfig(CostModelConfig):
    profile: str | None = setting(None, help="a profile: project .csv/.parquet or a Vidur dir")
    iteration_overhead_s: float | None = setting(
        None, ge=0, help="CPU side of an iteration; null: the profile's measured one, else the "
                         "roofline's (the hardware preset's, vLLM v0 as measured by Vidur)")


def _same_device(profiled: str, hardware: str) -> bool:
    p, h = profiled.lower(), hardware.lower()
    return p == h or h.startswith(p + "-")


def mismatches(made: dict, model: ModelShape, names: set[str], hardware: str,
               tp: int) -> list[str]:
    """How a profile measured for `made` (model, dtype, device, tensor_parallel; None: not
    known yet) differs from a run of `model` (known by `names`, `model_names`) on `hardware` at
    `tp`: the names of the differing keys."""
    wrong = []
    if made["model"].lower() not in names:
        wrong.append("model")
    if made["dtype"] is not None and dtype_name(made["dtype"], "profile dtype") != model.dtype:
        wrong.append("dtype")
    if made["dtype"] is None and model.dtype_bytes != 2:   # Vidur measured 16-bit kernels
        wrong.append("dtype")
    if not _same_device(made["device"], hardware):
        wrong.append("device")
    if made["tensor_parallel"] is not None and made["tensor_parallel"] != tp:
        wrong.append("tensor_parallel")
    return wrong


def model_names(model) -> set[str]:
    """The names a profile may give a run's model (a preset dict or a ModelShape): its preset
    name and its Hugging Face name."""
    if isinstance(model, dict):
        return {str(n).lower() for n in (model.get("name"), model.get("hf_name")) if n}
    return {model.name.lower()}


def _installed(name: str) -> str | None:
    import platform
    from importlib import metadata
    if name == "python":
        return platform.python_version()
    try:
        return metadata.version("sarathi-lab" if name == "sarathi_lab" else name)
    except metadata.PackageNotFoundError:
        return None


class ProfiledCostModel(CostModel):
    config_class = ProfiledConfig

    def __init__(self, model, hardware, tensor_parallel: int = 1, cfg=None):
        cfg = cfg or ProfiledConfig()
        if not cfg.profile:
            raise ProfileError("executor.profile: the profiled cost model needs a profile "
                               "(executor.profile=PATH)")
        self.roofline = RooflineCostModel(model, hardware, tensor_parallel)
        m, hw, tp = self.roofline.model, self.roofline.hw, self.roofline.tp
        if m.is_moe:   # a profile's operators are a dense layer's: no router, no experts
            raise ProfileError(f"executor.cost_model=profiled: {m.name} is a mixture-of-experts "
                               "model, which a profile's dense operators cannot price; use "
                               "executor.cost_model=roofline")
        prof = load(cfg.profile, m.num_layers, tp)
        run = f"model={m.name} dtype={m.dtype} hardware={hw.name} tensor_parallel={tp}"
        made = (f"model={prof.model} dtype={prof.dtype or 'float16/bfloat16'} "
                f"device={prof.device} tensor_parallel={prof.tensor_parallel}")
        wrong = mismatches({"model": prof.model, "dtype": prof.dtype, "device": prof.device,
                            "tensor_parallel": prof.tensor_parallel},
                           m, model_names(model) | {m.name.lower()}, hw.name, tp)
        shape = {"n_head": m.num_heads, "n_kv_head": m.num_kv_heads,
                 "n_embd": m.hidden_size, "n_expanded_embd": m.intermediate_size}
        wrong += [f"shape ({k}: {v} in the profile, {shape[k]} in the run)"
                  for k, v in prof.shape.items() if shape[k] != v]
        if wrong:
            raise ProfileError(f"executor.profile={cfg.profile} was measured for {made}, but "
                               f"this run is {run} (differs in: {', '.join(wrong)})")
        missing = missing_operators(prof)
        if missing:
            raise ProfileError(f"executor.profile: {missing}")
        self.profile = prof
        self.rewarm = prof.rewarm
        # What the roofline prices because the profile does not measure it: said in describe()
        # (the run's summary), so that a reader knows which terms are measured.
        self.from_roofline = {}
        if cfg.iteration_overhead_s is not None:
            self.overhead, self.overhead_curve = cfg.iteration_overhead_s, None
            self.req_overhead = 0.0
        elif prof.overhead is not None or prof.overhead_s is not None:
            self.overhead, self.overhead_curve = prof.overhead_s or 0.0, prof.overhead
            self.req_overhead = 0.0
        else:
            r = self.roofline
            self.overhead, self.overhead_curve = r.overhead, None
            self.req_overhead = r.req_overhead
            self.from_roofline["overhead"] = (
                f"hardware preset {hw.name}: iteration_overhead_s={r.overhead:g} + "
                f"request_overhead_s={r.req_overhead:g} per request (the profile has no "
                "overhead rows)")
        if prof.lm_head is None:
            self.from_roofline["lm_head"] = "the roofline (the profile has no lm_head rows)"
        if tp > 1:
            self.from_roofline["allreduce"] = "the roofline (no profile read here measures it)"
        # the profiled range, per dimension a batch is checked on
        self.limits = {
            "tokens": prof.linear.x[-1],
            "prefill chunk": prof.prefill_attention.a[-1],
            "prefill context": prof.prefill_attention.b_max,
            "decode batch": prof.decode_attention.a[-1],
            "decode context": prof.decode_attention.context_max,
        }
        self.beyond: dict[str, float] = {}    # the furthest extent seen beyond each limit
        self._warned = False
        self._warn_versions()

    # -- what priced the run ----------------------------------------------------------------
    def measured_with(self) -> dict | str:
        """The library versions the profile records (a project profile's ``versions``
        metadata), or a sentence where it records none (Vidur's)."""
        v = self.profile.meta.get("versions")
        if v is None:
            return ("not recorded (a Vidur profile: vLLM-era kernels measured by Vidur, see "
                    "its SOURCES.md)" if self.profile.meta.get("format") == "vidur"
                    else "not recorded")
        try:
            return json.loads(v) if isinstance(v, str) else dict(v)
        except (ValueError, TypeError):
            raise ProfileError(f"profile {self.profile.source}: metadata 'versions' must be a "
                               f"JSON object of library versions, got {v!r}") from None

    def _warn_versions(self) -> None:
        rec = self.measured_with()
        if not isinstance(rec, dict):
            return
        diff = [f"{k} {v} (now {_installed(k) or 'not installed'})" for k, v in sorted(rec.items())
                if k in ("python", "torch", "numpy", "transformers", "sarathi_lab")
                and v and _installed(k) != v]
        if diff:
            log.warning("profiled cost model: profile %s was measured under other versions: %s; "
                        "its times may be stale", self.profile.source, ", ".join(diff))

    def describe(self) -> dict:
        return {"profile": self.profile.source,
                "device": self.profile.device, "measured_with": self.measured_with(),
                "from_roofline": dict(self.from_roofline),
                "rewarm": None if self.rewarm is None else self.rewarm.describe(),
                "beyond_profile": {k: {"furthest": v, "profiled": float(self.limits[k])}
                                   for k, v in self.beyond.items()}}

    # -- the profiled range -----------------------------------------------------------------
    def _check_range(self, T, prefills, decode_contexts) -> None:
        """Record how far a batch goes beyond the profiled range; warn once per run."""
        lim = self.limits
        seen = [("tokens", T, "{} tokens")]   # (dimension, this batch's extent, how it reads)
        if prefills:
            seen += [("prefill chunk", max(c for c, _ in prefills),
                      "a prefill chunk of {} tokens"),
                     ("prefill context", max(k for _, k in prefills), "prefill context {}")]
        if decode_contexts:
            seen += [("decode batch", len(decode_contexts), "a batch of {} decodes"),
                     ("decode context", max(decode_contexts), "decode context {}")]
        out = [(dim, v, f"{text.format(v)} beyond the profiled {lim[dim]:g}")
               for dim, v, text in seen if v > lim[dim]]
        for dim, v, _ in out:
            self.beyond[dim] = max(v, self.beyond.get(dim, 0))
        if out and not self._warned:
            self._warned = True
            log.warning("profiled cost model: %s (profile %s); extrapolated linearly. Warned "
                        "once per run; the summary's cost_model.beyond_profile has the furthest "
                        "extents", "; ".join(m for *_, m in out), self.profile.source)

    # -- operators --------------------------------------------------------------------------
    def _prefill(self, c: int, k: int) -> float:
        surf = self.profile.prefill_attention
        t = surf(c, k)
        if k > 0:
            t = max(t, self._increment(c, k))
        return t

    def _increment(self, c: int, k: int) -> float:
        """The largest P(k' + c) - P(k') over 0 <= k' <= k, P the whole prompt's attention
        (context 0). Causal attention of a chunk does at least the work the whole prompt's
        attention gains by it: charging no less makes a chunked prompt never cheaper than one
        piece, where measured kernels (e.g. Vidur's 4096-token prefill vs two 2048-token chunks)
        would have it otherwise. The maximum over every earlier k', not the increment at k
        alone, keeps this floor nondecreasing in context (P is not convex everywhere: at a fixed
        chunk the bare increment fell by up to 0.3 ms as context grew on Vidur's A100 profile).
        P is piecewise linear, so the maximum is at k = 0, k, or where k' or k' + c is a knot."""
        surf = self.profile.prefill_attention
        knots = surf.a
        cand = np.concatenate(([0.0, float(k)], knots[knots <= k], knots - c))
        cand = cand[(cand >= 0) & (cand <= k)]
        lo = surf.b[0]
        return float(np.max(surf.at(cand + c, lo) - surf.at(cand, lo)))

    def _decode(self, contexts) -> float:
        """Decode attention read off the surface by (batch, mean context), as Vidur does, but
        taken as the largest over the batch's longest j requests (j = 1..b, each at the mean
        of those j): a batch never runs faster than its longest requests would alone. For a
        batch of equal contexts that is the whole batch's value (the surface grows with
        batch); it makes one more request, at any context, never predict less time, where the
        whole batch's mean alone fell when a short request joined long ones (0.75 ms on
        Vidur's A100 Llama-2-70B profile: 57 decodes at mean context 2677 and one at 185)."""
        k = np.sort(np.asarray(contexts, dtype=float))[::-1]
        j = np.arange(1, k.size + 1)
        return float(self.profile.decode_attention.at(j, np.cumsum(k) / j).max())

    def _over(self, B: int) -> float:
        if self.overhead_curve is not None:
            return self.overhead_curve(B)     # monotone; flat-to-linear beyond its range
        return self.overhead + B * self.req_overhead

    def _lm_head(self, S: int) -> float:
        curve = self.profile.lm_head
        if curve is None or S <= 0:
            return self.roofline.lm_head_time(S)
        return curve(S)

    def iteration_time(self, prefills, decode_contexts, num_sampled: int | None = None) -> float:
        T = sum(c for c, _ in prefills) + len(decode_contexts)
        if T <= 0:
            return self.overhead
        self._check_range(T, prefills, decode_contexts)
        S = len(prefills) + len(decode_contexts) if num_sampled is None else num_sampled
        B = len(prefills) + len(decode_contexts)
        t = self._over(B) + self.profile.linear(T) + self._lm_head(S) \
            + self.roofline.allreduce_time(T)
        for c, k in prefills:
            t += self._prefill(c, k)
        if decode_contexts:
            t += self._decode(decode_contexts)
        return max(t, 0.0)

    def iteration_parts(self, prefills, decode_contexts, num_sampled: int | None = None):
        """(the per-iteration overhead, everything else but the LM head, the LM head):
        iteration_time's three parts for pipeline stages."""
        T = sum(c for c, _ in prefills) + len(decode_contexts)
        if T <= 0:
            return self.overhead, 0.0, 0.0
        B = len(prefills) + len(decode_contexts)
        S = B if num_sampled is None else num_sampled
        over = self._over(B)
        head = self._lm_head(S)
        whole = self.iteration_time(prefills, decode_contexts, num_sampled)
        return over, max(whole - over - head, 0.0), head

    def num_kv_blocks(self, block_size: int, gpu_memory_utilization: float = 0.9,
                      workspace_bytes: float = 2**30, activation_tokens: int = 8192) -> int:
        return self.roofline.num_kv_blocks(block_size, gpu_memory_utilization, workspace_bytes,
                                           activation_tokens)

    @property
    def max_model_len(self) -> int:
        return self.roofline.max_model_len

    def kv_block_bytes(self, block_size: int) -> int:
        return self.roofline.kv_block_bytes(block_size)
