"""The engine's guard: every batch a policy returns is checked against the rules before it runs,
so that a plug-in's mistake stops the run with an error naming the plug-in, the rule, the request
and the iteration, instead of producing a plausible wrong number.

Rules: the policy's token limit and `max_num_seqs`; each entry at least one token and at most
what its request has left to compute, or a decode and its k draft tokens (speculative decoding,
k at most scheduler.num_speculative_tokens, within max_model_len); no request twice in a batch;
only running requests; KV slots held for every token scheduled; a policy that declares
`whole_prompts` computes every entry to its end (no prompt chunked, none recomputed in parts). A run that emits no token and ends no request for a bounded
number of iterations is stuck (a policy that preempts and re-admits forever), and at the end of a
run every KV block must be free or cached.

Preemption by swap: a swapped request holds host blocks and no device blocks (so it is never
scheduled: it is not running); a swap-out moves the blocks of every computed token; a swap-in
restores exactly the host blocks its swap-out filled, in order, to the head of its new block
table, with its progress and tokens unchanged; no batch swaps both ways (a block freed by one
direction could be refilled before the other copied it); a swapped request is swapped in or
rejected, never lost; at the end no host block is held.
"""
from __future__ import annotations

from sarathi_lab.request import Status

RUNNING = Status.RUNNING
SWAPPED = Status.SWAPPED


def _short(x, limit: int = 60) -> str:
    text = repr(x)
    return text if len(text) <= limit else text[:limit] + "..."


class RuleViolation(RuntimeError):
    """A policy broke a rule of the engine; the message names the plug-in, rule and request."""


