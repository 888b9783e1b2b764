"""Profiled cost model: an iteration's time interpolated from measured operator times.

``executor.cost_model=profiled executor.profile=PATH`` (a project-format .csv/.parquet profile, as
``sarathi-lab-profile`` writes, or a Vidur profile directory; formats and Vidur's operator mapping
in `costmodels.profiles`). An iteration of T scheduled tokens for B requests, S of them sampled,
costs

    overhead(B)                       measured (the profile's ``overhead`` rows: a constant, or
                                      by requests in the batch) unless
                                      executor.iteration_overhead_s is set; 0 if neither
  + linear(T)                         interpolated by tokens
  + sum over prefill chunks of prefill_attention(chunk, context), at least the increment
                                      prefill_attention(context + chunk, 0)
                                      - prefill_attention(context, 0), so chunking a prompt is
                                      never cheaper than one piece
  + decode_attention(decodes in the batch, their mean context)
  + lm_head(S)                        the profile's if it has one, else the roofline's
  + allreduce(T)                      the roofline's (tp > 1; no profile measures it)

An operator the profile lacks (e.g. attention in a Vidur directory without attention.csv) is
priced by the roofline for the same model and hardware, which also sizes memory (num_kv_blocks)
and gives max_model_len. Every interpolation is monotone (isotonic over the sorted grid,
`profiles.monotone`, linear between points); beyond the profiled range it extrapolates linearly, as the roofline
does for a compute-bound operator, and logs one warning per operator.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

from sarathi_lab.costmodels.base import CostModel, CostModelConfig
from sarathi_lab.costmodels.profiles import ProfileError, load
from sarathi_lab.costmodels.roofline import RooflineCostModel
from sarathi_lab.models.dtypes import dtype_name
from sarathi_lab.settings import setting

log = logging.getLogger(__name__)


@dataclass
class ProfiledConfig(CostModelConfig):
    profile: str | None = setting(None, help="a profile: project .csv/.parquet or a Vidur dir")
    iteration_overhead_s: float | None = setting(
        None, ge=0, help="CPU side of an iteration; null: the profile's measured one, else 0")


def _same_device(profiled: str, hardware: str) -> bool:
    p, h = profiled.lower(), hardware.lower()
    return p == h or h.startswith(p + "-")


class ProfiledCostModel(CostModel):
    config_class = ProfiledConfig

    def __init__(self, model, hardware, tensor_parallel: int = 1, cfg=None):
        cfg = cfg or ProfiledConfig()
        if not cfg.profile:
            raise ProfileError("executor.profile: the profiled cost model needs a profile "
                               "(executor.profile=PATH)")
        self.roofline = RooflineCostModel(model, hardware, tensor_parallel)
        m, hw, tp = self.roofline.model, self.roofline.hw, self.roofline.tp
        prof = load(cfg.profile, m.num_layers, tp)
        names = {m.name.lower()}
        if isinstance(model, dict) and model.get("hf_name"):
            names.add(str(model["hf_name"]).lower())
        run = f"model={m.name} dtype={m.dtype} hardware={hw.name} tensor_parallel={tp}"
        made = (f"model={prof.model} dtype={prof.dtype or 'float16/bfloat16'} "
                f"device={prof.device} tensor_parallel={prof.tensor_parallel}")
        wrong = []
        if prof.model.lower() not in names:
            wrong.append("model")
        if prof.dtype is not None and dtype_name(prof.dtype, "profile dtype") != m.dtype:
            wrong.append("dtype")
        if prof.dtype is None and m.dtype_bytes != 2:   # Vidur measured 16-bit kernels
            wrong.append("dtype")
        if not _same_device(prof.device, hw.name):
            wrong.append("device")
        if prof.tensor_parallel != tp:
            wrong.append("tensor_parallel")
        shape = {"n_head": m.num_heads, "n_kv_head": m.num_kv_heads,
                 "n_embd": m.hidden_size, "n_expanded_embd": m.intermediate_size}
        wrong += [f"shape ({k}: {v} in the profile, {shape[k]} in the run)"
                  for k, v in prof.shape.items() if shape[k] != v]
        if wrong:
            raise ProfileError(f"executor.profile={cfg.profile} was measured for {made}, but "
                               f"this run is {run} (differs in: {', '.join(wrong)})")
        self.profile = prof
        self.overhead = cfg.iteration_overhead_s if cfg.iteration_overhead_s is not None \
            else (prof.overhead_s or 0.0)
        # by requests in the batch, when measured so and not overridden
        self.overhead_curve = prof.overhead if cfg.iteration_overhead_s is None else None
        self._warned: set[str] = set()

    def _warn_beyond(self, op: str, point: str) -> None:
        if op not in self._warned:
            self._warned.add(op)
            log.warning("profiled cost model: %s at %s is beyond the profile %s; extrapolated "
                        "linearly (warned once per operator)", op, point, self.profile.source)

    def _linear(self, T: int) -> float:
        curve = self.profile.linear
        if curve is None:
            r = self.roofline
            return r.linear_time(T) + r.elementwise_time(T) + r.layer_floors
        if curve.beyond(T):
            self._warn_beyond("linear", f"{T} tokens")
        return curve(T)

    def _prefill(self, c: int, k: int) -> float:
        surf = self.profile.prefill_attention
        if surf is None:
            return self.roofline.chunk_attention_time(c, k)
        if surf.beyond(c, k):
            self._warn_beyond("prefill_attention", f"chunk {c}, context {k}")
        t = surf(c, k)
        if k > 0:
            # Causal attention of a chunk does at least the FLOPs that the whole prompt's
            # attention gains by it: charging no less than that increment makes a chunked
            # prompt never cheaper than one piece, where measured kernels (e.g. Vidur's 4096-token
            # prefill vs two 2048-token chunks) would have it otherwise.
            t = max(t, surf(k + c, 0) - surf(k, 0))
        return t

    def _decode(self, contexts) -> float:
        surf = self.profile.decode_attention
        if surf is None:
            return self.roofline.attention_time([], contexts)
        b, k = len(contexts), sum(contexts) / len(contexts)
        if surf.beyond(b, k):
            self._warn_beyond("decode_attention", f"batch {b}, mean context {k:.0f}")
        return surf(b, k)

    def _overhead(self, B: int) -> float:
        curve = self.overhead_curve
        if curve.beyond(B):
            self._warn_beyond("overhead", f"{B} requests")
        return curve(B)

    def _lm_head(self, S: int) -> float:
        curve = self.profile.lm_head
        if curve is None or S <= 0:
            return self.roofline.lm_head_time(S)
        if curve.beyond(S):
            self._warn_beyond("lm_head", f"{S} rows")
        return curve(S)

    def iteration_time(self, prefills, decode_contexts, num_sampled: int | None = None) -> float:
        T = sum(c for c, _ in prefills) + len(decode_contexts)
        if T <= 0:
            return self.overhead
        S = len(prefills) + len(decode_contexts) if num_sampled is None else num_sampled
        B = len(prefills) + len(decode_contexts)
        over = self.overhead if self.overhead_curve is None else self._overhead(B)
        t = over + self._linear(T) + self._lm_head(S) + self.roofline.allreduce_time(T)
        for c, k in prefills:
            t += self._prefill(c, k)
        if decode_contexts:
            t += self._decode(decode_contexts)
        return max(t, 0.0)

    def iteration_parts(self, prefills, decode_contexts, num_sampled: int | None = None):
        """(the measured per-iteration overhead, everything else but the LM head, the LM
        head): iteration_time's three parts for pipeline stages."""
        T = sum(c for c, _ in prefills) + len(decode_contexts)
        if T <= 0:
            return self.overhead, 0.0, 0.0
        B = len(prefills) + len(decode_contexts)
        S = B if num_sampled is None else num_sampled
        over = self.overhead if self.overhead_curve is None else self._overhead(B)
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
