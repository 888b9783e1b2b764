"""A plug-in policy needs no fast-forward code (issue 21): one of ~30 lines runs with
fast-forward on and off, in code and through the CLI, with identical results; a subclass of a
built-in that changes `schedule()` is stepped rather than skipped by the built-in's opt-in."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import LinearCost, make_policy
from helpers import patience, random_requests
from plugin_policy import Alternate, DecodeFirst

from sarathi_lab.engine import Engine
from sarathi_lab.schedulers.sarathi import Sarathi

TESTS = Path(__file__).resolve().parent


def trace(seed=3, n=40):
    return random_requests(seed, n, rate=10.0, max_prompt=60, max_output=60)


def run(cls, ff, **kw):
    base = make_policy("sarathi", num_blocks=200, max_model_len=128, token_budget=32)
    cfg = cls.parse_config({"block_size": 4, **kw})
    eng = Engine(cls(cfg, base.kv), LinearCost(base=0.01, per_token=1e-4, per_ctx=1e-6),
                 fast_forward=ff)
    reqs = trace()
    eng.run(reqs)
    return eng, [(r.status.name, r.num_output_tokens, r.num_preemptions, r.token_times)
                 for r in reqs]


@pytest.mark.parametrize("cls, kw", [(DecodeFirst, {"prefill_chunk": 24}),
                                     (Alternate, {"token_budget": 32})])
def test_a_plugin_policy_without_fast_forward_code_runs_the_same_either_way(cls, kw):
    fast, fast_reqs = run(cls, True, **kw)
    slow, slow_reqs = run(cls, False, **kw)
    assert cls.fast_forward is None and not fast.fast_forward   # nothing declared: stepped
    assert fast_reqs == slow_reqs
    assert all(s == "FINISHED" for s, *_ in fast_reqs)
    np.testing.assert_array_equal(fast.iterations(), slow.iterations())


def test_the_builtin_opt_in_would_be_wrong_for_a_subclass_that_reschedules():
    # what the rule prevents: Alternate vouching for Sarathi's steady runs would be skipped
    # through decode runs its schedule() never gives
    class Vouches(Alternate):
        fast_forward = Sarathi.fast_forward
    eng, wrong = run(Vouches, True, token_budget=32)
    _, right = run(Alternate, False, token_budget=32)
    assert eng._n_skipped > 0 and wrong != right


def cli(run_dir: Path, *args):
    """`sarathi-lab` in a subprocess with this directory's modules importable; its tables."""
    env = {**os.environ, "WANDB_MODE": "disabled",
           "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-c", "from sarathi_lab.cli.main import main; main()",
                        f"hydra.run.dir={run_dir}", *args], cwd=run_dir.parent, env=env,
                       capture_output=True, text=True, timeout=patience(300))
    assert r.returncode == 0, r.stdout + r.stderr
    return (pd.read_parquet(run_dir / "requests.parquet"),
            pd.read_parquet(run_dir / "iterations.parquet"))


@pytest.mark.slow   # two CLI subprocesses
def test_a_plugin_policy_runs_the_same_through_the_cli_with_and_without_fast_forward(tmp_path):
    args = ("scheduler=custom", "scheduler.name=plugin_policy:DecodeFirst",
            "+scheduler.prefill_chunk=48", "trace=synthetic", "trace.num_requests=30",
            "progress=false")
    reqs, its = cli(tmp_path / "on", *args, "fast_forward=true")
    reqs_off, its_off = cli(tmp_path / "off", *args, "fast_forward=false")
    assert len(reqs) == 30 and reqs["num_output_tokens"].sum() > 30
    assert its["prefill_tokens"].max() == 48
    pd.testing.assert_frame_equal(reqs, reqs_off)
    pd.testing.assert_frame_equal(its, its_off)
