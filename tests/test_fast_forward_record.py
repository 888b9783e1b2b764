"""The summary's `fast_forward` record: `run.fast_forward` is on by default, and a run that
cannot skip through its steady runs says why instead of recording the setting as if it acted."""
import pytest
from helpers import composed

from sarathi_lab.run.runner import run
from sarathi_lab.schedulers.sarathi import Sarathi

SMALL = ["trace=synthetic", "trace.num_requests=6", "trace.qps=20", "progress=false"]


class Restepped(Sarathi):
    """A new schedule(): the parent's fast-forward declaration no longer vouches for it."""
    name = "restepped"

    def schedule(self, now):
        return super().schedule(now)


@pytest.mark.parametrize("overrides, why", [
    ([], None),
    (["fast_forward=false"], "run.fast_forward=false"),
    (["executor.step_jitter=0.1"],
     "executor.step_jitter draws a factor for every executed step"),
    (["executor.pipeline_parallel=2"],
     "executor.pipeline_parallel=2: the pipeline places every batch"),
    (["scheduler.num_speculative_tokens=2", "executor.draft_cost_ratio=0.05",
      "executor.acceptance_rate=0.7"],
     "speculative decoding: a steady run's tokens per step depend on the drafts accepted"),
    (["scheduler=custom", "scheduler.name=test_fast_forward_record:Restepped"],
     "Restepped declares no fast_forward"),
    (["cluster.num_replicas=2"], None),
    # Sarathi declares its runs; the budget controller turned them off, and is named
    (["scheduler=sarathi", "scheduler.controller=tbt_target", "+scheduler.target_tbt_s=0.05"],
     "scheduler.controller=tbt_target: the budget may change every iteration"),
])
def test_the_summary_says_whether_the_run_fast_forwarded_and_why_not(overrides, why):
    s = run(composed(*SMALL, *overrides), None, write=False)
    assert s["fast_forward"] == {"enabled": why is None, "why_not": why}
    assert s["settings"]["run"]["fast_forward"] is ("fast_forward=false" not in overrides)


@pytest.mark.slow   # the real executor on a CPU (~10 CPU-s; 234 s at load 12)
def test_a_real_executor_runs_every_iteration():
    s = run(composed("executor=torch", "model=tiny-llama", "executor.device=cpu", *SMALL), None,
            write=False)
    assert s["fast_forward"] == {"enabled": False,
                                 "why_not": "the executor runs every iteration (no decode_run)"}
