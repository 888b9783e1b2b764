"""Fast-forward: the simulator's skip through steady runs, as an explicit opt-in of a policy.

Between arrivals and finishes a policy's batches often repeat: one decode of every running
request (a decode run), or that plus the next chunk of one prompt (a chunk run). The engine
can compute k such iterations at once (their durations from the cost model in one call) and
move request state in one go -- exactly what k `schedule()`/`update()` round trips would do, in
a fraction of the time. Whether the next batches are such a run depends on the policy, so a
policy opts in by declaring it, as a class attribute:

    fast_forward = FastForward(steady_decode=my_steady_decode)

The declaration is the policy's promise; the engine reads nothing else (it does not look at
which methods a class defines). Its parts, each a function of the policy instance:

  steady_decode(policy) -> bool     (required) True only if, while nothing arrives and nothing
      finishes, the next `schedule()` would be exactly one decode of every running request,
      admitting, swapping in and preempting nothing. Asked only when every running request
      decodes (its prompt done, its last token emitted), after any batch. False is always safe.
  advance_decodes(policy, times, ended) -> list   what len(times) `update()` calls would do for
      as many decode-only batches of every running request, batch j ending at times[j];
      `ended` (running requests, in `running` order) finish in the last of them, and are
      returned, finished. Default: `advance_decodes` below, which is `Progress.update`'s; a
      policy whose `update` does more (counters: vtc) supplies its own.
  steady_chunks(policy) -> (req, chunk) | None    (optional; None: no chunk runs) (req, chunk)
      if, while nothing arrives, nothing finishes and KV suffices, each next `schedule()` would
      be one decode of every other running request plus `chunk` tokens of the running `req`'s
      prompt (what is left of it, if fewer), admitting nothing while it lasts (the last chunk
      included if no request waits). Asked after batches that left a prompt under way.
  advance_chunks(policy, times, req, chunks)      what len(times) `update()` calls would do for
      the batches `steady_chunks` offered, `chunks[j]` tokens of `req` in batch j. Default:
      `advance_chunks` below.

The rule for subclasses (`Policy.__init_subclass__` applies it when the class is created): a
declaration vouches for the `schedule` and `update` in force in the class that declares it --
the two methods whose calls a skipped run stands for -- and is bound to them. A subclass keeps
it only while both are still those very functions; one that changes either (in its body or
through a mixin) and declares nothing itself has no declaration: it is stepped one iteration
at a time (exact, only slower). It may re-declare, e.g. `fast_forward = Sarathi.fast_forward`
when its new `schedule` keeps the parent's steady runs (it vouches for that), or `fast_forward =
None` to say so explicitly. Overriding other methods (a victim rule, a token limit) keeps the
declaration: they act inside `schedule`, which the declaration's predicates consult through
the policy. The old per-method hooks (`steady_decode()`, `advance_decodes()`, ... as methods)
are refused at class creation, so none is silently ignored.

Every skipped run is checked by the engine against what the KV manager holds after it, and
`tests/test_reference_runs.py` and the policy tests run every built-in with fast-forward on and
off and compare the results exactly. The built-in policies' declarations are at the end of
this module, out of the policy modules, which read as their papers describe them (each names
its own: `fast_forward = fast_forward.SARATHI`); each predicate states why the policy's
`schedule()` would give exactly that run. The engine's side of fast-forward, the runs
themselves, is `sarathi_lab/engine/fast_forward.py`.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sarathi_lab.request import Request, Status


def advance_decodes(policy, times: list[float], ended: list[Request] = ()) -> list[Request]:
    """What len(times) `Progress.update` calls would do for as many decode-only batches of every
    running request of `policy`; `ended` finish in the last of them and are returned."""
    k = len(times)
    running = policy.running
    kv = policy.kv
    for r in running:   # the tokens the run emits, before its full blocks are hashed
        if r._planned_ids is not None:
            r.emit_planned(k)
    if not kv.allocate_decodes(running, k):
        for r in running:   # prefix caching hashes full blocks one request at a time
            ok = kv.allocate_slots(r, k)
            assert ok is not None, "fast-forward checked the KV blocks first"
    for r in running:
        r.num_computed_tokens += k
        r.num_output_tokens += k
        r.token_times.extend(times)
    if not ended:
        return []
    end = times[-1]
    for r in ended:
        r.status = Status.FINISHED
        r.finish_time = end
        kv.free(r)
    policy.running = [r for r in running if r.status is Status.RUNNING]
    return list(ended)


def advance_chunks(policy, times: list[float], req: Request, chunks: list[int]) -> None:
    """What len(times) `Progress.update` calls would do for the batches `steady_chunks` offered:
    one decode of every running request but `req` and `chunks[j]` tokens of `req`'s prompt in
    batch j, which ends at times[j]. If the last chunk completes the prompt, `req` emits its
    first token then. Nothing ends."""
    decodes = [r for r in policy.running if r is not req]
    k = len(times)
    kv = policy.kv
    ok = kv.allocate_decodes(decodes, k)
    assert ok, "fast-forward checked the KV blocks first"
    for r in decodes:
        r.emit_planned(k)
        r.num_computed_tokens += k
        r.num_output_tokens += k
        r.token_times.extend(times)
    for c in chunks:
        new = kv.allocate_blocks(req, c)
        assert new == [], "prompt blocks are held from admission"
        req.num_computed_tokens += c
    if req.num_computed_tokens == req.num_prompt_tokens + req.num_output_tokens:
        req.emit_planned(1)
        req.num_output_tokens += 1
        req.token_times.append(times[-1])


@dataclass(frozen=True, slots=True)
class FastForward:
    """A policy's fast-forward declaration (see the module's docstring for each part's
    promise)."""
    steady_decode: Callable[..., bool]
    advance_decodes: Callable[..., list] = advance_decodes
    steady_chunks: Callable[..., tuple | None] | None = None
    advance_chunks: Callable[..., None] = advance_chunks

    def __post_init__(self):
        for part in ("steady_decode", "advance_decodes", "advance_chunks"):
            if not callable(getattr(self, part)):
                raise TypeError(f"FastForward({part}={getattr(self, part)!r}): must be a "
                                "function of the policy")
        if self.steady_chunks is not None and not callable(self.steady_chunks):
            raise TypeError(f"FastForward(steady_chunks={self.steady_chunks!r}): must be a "
                            "function of the policy, or None (no chunk runs)")


# the methods a skipped run stands for: a declaration vouches for the ones in force where it is
# made, and holds for no class where either is another function
STOOD_FOR = ("schedule", "update")
# the per-method hooks of the contract before FastForward: refused, never silently ignored
OLD_HOOKS = ("steady_decode", "steady_chunks", "advance_decodes", "advance_chunks")


def bind(cls: type) -> None:
    """Set the declaration in force for the policy class `cls` being created (the rule in the
    module's docstring): its own `fast_forward`, bound to its `schedule` and `update`
    (`cls._fast_forward_for`); else its parent's if both are still the ones that declaration
    was bound to; else None. Raises TypeError for an old-style hook (defined anywhere in its
    bases, mixins included) or a declaration that is not a FastForward."""
    where = f"policy class {cls.__module__}.{cls.__qualname__}"
    old = [m for m in OLD_HOOKS if hasattr(cls, m)]
    if old:
        raise TypeError(
            f"{where} defines {', '.join(old)}(): the fast-forward hooks are no longer methods "
            "(nothing would call them); declare `fast_forward = FastForward(steady_decode=...)` "
            "in the class body (sarathi_lab.schedulers.mechanics.fast_forward), or drop them "
            "to be stepped")
    methods = tuple(getattr(cls, m) for m in STOOD_FOR)
    if "fast_forward" in vars(cls):
        ff = vars(cls)["fast_forward"]
        if ff is not None and not isinstance(ff, FastForward):
            raise TypeError(f"{where}: fast_forward={ff!r} must be a FastForward or None")
        cls._fast_forward_for = methods
    elif cls.fast_forward is not None and methods != cls._fast_forward_for:
        cls.fast_forward = None   # its schedule() or update() is not what was vouched for


# ================================================================================================
# The built-in policies' declarations: when each policy's next batches are a steady run.

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
