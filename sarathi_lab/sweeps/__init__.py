"""Many runs: sweeps and capacity searches, above the run.

Modules, top to bottom: `capacity` (`mode=capacity`: bisection over the arrival rate, each
probe a run judged by the SLO and by `steady`), `bookkeeping` (sweep and run directory names,
the sweep lock, sweep.json and sweep.log, Hydra's callback), `steady` (the steady-state rule: a
probe's length, warm-up and stability test), `check` (every job of a sweep resolved before the
first starts).
"""
