"""Speculative decoding in the simulator: what a batch's drafts and their verification cost, and
how many drafts the target accepts.

A speculative entry (SchedulerOutput.spec_lens) is a decode with k draft tokens. Its iteration:

- the draft model runs k decode steps over the batch's speculative decodes (step j: the ones
  with more than j drafts, each at its context + j), priced by the roofline on the same
  hardware and tensor_parallel for the draft `executor.draft` names (the torch executor's
  setting, the same values): ``layers:N``, the target's first N layers with its final norm and
  LM head (a self-speculative draft: the target's shape cut to N layers), or a model preset;
  or as a share of the target's decode step of the same decodes (`executor.draft_cost_ratio`).
  Simplified: the draft's first step is priced as one decode, though it also absorbs the
  token the target sampled last time (vLLM's draft runner feeds it in that step);
- the target verifies each speculative decode's 1 + k tokens in the same forward as the rest
  of the batch: the causal attention of 1 + k query tokens over the context and each other and
  their GEMM rows are exactly what a (1 + k)-token prompt chunk at that context costs, so they
  are priced as one (`iteration_time`'s prefill entries), with LM-head rows for all 1 + k
  positions (the target's distribution at every draft, the bonus one included).

Acceptance (`executor.acceptance`): the draft token for output position o of request r is
accepted when u(r, o) < p_i, with u a uniform draw fixed by (acceptance_seed, r, o) and p_i the
rate of its place i in the window: `fixed` (one rate for every place), `geometric` (a rate per
place: the chance the i-th draft is accepted once the ones before it were), `trace` (each
request's own rate, a CSV trace's `acceptance_rate` column). A step accepts the drafts up to the first rejected one. As
u depends on the request and the position only, a request's acceptance does not change with
the schedule (the batch it runs in, the order of arrivals), so runs that differ in policy or
load see the same draft quality.
"""
from __future__ import annotations

import re
import zlib

import numpy as np

from sarathi_lab.costmodels.base import batch_shape
from sarathi_lab.settings import ConfigError

_M64 = (1 << 64) - 1

#: the settings read only with scheduler.num_speculative_tokens > 0
SETTINGS = ("draft", "draft_cost_ratio", "acceptance", "acceptance_rate",
            "acceptance_rates", "acceptance_seed")
#: the acceptance models and the setting each reads
RATE_KEYS = {"fixed": "acceptance_rate", "geometric": "acceptance_rates"}
#: acceptance=trace: the trace column of each request's rate (a CSV trace's optional column,
#: traces/csv_formats.py)
COLUMN = "acceptance_rate"


_LAYERS = re.compile(r"layers:(\d+)")


def draft_layers(spec: str) -> int | None:
    """N of ``layers:N`` (the target's first N layers as the draft); None for a model preset's
    name: `executor.draft`'s forms, the same on both executors (checked before a model is
    known; N against the model's layers, and the preset's existence, when the model is)."""
    if not spec.startswith("layers:"):
        if not re.fullmatch(r"[A-Za-z0-9][\w.-]*", spec):
            raise ConfigError(f"executor.draft={spec!r}: expected layers:N or a model preset's "
                              "name (configs/model)")
        return None
    m = _LAYERS.fullmatch(spec)
    if m is None or int(m.group(1)) < 1:
        raise ConfigError(f"executor.draft={spec!r}: expected layers:N with N >= 1 (the target's "
                          "first N layers as the draft)")
    return int(m.group(1))


def _mix(z: int) -> int:
    """splitmix64's finaliser: a 64-bit integer to another, bits well mixed."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def request_key(seed: int, request_id) -> int:
    """The 64-bit key of a request's draws: from the seed and its id (crc32 of the id's repr,
    stable across processes, unlike hash())."""
    return _mix((seed * 0x9E3779B97F4A7C15 + zlib.crc32(repr(request_id).encode())) & _M64)


def unit(key: int, position: int) -> float:
    """u(r, o): a uniform in [0, 1) fixed by a request's key and an output position."""
    return (_mix((key + (position + 1) * 0x9E3779B97F4A7C15) & _M64) >> 11) * 2.0 ** -53


def check_settings(cfg, k: int) -> None:
    """Start-up: the sim executor's speculation settings, complete and consistent for k drafts
    (scheduler.num_speculative_tokens = k > 0)."""
    if (cfg.draft is None) == (cfg.draft_cost_ratio is None):
        raise ConfigError(f"scheduler.num_speculative_tokens={k}: set one of executor.draft "
                          "(layers:N, the target's first N layers, or a model preset: priced "
                          "as the draft) or executor.draft_cost_ratio (a draft step's share of "
                          "the target's decode step)"
                          + ("" if cfg.draft is None else ", not both"))
    if cfg.pipeline_parallel > 1:
        raise ConfigError(f"scheduler.num_speculative_tokens={k} with executor.pipeline_parallel="
                          f"{cfg.pipeline_parallel}: speculation is simulated for one stage only")
    key = RATE_KEYS.get(cfg.acceptance)
    if key is not None and getattr(cfg, key) is None:
        raise ConfigError(f"executor.acceptance={cfg.acceptance}: set executor.{key}")
    rates = cfg.acceptance_rates
    if cfg.acceptance == "geometric" and len(rates) < k:
        raise ConfigError(f"executor.acceptance_rates={rates}: {len(rates)} rates for "
                          f"scheduler.num_speculative_tokens={k} draft positions (one per position)")
    if rates is not None and any(not 0 <= p <= 1 for p in rates):
        raise ConfigError(f"executor.acceptance_rates={rates}: each must be in [0, 1]")


