"""The executor contract: run one scheduled batch, say how long it took, what it sampled and which
requests it ended.

A plug-in executor subclasses `Executor`, declares its settings as a dataclass (`config_class`,
built by `sarathi_lab.settings.parse` from the ``executor`` config node) and implements
`execute`. It is constructed as ``cls(cfg, model, hardware)``: its typed settings and the model
and hardware presets as plain dicts (hardware is None when `uses_hardware` is False).
"""
from __future__ import annotations

import abc
from dataclasses import dataclass
from operator import attrgetter
from typing import ClassVar

import numpy as np

from sarathi_lab.settings import ConfigError, parse, plain

_ID, _OUT = attrgetter("request_id"), attrgetter("num_output_tokens")


@dataclass
class ExecutorConfig:
    """Settings shared by every executor (none yet); plug-ins subclass it."""


@dataclass(slots=True)
class StepResult:
    duration: float                      # seconds the iteration took (measured or predicted)
    sampled: list[int] | None = None     # aligned with SchedulerOutput.reqs; None in simulation
    # indices into SchedulerOutput.reqs of the requests this step ended (their last token was
    # emitted); None: the engine asks `Executor.finished`, the default stop rule
    finished: list[int] | None = None
    swap_s: float = 0.0                  # of `duration`, seconds spent copying swapped KV
    # speculative decoding (SchedulerOutput.spec_lens): per entry, how many of its k draft
    # tokens the target accepted (0..k; 0 for ordinary entries); None: no speculation ran
    accepted: list[int] | None = None
    # a real executor's accepted draft token ids per entry (len == accepted[i]); sampled[i]
    # stays the one token the target sampled after them (the correction or bonus token)
    accepted_ids: list[list[int]] | None = None
    # with `accepted`: the tokens each entry emits this step (0 if it samples none; a
    # speculative one 1 + accepted, cut where its stop rule ends it). None: the engine fills it
    # by the default stop rule (`Executor.speculative_ends`); an executor with a stop rule of
    # its own (EOS) sets it and `finished` itself
    emitted: list[int] | None = None


