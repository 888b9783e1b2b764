"""Speculative decoding: the shared accounting (settings, batch entries of 1 + k tokens, the
guard's rules, the engine's and the policy's update by 1 + accepted tokens, stops mid-way) and
the simulator's drafts, verification and acceptance models, checked by hand."""
import pytest
from conftest import LinearCost, make_policy, req

from sarathi_lab.engine import Engine
from sarathi_lab.executors.base import StepResult
from sarathi_lab.guard import RuleViolation
from sarathi_lab.settings import ConfigError


class Scripted(LinearCost):
    """LinearCost that speculates: the target accepts the scripted number of drafts of each
    speculative entry, per request id, in order (then all of them)."""
    supports_speculation = True

    def __init__(self, script=None, **kw):
        super().__init__(**kw)
        self.script = {k: list(v) for k, v in (script or {}).items()}

    def execute(self, out):
        step = super().execute(out)
        if out.spec_lens:
            step.accepted = [min(s, self.script.get(r.request_id, []).pop(0))
                             if s and self.script.get(r.request_id) else s
                             for r, s in zip(out.reqs, out.spec_lens)]
        return step


def run(ex, reqs, **kw):
    p = make_policy("sarathi", **kw)
    e = Engine(p, ex, fast_forward=True)
    e.run(reqs)
    return p, e


def test_accepted_tokens_advance_a_decode_and_a_stop_cuts_them():
    # prompt 4, output 7, k = 3: the first token comes with the prompt; then steps of
    # 1 + accepted tokens: 1 + 2 = 3 (4 out), 1 + 0 = 1 (5 out), 1 + 3 = 4 cut at 7 (2 dropped)
    r = req(0, 4, 7)
    ex = Scripted({0: [2, 0, 3]})
    p, e = run(ex, [r], token_budget=64, num_speculative_tokens=3)
    assert r.num_output_tokens == 7 and r.finish_reason == "stop"
    assert len(r.token_times) == 7 and len(set(r.token_times)) == 4   # 4 emission events
    assert (r.spec_proposed, r.spec_accepted) == (9, 5)   # 3 steps of 3 drafts; 2 + 0 + 3
    assert e.num_iterations == 4 and not e.fast_forward   # speculation steps every iteration
    assert p.kv.num_used_blocks == 0 and p.kv.num_stored_tokens == 0


def test_the_executor_must_speculate():
    p = make_policy("sarathi", token_budget=64, num_speculative_tokens=2)
    with pytest.raises(ConfigError, match="num_speculative_tokens=2.*LinearCost.*"
                                          "supports_speculation"):
        Engine(p, LinearCost())
