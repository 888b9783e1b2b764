"""Fit the roofline's efficiency factors and kernel floors to Vidur's measured GPU profiles.

  python experiments/calibrate_roofline.py [--profiles DIR]    (> calibrate_roofline.txt)

Compares the roofline (sarathi_lab.costmodels.roofline.py) per layer with measured medians
(Vidur, MLSys'24; DIR/SOURCES.md) and prints predicted/measured ratios (median, p10, p90) before
(peak numbers: every efficiency 1, no floors) and after the fit:

  layer        everything but attention: QKV, O, gate/up, down GEMMs + norms, RoPE, SiLU*mul,
               add; every profiled Llama-family model and TP degree on A100 and H100, split at
               the ridge point (T = peak/bandwidth tokens in bf16) into memory-bound
               (T <= ridge/2) and compute-bound (T >= 2 ridge); the transition is not fitted
  attention    Llama-2-70B geometry, TP 2, A100 (the one attention profile): prefill by chunk
               and cached context, decode by batch and context
  all-reduce   NCCL on one DGX A100 / H100 node

Fits: memory-bound layers, measured ~ bytes/(bw mem_eff) + floor (least squares in relative
error); compute-bound layers, compute_eff = median of FLOP time / (measured - elementwise -
floor); decode attention gives attention's kernel floor at that mem_eff; prefill chunks of >= 512
tokens give attn_eff (median); small/large all-reduces give latency and link_eff.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from sarathi_lab.costmodels.roofline import HardwareSpec, RooflineCostModel
from sarathi_lab.models.shape import ModelShape

REPO = Path(__file__).resolve().parents[1]
GPUS = {"a100": "a100-80gb", "h100": "h100-sxm"}        # profile folder -> hardware preset
NETS = {"a100": "a100_dgx", "h100": "h100_dgx"}
GEMMS = ["attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj"]
ELEMENTWISE = ["input_layernorm", "post_attention_layernorm", "attn_rope", "mlp_act", "add"]
OURS = {"Llama-2-7b-hf": "llama-2-7b", "Llama-2-70b-hf": "llama-2-70b",
        "Meta-Llama-3-8B": "llama-3-8b"}                 # profiled models that have a preset
ONES = dict(compute_eff=1.0, attn_eff=1.0, mem_eff=1.0, link_eff=1.0, iteration_overhead_s=0.0,
            layer_overhead_s=0.0)


def hardware(gpu: str) -> HardwareSpec:
    cfg = yaml.safe_load((REPO / "configs/hardware" / f"{GPUS[gpu]}.yaml").read_text())
    cfg.update(ONES, link_latency_s=0.0)                  # raw peaks: ratios are efficiencies
    return HardwareSpec.from_config(cfg)


def one_layer(name, hidden, inter, heads, kv_heads) -> ModelShape:
    return ModelShape(name=name, num_layers=1, hidden_size=int(hidden),
                      intermediate_size=int(inter), num_heads=int(heads),
                      num_kv_heads=int(kv_heads), head_dim=None, vocab_size=32000,
                      max_model_len=4096)


def summarize(df: pd.DataFrame, by: list[str], col: str) -> pd.DataFrame:
    g = df.groupby(by, sort=False)[col]
    return pd.DataFrame({"n": g.size(), "median": g.median(), "p10": g.quantile(0.1),
                         "p90": g.quantile(0.9)}).round(3)


def linear_points(root: Path) -> pd.DataFrame:
    """One row per (gpu, model, tp, T): measured ms and the roofline's two terms at peak."""
    rows = []
    for gpu in GPUS:
        hw = hardware(gpu)
        ridge = hw.peak_flops / hw.mem_bandwidth
        for csv in sorted((root / "compute" / gpu).glob("*/*/mlp.csv")):
            d = pd.read_csv(csv)
            if not d.use_gated_mlp.all():
                continue                                  # phi-2: not a Llama-family block
            med = {op: f"time_stats.{op}.median" for op in GEMMS + ELEMENTWISE}
            d = d.groupby(["num_tensor_parallel_workers", "num_tokens"])[list(med.values())]\
                .median().reset_index()
            s = pd.read_csv(csv, nrows=1).iloc[0]
            shape = one_layer(csv.parent.name, s.n_embd, s.n_expanded_embd, s.n_head, s.n_kv_head)
            for tp, g in d.groupby("num_tensor_parallel_workers"):
                cm = RooflineCostModel(shape, hw, int(tp))
                T = g.num_tokens.to_numpy()
                rows.append(pd.DataFrame({
                    "gpu": gpu, "model": shape.name, "tp": int(tp), "T": T,
                    "gemm_ms": g[[med[o] for o in GEMMS]].sum(axis=1).to_numpy(),
                    "ew_ms": g[[med[o] for o in ELEMENTWISE]].sum(axis=1).to_numpy(),
                    "flop_ms": T * cm.lin_per_token * 1e3, "mem_ms": cm.lin_weights * 1e3,
                    "ew_pred_ms": T * cm.ew_per_token * 1e3,
                    "regime": np.select([T <= ridge / 2, T >= 2 * ridge],
                                        ["memory", "compute"], "transition")}))
    return pd.concat(rows, ignore_index=True)


