"""What chunking a prompt costs, three ways, read independently of calibrate_roofline.py:
the roofline, the profiled model, and the raw measured operator times of Vidur's Llama-2-70B
TP2 A100 profile at exactly the chunks' shapes.

    python experiments/calibration/chunk_cost_three_way.py [--profiles DIR]

One prompt of n tokens prefilled alone in chunks of c (chunk i at cached context k = i c),
total time over the one-piece prefill, - 1, in %. The raw column reads mlp.csv by num_tokens
and attention.csv's prefill rows (is_prefill, batch_size 1) by (prefill_chunk_size,
kv_cache_size), where kv_cache_size is the context already cached BEFORE the chunk (Vidur's
AttentionInput.is_valid requires prefill_chunk_size + kv_cache_size <= max_seq_len, 4096 here:
the chunk of 128 is measured up to context 3968, the one piece of 4096 only at 0). "Raw" is the
median of a point's repeated rows, no interpolation: a prompt with any chunk at an unmeasured
point gets no raw figure (8k: beyond max_seq_len). What no Vidur compute profile measures (the
CPU side, the LM head, the all-reduce) is the roofline's, the same in all three columns.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd
import yaml

from sarathi_lab.costmodels.profiled import ProfiledConfig, ProfiledCostModel
from sarathi_lab.costmodels.roofline import RooflineCostModel

REPO = Path(__file__).resolve().parents[2]
PROFILE = "compute/a100/meta-llama/Llama-2-70b-hf"
LAYERS, TP = 80, 2
LINEAR_OPS = {"input_layernorm": 1, "attn_pre_proj": 1, "attn_rope": 1, "attn_post_proj": 1,
              "post_attention_layernorm": 1, "mlp_up_proj": 1, "mlp_act": 1,
              "mlp_down_proj": 1, "add": 2}        # two residual adds a layer
ATTN_OPS = ("attn_prefill", "attn_input_reshape", "attn_output_reshape")
CHUNKS = (128, 256, 512, 1024, 2048, 4096)
PROMPTS = (2048, 4096, 8192)


def raw_points(d: Path) -> tuple[dict, dict]:
    """Whole-model seconds at the measured points: linear by tokens, prefill attention by
    (chunk, context before it)."""
    mlp = pd.read_csv(d / "mlp.csv")
    mlp = mlp[mlp.num_tensor_parallel_workers == TP]
    per_layer = sum(n * mlp[f"time_stats.{op}.median"] for op, n in LINEAR_OPS.items())
    ms = LAYERS * per_layer + mlp["time_stats.emb.median"]       # the embedding runs once
    linear = (ms.groupby(mlp.num_tokens).median() * 1e-3).to_dict()
    att = pd.read_csv(d / "attention.csv")
    att = att[(att.num_tensor_parallel_workers == TP) & att.is_prefill & (att.batch_size == 1)]
    ms = LAYERS * att[[f"time_stats.{op}.median" for op in ATTN_OPS]].sum(axis=1)
    prefill = (ms.groupby([att.prefill_chunk_size, att.kv_cache_size]).median()
               * 1e-3).to_dict()
    return linear, prefill


def overhead(price, n: int, c: int) -> float:
    """% more time for n tokens in chunks of c than in one piece (the last chunk samples)."""
    def total(step):
        return sum(price(min(step, n - k), k, int(k + step >= n)) for k in range(0, n, step))
    return 100 * (total(c) / total(n) - 1)


def presets() -> tuple[dict, dict]:
    """Llama-2-70B (its length raised to the longest prompt) and the A100 preset."""
    model = yaml.safe_load((REPO / "configs/model/llama-2-70b.yaml").read_text())
    model["max_model_len"] = max(PROMPTS)
    return model, yaml.safe_load((REPO / "configs/hardware/a100-80gb.yaml").read_text())


def table(profiles: Path) -> pd.DataFrame:
    model, hw = presets()
    roof = RooflineCostModel(model, hw, TP)
    prof = ProfiledCostModel(model, hw, TP, ProfiledConfig(profile=str(profiles / PROFILE),
                                                           iteration_overhead_s=0.0))
    linear, prefill = raw_points(profiles / PROFILE)

    def shared(c, S):    # measured by no compute profile: the roofline's, in every column
        return roof.overhead + roof.req_overhead + roof.allreduce_time(c) + roof.lm_head_time(S)

    def raw(c, k, S):
        if c not in linear or (c, k) not in prefill:
            return float("nan")
        return linear[c] + prefill[(c, k)] + shared(c, S)

    prices = {"roofline": lambda c, k, S: roof.iteration_time([(c, k)], [], S),
              "profiled model": lambda c, k, S: prof.iteration_time([(c, k)], [], S)
              + roof.overhead + roof.req_overhead,
              "raw points": raw}
    rows = []
    for n in PROMPTS:
        for name, price in prices.items():
            rows.append({"prompt": n, "source": name,
                         **{f"c={c}": round(overhead(price, n, c), 1) for c in CHUNKS if c < n}})
    return pd.DataFrame(rows)


def extra_by_part(profiles: Path, n: int = 4096) -> pd.DataFrame:
    """Where the n-token prompt's chunking overhead comes from, ms over one piece: the layers
    but attention (the roofline's with its per-layer floors and elementwise terms, against the
    raw linear points), prefill attention (the roofline against the raw points), and the terms
    all three columns share (CPU side, all-reduce); and the roofline's linear time over the raw
    point at the chunk's tokens."""
    roof = RooflineCostModel(*presets(), TP)
    linear, prefill = raw_points(profiles / PROFILE)

    def parts(c):
        ks = range(0, n, c)
        lin_r = roof.layer_floors + roof.linear_time(c) + roof.elementwise_time(c)
        return {"linear roofline": len(ks) * lin_r, "linear raw": len(ks) * linear[c],
                "attention roofline": sum(roof.chunk_attention_time(c, k) for k in ks),
                "attention raw": sum(prefill[(c, k)] for k in ks),
                "shared": len(ks) * (roof.overhead + roof.req_overhead + roof.allreduce_time(c)),
                "linear roofline/raw at c": lin_r / linear[c]}
    one = parts(n)
    rows = []
    for c in CHUNKS:
        if c < n:
            p = parts(c)
            rows.append({"chunk": c, **{k: round(1e3 * (v - one[k]), 1) for k, v in p.items()
                                        if "/" not in k},
                         "linear roofline/raw at c": round(p["linear roofline/raw at c"], 3)})
    rows.append({"chunk": "one piece (ms)", **{k: round(1e3 * v, 1) for k, v in one.items()
                                                if "/" not in k},
                 "linear roofline/raw at c": round(one["linear roofline/raw at c"], 3)})
    return pd.DataFrame(rows)


