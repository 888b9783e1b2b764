"""Progress and KV bookkeeping: the one place request progress changes after a batch ran
(`update`), one decode each of requests whose KV was reserved (`decode_reserved`), and
`split_running`, the decodes and the prompts under way among running requests. A mixin of
`Policy`; the fast-forward's counterparts of `update` are in `fast_forward.py`.
"""
from __future__ import annotations

from sarathi_lab.request import Request, Status
from sarathi_lab.schedulers.output import SchedulerOutput


def split_running(running: list[Request]) -> tuple[list[Request], list[Request]]:
    """(decodes, prefills): the running requests whose next step computes exactly their last
    emitted token (`Request.is_decoding`), and the others, each in running order. The property
    is inlined here: this runs once per iteration over every running request, the simulator's
    hottest loop, where a property call per request is a measurable share of a run."""
    decodes, prefills = [], []
    decode, prefill = decodes.append, prefills.append
    for req in running:
        out_n = req.num_output_tokens
        if out_n and req.num_computed_tokens == req.num_prompt_tokens + out_n - 1:
            decode(req)
        else:
            prefill(req)
    return decodes, prefills


class Progress:
    # the target's verdicts on drafts so far (a budget controller's `View` shows them): drafts
    # accepted, and drafts judged (accepted + the first rejected of each step that rejected one)
    drafts_accepted = 0
    drafts_judged = 0

    def update(self, out: SchedulerOutput, step, start: float, end: float) -> list[Request]:
        """Apply an executed batch (`step`, a StepResult): advance counters, emit tokens, end the
        requests the executor ended, free their KV. Returns the requests that finished."""
        if self.admission is not None:
            self.admission.observe(out.split_counts()[0], start, end)
        if step.accepted is not None:
            done = self._update_speculative(out, step, start, end)
        else:
            done = self._update_entries(out, step, start, end)
        if done:
            self.running = [r for r in self.running if r.status is Status.RUNNING]
        if out.swapped_out or out.swapped_in:
            self._charge_swap_time(out, step.swap_s)
        return done

    def _update_entries(self, out: SchedulerOutput, step, start: float, end: float) -> list:
        """`update` of a batch without speculation: each entry that catches up emits one token."""
        done = []
        sampled = step.sampled
        ended = set(step.finished) if step.finished else ()
        for i, (req, n) in enumerate(zip(out.reqs, out.num_new_tokens)):
            if req.first_scheduled_time is None:
                req.first_scheduled_time = start
            done_n = req.num_computed_tokens + n
            req.num_computed_tokens = done_n
            out_n = req.num_output_tokens
            if done_n == req.num_prompt_tokens + out_n:
                req.num_output_tokens = out_n + 1
                req.token_times.append(end)
                if sampled is not None:
                    req.output_token_ids.append(sampled[i])
                elif req._planned_ids is not None:   # simulated: its planned answer
                    req.emit_planned(1)
                if i in ended:
                    done.append(self._finished(req, end))
        return done

    def _update_speculative(self, out: SchedulerOutput, step, start: float, end: float) -> list:
        """`update` of a batch with speculative decodes: entry i advances by and emits
        step.emitted[i] tokens (1 + its accepted drafts, cut at its stop), all at the end of
        the iteration; the KV slots of the drafts it did not keep are released."""
        done = []
        sampled, ids, emitted = step.sampled, step.accepted_ids, step.emitted
        accepted, spec = step.accepted, out.spec_lens or [0] * len(out.reqs)
        ended = set(step.finished) if step.finished else ()
        for i, (req, n) in enumerate(zip(out.reqs, out.num_new_tokens)):
            if req.first_scheduled_time is None:
                req.first_scheduled_time = start
            m, s = emitted[i], spec[i]
            if s:
                a = accepted[i]
                req.spec_proposed += s
                req.spec_accepted += a
                self.drafts_accepted += a
                self.drafts_judged += a + (a < s)
                req.num_computed_tokens += m
                self.kv.release_slots(req, n - m)
            else:
                req.num_computed_tokens += n
            if m:
                req.num_output_tokens += m
                req.token_times.extend([end] * m)
                if sampled is not None:
                    toks = (ids[i] if ids is not None else []) + [sampled[i]]
                    req.output_token_ids.extend(toks[:m])
                else:
                    req.emit_planned(m)
                if i in ended:
                    done.append(self._finished(req, end))
        return done

    def _finished(self, req, end: float):
        """`req` ended at `end` (the executor said so): its KV freed."""
        req.status = Status.FINISHED
        req.finish_time = end
        self.kv.free(req)
        return req

    @staticmethod
    def _charge_swap_time(out: SchedulerOutput, seconds: float) -> None:
        """Each swapped request's share of the iteration's swap time, by the blocks it moved."""
        moves = out.swapped_out + out.swapped_in
        total = sum(len(p) for _, p in moves)
        if total and seconds:
            for r, pairs in moves:
                r.swap_time_s += seconds * len(pairs) / total

    def decode_reserved(self, out: SchedulerOutput) -> None:
        """One decode for every running request whose KV was reserved up front (no growth, so
        no preemption; whole-prompt admission leaves no partial prefill behind)."""
        ok = self.kv.reserve and self.kv.allocate_decodes(self.running)
        assert ok, "decode_reserved needs reserved KV"
        out.add_decodes(list(self.running))
