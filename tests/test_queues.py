"""Waiting queues (scheduler.queue=fcfs|priority|edf|spf): their order, where preempted requests
go back, the preemption victim; admission walks the queue without overtaking; and the policy
invariants hold under every queue."""
import random

import numpy as np
import pytest
from conftest import LinearCost, make_policy

from sarathi_lab.engine import Engine
from sarathi_lab.request import Request, Status
from sarathi_lab.schedulers.queues import (
    DeadlineQueue,
    PriorityQueue,
    RequestQueue,
    ShortestPromptQueue,
)
from sarathi_lab.schedulers.sarathi import Sarathi, SarathiConfig

POLICIES = ["request_level", "orca", "vllm", "sarathi"]
QUEUES = ["fcfs", "priority", "edf", "spf"]


def r(i, t=0.0, prompt=4, out=8, **service):
    return Request(i, t, prompt, out, **service)


def ids(reqs):
    return [x.request_id for x in reqs]


def drain(q):
    out = []
    while q:
        out.append(q.pop())
    return out


# -- the queues themselves ---------------------------------------------------------------------
def test_fcfs_is_arrival_order_and_preempted_go_to_the_head():
    q = RequestQueue()
    assert not q and len(q) == 0
    a, b, c, d = r(0, 0.0), r(1, 1.0), r(2, 2.0), r(3, 3.0)
    for x in (a, b, c):
        q.push(x)
    assert len(q) == 3 and q.peek() is a and ids(q) == [0, 1, 2]
    assert q.pop() is a and q.peek() is b
    q.push_preempted(d)    # admitted before everything still waiting
    q.push_preempted(a)    # preempted after d in the same step: ahead of it (admitted earlier)
    assert ids(q) == [0, 3, 1, 2] and q.peek() is a
    assert ids(drain(q)) == [0, 3, 1, 2] and not q
    # the victim is the latest admitted, whatever its service attributes
    cands = [r(5, priority=9), r(6, priority=0), r(7, priority=1)]
    assert q.victim(cands) is cands[-1]


def test_priority_queue_order_ties_and_preempted_by_key():
    q = PriorityQueue()
    reqs = [r(0, 0.0, priority=2), r(1, 0.5, priority=0), r(2, 1.0, priority=1),
            r(3, 1.5, priority=0), r(4, 1.5, priority=0)]
    for x in reqs:
        q.push(x)
    # smallest value first; equal values in arrival order, then push order
    assert ids(q) == [1, 3, 4, 2, 0]
    assert ids(q) == [1, 3, 4, 2, 0]     # iterating does not consume or reorder
    assert q.peek() is reqs[1] and len(q) == 5
    assert q.pop() is reqs[1] and q.pop() is reqs[3]
    # a preempted request goes back by its key, not to the head; among its equals, by arrival
    late_urgent = r(5, 9.0, priority=0)
    q.push(late_urgent)
    q.push_preempted(reqs[1])            # priority 0, arrived at 0.5: ahead of 4 and 5
    assert ids(q) == [1, 4, 5, 2, 0]
    assert ids(drain(q)) == [1, 4, 5, 2, 0]


def test_deadline_queue_puts_requests_without_one_last():
    q = DeadlineQueue()
    reqs = [r(0, 0.0), r(1, 0.1, deadline=5.0), r(2, 0.2, deadline=1.0), r(3, 0.3),
            r(4, 0.4, deadline=1.0)]
    for x in reqs:
        q.push(x)
    assert ids(q) == [2, 4, 1, 0, 3]
    q.pop()
    q.push_preempted(reqs[2])
    assert ids(drain(q)) == [2, 4, 1, 0, 3]


def test_shortest_prompt_queue():
    q = ShortestPromptQueue()
    for i, n in enumerate([9, 3, 6, 3]):
        q.push(r(i, i, prompt=n))
    assert ids(drain(q)) == [1, 3, 2, 0]


