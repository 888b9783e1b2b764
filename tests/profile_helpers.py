"""Profiles that several cost-model test modules share (a test module imports no other test
module): a few rows of Vidur's measured profiles, a synthetic machine whose operator times are
known formulas, writing such rows as a profile CSV, and a profiled cost model over a preset."""
import csv

import yaml
from helpers import CONFIGS, TESTS

from sarathi_lab.costmodels.profiled import ProfiledConfig, ProfiledCostModel

# a few rows of Vidur's Llama-2-70B TP2 A100 profiles (MIT, microsoft/vidur; see SOURCES.md)
VIDUR = TESTS / "data" / "vidur" / "a100" / "meta-llama" / "Llama-2-70b-hf"
# the CLI overrides of a run the Vidur fixture above matches (model, TP, GPU), on a short trace
VIDUR_RUN = ("trace=synthetic", "model=llama-2-70b", "executor.tensor_parallel=2",
             "hardware=a100-80gb")


def preset(kind, name):
    return yaml.safe_load((CONFIGS / kind / f"{name}.yaml").read_text())


# The synthetic machine: whole-model seconds of each operator.
def lin(T):
    return 2e-3 + 5e-6 * T + 1e-10 * T * T


def pre(c, k):
    return 1e-4 + 1e-9 * (c * k + c * c / 2) + 1e-8 * (k + c)


def dec(b, k):
    return 5e-5 + 2e-9 * b * (k + 1) + 1e-6 * b


def head(S):
    return 1e-4 + 1e-6 * S


OVERHEAD = 1.5e-3


META = {"model": "llama-2-7b", "dtype": "bfloat16", "device": "a100-80gb", "tensor_parallel": 1}


def synthetic_rows():
    rows = [{"operator": "linear", "num_tokens": T, "time_s": lin(T)}
            for T in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 3072, 4096)]
    rows += [{"operator": "lm_head", "num_tokens": S, "time_s": head(S)} for S in (1, 64, 256)]
    rows += [{"operator": "prefill_attention", "chunk": c, "context": k, "time_s": pre(c, k)}
             for c in range(128, 4097, 128) for k in range(0, 4097, 512)]
    rows += [{"operator": "decode_attention", "batch": b, "context": k, "time_s": dec(b, k)}
             for b in (1, 2, 4, 8, 16, 32, 64, 128, 256) for k in (16, 256, 1024, 4096)]
    rows += [{"operator": "overhead", "time_s": OVERHEAD}]
    return [{**META, **r} for r in rows]


def write_csv(path, rows):
    cols = ["operator", "num_tokens", "chunk", "batch", "context", "time_s", *META]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, cols)
        w.writeheader()
        w.writerows(rows)
    return path


def profiled(profile, model="llama-2-7b", hardware="a100-80gb", tp=1, **settings):
    return ProfiledCostModel(preset("model", model), preset("hardware", hardware), tp,
                             ProfiledConfig(profile=str(profile), **settings))
