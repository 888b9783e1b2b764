"""Fidelity of the simulator against real runs on this machine.

    python experiments/fidelity/run.py [--toy] [--profile PATH] [--repeats 5] [--out DIR]
        [--qps R] [--policies a,b] [--requests N]
    python experiments/fidelity/run.py --bias DIR    # the bias table of a kept study, again

1. Profiles the real (torch) executor here with `sarathi-lab-profile`'s code (or reuses --profile),
   in parts spread over the real runs, each part giving a profile of medians and one of means
   from the same rounds.
2. Replays one trace with `executor=torch` (`--repeats` times, interleaved over the policies),
   recording every step's batch, and with `executor=sim executor.cost_model=profiled` on each
   profile, with and without step jitter, under request_level, orca, vllm and sarathi at two
   token budgets, on the same KV cache size.
3. Writes, in DIR (default results/fidelity, or results/fidelity/toy with --toy): fidelity.csv
   (per policy and figure: the real runs' mean and 90% t-interval of the mean, the simulated
   value, its error against the mean, inside or not), fidelity.md (the verdict tables, the bias
   and spread over figures, the residuals and host time), residuals.csv / residuals_mean.csv
   (measured - predicted per iteration, on the very batch each real iteration ran, by batch
   composition), decode_streams.csv (single-request decodes by their place in a run of them),
   host_time.csv (the iterations' host_s by batch size), fidelity.json, cdfs.png,
   profile.parquet, profile_mean.parquet and profile_check.csv.

Noise control: one torch thread (OMP_NUM_THREADS=1 set before torch loads; a 2-core machine shared
with other jobs swings by 3-4x with two); the profile and the real runs timed on the thread's CPU
time (`executor.clock=cpu`: a real run's clock is the engine's virtual clock, advanced by each
step's measured duration, so every token time is a sum of measured step times, and time other
jobs hold the core is in none of them; the host time around the steps is recorded as host_s and
not counted); the real runs repeated in interleaved rounds so that a slow period touches every
policy alike.

The study's library is fidelity_lib/ beside this script (its __init__ lists the modules), shared
with the scripts that read a kept study again (pooled.py, speed_spread.py, noise_memory.py); this
file is the command line alone.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
# (importing fidelity_lib sets one torch thread before anything loads torch)
from fidelity_lib import ROOT  # noqa: E402
from fidelity_lib.kept import reread_bias  # noqa: E402
from fidelity_lib.runs import POLICIES, SCALES  # noqa: E402
from fidelity_lib.study import study  # noqa: E402


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--toy", action="store_true", help="seconds: a tiny model and trace")
    p.add_argument("--profile", help="reuse this profile instead of measuring one")
    p.add_argument("--repeats", type=int, default=5, help="real runs per policy (>= 2)")
    p.add_argument("--out", help="default: results/fidelity (results/fidelity/toy with --toy)")
    p.add_argument("--qps", type=float, help="arrival rate, req/s (default: the scale's, "
                   f"{SCALES['full']['qps']:g} for the full study)")
    p.add_argument("--policies", help=f"comma-separated subset of {','.join(POLICIES)}")
    p.add_argument("--requests", type=int, help="requests in the trace (default: the scale's, "
                   f"{SCALES['full']['num_requests']} for the full study)")
    p.add_argument("--warm-steps", type=int, help="the profiler's decode steps before each timed "
                   "decode batch (default: sarathi-lab-profile's; 0: the profiles before it)")
    p.add_argument("--bias", metavar="DIR", help="print the bias table of the study kept in "
                   "DIR (its runs/ folder), recomputed from its runs' summaries, and stop")
    a = p.parse_args(argv)
    if a.bias:
        print(reread_bias(Path(a.bias)))
        return
    if a.warm_steps is not None and a.warm_steps < 0:
        sys.exit(f"--warm-steps={a.warm_steps}: must be >= 0")
    if a.warm_steps is not None and a.profile:
        sys.exit("--warm-steps: read only when the study measures its profile (not with "
                 "--profile)")
    if a.repeats < 2:
        sys.exit(f"--repeats={a.repeats}: must be >= 2 (the interval of the real runs' mean)")
    if a.qps is not None and not a.qps > 0:
        sys.exit(f"--qps={a.qps}: must be > 0")
    if a.requests is not None and a.requests < 1:
        sys.exit(f"--requests={a.requests}: must be >= 1")
    out = Path(a.out) if a.out else ROOT / "results" / "fidelity" / ("toy" if a.toy else "")
    study(out, a.toy, a.profile, a.repeats, qps=a.qps,
          policies=a.policies.split(",") if a.policies else None, num_requests=a.requests,
          warm=a.warm_steps)


if __name__ == "__main__":
    main()