@pytest.mark.parametrize("queue, attrs, victim", [
    # the candidate with the largest key; among equals, the latest admitted (the last one)
    (PriorityQueue, [dict(priority=0), dict(priority=3), dict(priority=1)], 1),
    (PriorityQueue, [dict(priority=0), dict(priority=2), dict(priority=2)], 2),
    (PriorityQueue, [dict(priority=5), dict(priority=2), dict(priority=5)], 2),
    (DeadlineQueue, [dict(deadline=1.0), dict(deadline=9.0), dict(deadline=4.0)], 1),
    (DeadlineQueue, [dict(), dict(deadline=9.0), dict(deadline=4.0)], 0),   # none: preempted first
    (DeadlineQueue, [dict(), dict(), dict(deadline=4.0)], 1),
    (ShortestPromptQueue, [dict(prompt=9), dict(prompt=30), dict(prompt=12)], 1),
    (RequestQueue, [dict(priority=9), dict(priority=0), dict(priority=0)], 2),
])
def test_victim(queue, attrs, victim):
    cands = [r(i, **a) for i, a in enumerate(attrs)]
    assert queue().victim(cands) is cands[victim]
    assert queue().victim(cands[:1]) is cands[0]


def test_queue_by_name_or_dotted_path():
    assert type(make_policy("sarathi", queue="edf").waiting) is DeadlineQueue
    p = make_policy("vllm", queue="sarathi_lab.schedulers.queues:PriorityQueue")
    assert type(p.waiting) is PriorityQueue
    with pytest.raises(ValueError, match="unknown queue 'lifo'; known: edf, fcfs, priority, spf"):
        make_policy("sarathi", queue="lifo")
    # built in code without a queue, a policy takes the built-in its settings name, and no
    # other: the policy layer does not import the registry, which finds plug-ins
    kv = make_policy("vllm").kv
    assert type(Sarathi(SarathiConfig(queue="spf", block_size=4), kv).waiting) \
        is ShortestPromptQueue
    with pytest.raises(ValueError, match=r"^scheduler\.queue='my:Lifo': a policy built without a "
                       r"queue knows only the built-in ones \(fcfs, priority, edf, spf\); pass "):
        Sarathi(SarathiConfig(queue="my:Lifo", block_size=4), kv)


# -- admission order, hand-built -----------------------------------------------------------------
def stepper(policy):
    eng = Engine(policy, LinearCost(), fast_forward=False)

    def step():
        out = eng.advance().batch
        return [(x.request_id, n) for x, n in zip(out.reqs, out.num_new_tokens)]
    return eng, step


@pytest.mark.parametrize("queue, service, first, second", [
    # four requests arrive together; a batch holds 10 prompt tokens (vLLM: prefill-only batches)
    ("fcfs", dict(priority=[2, 0, 1, 0]), [(0, 5), (1, 5)], [(2, 5), (3, 5)]),
    ("priority", dict(priority=[2, 0, 1, 0]), [(1, 5), (3, 5)], [(2, 5), (0, 5)]),
    ("edf", dict(deadline=[None, 3.0, 1.0, 2.0]), [(2, 5), (3, 5)], [(1, 5), (0, 5)]),
    ("spf", dict(prompt=[5, 4, 3, 2]), [(3, 2), (2, 3), (1, 4)], [(0, 5)]),
    ("fcfs", dict(prompt=[5, 4, 3, 2]), [(0, 5), (1, 4)], [(2, 3), (3, 2)]),
])
def test_admission_order(queue, service, first, second):
    p = make_policy("vllm", max_num_batched_tokens=10, max_model_len=10, queue=queue)
    eng, step = stepper(p)
    for i in range(4):
        kw = {k: v[i] for k, v in service.items()}
        prompt = kw.pop("prompt", 5)
        eng.add_request(r(i, 0.0, prompt=prompt, out=3, **kw))
    assert step() == first
    assert step() == second