class Executor(abc.ABC):
    """Turns a `SchedulerOutput` into a `StepResult`.

    Each scheduled entry (req, n) means: compute tokens [req.num_computed_tokens,
    req.num_computed_tokens + n) of `req`, reading its earlier KV through the KV manager's block
    table; if that catches the request up (num_computed_tokens + n == num_tokens), sample one
    token for it.

    The executor decides when a request ends. The default rule (`finished`): when it has emitted
    its workload output length (the trace's), its `max_tokens`, or what `max_model_len` leaves
    after the prompt, whichever comes first. A real executor may add its own (EOS).
    """

    #: the settings dataclass; `settings.parse` checks the ``executor`` node against it
    config_class: ClassVar[type] = ExecutorConfig
    #: True: durations are predicted, not measured (a simulator); decides how a run is labelled
    simulated: ClassVar[bool] = False
    #: True: reads the ``hardware`` preset; False: a configured hardware preset is an error
    uses_hardware: ClassVar[bool] = False
    #: True when `decode_run` is implemented (lets the engine skip through steady decode runs)
    supports_fast_forward: ClassVar[bool] = False
    #: where it is False: why, for the summary's `fast_forward` record
    no_fast_forward: ClassVar[str] = "the executor runs every iteration (no decode_run)"
    #: True when `execute` copies (or charges) the KV blocks of a batch's swap-outs and
    #: swap-ins (`SchedulerOutput.blocks_to_swap_out` / `blocks_to_swap_in`) before it runs,
    #: and reports their time in `StepResult.swap_s`; scheduler.preemption_mode=swap needs it
    supports_swap: ClassVar[bool] = False
    #: True when a block table with freed blocks (`kv/window.py`: id -1 where a block left the
    #: sliding window) is safe: nothing reads a freed block's slot. scheduler.sliding_window_kv
    #: needs it; where it is False, `no_sliding_window_kv` says why
    supports_sliding_window_kv: ClassVar[bool] = False
    no_sliding_window_kv: ClassVar[str] = "it does not declare supports_sliding_window_kv"
    #: True when the executor runs pipeline stages (an ``executor.pipeline_parallel`` setting,
    #: `join_pipeline`; sarathi_lab/topology/pipeline.py drives it); False: that setting is an error
    supports_pipeline: ClassVar[bool] = False
    #: True when `execute` runs a batch's speculative decodes (`SchedulerOutput.spec_lens`:
    #: drafts k, verified by the target in this step) and returns `StepResult.accepted`;
    #: False: scheduler.num_speculative_tokens > 0 is an error
    supports_speculation: ClassVar[bool] = False
    #: its settings read only with scheduler.num_speculative_tokens > 0 (one the user set
    #: without it is an error)
    speculation_settings: ClassVar[tuple[str, ...]] = ()
    #: True when `predictor` returns one (a budget controller that prices batches needs it)
    offers_predictor: ClassVar[bool] = False

    @classmethod
    def parse_config(cls, values: dict, where: str = "executor"):
        """Typed settings from the ``executor`` config node (without its ``name``)."""
        return parse(cls.config_class, values, where, f"executor {cls.__qualname__}")

    @classmethod
    def check_speculation_settings(cls, cfg, k: int) -> None:
        """Start-up, with scheduler.num_speculative_tokens = k > 0: raise ConfigError, naming
        the setting, if `cfg` cannot run k drafts per decode."""

    @classmethod
    def check_model(cls, cfg, model: dict) -> None:
        """Start-up, once the model's shape is known (before any run directory): raise
        ConfigError, naming the model and the setting, if `cfg` cannot run `model`."""

    @classmethod
    def reads_model_key(cls, key: str) -> bool:
        """Whether this executor reads the model preset's `key` (an override of one it does
        not read is an error)."""
        return True

    @classmethod
    def from_config(cls, values: dict, model: dict, hardware: dict | None = None):
        """Construct from a raw ``executor`` node (its ``name`` ignored) and the presets (dicts
        or OmegaConf nodes)."""
        values = {k: v for k, v in plain(values).items() if k != "name"}
        return cls(cls.parse_config(values), plain(model), plain(hardware) or None)

    # -- sizing and set-up ------------------------------------------------------------------------
    def num_kv_blocks(self, block_size: int) -> int | None:
        """How many KV blocks of `block_size` tokens fit this executor's memory (None: unknown,
        the user must set scheduler.num_kv_blocks)."""
        return None

    def max_model_len(self) -> int | None:
        """The longest sequence the model takes (None: unknown)."""
        return None

    def kv_block_bytes(self, block_size: int) -> int | None:
        """Bytes of one KV block of `block_size` tokens on one GPU (None: unknown). Sizes the
        host swap space (scheduler.swap_space_gib) and the swap traffic."""
        return None

    def predictor(self):
        """A predictor of iteration time for a policy's budget controller: (prefill chunks as
        (tokens, tokens in KV) pairs, decode contexts, spec_len=0) -> seconds, as this executor
        would price such a batch (spec_len = k > 0, where it speculates: each decode drafts k
        tokens and verifies 1 + k, the draft's steps included; `controllers.base.Predictor`);
        None: it offers none (a real executor measures time)."""
        return None

    def cost_model_record(self) -> dict | None:
        """Which cost model priced the run (the summary's ``cost_model``); None: none did (a
        real executor's times are measured)."""
        return None

    def check_kv_memory(self, num_blocks: int, block_size: int) -> None:
        """Raise if a KV cache of `num_blocks` blocks cannot be held (checked before anything
        is allocated); the message names the setting to change."""

    def check_swap_memory(self, num_host_blocks: int, block_size: int) -> None:
        """Raise if a host swap space of `num_host_blocks` KV blocks cannot be held (checked
        before anything is allocated); the message names the setting to change."""

    def bind(self, kv) -> None:
        """Called once, by the engine, with the KV-cache manager (block tables live there).
        Subclasses that override it call `super().bind(kv)`."""
        self.kv = kv
        self._stop_at: dict = {}     # request id -> (output length at which it ends, why)
        self._stop_len: dict = {}    # request id -> that length alone (the hot path's lookup)

    def prepare_trace(self, df, trace_cfg: dict):
        """A chance to complete a trace before it becomes requests (the real model gives a
        length-only trace prompt token ids). Returns the trace."""
        return df

    # -- requests ---------------------------------------------------------------------------------
    def add_request(self, req, output_len: int | None) -> str | None:
        """A request arrived, with its workload output length (None: unknown, the request runs
        to `max_tokens` or `max_model_len`). Returns a reason if it can never be served, else
        None."""
        limit = self.kv.max_model_len - req.num_prompt_tokens
        stops = [(limit, "max_model_len")]
        if req.max_tokens is not None:
            stops.append((req.max_tokens, "max_tokens"))
        if output_len is not None:
            stops.append((max(int(output_len), 1), "stop"))
        stop = self._stop_at[req.request_id] = min(stops, key=lambda s: s[0])
        self._stop_len[req.request_id] = stop[0]
        return None

    def stop_lengths(self):
        """A read-only view, request id -> the output length at which `finished` ends it: lets
        the engine apply the default rule in the same pass as its batch checks."""
        from types import MappingProxyType
        return MappingProxyType(self._stop_len)

    def output_len(self, req) -> int:
        """How many tokens `req` will emit in all (for oracle policies and the metrics)."""
        return self._stop_at[req.request_id][0]

    def tokens_left(self, reqs) -> np.ndarray:
        """How many more tokens each request emits before it ends (for the fast-forward)."""
        n = len(reqs)
        stop = np.fromiter(map(self._stop_len.__getitem__, map(_ID, reqs)), np.int64, n)
        return stop - np.fromiter(map(_OUT, reqs), np.int64, n)

    def finished(self, out) -> list[int]:
        """Indices of the batch's entries that emit their last token this step."""
        stop = self._stop_len
        done = []
        for i, (r, n) in enumerate(zip(out.reqs, out.num_new_tokens)):
            if r.num_computed_tokens + n == r.num_prompt_tokens + r.num_output_tokens \
                    and r.num_output_tokens + 1 >= stop[r.request_id]:
                done.append(i)
        return done

    def speculative_ends(self, out, accepted: list[int]) -> tuple[list[int], list[int]]:
        """By the default stop rule, for a batch with speculative entries whose target accepted
        `accepted[i]` drafts: (the tokens each entry emits, the indices of the entries that
        end). A speculative entry emits 1 + accepted[i], cut at its stop (the tokens past it
        are dropped: a request never gets more output than its rule); an ordinary entry 1 if
        it samples, else 0."""
        stop, spec = self._stop_len, out.spec_lens
        emitted, done = [], []
        for i, (r, n) in enumerate(zip(out.reqs, out.num_new_tokens)):
            out_n = r.num_output_tokens
            if spec[i]:
                m = 1 + accepted[i]
            elif r.num_computed_tokens + n == r.num_prompt_tokens + out_n:
                m = 1
            else:
                emitted.append(0)
                continue
            room = stop[r.request_id] - out_n
            if m >= room:
                m = room
                done.append(i)
            emitted.append(m)
        return emitted, done

    def finish_reason(self, req) -> str:
        return self._stop_at[req.request_id][1]

    def abort(self, req) -> None:
        """`req` left before its end (`Engine.abort`): drop what the executor keeps for it.
        Subclasses that keep per-request state override it with `super().abort(req)`."""
        self._stop_at.pop(req.request_id, None)
        self._stop_len.pop(req.request_id, None)

    # -- steps ------------------------------------------------------------------------------------
    @abc.abstractmethod
    def execute(self, out) -> StepResult:
        """Run (or predict) one batch."""

    def decode_run(self, contexts: np.ndarray, k: int) -> np.ndarray:
        """Durations of k consecutive decode-only iterations of the same requests, whose
        contexts (tokens already in KV) start at `contexts` and grow by one each step."""
        raise NotImplementedError(f"{type(self).__name__} does not predict decode runs")

    def chunk_run(self, contexts: list[int], computed: int, chunks: list[int],
                  samples_last: bool) -> list[float] | None:
        """Durations of len(chunks) consecutive batches of the same decodes (`contexts`, tokens
        in KV before the first, +1 each batch) and one prompt chunk each (`chunks[j]` tokens
        after `computed` + the chunks before it; the last samples a token if `samples_last`),
        as `execute` would time them; None: not predicted (the engine steps such batches)."""
        return None


def check_speculation(k: int, executor) -> bool:
    """Whether a run with scheduler.num_speculative_tokens = k speculates (k > 0); an error if
    the executor (an instance or its class) cannot (its supports_speculation is False)."""
    if k and not executor.supports_speculation:
        name = executor.__name__ if isinstance(executor, type) else type(executor).__name__
        raise ConfigError(f"scheduler.num_speculative_tokens={k}: executor "
                          f"{name} does not run speculative decodes (its "
                          "supports_speculation is False; executor=sim does); set "
                          "scheduler.num_speculative_tokens=0 or choose another executor")
    return bool(k)
