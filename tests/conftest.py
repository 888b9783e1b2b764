import dataclasses
import os
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