def attention_points(root: Path) -> pd.DataFrame:
    d = pd.read_csv(root / "compute/a100/meta-llama/Llama-2-70b-hf/attention.csv")
    s = d.iloc[0]
    cm = RooflineCostModel(one_layer("llama-2-70b", s.n_embd, 4 * s.n_embd, s.n_q_head,
                                     s.n_kv_head), hardware("a100"),
                           int(s.num_tensor_parallel_workers))
    p, q = d[d.is_prefill], d[~d.is_prefill]
    c, k = p.prefill_chunk_size.to_numpy(), p.kv_cache_size.to_numpy()
    B, kd = q.batch_size.to_numpy(), q.kv_cache_size.to_numpy()
    kv_mb = B * (kd + 1) * cm.kv_bytes_per_token / 1e6
    return pd.concat([
        pd.DataFrame({"kind": np.where(c >= 512, "prefill c>=512", "prefill c<512"),
                      "meas_ms": p["time_stats.attn_prefill.median"].to_numpy(),
                      "flop_ms": (c * k + c * (c + 1) // 2) * cm.attn_per_pair * 1e3,
                      "mem_ms": (k + c) * cm.attn_per_kv_token * 1e3}),
        pd.DataFrame({"kind": np.where(kv_mb >= 32, "decode KV>=32MB", "decode KV<32MB"),
                      "meas_ms": q["time_stats.attn_decode.median"].to_numpy(),
                      "flop_ms": B * (kd + 1) * cm.attn_per_pair * 1e3,
                      "mem_ms": B * (kd + 1) * cm.attn_per_kv_token * 1e3})],
        ignore_index=True)


def network(root: Path, gpu: str) -> tuple[float, float, pd.DataFrame]:
    d = pd.read_csv(root / "network" / NETS[gpu] / "all_reduce.csv")
    d = d[d.devices_per_node == d.num_workers]            # one node, all GPUs on NVSwitch
    d = d.groupby(["num_workers", "size"])["time_stats.all_reduce.median"].median().reset_index()
    t = d["time_stats.all_reduce.median"] * 1e-3
    lat = float(t[d["size"] <= 65536].median())
    w = d.num_workers
    busbw = 2 * (w - 1) / w * d["size"] / (t - lat).clip(lower=1e-7)
    big = d["size"] >= 32 * 2**20
    eff = float((busbw[big] / hardware(gpu).link_bandwidth).median())
    pred = lat + 2 * (w - 1) / w * d["size"] / (hardware(gpu).link_bandwidth * eff)
    d["ratio"] = pred / t
    d["msg"] = np.where(d["size"] <= 65536, "<=64KiB", np.where(big, ">=32MiB", "between"))
    return lat, eff, summarize(d, ["msg"], "ratio")


def affine_fit(x, y) -> tuple[float, float]:
    """y ~ a x + b, least squares in relative error (every point counts alike)."""
    A = np.c_[x, np.ones_like(x)] / y[:, None]
    a, b = np.linalg.lstsq(A, np.ones_like(y), rcond=None)[0]
    return float(a), float(b)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profiles", type=Path, default=REPO.parent / "shared/profiles/vidur")
    root = ap.parse_args().profiles
    pd.set_option("display.width", 120)
    fit, floor = {}, {}

    lin = linear_points(root)
    lin["meas_ms"] = lin.gemm_ms + lin.ew_ms
    lin["before"] = (np.maximum(lin.flop_ms, lin.mem_ms) + lin.ew_pred_ms) / lin.meas_ms
    for gpu, g in lin.groupby("gpu"):
        m, c = g[g.regime == "memory"], g[g.regime == "compute"]
        slope, floor[gpu] = affine_fit((m.mem_ms + m.ew_pred_ms).to_numpy(), m.meas_ms.to_numpy())
        me = round(1 / slope, 2)
        ce = (c.flop_ms / (c.meas_ms - c.ew_pred_ms / me - floor[gpu])).median()
        fit[gpu] = dict(mem_eff=me, compute_eff=round(float(ce), 2))
    ce = lin.gpu.map(lambda x: fit[x]["compute_eff"])
    me = lin.gpu.map(lambda x: fit[x]["mem_eff"])
    lin["after"] = (np.maximum(lin.flop_ms / ce, lin.mem_ms / me) + lin.ew_pred_ms / me
                    + lin.gpu.map(floor)) / lin.meas_ms
    print(f"== Layer without attention (QKV+O+gate/up+down GEMMs + norms, RoPE, SiLU*mul, add), "
          f"predicted/measured, {len(lin)} points\n   models: "
          + ", ".join(sorted(lin.model.unique())))
    for col, what in [("before", "at peak (every eff = 1, no floor)"), ("after", "after the fit")]:
        print(f"\n-- {what}")
        print(summarize(lin, ["gpu", "regime"], col).to_string())
    print("\n-- after the fit, median by model and TP (all regimes); * = a model with a preset")
    lin["model*"] = lin.model.map(lambda m: m + (" *" if m in OURS else ""))
    print(lin.groupby(["gpu", "model*", "tp"])["after"].median().unstack("tp").round(2).to_string())

    att = attention_points(root)
    att["before"] = np.maximum(att.flop_ms, att.mem_ms) / att.meas_ms
    dec, pre = att[att.kind.str.startswith("decode")], att[att.kind == "prefill c>=512"]
    dec_eff = 1 / affine_fit(dec.mem_ms.to_numpy(), dec.meas_ms.to_numpy())[0]
    me = fit["a100"]["mem_eff"]
    att_floor = float((dec.meas_ms - dec.mem_ms / me).median())
    ae = round(float((pre.flop_ms / (pre.meas_ms - att_floor)).median()), 2)
    att["after"] = (np.maximum(att.flop_ms / ae, att.mem_ms / me) + att_floor) / att.meas_ms
    print("\n== Attention, Llama-2-70B TP2 on A100 (FlashAttention, block 16), "
          "predicted/measured per layer")
    print(pd.concat({"before": summarize(att, ["kind"], "before"),
                     "after": summarize(att, ["kind"], "after")}, axis=1).to_string())
    print(f"decode KV reads alone fit a bandwidth efficiency of {dec_eff:.2f} "
          f"(GEMM weight reads: {me:.2f}); kernel floor {att_floor * 1e3:.1f} us per layer")

    print("\n== All-reduce (NCCL, one DGX node), predicted/measured after the fit")
    for gpu in GPUS:
        lat, eff, table = network(root, gpu)
        print(f"-- {gpu}: latency {lat * 1e6:.0f} us, link_eff {eff:.2f}")
        print(table.to_string())
        fit[gpu].update(attn_eff=ae, link_eff=round(eff, 2), link_latency_s=float(f"{lat:.2g}"),
                        layer_overhead_s=float(f"{(floor[gpu] + att_floor) * 1e-3:.2g}"))

    print("\n== Fitted preset values. layer_overhead_s = floor of the layer's other kernels "
          f"(a100 {floor['a100'] * 1e3:.0f} us, h100 {floor['h100'] * 1e3:.0f} us) + attention's; "
          "H100 has no attention profile and takes A100's attn_eff and attention floor; H200 "
          "takes H100's values")
    print(pd.DataFrame(fit).T.to_string())
    for gpu, vals in fit.items():
        cfg = yaml.safe_load((REPO / "configs/hardware" / f"{GPUS[gpu]}.yaml").read_text())
        off = {k: (cfg.get(k), v) for k, v in vals.items() if not np.isclose(cfg.get(k, 0), v)}
        print(f"configs/hardware/{GPUS[gpu]}.yaml:", f"differs {off}" if off else "matches")


if __name__ == "__main__":
    main()
