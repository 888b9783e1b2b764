"""The harness that times one real iteration of the torch executor: synthetic batches whose requests
sit at the wanted contexts in a paged KV cache, primed by an unmeasured step, with the attention
kernels and the LM head wrapped in timers."""
from __future__ import annotations

import time

import numpy as np

# the prompt of the request whose decodes settle the machine before a chunk (`Harness._settle`)
SETTLE_PROMPT = 32


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


def _batch(entries, vocab: int, rng, lead: int = 0):
    """Requests and a scheduled batch for entries (new tokens n, context k): a decode after k
    tokens if n == 1 and k > 0, else the last chunk of a prompt of k + n tokens. Every entry
    samples. With `lead`, each decode is its request's (lead + 1)-th output token: a prompt of
    k - lead tokens (its context the prompt and the outputs before it), so that `lead` decode
    steps can run before it (`Harness._stream`)."""
    from sarathi_lab.request import Request
    from sarathi_lab.schedulers.output import SchedulerOutput
    out = SchedulerOutput()
    for i, (n, k) in enumerate(entries):
        if n == 1 and k > 0:
            p = k - lead
            r = Request(i, 0.0, p, prompt_token_ids=rng.integers(0, vocab, p).tolist())
            r.output_token_ids.extend(rng.integers(0, vocab, lead + 1).tolist())
            r.num_output_tokens = lead + 1
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

    def run(self, entries, warm: int = 0, settle: int = 0, after_chunk: bool = False) -> dict:
        """One iteration of `entries`: seconds of the whole step and of each part. An unmeasured
        step first brings every sequence to its context (`_prime`), as its earlier steps would
        have in a real run. `warm` > 0, for a batch of decodes only or of prompts at context 0
        only: `warm` unmeasured steps of the batch's own shape run back to back before it
        (`_stream`), the state a run's steady stream of decode steps is in. `settle` > 0: after
        the prime, `settle` decode steps of another request (`_settle`), as a run's prompt
        chunks come between decodes, not right after a heavier step. `after_chunk`, for one
        chunk of c tokens at context k > 0: timed right after the chunk before it (min(c, k)
        tokens; the rest of the context primed in one step before the settling decodes), as a
        chunked prompt runs: measured after the settling decodes alone, such a chunk took
        1.02-1.09x what it took after its previous chunk (experiments/fidelity's model)."""
        if settle and warm:
            raise ValueError(f"settle={settle} with warm={warm}: one state or the other")
        if after_chunk and not (len(entries) == 1 and entries[0][0] > 1 and entries[0][1] > 0):
            raise ValueError(f"after_chunk: for one chunk at a context > 0, not {entries}")
        lead = 0
        decodes = all(n == 1 and k > 0 for n, k in entries)
        if warm:
            if not (decodes or all(k == 0 for _, k in entries)):
                raise ValueError(f"warm={warm}: for a batch of decodes only or of prompts at "
                                 f"context 0 only, not {entries}")
            if decodes:   # the stream's first step needs a prompt token before it
                lead = min(warm, min(k for _, k in entries) - 1)
        out = _batch(entries, self.ex.args.vocab_size, self.rng, lead)
        self.ex.kv.assign(out.reqs)
        for r in out.reqs:
            self.ex.add_request(r, None)
        if lead:
            self._stream(out, entries, lead)
        elif after_chunk:
            self._previous_chunk(out, entries[0], settle)
        else:
            self._prime(out, entries)
            if settle:
                self._settle(out, settle)
            if not decodes:   # prompts at context 0: the same prompts again
                for _ in range(warm):
                    self.ex.execute(out)
        self.attn.take(), self.head.take()
        tm = self.ex.timers
        before = dict(tm)
        step = self.ex.execute(out)
        parts = {k: tm[k] - before[k] for k in ("prepare", "forward", "sample")}
        parts.update(total=step.duration, attention=self.attn.take(), head=self.head.take())
        parts["linear"] = parts["forward"] - parts["attention"] - parts["head"]
        parts["overhead"] = parts["prepare"] + parts["sample"]
        return parts

    def _previous_chunk(self, out, entry, settle: int) -> None:
        """Run, unmeasured, the steps of a chunked prompt before its chunk `entry` (c tokens at
        context k): the context before the previous chunk in one step, the settling decodes
        (`settle`), then the previous chunk, min(c, k) tokens."""
        from sarathi_lab.schedulers.output import SchedulerOutput
        (c, k), r = entry, out.reqs[0]
        prev = min(c, k)

        def chunk(start: int, n: int) -> None:
            r.num_computed_tokens = start
            step = SchedulerOutput()
            step.add(r, n)
            self.ex.execute(step)
        if k > prev:
            chunk(0, k - prev)
        if settle:
            self._settle(out, settle)
        chunk(k - prev, prev)
        r.num_computed_tokens = k

    def _settle(self, out, steps: int) -> None:
        """Run, unmeasured, a short prompt (SETTLE_PROMPT tokens) and `steps` decodes of another
        request beside `out`'s (its blocks after theirs), then leave `out`'s block tables as they
        were. A step's time on a CPU depends on the steps just before it: a 16-token chunk took
        5.9 ms right after the 1024-token prompts of the point before it and 3.8 ms after smaller
        ones (experiments/fidelity's model), and a chunk after its own prime, the whole context
        as one step, comes after a far heavier step than a run's chunks do. In a run, a prompt
        chunk follows decodes (or another chunk of its size beside them)."""
        from sarathi_lab.schedulers.output import SchedulerOutput
        (r,) = _batch([(SETTLE_PROMPT, 0)], self.ex.args.vocab_size, self.rng).reqs
        r.request_id = len(out.reqs)
        self.ex.kv.assign([*out.reqs, r])
        self.ex.add_request(r, None)
        step = SchedulerOutput()
        step.add(r, SETTLE_PROMPT)
        self._decodes(r, step, self.ex.execute(step), steps, beside=out.reqs)
        self.ex.abort(r)
        self.ex.kv.assign(out.reqs)

    def stream(self, prompt: int, steps: int) -> list[float]:
        """A prompt of `prompt` tokens in one step (unmeasured), then `steps` decode steps of its
        request, one after another as a run decodes a request alone: each decode's seconds
        (`StepResult.duration`). On a CPU the first decodes after a prompt step run slower than
        steady ones (the profile's ``decode_rewarm`` rows, `measure.REWARM_STEADY`)."""
        out = _batch([(prompt, 0)], self.ex.args.vocab_size, self.rng)
        r = out.reqs[0]
        self.ex.kv.assign(out.reqs)
        self.ex.add_request(r, None)
        times = self._decodes(r, out, self.ex.execute(out), steps)
        self.attn.take(), self.head.take()
        return times

    def _decodes(self, r, step, res, steps: int, beside=()) -> list[float]:
        """`steps` decode steps of request `r` alone, one after another, after `step` (which
        returned `res`), its blocks after those of the requests `beside`: each one's seconds."""
        from sarathi_lab.schedulers.output import SchedulerOutput
        times = []
        for _ in range(steps):
            r.num_computed_tokens += step.num_new_tokens[0]
            r.output_token_ids.append(res.sampled[0])
            r.num_output_tokens += 1
            step = SchedulerOutput()
            step.add(r, 1)
            self.ex.kv.assign([*beside, r])      # its block table grows with its tokens
            res = self.ex.execute(step)
            times.append(res.duration)
        return times

    def _stream(self, out, entries, lead: int) -> None:
        """Run, unmeasured, the `lead` decode steps of `out`'s requests before it (contexts
        k - lead .. k - 1, each step sampling), as a run decodes them: the first brings each
        sequence's KV copy to its context (`_prime`), the others each add one token."""
        from sarathi_lab.schedulers.output import SchedulerOutput
        for j in range(lead):
            step = SchedulerOutput()
            for r, (_, k) in zip(out.reqs, entries):
                r.num_computed_tokens, r.num_output_tokens = k - lead + j, j + 1
                step.add(r, 1)
            self.ex.execute(step)
        for r, (_, k) in zip(out.reqs, entries):
            r.num_computed_tokens, r.num_output_tokens = k, lead + 1

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
            for r, (_, k) in zip(out.reqs, entries):
                r.num_computed_tokens = k
