"""The fidelity study's library: run.py (the study's command line) and the scripts beside it
(pooled.py, speed_spread.py, noise_memory.py, decode_warmth.py) put this folder's parent on
sys.path and import from here, as tests/test_fidelity.py does.

    runs       the model, policies and scales; a run's config; the figures compared
    interval   the 90% t-interval of a mean of a few runs
    bias       the simulation's error against the real runs, the bias and its intervals
    residuals  every real iteration's batch, priced by the cost model, by composition
    jitter     the step jitter's log-sd, from a profile or from the real steps
    speed      the machine's speed between the profile's parts; the simulation averaged over it
    report     the Markdown tables
    plots      the CDFs of the real runs beside the simulation
    kept       a kept study's runs read again (`run.py --bias`)
    study      the study: profile, real runs, simulations, residuals, outputs
"""
import os
import sys
from pathlib import Path

# Before torch loads (the study imports it late): one thread, as every timing of the study
# assumes (a 2-core machine shared with other jobs swings by 3-4x with two); no model hub.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = Path(__file__).resolve().parents[3]
# experiments/studies.py (the helpers every study shares) is no package: its folder goes on the
# path, as each study script puts it
sys.path.insert(0, str(ROOT / "experiments"))