@pytest.mark.parametrize("queue", ["fcfs", "priority"])
def test_late_urgent_request_is_admitted_first(queue):
    # one request runs at a time (max_num_seqs=1); 1 and 2 wait for 0, 2 arrives later but
    # is more urgent
    p = make_policy("sarathi", max_num_seqs=1, token_budget=64, queue=queue)
    eng, step = stepper(p)
    eng.add_request(r(0, 0.0, prompt=4, out=2, priority=1))
    eng.add_request(r(1, 0.0, prompt=4, out=2, priority=1))
    assert step() == [(0, 4)]
    eng.add_request(r(2, 0.0, prompt=4, out=2, priority=0))
    assert step() == [(0, 1)]        # 0 ends
    assert step() == ([(2, 4)] if queue == "priority" else [(1, 4)])


@pytest.mark.parametrize("queue", ["fcfs", "priority", "edf"])
def test_blocked_head_is_not_overtaken(queue):
    # 10 blocks of 4 tokens: 0 holds 5, then 6; 2 (small, less urgent) would fit in what is left,
    # but 1 (urgent, 6 blocks) is the head of the ordered queues, and no one overtakes it
    p = make_policy("sarathi", num_blocks=10, max_model_len=64, token_budget=64,
                    kv_watermark=0.0, queue=queue)
    eng, step = stepper(p)
    eng.add_request(r(0, 0.0, prompt=20, out=3))
    assert step() == [(0, 20)]
    eng.add_request(r(2, 0.0, prompt=4, out=3, priority=1, deadline=9.0))
    eng.add_request(r(1, 0.0, prompt=24, out=3, priority=0, deadline=1.0))
    if queue == "fcfs":                  # 2 arrived first, and fits
        assert step() == [(0, 1), (2, 4)]
        return
    assert step() == [(0, 1)]
    assert ids(p.waiting) == [1, 2]
    assert step() == [(0, 1)]            # 0 ends, its 5 blocks free
    assert step() == [(1, 24), (2, 4)]


# -- the preemption victim and where it goes back, hand-built ------------------------------------
@pytest.mark.parametrize("queue, service, batch, preempted, waiting, after", [
    # FCFS: the latest admitted (C) goes, back to the head; D, which would fit, waits behind it
    ("fcfs", dict(priority=[0, 2, 1, 1]), "AB", "C", "CD", ("AB", "", "CD")),
    # priority: the least urgent among those not yet in the batch (B, the one that needs the
    # block itself); D, more urgent than B, goes ahead of it and is admitted in the same step
    ("priority", dict(priority=[0, 2, 1, 1]), "ACD", "B", "B", ("AC", "D", "DB")),
    # D less urgent than B: B is the head, does not fit, and D waits behind it
    ("priority", dict(priority=[0, 2, 1, 3]), "AC", "B", "BD", ("AC", "", "BD")),
    # B and C equally urgent: the latest admitted of them (C)
    ("priority", dict(priority=[0, 1, 1, 3]), "AB", "C", "CD", ("AB", "", "CD")),
    ("edf", dict(deadline=[1.0, 9.0, 5.0, 5.0]), "ACD", "B", "B", ("AC", "D", "DB")),
    # no deadline is the latest: C goes, and back behind D, which is admitted in its place
    ("edf", dict(deadline=[1.0, 5.0, None, 7.0]), "ABD", "C", "C", ("AB", "D", "DC")),
])
def test_preemption_victim_and_requeue(queue, service, batch, preempted, waiting, after):
    """Sarathi, 7 blocks of 4 tokens, prompts of 4, max_num_seqs=3. A and B start at step 1,
    C at step 2, D arrives at step 3 and waits (3 running). At step 6 A and B both need a
    new block with 1 free: A takes it, and B needs a victim among B and C (A is granted)."""
    p = make_policy("sarathi", num_blocks=7, block_size=4, max_model_len=64, token_budget=64,
                    kv_watermark=0.0, max_num_seqs=3, queue=queue)
    eng = Engine(p, LinearCost(), fast_forward=False)
    reqs = {}
    for i, name in enumerate("ABCD"):
        kw = {k: v[i] for k, v in service.items()}
        reqs[name] = r(i, 0.0, prompt=4, out=20, **kw)
    names = {x.request_id: n for n, x in reqs.items()}

    def step():
        out = eng.advance().batch
        return ("".join(names[x.request_id] for x in out.reqs),
                "".join(names[x.request_id] for x in out.preempted),
                "".join(names[x.request_id] for x in p.waiting))
    eng.add_request(reqs["A"])
    eng.add_request(reqs["B"])
    assert step() == ("AB", "", "")
    eng.add_request(reqs["C"])
    assert step() == ("ABC", "", "")
    eng.add_request(reqs["D"])
    for _ in range(3):
        assert step() == ("ABC", "", "D")
    assert p.kv.num_free_blocks == 1
    assert step() == (batch, preempted, waiting)
    assert reqs[preempted].num_preemptions == 1 and reqs[preempted].num_computed_tokens == 0
    assert reqs[preempted].status is Status.WAITING
    assert step() == after


