"""The real executor: a Llama-family model with a paged KV cache, on a GPU or a CPU.

Config (``configs/executor/torch.yaml``): ``device`` (auto: cuda if available), ``dtype`` (auto:
bf16 on a GPU, fp32 on a CPU), ``attention_backend`` (auto: triton on a GPU, torch on a CPU;
triton on a CPU needs TRITON_INTERPRET=1), ``kv_cache_gib`` (the KV budget on a CPU),
``gpu_memory_utilization`` (share of the free GPU memory after the weights that the KV cache
takes), ``temperature``/``top_p``/``seed`` (sampling), ``shared_prefix_len`` (random prompts of a
length-only trace open with a common prefix of that many tokens), ``stop_at_eos`` (a request ends
when it samples one of the model's EOS ids; the trace's output length stays its upper bound).

On the torch attention backend each running request keeps a contiguous copy of its KV per layer
that grows in place (`kernels/sequence_kv.py`), so a step reads its new tokens out of the paged
cache instead of gathering every block of every sequence.

Preemption by swap copies real KV: the host swap space is a tensor in host memory (pinned on a
GPU) of `scheduler.num_swap_blocks` blocks; a step first copies its swap-outs' device blocks to
host blocks, then its swap-ins' host blocks to device blocks, then runs the forward (on a CPU
the copy is still a real copy, between two tensors). Its time is part of the step's, and
reported apart as `swap_s`.

Each step flattens the scheduled tokens of all requests into one batch (no padding) and samples
for the requests it catches up. Sampling with temperature > 0 draws from a generator seeded by
(seed, request id, output index), so a request's tokens do not depend on what it was batched with.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np
import torch

from sarathi_lab.executors import spec_step
from sarathi_lab.executors.base import Executor, ExecutorConfig, StepResult
from sarathi_lab.executors.draft import check_draft, make_draft, require_draft
from sarathi_lab.executors.sampling import draw, eos_token_ids, probabilities, stream_seed
from sarathi_lab.kernels.sequence_kv import SequenceKV
from sarathi_lab.models.dtypes import torch_dtype
from sarathi_lab.models.llama import AttnMetadata
from sarathi_lab.models.loader import check_memory, load_model
from sarathi_lab.resources import memory_limit
from sarathi_lab.settings import ConfigError, setting

log = logging.getLogger(__name__)


# the roofline's quantization settings (costmodels/roofline.py), which this executor does not run
_QUANTIZED = ("weight_dtype", "kv_cache_dtype", "weight_only")


def _auto(value, default):
    return default if value in (None, "auto") else value


@dataclass
class TorchConfig(ExecutorConfig):
    device: str = setting("auto", help="auto: cuda if available, else cpu | cpu | cuda | cuda:N")
    dtype: str = setting("auto", help="auto: bfloat16 on a GPU, float32 on a CPU | float32 | "
                                      "float16 | bfloat16")
    attention_backend: str = setting("auto", choices=("auto", "torch", "triton"),
                                     help="auto: triton on a GPU, torch on a CPU")
    kv_cache_gib: float = setting(1.0, gt=0, help="KV-cache budget on a CPU")
    gpu_memory_utilization: float = setting(0.85, gt=0, le=1,
                                            help="share of free GPU memory the KV cache takes")
    temperature: float = setting(0.0, ge=0, help="0: greedy")
    top_p: float = setting(1.0, gt=0, le=1, help="nucleus sampling mass")
    seed: int = setting(0, ge=0, help="sampling streams; random prompt ids")
    shared_prefix_len: int = setting(0, ge=0, help="random prompts open with a common prefix")
    stop_at_eos: bool | None = setting(
        None, help="end a request when it samples an EOS id of the model (generation_config.json, "
                   "else config.json); the trace's output length stays the upper bound. null: "
                   "on for prompts the trace carries, off for the random prompts of a "
                   "length-only trace (its output lengths are the workload)")
    clock: str = setting(
        "wall", choices=("wall", "cpu"),
        help="what a step's duration and the host time around it (iterations' host_s) "
             "measure. wall: time.perf_counter, and the engine's clock advances by host time + "
             "step, the real elapsed time; cpu: this thread's CPU time (time.thread_time), which "
             "other jobs on a shared machine do not stretch by taking the core (they still slow "
             "it through shared caches and memory), and the engine's clock advances by the step "
             "alone (host_s recorded, not counted). cpu needs executor.device=cpu and one torch "
             "thread (num_threads=1)")
    draft: str | None = setting(
        None, help="speculative decoding's draft model (with scheduler.num_speculative_tokens "
                   "> 0; null: none): layers:N, the target's first N layers with its final norm "
                   "and LM head, sharing the target's KV; or a model preset of the target's "
                   "vocabulary (e.g. tiny-llama), with a KV cache of its own (executors/draft.py)")

    def validate(self) -> None:
        if self.top_p < 1 and self.temperature == 0:
            raise ValueError(f"top_p={self.top_p}: read only with executor.temperature > 0 "
                             "(temperature 0 decodes greedily, from no sampled nucleus)")
        if self.draft is not None:
            check_draft(self.draft, self.temperature)


class TorchExecutor(Executor):
    config_class = TorchConfig
    supports_swap = True
    # Attention reads the paged cache through whole block tables: the reference kernel
    # gathers every block of a table before masking, the Triton kernel starts each query
    # tile's keys at a multiple of its key tile (which may lie in a block before the window),
    # and the draft model's cache shares the table. A freed block (-1) would be read there.
    no_sliding_window_kv = ("its attention kernels (kernels/reference.py's paged path, "
                            "kernels/triton_attention.py) and the draft's cache read whole block "
                            "tables, freed blocks included; there is no null block to point "
                            "them at")
    supports_speculation = True   # with executor.draft: executors/spec_step.py
    speculation_settings = ("draft",)

    @classmethod
    def check_speculation_settings(cls, cfg: TorchConfig, k: int) -> None:
        require_draft(cfg.draft, k)

    @classmethod
    def parse_config(cls, values: dict, where: str = "executor") -> TorchConfig:
        for key in _QUANTIZED:   # the sim executor's roofline prices these; say so
            if key in values:
                raise ConfigError(
                    f"{where}.{key}={values[key]!r}: the torch executor runs weights and KV "
                    f"in {where}.dtype (float32, float16, bfloat16); quantized weights and KV "
                    "are priced by the simulator (executor=sim), not run")
        return super().parse_config(values, where)

    def __init__(self, cfg: TorchConfig, model: dict, hardware=None):
        from sarathi_lab.kernels import get_backend
        self.cfg, self.model_cfg = cfg, dict(model)
        cuda = torch.cuda.is_available()
        try:
            self.device = torch.device(_auto(cfg.device, "cuda" if cuda else "cpu"))
        except RuntimeError as e:
            raise ConfigError(f"executor.device={cfg.device!r}: {e}") from None
        on_gpu = self.device.type == "cuda"
        if on_gpu and not cuda:
            raise ConfigError(f"executor.device={cfg.device!r}: no CUDA device is available "
                              "(use executor.device=cpu or auto)")
        self.dtype = torch_dtype(_auto(cfg.dtype, "bfloat16" if on_gpu else "float32"),
                                 "executor.dtype")
        self.backend = _auto(cfg.attention_backend, "triton" if on_gpu else "torch")
        if self.backend == "triton" and not on_gpu and self.dtype == torch.bfloat16:
            raise ConfigError("executor.attention_backend=triton on a CPU runs the Triton "
                              "interpreter, which computes bf16 wrongly: use executor.dtype=float32")
        kernels = get_backend(self.backend)
        self.kv_cache_gib = cfg.kv_cache_gib
        self.gpu_memory_utilization = cfg.gpu_memory_utilization
        self.temperature = cfg.temperature
        self.top_p = cfg.top_p
        self.seed = cfg.seed
        self.shared_prefix_len = cfg.shared_prefix_len
        self.eos_ids = frozenset(eos_token_ids(self.model_cfg))
        if cfg.stop_at_eos and not self.eos_ids:
            raise ConfigError("executor.stop_at_eos=true: the model declares no eos_token_id "
                              "(random weights, or none in model.path's generation_config.json "
                              "and config.json)")
        # null: decided by the trace (prepare_trace); requests handed over directly carry their
        # own prompts
        self.stop_at_eos = bool(self.eos_ids) and cfg.stop_at_eos is not False

        if cfg.clock == "cpu":
            if on_gpu:
                raise ConfigError("executor.clock=cpu: a GPU's kernels run outside this "
                                  "thread's CPU time; use executor.clock=wall on a GPU")
            if torch.get_num_threads() != 1:
                raise ConfigError(
                    f"executor.clock=cpu counts the calling thread's CPU time, and torch runs "
                    f"{torch.get_num_threads()} threads, whose other threads' work it would "
                    "miss: set num_threads=1")
        # the clock of StepResult.duration and of the phase timers
        self.now = time.thread_time if cfg.clock == "cpu" else time.perf_counter
        # The engine times the host work around each step (the policy's schedule and update,
        # its bookkeeping: the iterations' `host_s`) on the same clock. On the wall clock that
        # is real elapsed time, which the engine's clock then counts, so a run's latencies hold
        # it; on the CPU clock it is recorded only, and the engine's clock stays the sum of
        # the steps' times (what the fidelity study compares with a cost model's).
        self.host_clock = self.now
        self.host_in_clock = cfg.clock == "wall"
        # weights, KV (on a CPU a budget; on a GPU a share of what the weights leave) and
        # activations against the memory free now, before any of it is allocated
        kv = 0 if on_gpu else int(cfg.kv_cache_gib * 2**30) * (2 if self.backend == "torch" else 1)
        free, source = (torch.cuda.mem_get_info(self.device)[0], "") if on_gpu \
            else memory_limit()
        check_memory(self.model_cfg, self.dtype, kv, "executor.kv_cache_gib", free,
                     f"{self.device} ({source})" if source else str(self.device))
        self.model = load_model(self.model_cfg, self.device, self.dtype)
        self.args = self.model.args
        if any(i >= self.args.vocab_size for i in self.eos_ids):
            raise ValueError(f"model.path: eos_token_id {sorted(self.eos_ids)} outside the "
                             f"vocabulary of {self.args.vocab_size}")
        self.model.setup(kernels, self.device)
        self.draft = make_draft(cfg.draft, self.model, self.device, self.dtype, kernels) \
            if cfg.draft else None
        self.kv = None
        # request id -> (temperature, top_p, seed or None, ignore_eos): `set_sampling`
        self.request_sampling: dict = {}
        # seconds spent per phase, summed over steps (read by benchmarks)
        self.timers = {"swap": 0.0, "draft": 0.0, "prepare": 0.0, "forward": 0.0, "sample": 0.0,
                       "steps": 0}

    @property
    def greedy_only(self) -> bool:   # drafts are verified greedily: the server reads it
        return self.draft is not None

    # -- sizing ---------------------------------------------------------------------------------
    def block_bytes(self, block_size: int) -> int:
        a = self.args
        return 2 * a.num_layers * block_size * a.num_kv_heads * a.head_dim * self.dtype.itemsize

    def cache_bytes(self, block_size: int) -> int:
        """Bytes of one block of every KV cache: the target's, and a draft model's own."""
        d = self.draft
        own = d.block_bytes(block_size, self.dtype.itemsize) if d and d.own_cache else 0
        return self.block_bytes(block_size) + own

    def num_kv_blocks(self, block_size: int) -> int:
        per_block = self.cache_bytes(block_size)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
            free, _ = torch.cuda.mem_get_info(self.device)
            budget, knob = free * self.gpu_memory_utilization, "executor.gpu_memory_utilization"
        else:
            budget, knob = self.kv_cache_gib * 2**30, "executor.kv_cache_gib"
            free, source = memory_limit()
            if free is not None and budget > free:
                raise ValueError(f"executor.kv_cache_gib={self.kv_cache_gib}: more than the "
                                 f"{free / 2**30:.2f} GiB host memory limit ({source}); "
                                 "lower it")
        n = int(budget // per_block)
        if n < 1:
            raise ValueError(
                f"{knob}: the KV budget of {budget / 2**20:.3f} MiB holds no KV block "
                f"({per_block / 2**20:.3f} MiB each at block_size={block_size}); raise it")
        return n

    def kv_block_bytes(self, block_size: int) -> int:
        return self.block_bytes(block_size)

    def check_swap_memory(self, num_host_blocks: int, block_size: int) -> None:
        """The host swap space lives in host memory, beside (on a CPU) the KV cache."""
        need = num_host_blocks * self.block_bytes(block_size)
        free, source = memory_limit()
        if free is not None and need > free:
            raise ValueError(
                f"the swap space of {num_host_blocks} KV blocks needs {need / 2**30:.2f} GiB of "
                f"host memory but {free / 2**30:.2f} GiB is the limit ({source}); lower "
                "scheduler.swap_space_gib (or scheduler.num_swap_blocks)")

    def max_model_len(self) -> int:
        n = self.args.max_model_len
        cap = self.model_cfg.get("max_model_len")
        return min(n, int(cap)) if cap else n

    def check_kv_memory(self, num_blocks: int, block_size: int) -> None:
        """The KV cache must fit the memory free now: allocating more is an out-of-memory kill
        (CPU) or error (GPU) with no word of which setting asked for it."""
        need = num_blocks * self.block_bytes(block_size)
        copies = ""
        if self.backend == "torch":
            # the running requests' contiguous copies (kernels/sequence_kv.py) hold at most
            # the slots their block tables hold: at most the cache again
            need *= 2
            copies = " (with the torch backend's contiguous copies of it)"
        need += num_blocks * (self.cache_bytes(block_size) - self.block_bytes(block_size))
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            source = "free on the GPU"
        else:
            free, source = memory_limit()
            if free is None:
                return
        if need > free:
            knob = ("executor.gpu_memory_utilization" if self.device.type == "cuda"
                    else "executor.kv_cache_gib")
            raise ValueError(
                f"the KV cache of {num_blocks} blocks needs {need / 2**30:.2f} GiB{copies} but "
                f"{free / 2**30:.2f} GiB is the limit on {self.device} ({source}); lower "
                f"{knob} (or scheduler.num_kv_blocks, if set)")

    def bind(self, kv) -> None:
        super().bind(kv)
        a = self.args
        # zeros, not empty: masked-out slots must never hold NaN (0 * NaN poisons the sum)
        cache = torch.zeros(2, a.num_layers, kv.num_blocks, kv.block_size, a.num_kv_heads,
                            a.head_dim, dtype=self.dtype, device=self.device)
        self.kv_cache = cache
        self.model.bind_cache(cache[0], cache[1])
        self.host_cache = None
        if kv.num_host_blocks:   # the swap space: same layout, in host memory
            self.host_cache = torch.zeros(2, a.num_layers, kv.num_host_blocks, kv.block_size,
                                          a.num_kv_heads, a.head_dim, dtype=self.dtype,
                                          pin_memory=self.device.type == "cuda")
        self.sequence_kv = SequenceKV() if self.backend == "torch" else None
        if self.draft is not None and self.draft.own_cache:
            self.draft.bind(kv.num_blocks, kv.block_size, self.dtype, self.device)
        self._eos_ended: set = set()

    def prepare_trace(self, df, trace_cfg=None):
        """Give a length-only trace seeded random prompt ids (a trace with its own keeps them)."""
        from sarathi_lab.traces import attach_prompt_ids
        own = "prompt_token_ids" in df and not df["prompt_token_ids"].isna().any()
        if self.cfg.stop_at_eos is None and not own and self.stop_at_eos:
            log.info("executor.stop_at_eos=null: the trace has no prompt ids, so its random "
                     "prompts run to the trace's output lengths (set it to true to stop at EOS)")
            self.stop_at_eos = False
        if own and self.shared_prefix_len:
            raise ConfigError(f"executor.shared_prefix_len={self.shared_prefix_len}: the trace "
                              "carries its own prompt_token_ids, which are kept, so there are no "
                              "random prompts to open with a shared prefix (it is for a "
                              "length-only trace)")
        seed = (trace_cfg or {}).get("seed")
        return attach_prompt_ids(df, self.args.vocab_size, seed=self.seed if seed is None else seed,
                                 shared_prefix_len=self.shared_prefix_len)

    # -- one step -------------------------------------------------------------------------------
    def prepare(self, out, drafts: dict | None = None):
        """Flattened inputs of a scheduled batch: (input_ids, positions, metadata, the indices of
        the entries that sample, their logits rows). `drafts`: entry index -> the draft tokens of
        a speculative entry, its inputs after its last token; all its rows are logits rows."""
        reqs, ns = out.reqs, out.num_new_tokens
        starts = [r.num_computed_tokens for r in reqs]
        drafts = drafts or {}
        ids, sample = [], []
        for i, (r, s, n) in enumerate(zip(reqs, starts, ns)):
            P = r.num_prompt_tokens
            if r.prompt_token_ids is None:
                raise ValueError(f"request {r.request_id!r} has no prompt_token_ids: the torch "
                                 "executor runs a real model (prepare_trace gives a length-only "
                                 "trace random ids)")
            if s + n <= P:
                ids += r.prompt_token_ids[s:s + n]
            elif s >= P:
                ids += r.output_token_ids[s - P:s - P + n]
            else:
                ids += r.prompt_token_ids[s:]
                ids += r.output_token_ids[:s + n - P]
            spec = drafts.get(i)
            if spec is not None:
                ids += spec
            if s + n - len(spec or ()) == P + r.num_output_tokens:
                sample.append(i)
        positions, meta, cu = self.batch_metadata(reqs, starts, ns)
        ends = cu[1:].tolist()
        rows = []
        for i in sample:
            k = len(drafts.get(i, ()))
            rows.extend(range(ends[i] - 1 - k, ends[i]))
        logits_rows = torch.tensor(rows, dtype=torch.int64, device=self.device)
        return torch.tensor(ids, device=self.device), positions, meta, sample, logits_rows

    def batch_metadata(self, reqs, starts, ns, sequence_kv: bool = True):
        """(positions, attention metadata, query_start_loc on the host) of a flattened batch:
        entry i computes the ns[i] tokens of reqs[i] after its first starts[i]. `sequence_kv`:
        attend through the target's contiguous copies (False: a draft model's own cache)."""
        bs = self.kv.block_size
        tables = [self.kv.block_table(r) for r in reqs]
        B, T = len(reqs), sum(ns)
        n_t = torch.tensor(ns, dtype=torch.int64)
        s_t = torch.tensor(starts, dtype=torch.int64)
        cu = torch.zeros(B + 1, dtype=torch.int64)
        torch.cumsum(n_t, 0, out=cu[1:])
        row_req = torch.repeat_interleave(torch.arange(B), n_t)
        positions = torch.arange(T) - (cu[:-1] - s_t)[row_req]
        width = max(map(len, tables))
        bt = np.zeros((B, width), dtype=np.int64)   # padding 0: never read past seq_lens
        for i, t in enumerate(tables):
            bt[i, :len(t)] = t
        bt = torch.from_numpy(bt)
        slots = bt.view(-1)[row_req * width + positions // bs] * bs + positions % bs
        dev = self.device
        meta = AttnMetadata(slot_mapping=slots.to(dev), block_tables=bt.to(dev, torch.int32),
                            query_start_loc=cu.to(dev, torch.int32),
                            seq_lens=(s_t + n_t).to(dev, torch.int32))
        if self.backend == "triton":   # spares the kernel a device-to-host sync per layer
            meta.attn_kwargs = {"max_query_len": max(ns)}
        elif self.sequence_kv is not None and sequence_kv:
            meta.attn_kwargs = {"sequence_kv": self.sequence_kv.plan(
                [r.request_id for r in reqs], starts, ns, tables, bs)}
        return positions.to(dev), meta, cu

    def swap(self, out) -> None:
        """Copy the batch's swapped KV blocks: device to host for its swap-outs, then host to
        device for its swap-ins (a batch never does both: the guard's rule), K and V of every
        layer."""
        cache, host = self.kv_cache, self.host_cache
        if out.swapped_out:
            dev, hst = zip(*out.blocks_to_swap_out)
            host[:, :, list(hst)] = cache[:, :, list(dev)].to(host.device)
        if out.swapped_in:
            hst, dev = zip(*out.blocks_to_swap_in)
            cache[:, :, list(dev)] = host[:, :, list(hst)].to(cache.device)

    def execute(self, out) -> StepResult:
        sync = torch.cuda.synchronize if self.device.type == "cuda" else (lambda: None)
        now = self.now
        t0 = now()
        tp = t0
        if out.swapped_out or out.swapped_in:
            self.swap(out)
            sync()
            tp = now()
        lens = spec_step.spec_lens(out)
        drafts, td = None, tp
        if lens:
            spec_step.check_entries(self, out, lens)
            drafts = spec_step.propose(self, out, lens)
            sync()
            td = now()
        input_ids, positions, meta, sample, rows = self.prepare(out, drafts)
        t1 = now()
        logits = self.model(input_ids, positions, meta, rows)
        sync()
        t2 = now()
        reqs = out.reqs
        kept = None
        if drafts is not None:
            result, kept = spec_step.finish_step(self, out, lens, logits, sample, drafts)
        else:
            result = StepResult(duration=0.0, sampled=[-1] * len(reqs),
                                finished=self.finished(out))
            if sample:
                self.sample_entries(out, logits, sample, result)
        finished = result.finished
        if self.request_sampling:
            for i in finished:
                self.request_sampling.pop(reqs[i].request_id, None)
        seq_kv = self.sequence_kv
        if seq_kv is not None:
            seq_kv.commit(meta.attn_kwargs["sequence_kv"], kept)
            seq_kv.drop([reqs[i].request_id for i in finished])
            seq_kv.drop([r.request_id for r in out.preempted])
            seq_kv.drop([r.request_id for r in out.rejected])   # outgrew the cache mid-run
        if self.draft is not None:
            self.draft.drop([reqs[i].request_id for i in finished] +
                            [r.request_id for r in out.preempted + out.rejected])
        t3 = now()
        tm = self.timers
        tm["swap"] += tp - t0
        tm["draft"] += td - tp
        tm["prepare"] += t1 - td
        tm["forward"] += t2 - t1
        tm["sample"] += t3 - t2
        tm["steps"] += 1
        result.duration, result.swap_s = t3 - t0, tp - t0
        return result

    def sample_entries(self, out, logits, idx, result: StepResult) -> None:
        """Sample the entries `idx` of the batch, one logits row each (in that order), into
        `result.sampled`; an entry that samples an EOS joins `result.finished`."""
        reqs = out.reqs
        for i, tok in zip(idx, self.sample(logits, [reqs[i] for i in idx])):
            result.sampled[i] = tok
        if self.stop_at_eos:
            ends = set(result.finished)
            for i in idx:
                if result.sampled[i] in self.eos_ids and not self._ignores_eos(reqs[i]):
                    self._eos_ended.add(reqs[i].request_id)
                    ends.add(i)
            result.finished = sorted(ends)

    def add_request(self, req, output_len):
        reason = super().add_request(req, output_len)
        if self.stop_at_eos and self._stop_at[req.request_id][1] == "stop":
            # the model ends it; the trace's length only caps it, as max_tokens would
            self._stop_at[req.request_id] = (self._stop_at[req.request_id][0], "length")
        return reason

    def set_sampling(self, request_id, temperature: float, top_p: float, seed: int | None,
                     ignore_eos: bool) -> None:
        """A request's own sampling, in place of the settings' (a served request's
        `temperature`, `top_p`, `seed`, `ignore_eos`); forgotten when it ends."""
        self.request_sampling[request_id] = (float(temperature), float(top_p), seed,
                                             bool(ignore_eos))

    def _ignores_eos(self, req) -> bool:
        own = self.request_sampling.get(req.request_id)
        return own is not None and own[3]

    def abort(self, req) -> None:
        super().abort(req)
        self.request_sampling.pop(req.request_id, None)
        if self.sequence_kv is not None:   # its contiguous KV copy
            self.sequence_kv.drop([req.request_id])
        if self.draft is not None:
            self.draft.drop([req.request_id])

    def finish_reason(self, req) -> str:
        if req.request_id in self._eos_ended:
            return "eos"
        return super().finish_reason(req)

    def sample(self, logits: torch.Tensor, reqs) -> list[int]:
        own = self.request_sampling
        if own and any(r.request_id in own for r in reqs):
            return self._sample_each(logits, reqs)
        if self.temperature <= 0:
            return logits.argmax(dim=-1).tolist()
        probs = probabilities(logits, self.temperature)
        return [draw(p, self.top_p, stream_seed(self.seed, r.request_id, r.num_output_tokens))
                for p, r in zip(probs, reqs)]

    def _sample_each(self, logits: torch.Tensor, reqs) -> list[int]:
        """Each request with its own sampling (`request_sampling`), the others with the
        settings'."""
        greedy = logits.argmax(dim=-1).tolist()
        toks = []
        for i, r in enumerate(reqs):
            temp, top_p, seed, _ = self.request_sampling.get(
                r.request_id, (self.temperature, self.top_p, None, False))
            if temp <= 0:
                toks.append(greedy[i])
                continue
            p = probabilities(logits[i], temp)
            # a request's own seed: its stream depends on nothing else (same seed, same tokens)
            stream = stream_seed(self.seed, r.request_id, r.num_output_tokens) \
                if seed is None else stream_seed(seed, None, r.num_output_tokens)
            toks.append(draw(p, top_p, stream))
        return toks