class BatchGuard:
    def __init__(self, policy, kv):
        self.policy, self.kv = policy, kv
        self.limit = policy.token_limit()
        self.max_seqs = policy.cfg.max_num_seqs
        self.whole = bool(policy.whole_prompts)
        # a prompt is prefilled in at most max_model_len iterations (one token each), after
        # which it emits; a window twice that long without any output is a livelock
        self.patience = 2 * kv.max_model_len + 1000
        self.idle = 0
        self.blocks, self.block_size = kv.block_counts(), kv.block_size
        # request id -> (request, host blocks, computed tokens, its tokens) at its swap-out
        self.swap_log: dict = {}

    def _fail(self, rule: str, detail: str, where) -> None:
        """Raise a RuleViolation naming the plug-in's class, the method whose result broke
        `rule` (during the run the batch schedule() returned; the end-of-run check names
        none), the moment and the detail."""
        cls = type(self.policy)
        where = where() if callable(where) else where
        method = "" if where == "at the end" else ".schedule()"
        raise RuleViolation(f"{cls.__module__}.{cls.__qualname__}{method} broke the rule "
                            f"'{rule}' {where}: {detail}")

    def output_type(self, out, where) -> None:
        """schedule() must return a SchedulerOutput (a subclass will do)."""
        from sarathi_lab.schedulers.output import SchedulerOutput
        if not isinstance(out, SchedulerOutput):
            got = "None" if out is None else f"a {type(out).__name__}: {_short(out)}"
            self._fail("schedule() returns a SchedulerOutput", f"it returned {got} (build one "
                       "with out = SchedulerOutput(), out.add(req, n) per request, and return "
                       "out)", where)

    def check(self, out, where, stop=None) -> tuple[int, list[int] | None]:
        """Check the batch `out` before it runs. Returns how many of its entries sample a token
        and, given `stop` (request id -> the output length at which it ends: the executor's
        default rule), the indices of the entries that end now (else None). `where()` names the
        moment (iteration and time) in errors."""
        reqs, ns = out.reqs, out.num_new_tokens
        n = len(reqs)
        if len(ns) != n:
            self._fail("one token count per request", f"{n} requests, {len(ns)} counts", where)
        total = sum(ns)
        if self.limit is not None and total > self.limit:
            self._fail("token limit", f"the batch holds {total} tokens, the policy's limit is "
                       f"{self.limit}", where)
        if len(self.policy.running) > self.max_seqs:
            self._fail("max_num_seqs", f"{len(self.policy.running)} requests running, "
                       f"scheduler.max_num_seqs={self.max_seqs}", where)
        if min(ns) < 1:
            i = next(i for i, k in enumerate(ns) if k < 1)
            self._fail("at least one token per entry", f"request {reqs[i].request_id!r} is given "
                       f"{ns[i]} tokens", where)
        if n > 1 and len(set(reqs)) < n:   # requests hash and compare by identity
            seen = set()
            dup = next(r for r in reqs if id(r) in seen or seen.add(id(r)))
            self._fail("each request once per batch", f"request {dup.request_id!r} appears "
                       "more than once", where)
        spec = out.spec_lens or None
        if spec is not None:
            self._check_spec(out, where)
        samples, bs, held = 0, self.block_size, self.blocks
        ended = None if stop is None else []
        for i, (r, k) in enumerate(zip(reqs, ns)):
            rid = r.request_id
            end = r.num_computed_tokens + k
            out_n = r.num_output_tokens
            todo = r.num_prompt_tokens + out_n
            if end == todo:
                samples += 1
                if stop is not None and out_n + 1 >= stop[rid]:
                    ended.append(i)
            elif spec is not None and spec[i]:
                # a speculative decode (checked above): it emits 1 + its accepted drafts, so
                # whether it ends is known only after the step (the engine decides it then)
                samples += 1
            elif end > todo:
                self._entry(r, k, where)
            try:   # a subscript of the read-only view costs less than its get()
                slots = len(held[rid]) * bs
            except KeyError:
                slots = 0
            if end > slots or r.status is not RUNNING:
                self._entry(r, k, where)
        if self.whole and samples < n:   # an entry short of its request's end: a chunk
            r, k = next((r, k) for r, k in zip(reqs, ns)
                        if r.num_computed_tokens + k < r.num_prompt_tokens + r.num_output_tokens)
            self._fail("whole prompts", f"request {r.request_id!r} is given {k} of the "
                       f"{r.num_prompt_tokens + r.num_output_tokens - r.num_computed_tokens} "
                       "tokens it has left, but the policy declares whole_prompts = True",
                       where)
        if out.swapped_out or out.swapped_in or self.swap_log or self.policy.swapped:
            self._check_swaps(out, where)
        return samples, ended

    def _check_spec(self, out, where) -> None:
        """Speculative entries: one draft count per entry, each a decode given 1 + its drafts,
        no more drafts than scheduler.num_speculative_tokens, all within max_model_len."""
        spec, reqs, ns = out.spec_lens, out.reqs, out.num_new_tokens
        if len(spec) != len(reqs):
            self._fail("one speculation length per entry", f"{len(reqs)} requests, "
                       f"{len(spec)} spec_lens (add entries with out.add(req, n, spec=k))",
                       where)
        k_max = self.policy.cfg.num_speculative_tokens
        mml = self.kv.max_model_len
        for r, n, s in zip(reqs, ns, spec):
            if not s:
                continue
            rid = r.request_id
            if not 0 < s <= k_max:
                self._fail("speculation length within scheduler.num_speculative_tokens",
                           f"request {rid!r} is given {s} draft tokens; "
                           f"scheduler.num_speculative_tokens={k_max}", where)
            if not r.is_decoding or n != 1 + s:
                self._fail("a speculative entry is a decode of 1 + k tokens",
                           f"request {rid!r} is given {n} tokens with {s} drafts, having "
                           f"{r.num_tokens_to_compute} left to compute (1 for a decode)", where)
            if r.num_computed_tokens + n > mml:
                self._fail("drafts within max_model_len", f"request {rid!r} is given {s} "
                           f"drafts after {r.num_computed_tokens + 1} tokens; "
                           f"max_model_len={mml}", where)

    # -- preemption by swap -----------------------------------------------------------------------
    @staticmethod
    def _tokens(r) -> tuple:
        return r.num_prompt_tokens, r.num_output_tokens, tuple(r.output_token_ids)

    def _check_swaps(self, out, where) -> None:
        kv, bs, log, held = self.kv, self.block_size, self.swap_log, self.blocks
        if out.swapped_out and out.swapped_in:
            self._fail("no batch swaps both ways", f"it swaps out "
                       f"{[r.request_id for r, _ in out.swapped_out]} and swaps in "
                       f"{[r.request_id for r, _ in out.swapped_in]}", where)
        for r, pairs in out.swapped_out:
            rid, host = r.request_id, kv.host_block_table(r)
            if r.status is not SWAPPED or rid in held:
                self._fail("a swapped request holds no device blocks", f"request {rid!r} is "
                           f"{r.status.name.lower()} and holds {len(held.get(rid, ()))} device "
                           "blocks after its swap-out", where)
            n = -(-r.num_computed_tokens // bs)
            moved = [h for _, h in pairs]
            if not n or moved != host or len(host) != n or len({d for d, _ in pairs}) != n:
                self._fail("a swap-out moves the blocks of every computed token",
                           f"request {rid!r} has {r.num_computed_tokens} tokens computed "
                           f"({n} blocks of {bs}); its swap-out copies {pairs} and it holds host "
                           f"blocks {host}", where)
            log[rid] = (r, host, r.num_computed_tokens, self._tokens(r))
        for r, pairs in out.swapped_in:
            rid = r.request_id
            rec = log.pop(rid, None)
            if rec is None:
                self._fail("only swapped requests are swapped in", f"request {rid!r} was not "
                           "swapped out", where)
            _, host, n_tok, tokens = rec
            source, dest = [h for h, _ in pairs], [d for _, d in pairs]
            if source != host or kv.block_table(r)[:len(dest)] != dest \
                    or len(set(dest)) != len(dest):
                self._fail("a swap-in restores exactly the swapped blocks", f"request {rid!r} "
                           f"was swapped out to host blocks {host}; its swap-in copies {pairs} "
                           f"and its block table is {kv.block_table(r)}", where)
            if r.num_computed_tokens != n_tok or self._tokens(r) != tokens \
                    or kv.host_block_table(r):
                self._fail("a swap-in restores exactly the swapped blocks", f"request {rid!r} "
                           f"was swapped out with {n_tok} tokens computed and comes back with "
                           f"{r.num_computed_tokens} (its tokens changed: "
                           f"{self._tokens(r) != tokens}; host blocks still held: "
                           f"{kv.host_block_table(r)})", where)
        swapped = self.policy.swapped
        if len(swapped) != len(log):
            ids = {r.request_id for r in swapped}
            for rid in [k for k in log if k not in ids]:
                if log[rid][0].status is Status.REJECTED and not kv.host_block_table(log[rid][0]):
                    del log[rid]   # rejected while swapped (it could never come back)
                else:
                    self._fail("a swapped request is swapped in or rejected, never lost",
                               f"request {rid!r} left the swapped queue without a swap-in", where)
        for r in swapped:
            rid = r.request_id
            if rid not in log or r.status is not SWAPPED or rid in held \
                    or kv.host_block_table(r) != log[rid][1]:
                self._fail("a swapped request holds its host blocks and no device blocks",
                           f"request {rid!r} is {r.status.name.lower()}, holds "
                           f"{len(held.get(rid, ()))} device blocks and host blocks "
                           f"{kv.host_block_table(r)}", where)

    def swaps_without_batch(self, out, where) -> None:
        """A batch with no entries moved KV blocks: no iteration would copy them."""
        self._fail("a batch that swaps KV schedules tokens", f"it swaps out "
                   f"{[r.request_id for r, _ in out.swapped_out]} and in "
                   f"{[r.request_id for r, _ in out.swapped_in]} but schedules nothing", where)

    def _entry(self, r, k, where) -> None:
        rid = r.request_id
        end = r.num_computed_tokens + k
        todo = r.num_prompt_tokens + r.num_output_tokens
        held = self.kv.held_slots([r])[0]
        if r.status is not RUNNING:
            self._fail("only running requests", f"request {rid!r} is {r.status.name.lower()}",
                       where)
        if end > todo:
            # a schedule() that moves num_computed_tokens forward itself, then gives the tokens
            # the request had left before, ends here: say who may move it
            self._fail("no more tokens than a request has left", f"request {rid!r} is given {k} "
                       f"tokens with {todo - r.num_computed_tokens} left to compute (its "
                       f"num_computed_tokens is {r.num_computed_tokens}; only the engine's "
                       "update() may move it, never schedule())", where)
        self._fail("KV slots for every token", f"request {rid!r} is given {k} tokens after "
                   f"{r.num_computed_tokens} but holds KV slots for {held}", where)

    def progressed(self, emitted: int, ended: int, where: str) -> None:
        """After an iteration: count iterations without output; too many is a livelock."""
        if emitted or ended:
            self.idle = 0
            return
        self.idle += 1
        if self.idle > self.patience:
            p = self.policy
            self._fail("progress", f"{self.idle} iterations in a row emitted no token and ended "
                       f"no request ({len(p.waiting)} waiting, {len(p.running)} running); it "
                       "would never finish", where)

    def finished(self) -> None:
        """At the end of a run: nothing left queued, swapped or running, no KV block (device or
        host) held."""
        p, kv = self.policy, self.kv
        if p.waiting or p.running or p.swapped:
            swapped = f", {len(p.swapped)} swapped" if p.swapped else ""
            self._fail("every request ends", f"{len(p.waiting)} waiting{swapped} and "
                       f"{len(p.running)} running requests were left when the run ended",
                       "at the end")
        if kv.host_holders() or kv.num_used_host_blocks:
            self._fail("every host block is freed", f"{kv.num_used_host_blocks} host blocks "
                       f"still held, by requests {sorted(kv.host_holders(), key=str)[:10]}",
                       "at the end")
        holders = kv.holders()
        if holders or kv.num_used_blocks:
            self._fail("every KV block is freed", f"{kv.num_used_blocks} blocks still held, by "
                       f"requests {sorted(holders, key=str)[:10]}", "at the end")
