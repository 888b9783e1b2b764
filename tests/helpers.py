"""Helpers that several test modules share (a test module imports no other test module):
the command line in a subprocess and the packaged config composed in-process, a setting class's
defaults, a plug-in executor whose prices add up by hand, instant simulated hardware and a tiny
model for it, and a policy's engine stepped by hand."""
import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from conftest import LinearCost
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from sarathi_lab.engine import Engine
from sarathi_lab.executors.base import Executor, ExecutorConfig, StepResult
from sarathi_lab.request import Request
from sarathi_lab.settings import setting

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
CONFIGS = ROOT / "configs"   # the packaged Hydra configs


def patience(seconds: float) -> float:
    """A subprocess's time limit: `seconds` on an idle machine, stretched by the load when it
    starts (twice the load average per CPU): the suite's xdist workers and whatever else runs
    share the CPUs, and a run that takes 31 s alone took over 120 s at load 18 on 2 CPUs. A
    limit is there to end a hang, not to time the machine."""
    return seconds * max(1.0, 2.0 * os.getloadavg()[0] / (os.cpu_count() or 1))


def cli(*args, cwd=None, env=None, timeout=120):
    """Run `sarathi-lab` in a subprocess (the test modules importable, wandb off); `timeout` is
    for an idle machine (patience)."""
    e = {**os.environ, "WANDB_MODE": "disabled",
         "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
         **(env or {})}
    limit = patience(timeout)
    try:
        return subprocess.run([sys.executable, "-c", "from sarathi_lab.cli.main import main; main()",
                               *args], cwd=cwd, env=e, capture_output=True, text=True,
                              timeout=limit)
    except subprocess.TimeoutExpired as err:
        out = (err.stdout or "")[-2000:], (err.stderr or "")[-2000:]
        raise AssertionError(
            f"sarathi-lab {' '.join(map(str, args))} did not finish in {limit:.0f} s ({timeout} s "
            f"stretched by the load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs); "
            f"its output so far: {out}") from None


def composed(*overrides) -> dict:
    with initialize_config_module("sarathi_lab.configs", version_base="1.3"):
        cfg = compose("config", overrides=list(overrides))
    return OmegaConf.to_container(cfg, resolve=True)


def defaults(cls) -> dict:
    """The defaults of a settings class, as its config file should write them."""
    out = {}
    for f in dataclasses.fields(cls):
        if f.metadata.get("internal"):
            continue
        out[f.name] = f.default if f.default is not dataclasses.MISSING else f.default_factory()
    return out


@dataclasses.dataclass
class TokenCostConfig(ExecutorConfig):
    base: float = setting(0.01, ge=0)
    per_token: float = setting(0.001, ge=0)
    per_ctx: float = setting(0.0, ge=0)


class TokenCost(Executor):
    """A plug-in executor (loaded by dotted path, as a user's would be): an iteration costs
    `base` + `per_token` x its scheduled tokens (+ `per_ctx` x the tokens already in KV), so
    durations add up by hand."""
    config_class = TokenCostConfig
    simulated = True
    supports_fast_forward = True

    def __init__(self, cfg, model, hardware=None):
        self.base, self.per_token, self.per_ctx = cfg.base, cfg.per_token, cfg.per_ctx

    def execute(self, out):
        ctx = sum(r.num_computed_tokens for r in out.reqs)
        return StepResult(self.base + self.per_token * out.total_tokens + self.per_ctx * ctx)

    def decode_run(self, contexts, k):
        B = len(contexts)
        return self.base + self.per_token * B + self.per_ctx * (contexts.sum() + B * np.arange(k))

    chunk_run = LinearCost.chunk_run   # the same prices


# The roofline simulator on hardware so fast that an iteration costs only its fixed overhead.
INSTANT_HW = {"name": "instant", "peak_flops": 1e30, "mem_bandwidth": 1e30, "memory_bytes": 80e9,
              "link_bandwidth": 1e30, "link_latency_s": 0.0, "iteration_overhead_s": 0.01,
              "layer_overhead_s": 0.0}


TINY_MODEL = {"name": "tiny", "num_layers": 2, "hidden_size": 64, "intermediate_size": 128,
              "num_heads": 4, "num_kv_heads": 2, "head_dim": 16, "vocab_size": 512,
              "max_model_len": 64, "dtype": "float32"}


def instant_sim_cfg(scheduler, **top):
    return {"scheduler": scheduler, "executor": {"name": "sim"}, "model": dict(TINY_MODEL),
            "hardware": dict(INSTANT_HW), "progress": False, **top}


def three_sarathi_requests():
    return [Request(0, 0.0, 6, 3), Request(1, 0.0, 6, 2), Request(2, 0.025, 3, 2)]


SARATHI_8 = {"name": "sarathi", "token_budget": 8, "block_size": 4, "num_kv_blocks": 16}


def engine(policy, ex):
    """One engine per policy under test, made on first use."""
    if not hasattr(policy, "_test_engine"):
        policy._test_engine = Engine(policy, ex, fast_forward=False)
    return policy._test_engine


def add(policy, ex, r):
    return engine(policy, ex).add_request(r)


def step(policy, ex):
    out = engine(policy, ex).advance().batch
    return [(r.request_id, n) for r, n in zip(out.reqs, out.num_new_tokens)]


def random_requests(seed: int, n: int, rate: float, max_prompt: int, max_output: int) -> list:
    """n requests with Poisson arrivals at `rate` per second and lengths uniform in
    1..max_prompt / 1..max_output, drawn from `random.Random(seed)` (the same list every time)."""
    import random

    from sarathi_lab.request import Request
    rng, t, out = random.Random(seed), 0.0, []
    for i in range(n):
        t += rng.expovariate(rate)
        out.append(Request(i, t, rng.randint(1, max_prompt), rng.randint(1, max_output)))
    return out