def what_if(profiles: Path) -> pd.DataFrame:
    """The roofline's overhead with one of its parts replaced: its linear layers by the raw
    points (what is left is attention's), and its attention by the profile's two speeds (the
    free fit of calibrate_roofline: own-chunk pairs at 0.17 of peak, cached-context pairs at
    0.38; the presets keep one, 0.28)."""
    model, hw = presets()
    roof = RooflineCostModel(model, hw, TP)
    two = RooflineCostModel(model, {**hw, "attn_self_eff": 0.17, "attn_eff": 0.38}, TP)
    linear, _ = raw_points(profiles / PROFILE)

    def raw_linear(c, k, S):
        if c not in linear:
            return float("nan")
        return roof.iteration_time([(c, k)], [], S) - roof.layer_floors - roof.linear_time(c) \
            - roof.elementwise_time(c) + linear[c]

    prices = {"roofline, raw linear points": raw_linear,
              "roofline, attention at 0.17/0.38": lambda c, k, S: two.iteration_time([(c, k)],
                                                                                   [], S)}
    return pd.DataFrame([{"prompt": n, "source": name,
                          **{f"c={c}": round(overhead(price, n, c), 1) for c in CHUNKS if c < n}}
                         for n in PROMPTS for name, price in prices.items()])


def default_profiles() -> Path:
    """Vidur's profiles in the shared folder, which sits beside the main checkout (../shared)
    or beside a worktree's parent (the first of the two that exists)."""
    near = [p / "shared/profiles/vidur" for p in (REPO.parent, REPO.parent.parent)]
    return next((p for p in near if p.is_dir()), near[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profiles", type=Path, default=default_profiles())
    args = ap.parse_args()
    with pd.option_context("display.width", 200):
        print(table(args.profiles).to_string(index=False))
        print("\nms over one piece by part, 4096-token prompt:")
        print(extra_by_part(args.profiles).to_string(index=False))
        print("\nthe roofline with one part replaced:")
        print(what_if(args.profiles).to_string(index=False))


if __name__ == "__main__":
    main()
