"""The built-in policies' fast-forward declarations (`mechanics/fast_forward.py`): when each
policy's next batches are a steady run the simulator may skip through. Kept out of the policy
modules, which read as their papers describe them; each policy names its declaration there
(`fast_forward = steady.SARATHI`). Each predicate states why the policy's `schedule()` would
give exactly that run, and is checked by running the policy with fast-forward on and off.
"""
from __future__ import annotations

from sarathi_lab.request import Status
from sarathi_lab.schedulers.mechanics.fast_forward import FastForward, advance_decodes


# -- whole prompts: request_level, orca, vllm ---------------------------------------------------
def _request_level(policy) -> bool:
    # a batch runs to completion: nothing is admitted while any request runs
    return True


def _orca(policy) -> bool:
    # every decode, plus whole prompts in what is left of the token cap
    return not policy.waiting or policy.head_blocked(policy.token_cap - len(policy.running),
                                                     whole=True)


def _vllm(policy) -> bool:
    # a prompt batch comes first whenever the head can start; else the decodes
    return not policy.waiting or policy.head_blocked(policy.token_cap, whole=True)


REQUEST_LEVEL = FastForward(steady_decode=_request_level)
ORCA = FastForward(steady_decode=_orca)
VLLM = FastForward(steady_decode=_vllm)


# -- chunked prefill: sarathi, and the policies built on it ---------------------------------------
def sarathi_decode(policy) -> bool:
    # decodes never outnumber the budget (each request's prompt went through it first);
    # checked anyway, as the engine does not see the last batch decode them all
    left = policy.cfg.token_budget - len(policy.running)
    return left >= 0 and (not policy.waiting or policy.head_blocked(left))


def sarathi_chunks(policy):
    # one prompt under way beside decodes only: each batch is every decode plus the chunk
    # that fills the budget, which leaves none to admit with until the prompt's last chunk
    # (the engine stops before that one while a request waits). A waiting head that could
    # never fit is not left behind by any schedule(): admit_waiting rejects it there
    running, budget = policy.running, policy.cfg.token_budget
    if policy.admission is not None or policy.swapped or policy.kv.enable_prefix_caching \
            or len(running) > budget:
        return None
    pre = None
    for req in running:   # req.is_decoding, inlined: asked after most prefill batches
        out_n = req.num_output_tokens
        if not out_n or req.num_computed_tokens != req.num_prompt_tokens + out_n - 1:
            if pre is not None:
                return None
            pre = req
    if pre is None or pre.status is not Status.RUNNING:
        return None
    return pre, budget - (len(running) - 1)


SARATHI = FastForward(steady_decode=sarathi_decode, steady_chunks=sarathi_chunks)
# prefill chunks in the queue's order (edf): with every running request decoding no prefill is
# under way, so only the head's admission could change the batch, exactly as for sarathi. Its
# chunk runs are not declared (the ranked order may hand the budget to the waiting head)
ORDERED_SARATHI = FastForward(steady_decode=sarathi_decode)


def _sarathi_priority(policy) -> bool:
    # as sarathi, and the head must not be able to preempt: the blocks it could free and the
    # free blocks only shrink together while running requests decode, so a head that cannot
    # preempt now cannot during the run either (keys do not change with time)
    if not sarathi_decode(policy):
        return False
    return not (policy.cfg.priority_preemption and policy.waiting
                and policy.victims(policy.waiting.peek()))


SARATHI_PRIORITY = FastForward(steady_decode=_sarathi_priority)


def _vtc_decode(policy) -> bool:
    # counters grow during a decode run, so the turn may pass to any backlogged tenant:
    # steady only if no tenant's oldest request could start now (nor, as each rule only
    # tightens while running requests grow, during the run)
    left = policy.cfg.token_budget - len(policy.running)
    if left < 0:
        return False
    if not policy.waiting:
        return True
    if policy.kv.enable_prefix_caching:
        return False
    return all(policy.admission_blocker(q[0], left) is not None
               for q in policy.waiting.queues.values() if q)


def _vtc_advance(policy, times, ended=()):
    # VTC.update charges each emitted token to its tenant: k decodes of every running request
    # (those that end in the last step included) charge k each
    served, k = policy.waiting.output_tokens, len(times)
    for r in policy.running:
        served[r.tenant] = served.get(r.tenant, 0) + k
    return advance_decodes(policy, times, ended)


# no chunk runs: the default advance_chunks does not charge the decodes beside the chunks
VTC = FastForward(steady_decode=_vtc_decode, advance_decodes=_vtc_advance)