@pytest.mark.parametrize("queue, service, survivor", [
    ("fcfs", dict(priority=[1, 0]), "A"),        # vLLM: the latest admitted (B) goes
    ("priority", dict(priority=[1, 0]), "B"),    # A, the less urgent, goes, though first in
    ("edf", dict(deadline=[9.0, 1.0]), "B"),
])
def test_vllm_preempts_by_the_queue(queue, service, survivor):
    # 4 blocks of 4: A (step 1) and B (step 2) hold 2 blocks each from step 3; at step 7 A
    # needs a third block
    p = make_policy("vllm", num_blocks=4, block_size=4, max_model_len=64,
                    max_num_batched_tokens=64, kv_watermark=0.0, queue=queue)
    eng, step = stepper(p)
    a = r(0, 0.0, prompt=4, out=20, **{k: v[0] for k, v in service.items()})
    b = r(1, 0.0, prompt=4, out=20, **{k: v[1] for k, v in service.items()})
    eng.add_request(a)
    assert step() == [(0, 4)]
    eng.add_request(b)
    assert step() == [(1, 4)]            # prefill-only batch: A's decode stalls
    for _ in range(4):
        assert step() == [(0, 1), (1, 1)]
    keep, gone = (a, b) if survivor == "A" else (b, a)
    assert step() == [(keep.request_id, 1)]
    assert gone.num_preemptions == 1 and ids(p.waiting) == [gone.request_id]
    assert keep.num_preemptions == 0


@pytest.mark.parametrize("name", ["vllm", "sarathi"])
@pytest.mark.parametrize("queue", QUEUES)
def test_a_request_that_could_never_be_admitted_again_is_rejected(name, queue):
    # 20 blocks, the watermark keeps 2 free at admission. Y (66 + 12 tokens) fits the cache but,
    # preempted at 73 tokens (19 blocks), could never be admitted again: rejected, not left to
    # block the queue until the run fails (vLLM ignores such a request likewise)
    p = make_policy(name, num_blocks=20, max_model_len=1024, max_num_batched_tokens=1024,
                    token_budget=512, kv_watermark=0.1, queue=queue)
    x, y = r(0, prompt=2, out=30), r(1, prompt=66, out=12)
    Engine(p, LinearCost()).run([x, y])
    assert x.status is Status.FINISHED and x.num_output_tokens == 30
    assert y.status is Status.REJECTED and y.num_output_tokens == 7 and y.num_preemptions == 1
    assert y.rejection_reason == ("needs 19 KV blocks to start, but only 18 of the cache's 20 "
                                  "may be taken at admission: scheduler.kv_watermark=0.1 keeps "
                                  "2 free")
    assert p.kv.num_free_blocks == 20
    # one whose prompt alone is past the watermark is rejected on arrival
    p = make_policy(name, num_blocks=20, max_model_len=1024, max_num_batched_tokens=1024,
                    kv_watermark=0.1, queue=queue)
    big, ok = r(0, prompt=73, out=2), r(1, prompt=4, out=2)
    Engine(p, LinearCost()).run([big, ok])
    assert big.status is Status.REJECTED and "needs 19 KV blocks to start" in big.rejection_reason
    assert ok.status is Status.FINISHED


