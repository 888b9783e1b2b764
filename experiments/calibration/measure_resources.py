"""Measure the bytes per replica, per request and per output token that sarathi_lab/resources.py
uses to refuse runs that cannot fit this machine's memory (its constants were set from this
script's output, rounded up; see the module's docstring).

    python experiments/calibration/measure_resources.py

Each figure is the growth of Python's traced peak memory (tracemalloc) over a whole run
(trace, engines, drive, tables, summary) between a small and a larger count of the one resource,
divided by the difference in counts; everything else the same.
"""
import gc
import tracemalloc

from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from sarathi_lab.run.runner import run


def peak(*overrides) -> int:
    with initialize_config_module("sarathi_lab.configs", version_base="1.3"):
        cfg = OmegaConf.to_container(compose("config", overrides=list(overrides)), resolve=True)
    gc.collect()
    tracemalloc.start()
    run(cfg, None, write=False)
    _, top = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return top


def per(name: str, low: int, high: int, make, units: int = 1) -> None:
    """The growth from `low` to `high`, per step of the count and per one of `units` alike
    (each output-token step adds a token to every one of the run's requests)."""
    a, b = peak(*make(low)), peak(*make(high))
    print(f"{name}: {(b - a) / (high - low) / units:,.0f} bytes each "
          f"(peak {a / 2**20:.1f} MiB at {low}, {b / 2**20:.1f} MiB at {high})")


if __name__ == "__main__":
    base = ["progress=false", "trace=synthetic", "trace.prompt_len=128", "trace.qps=20"]
    per("request (1 output token)", 1000, 5000,
        lambda n: [*base, f"trace.num_requests={n}", "trace.output_len=1"])
    per("output token", 16, 256,
        lambda n: [*base, "trace.num_requests=1000", f"trace.output_len={n}"],
        units=1000)     # a token more for each of the 1000 requests
    per("replica", 8, 64, lambda n: ["progress=false", "trace.num_requests=200", "trace.qps=50",
                                     f"cluster.num_replicas={n}"])