def check_unread(cfg) -> None:
    """Parse time: the acceptance setting of a model other than the chosen one is unread."""
    for model, key in RATE_KEYS.items():
        if model != cfg.acceptance and getattr(cfg, key) is not None:
            raise ConfigError(f"executor.{key}={getattr(cfg, key)}: read only with "
                              f"executor.acceptance={model} (acceptance={cfg.acceptance})")


class Speculation:
    """Prices a batch with speculative entries and draws its acceptance."""

    def __init__(self, cfg, cost_model, draft_cost_model=None):
        self.cost_model = cost_model
        self.draft = draft_cost_model
        self.ratio = cfg.draft_cost_ratio
        self.seed = cfg.acceptance_seed
        self.model = cfg.acceptance
        self.rate = cfg.acceptance_rate
        self.rates = cfg.acceptance_rates
        self.trace_rates: np.ndarray | None = None   # acceptance=trace: per request (row) id

    # -- acceptance ------------------------------------------------------------------------------
    def read_trace(self, df) -> None:
        """acceptance=trace: each request's rate from the trace's column (request ids are row
        positions, `traces.frame.to_requests`)."""
        if COLUMN not in df:
            raise ConfigError(f"executor.acceptance=trace: the trace has no column {COLUMN!r} "
                              "(a CSV trace's optional column of each request's rate); its "
                              f"columns: {', '.join(map(str, df.columns))}")
        rates = df[COLUMN].to_numpy(dtype=np.float64)
        bad = ~((rates >= 0) & (rates <= 1))   # NaN too
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ConfigError(f"executor.acceptance=trace: row {i} of the trace's column "
                              f"{COLUMN!r} is {rates[i]}; each must be in [0, 1]")
        self.trace_rates = rates

    def window_rates(self, req, s: int) -> list[float]:
        """p_i for the s places of `req`'s draft window."""
        if self.model == "fixed":
            return [self.rate] * s
        if self.model == "geometric":
            return self.rates[:s]
        rid = req.request_id
        rates = self.trace_rates
        if rates is None or not isinstance(rid, (int, np.integer)) or not 0 <= rid < len(rates):
            raise ConfigError(f"executor.acceptance=trace: request {rid!r} has no rate: the "
                              f"column {COLUMN!r} is read from the trace this executor "
                              "prepared (request ids are its rows; one engine only: a fleet's "
                              "other replicas never see it)")
        return [float(rates[rid])] * s

    def accepted(self, req, s: int) -> int:
        """How many of `req`'s s drafts (output positions num_output_tokens ...) the target
        accepts: the leading run of u(r, o) < p_i."""
        key = request_key(self.seed, req.request_id)
        o = req.num_output_tokens
        a = 0
        for p in self.window_rates(req, s):
            if unit(key, o + a) >= p:
                break
            a += 1
        return a

    # -- prices ----------------------------------------------------------------------------------
    def draft_time(self, contexts: list[int], lens: list[int]) -> float:
        """The draft's k steps over the speculative decodes at `contexts` with `lens` drafts."""
        cm, total = self.draft or self.cost_model, 0.0
        for j in range(max(lens)):
            ctx = [c + j for c, s in zip(contexts, lens) if s > j]
            total += cm.iteration_time([], ctx)
        return total if self.draft is not None else self.ratio * total

    def predict(self, prefills, decode_contexts, spec_len: int = 0) -> float:
        """A budget controller's price of a candidate batch (`controllers.base.Predictor`):
        with spec_len = k > 0 every decode drafts k tokens and verifies 1 + k, priced as `step`
        prices such a batch (the draft's k steps, then the verification)."""
        if not spec_len:
            return self.cost_model.iteration_time(prefills, decode_contexts)
        if self.draft is None and self.ratio is None:
            raise ValueError(f"predict(spec_len={spec_len}): this run does not speculate "
                             "(scheduler.num_speculative_tokens=0), so it prices no draft")
        n = len(decode_contexts)
        verify = [(1 + spec_len, c) for c in decode_contexts]
        # every decode samples its 1 + k positions; a prompt chunk, one token at most (counted)
        sampled = len(prefills) + n * (1 + spec_len)
        return (self.draft_time(list(decode_contexts), [spec_len] * n) if n else 0.0) + \
            self.cost_model.iteration_time([*prefills, *verify], [], sampled)

    def step(self, out) -> tuple[float, list[int]]:
        """(seconds, accepted drafts per entry) of a batch with speculative entries: the draft
        steps, then the target's forward over the whole batch with each speculative decode
        priced as a (1 + k)-token chunk at its context (module docstring)."""
        reqs, ns, spec = out.reqs, out.num_new_tokens, out.spec_lens
        # a speculative entry (1 + k tokens past its computed ones) is a prefill entry there,
        # and samples nothing by batch_shape's rule (it runs past the request's tokens)
        prefills, decodes, sampled = batch_shape(reqs, ns)
        contexts, lens, accepted = [], [], []
        for r, s in zip(reqs, spec):
            if s:
                contexts.append(r.num_computed_tokens)
                lens.append(s)
                sampled += 1 + s
                accepted.append(self.accepted(r, s))
            else:
                accepted.append(0)
        verify = self.cost_model.iteration_time(prefills, decodes, sampled)
        return self.draft_time(contexts, lens) + verify, accepted
