import dataclasses
import os
import resource
import sys
from pathlib import Path

# The checkout's root is no import root: `python -m pytest` puts it first on sys.path (and xdist's
# workers copy that sys.path), where kernels/, shipped as sarathi_lab.kernels, would stand in for
# Hugging Face's `kernels` package that transformers imports. The project is imported from its
# install (editable or the wheel), the tests' helpers from tests/ (pytest puts it there).
ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [p for p in sys.path if Path(p or os.curdir).resolve() != ROOT]

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRITON_INTERPRET", "1")   # before any @triton.jit runs

import pytest  # noqa: E402

from sarathi_lab.executors.base import Executor, StepResult  # noqa: E402
from sarathi_lab.kv import KVCacheManager  # noqa: E402
from sarathi_lab.registry import policy_class, queue_class  # noqa: E402
from sarathi_lab.request import Request  # noqa: E402


def slow_fixture(*args, **kwargs):
    """`pytest.fixture` for a fixture that runs a study, the command line, a server or a
    measurement: every test that uses it, directly or through another fixture, is marked slow
    (tests/test_suite_rules.py reads the test files for it; `pytest_fixture_setup` below checks
    the tests that run)."""
    def declare(fn):
        fn.slow_fixture = True
        return pytest.fixture(fn, **kwargs)
    if len(args) == 1 and callable(args[0]) and not kwargs:   # @slow_fixture, no arguments
        return declare(args[0])
    return declare


# A fixture that is not declared slow and takes more than this much CPU time (its process's and
# its subprocesses', nested fixtures' excluded) to set up for a test of the fast tier is an error:
# CPU time, not wall time, so the load of the machine does not move it.
SLOW_SETUP_CPU_S = 20.0
_setting_up: list = []   # the test being set up (the fixtures' requester)
_nested: list[float] = []   # CPU seconds of the fixtures set up inside each one being set up


def _cpu_s() -> float:
    return sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                  resource.getrusage(resource.RUSAGE_CHILDREN)))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    _setting_up.append(item)
    try:
        return (yield)
    finally:
        _setting_up.pop()


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef, request):
    item = _setting_up[-1] if _setting_up else None
    if item is None or item.get_closest_marker("slow"):
        return (yield)
    _nested.append(0.0)
    start = _cpu_s()
    try:
        result = yield
    finally:
        spent = _cpu_s() - start
        own = spent - _nested.pop()
        if _nested:
            _nested[-1] += spent
    # after the fixture is set up, so that pytest caches it as usual
    if getattr(fixturedef.func, "slow_fixture", False):
        pytest.fail(f"{item.nodeid} uses the slow fixture {fixturedef.argname!r} and is not "
                    f"marked slow", pytrace=False)
    if own > SLOW_SETUP_CPU_S:
        pytest.fail(f"fixture {fixturedef.argname!r} took {own:.0f} CPU-s to set up for "
                    f"{item.nodeid}, a test of the fast tier: declare it with slow_fixture "
                    f"(tests/conftest.py) and mark the tests that use it slow", pytrace=False)
    return result


class LinearCost(Executor):
    """A toy executor for exact scenarios: a fixed cost per iteration plus a cost per token."""
    supports_fast_forward = True

    def __init__(self, base=0.01, per_token=0.001, per_ctx=0.0):
        self.base, self.per_token, self.per_ctx = base, per_token, per_ctx

    def execute(self, out):
        ctx = sum(r.num_computed_tokens for r in out.reqs)
        return StepResult(self.base + self.per_token * out.total_tokens + self.per_ctx * ctx)

    def decode_run(self, contexts, k):
        import numpy as np
        steps = np.arange(k)
        B = len(contexts)
        return self.base + self.per_token * B + self.per_ctx * (contexts.sum() + B * steps)

    def chunk_run(self, contexts, computed, chunks, samples_last):
        # execute's sum, batch by batch: the decodes' contexts + the prompt's computed tokens
        B, total, out = len(contexts), sum(contexts), []
        for j, c in enumerate(chunks):
            out.append(self.base + self.per_token * (B + c)
                       + self.per_ctx * (total + B * j + computed))
            computed += c
        return out


def make_policy(name, *, num_blocks=1000, block_size=4, max_model_len=256, strict=False, **kw):
    """A policy on its own KV manager. Unless `strict`, the one policy-specific knob a test
    sets for several policies at once (token_budget / max_num_batched_tokens) goes only to the
    policies that read it."""
    cls = policy_class(name)
    if not strict:
        fields = {f.name for f in dataclasses.fields(cls.config_class)}
        kw = {k: v for k, v in kw.items()
              if k in fields or k not in ("token_budget", "max_num_batched_tokens")}
    sc = cls.parse_config({"block_size": block_size, **kw})
    kv = KVCacheManager(num_blocks, block_size, enable_prefix_caching=sc.enable_prefix_caching,
                        reserve=cls.reserves_kv, max_model_len=max_model_len)
    # the queue by name or dotted path, as the run layer finds it (a policy knows built-ins only)
    return cls(sc, kv, queue_class(sc.queue)())


def req(i, prompt, out, t=0.0, ids=None, max_tokens=None):
    return Request(i, t, prompt, out, prompt_token_ids=ids, max_tokens=max_tokens)


@pytest.fixture
def linear_cost():
    return LinearCost()


def only_read(sched: dict) -> dict:
    """A scheduler node for tests that set both policy-specific knobs: the one the named
    policy does not read becomes null (unset), as in configs/scheduler/common.yaml."""
    cls = policy_class(sched["name"])
    fields = {f.name for f in dataclasses.fields(cls.config_class)}
    return {k: (None if k in ("token_budget", "max_num_batched_tokens") and k not in fields
                else v) for k, v in sched.items()}