# -- the invariants, for each queue and policy ---------------------------------------------------
def service_trace(rng, n=40):
    t, out = 0.0, []
    for i in range(n):
        t += rng.expovariate(20.0)
        out.append(Request(i, t, rng.randint(1, 60), rng.randint(1, 40),
                           priority=rng.randint(0, 3),
                           deadline=rng.choice([None, t + rng.uniform(0.05, 2.0)])))
    return out


class Watched:
    """Checks the victim rule of the policy's queue at every preemption."""

    def preemption_victim(self, candidates):
        v = super().preemption_victim(candidates)
        key = getattr(self.waiting, "key", None)
        if key is None:
            assert v is candidates[-1]
        else:
            worst = max(key(c) for c in candidates)
            assert v is [c for c in candidates if key(c) == worst][-1]
        self.victims += 1
        return v


def watched(p):
    cls = type(f"Watched{type(p).__name__}", (Watched, type(p)), {})
    w = cls(p.cfg, p.kv)
    w.victims = 0
    return w


@pytest.mark.parametrize("queue", QUEUES)
@pytest.mark.parametrize("name", POLICIES)
@pytest.mark.parametrize("seed", range(3))
def test_invariants_under_every_queue(name, queue, seed):
    rng = random.Random(seed)
    blocks, budget = rng.choice([33, 60, 400]), rng.choice([8, 32, 128])
    seqs, watermark = rng.choice([2, 8, 64]), rng.choice([0.0, 0.01, 0.1])

    def go(ff):
        p = watched(make_policy(name, num_blocks=blocks, max_model_len=128, token_budget=budget,
                                max_num_batched_tokens=128, max_num_seqs=seqs,
                                kv_watermark=watermark, queue=queue))
        reqs = service_trace(random.Random(seed))
        eng = Engine(p, LinearCost(per_ctx=1e-5), fast_forward=ff)
        eng.run(reqs)
        return p, eng, reqs
    p, eng, reqs = go(False)
    it = eng.iters
    tokens = np.add(it["prefill_tokens"], it["decode_tokens"])
    assert tokens.max() <= (budget if name == "sarathi" else 128)
    assert max(it["num_requests"]) <= p.cfg.max_num_seqs
    assert max(it["kv_blocks_used"]) <= blocks
    assert sum(it["preemptions"]) == sum(x.num_preemptions for x in reqs)
    assert p.victims >= sum(it["preemptions"])
    for x in reqs:
        if x.status is Status.REJECTED:
            assert x.rejection_reason
            continue
        assert x.status is Status.FINISHED and x.finish_reason
        assert x.num_output_tokens == min(eng.output_lens[x.request_id],
                                          128 - x.num_prompt_tokens)
        assert len(x.token_times) == x.num_output_tokens
        assert x.arrival_time <= x.first_scheduled_time < x.token_times[0] <= x.finish_time
    assert not p.waiting and not p.running and p.kv.num_free_blocks == blocks
    # and the fast-forward is exact under every queue
    _, eng2, reqs2 = go(True)
    for a, b in zip(reqs, reqs2):
        assert (a.status, a.num_output_tokens, a.num_preemptions) == (
            b.status, b.num_output_tokens, b.num_preemptions)
        np.testing.assert_allclose(a.token_times, b.token_times, rtol=1e-12)
    it2 = eng2.iters
    for col in it:
        np.testing.assert_allclose(it[col], it2[col], rtol=1e-12, err_msg=col)


def test_the_random_scenarios_do_preempt_under_every_queue():
    """The invariant test above is not vacuous: its small caches preempt, under each queue."""
    for queue in QUEUES:
        p = watched(make_policy("vllm", num_blocks=33, max_model_len=128,
                                max_num_batched_tokens=128, queue=queue))
        reqs = service_trace(random.Random(0))
        Engine(p, LinearCost(per_ctx=1e-5)).run(reqs)
        assert p.victims > 0 and sum(x.num_preemptions for x in reqs) > 0, queue
