"""Fit the roofline's efficiencies, ridge exponent, floors and overheads to measured profiles.

  python experiments/calibrate_roofline.py [--profiles DIR]    (> calibrate_roofline.txt)

Compares the roofline (sarathi_lab/costmodels/roofline.py) per layer with measured medians and
prints predicted/measured ratios (median, p10, p90) per operator and per token range (1-64,
64-512, 512-4096, and beyond where profiled), before and after the fit:

  linear       everything in a layer but attention: QKV, O, gate/up, down GEMMs + norms, RoPE,
               SiLU*mul, add; every profiled Llama-family model and TP degree on A100 and H100
               (Vidur, MLSys'24; DIR/SOURCES.md). Tokens: the batch's tokens.
  attention    Llama-2-70B geometry, TP 2, A100 (the one attention profile): prefill by chunk
               (tokens: the chunk) and cached context, decode (tokens: the batch size) by context
  all-reduce   NCCL on one DGX A100 / H100 node (tokens: the message over Llama-2-70B's 8192
               bf16 hidden values per token); vLLM's one-shot custom all-reduce on H100 from the
               benchmark table published in sglang PR #2904 (tp 2/4/8, 512 B - 1 MiB)
  CPU          vLLM (v0) per-iteration CPU time measured by Vidur on A100 at TP 1
               (experiments/calibrate_roofline_cpu.csv: schedule + sampler + input preparation +
               output processing medians from data/profiling/a100/cpu_overheads.csv of
               github.com/microsoft/vidur, MIT License, the terms Vidur's simulator adds to an
               iteration)

Fits (least squares of log or relative error, every point alike):
  linear: measured ~ soft(F/ce, M/me) + elementwise/me + floor, soft(a, b) = (a^n + b^n)^(1/n);
          one n for both GPUs (grid), ce, me per GPU (grid), floor closed-form
  attention: measured ~ floor + FLOPs/(peak ae) + KV bytes/(bw ke), linear least squares in
          relative error, prefill and decode points weighted alike
  all-reduce: ring latency = median of <= 64 KiB, link_eff from >= 32 MiB (as before);
          one-shot: affine fit of the published table
  CPU: measured ~ iteration_overhead + B x request_overhead
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
ONES = dict(compute_eff=1.0, attn_eff=1.0, mem_eff=1.0, attn_kv_eff=1.0, link_eff=1.0,
            iteration_overhead_s=0.0, layer_overhead_s=0.0)
TOKEN_BINS = [0, 64, 512, 4096, np.inf]
TOKEN_LABELS = ["1-64", "65-512", "513-4096", ">4096"]
# vLLM's custom all-reduce on H100 without CUDA graphs, ms by (tp, bytes): the "vllm" table of
# github.com/sgl-project/sglang/pull/2904 (its one-shot kernel for small messages, two-shot above)
ONE_SHOT_H100 = {2: [0.0095, 0.0088, 0.0087, 0.0129, 0.0177, 0.0266],
                 4: [0.0091, 0.0085, 0.0092, 0.0206, 0.0269, 0.0402],
                 8: [0.0101, 0.0093, 0.0118, 0.0241, 0.0304, 0.0450]}
ONE_SHOT_BYTES = [512, 4096, 32768, 262144, 524288, 1048576]
# The previous roofline (hard max, one attention efficiency), as this script last fitted it
PREVIOUS = {"a100": dict(compute_eff=0.71, mem_eff=0.75, floor_ms=0.037),
            "h100": dict(compute_eff=0.67, mem_eff=0.82, floor_ms=0.033)}
PREVIOUS_ATTN = dict(attn_eff=0.24, mem_eff=0.75, floor_ms=0.0139)


def hardware(gpu: str) -> HardwareSpec:
    cfg = yaml.safe_load((REPO / "configs/hardware" / f"{GPUS[gpu]}.yaml").read_text())
    cfg.update(ONES, link_latency_s=0.0)                  # raw peaks: ratios are efficiencies
    return HardwareSpec.from_config(cfg)


def preset(gpu: str) -> dict:
    return yaml.safe_load((REPO / "configs/hardware" / f"{GPUS[gpu]}.yaml").read_text())


def one_layer(name, hidden, inter, heads, kv_heads) -> ModelShape:
    return ModelShape(name=name, num_layers=1, hidden_size=int(hidden),
                      intermediate_size=int(inter), num_heads=int(heads),
                      num_kv_heads=int(kv_heads), head_dim=None, vocab_size=32000,
                      max_model_len=4096)


def summarize(df: pd.DataFrame, by: list[str], col: str) -> pd.DataFrame:
    g = df.groupby(by, sort=False, observed=True)[col]
    return pd.DataFrame({"n": g.size(), "median": g.median(), "p10": g.quantile(0.1),
                         "p90": g.quantile(0.9)}).round(3)


def token_range(tokens) -> pd.Categorical:
    return pd.cut(tokens, TOKEN_BINS, labels=TOKEN_LABELS)


def soft(a, b, n):
    return b * (1 + (a / b) ** n) ** (1 / n)


def linear_points(root: Path) -> pd.DataFrame:
    """One row per (gpu, model, tp, T): measured ms and the roofline's terms at peak."""
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
                    "meas_ms": g[[med[o] for o in GEMMS + ELEMENTWISE]].sum(axis=1).to_numpy(),
                    "flop_ms": T * cm.lin_per_token * 1e3, "mem_ms": cm.lin_weights * 1e3,
                    "ew_ms": T * cm.ew_per_token * 1e3,
                    "regime": np.select([T <= ridge / 2, T >= 2 * ridge],
                                        ["memory", "compute"], "transition")}))
    return pd.concat(rows, ignore_index=True)


def fit_linear(lin: pd.DataFrame) -> tuple[float, dict]:
    """One ridge exponent for both GPUs; compute_eff, mem_eff and the floor per GPU."""
    best = None
    for n in np.round(np.arange(1.0, 3.01, 0.1), 2):
        loss, per = 0.0, {}
        for gpu, g in lin.groupby("gpu"):
            F, M, E, y = (g[c].to_numpy() for c in ("flop_ms", "mem_ms", "ew_ms", "meas_ms"))
            top = None
            for ce in np.arange(0.55, 0.85, 0.005):
                for me in np.arange(0.6, 1.0, 0.01):
                    core = soft(F / ce, M / me, n) + E / me
                    f = max(np.sum((1 - core / y) / y) / np.sum(1 / y ** 2), 0.0)
                    err = np.mean(np.log((core + f) / y) ** 2)
                    if top is None or err < top[0]:
                        top = (err, dict(compute_eff=round(ce, 3), mem_eff=round(me, 2),
                                         floor_ms=f))
            loss += top[0]
            per[gpu] = top[1]
        if best is None or loss < best[0]:
            best = (loss, float(n), per)
    return best[1], best[2]


def attention_points(root: Path) -> tuple[pd.DataFrame, RooflineCostModel]:
    d = pd.read_csv(root / "compute/a100/meta-llama/Llama-2-70b-hf/attention.csv")
    s = d.iloc[0]
    cm = RooflineCostModel(one_layer("llama-2-70b", s.n_embd, 4 * s.n_embd, s.n_q_head,
                                     s.n_kv_head), hardware("a100"),
                           int(s.num_tensor_parallel_workers))
    p, q = d[d.is_prefill], d[~d.is_prefill]
    c, k = p.prefill_chunk_size.to_numpy(), p.kv_cache_size.to_numpy()
    B, kd = q.batch_size.to_numpy(), q.kv_cache_size.to_numpy()
    return pd.concat([
        pd.DataFrame({"kind": "prefill", "tokens": c, "context": k,
                      "meas_ms": p["time_stats.attn_prefill.median"].to_numpy(),
                      "flop_ms": (c * k + c * (c + 1) // 2) * cm.attn_per_pair * 1e3,
                      "mem_ms": (k + c) * cm.attn_per_kv_token * 1e3}),
        pd.DataFrame({"kind": "decode", "tokens": B, "context": kd,
                      "meas_ms": q["time_stats.attn_decode.median"].to_numpy(),
                      "flop_ms": B * (kd + 1) * cm.attn_per_pair * 1e3,
                      "mem_ms": B * (kd + 1) * cm.attn_per_kv_token * 1e3})],
        ignore_index=True), cm


def fit_attention(att: pd.DataFrame) -> tuple[float, float, float]:
    """measured ~ floor + FLOPs x a + KV bytes x b, relative error; prefill and decode alike."""
    w = 1 / np.sqrt(att.groupby("kind").kind.transform("size").to_numpy())
    y = att.meas_ms.to_numpy()
    A = np.c_[np.ones_like(y), att.flop_ms, att.mem_ms] * (w / y)[:, None]
    floor, a, b = np.linalg.lstsq(A, w, rcond=None)[0]
    return float(floor), 1 / float(a), 1 / float(b)


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
    d["tokens"] = token_range(d["size"] / (8192 * 2))
    return lat, eff, summarize(d, ["tokens"], "ratio")


def one_shot(link_bandwidth: float) -> tuple[float, float, pd.DataFrame]:
    """Affine fit of vLLM's custom all-reduce: t = latency + 2 (tp-1)/tp bytes / (bw eff)."""
    rows = [(tp, s, ms * 1e-3) for tp, v in ONE_SHOT_H100.items()
            for s, ms in zip(ONE_SHOT_BYTES, v)]
    d = pd.DataFrame(rows, columns=["tp", "size", "t"])
    x = 2 * (d.tp - 1) / d.tp * d["size"]
    A = np.c_[np.ones(len(d)), x] / d.t.to_numpy()[:, None]
    lat, slope = np.linalg.lstsq(A, np.ones(len(d)), rcond=None)[0]
    eff = 1 / (slope * link_bandwidth)
    d["ratio"] = (lat + x * slope) / d.t
    return float(lat), float(eff), summarize(d, ["tp"], "ratio")


def cpu_overhead() -> tuple[float, float, pd.DataFrame]:
    d = pd.read_csv(Path(__file__).with_name("calibrate_roofline_cpu.csv"))
    y = d[[c for c in d.columns if c.endswith("_ms")]].sum(axis=1).to_numpy() * 1e-3
    A = np.c_[np.ones_like(y), d.batch_size] / y[:, None]
    a, b = np.linalg.lstsq(A, np.ones_like(y), rcond=None)[0]
    d["measured_ms"] = (y * 1e3).round(2)
    d["ratio"] = ((a + b * d.batch_size) / y).round(3)
    return float(a), float(b), d[["model", "batch_size", "measured_ms", "ratio"]]


def chunking_table(fit: dict) -> pd.DataFrame:
    """Prefill of one prompt in chunks of c vs one piece, A100, with the fitted preset values."""
    rows = []
    for name in ("mistral-7b", "yi-34b", "llama-2-70b"):
        model = yaml.safe_load((REPO / "configs/model" / f"{name}.yaml").read_text())
        tp = {"llama-2-70b": 4, "yi-34b": 2}.get(name, 1)
        for zero in (False, True):
            cfg = {**preset("a100"), **fit["a100"]}
            if zero:
                cfg.update(iteration_overhead_s=0.0, request_overhead_s=0.0,
                           layer_overhead_s=0.0)
            cm = RooflineCostModel(model, cfg, tp)
            n = min(model["max_model_len"], 16384)
            one = cm.iteration_time([(n, 0)], [], 1)
            row = {"model": f"{name} tp{tp}", "prompt": n, "fixed terms": "0" if zero else "on"}
            for c in (64, 256, 512, 2048):
                total = sum(cm.iteration_time([(min(c, n - k), k)], [], int(k + c >= n))
                            for k in range(0, n, c))
                row[f"c={c}"] = round(total / one, 3)
            rows.append(row)
    return pd.DataFrame(rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profiles", type=Path, default=REPO.parent / "shared/profiles/vidur")
    root = ap.parse_args().profiles
    if not list(root.glob("compute/*/*/*/mlp.csv")):
        ap.error(f"--profiles {root}: no compute/<gpu>/<org>/<model>/mlp.csv there (the Vidur "
                 "profiles, see their SOURCES.md)")
    pd.set_option("display.width", 120)
    fit = {}

    # ---- linear layers
    lin = linear_points(root)
    lin["tokens"] = token_range(lin["T"])
    lin["peak, max"] = (np.maximum(lin.flop_ms, lin.mem_ms) + lin.ew_ms) / lin.meas_ms
    prev = pd.DataFrame(PREVIOUS).T.loc[lin.gpu].reset_index(drop=True)
    lin["previous"] = (np.maximum(lin.flop_ms / prev.compute_eff, lin.mem_ms / prev.mem_eff)
                       + lin.ew_ms / prev.mem_eff + prev.floor_ms) / lin.meas_ms
    n, per = fit_linear(lin)
    for gpu, v in per.items():
        fit[gpu] = dict(compute_eff=v["compute_eff"], mem_eff=v["mem_eff"], ridge_exponent=n)
    ce, me = (lin.gpu.map(lambda g, k=k: fit[g][k]) for k in ("compute_eff", "mem_eff"))
    floor = lin.gpu.map(lambda g: per[g]["floor_ms"])
    lin["fitted"] = (soft(lin.flop_ms / ce, lin.mem_ms / me, n) + lin.ew_ms / me + floor) \
        / lin.meas_ms
    print(f"== Linear: layer without attention (QKV+O+gate/up+down GEMMs + norms, RoPE, SiLU*mul, "
          f"add), predicted/measured, {len(lin)} points\n   models: "
          + ", ".join(sorted(lin.model.unique())))
    print(f"   fit: ridge_exponent n = {n} (both GPUs); "
          + "; ".join(f"{g}: compute_eff {per[g]['compute_eff']}, mem_eff {per[g]['mem_eff']}, "
                      f"floor {per[g]['floor_ms'] * 1e3:.0f} us" for g in GPUS))
    print("\n-- by token range: at peak (hard max, every eff = 1, no floor); the previous roofline "
          "(hard max, its fit);\n   after the fit (soft roofline)")
    print(pd.concat({c: summarize(lin, ["gpu", "tokens"], c)
                     for c in ("peak, max", "previous", "fitted")}, axis=1).to_string())
    print("\n-- after the fit, by regime (ridge: T = peak/bandwidth tokens in bf16; memory "
          "T <= ridge/2, compute T >= 2 ridge)")
    print(summarize(lin, ["gpu", "regime"], "fitted").to_string())
    print("\n-- after the fit, median by model and TP (all T); * = a model with a preset")
    lin["model*"] = lin.model.map(lambda m: m + (" *" if m in OURS else ""))
    print(lin.groupby(["gpu", "model*", "tp"])["fitted"].median().unstack("tp").round(2)
          .to_string())

    # ---- attention
    att, _ = attention_points(root)
    att["tokens_r"] = token_range(att.tokens)
    ref = PREVIOUS_ATTN
    att["previous (max)"] = (np.maximum(att.flop_ms / ref["attn_eff"], att.mem_ms / ref["mem_eff"])
                             + ref["floor_ms"]) / att.meas_ms
    att_floor, ae, ke = fit_attention(att)
    ae, ke = round(ae, 2), round(ke, 2)
    att["fitted"] = (att_floor + att.flop_ms / ae + att.mem_ms / ke) / att.meas_ms
    for g in GPUS:
        fit[g].update(attn_eff=ae, attn_kv_eff=ke)
    print("\n== Attention, Llama-2-70B TP2 on A100 (FlashAttention, block 16), predicted/measured "
          "per layer; tokens: the chunk (prefill) or the batch size (decode); previous: "
          "max(FLOPs at attn_eff 0.24, KV at mem_eff 0.75) + 13.9 us")
    print(f"   fit: attn_eff {ae} (FLOPs), attn_kv_eff {ke} (KV reads), added; kernel floor "
          f"{att_floor * 1e3:.1f} us per layer")
    print(pd.concat({c: summarize(att, ["kind", "tokens_r"], c)
                     for c in ("previous (max)", "fitted")}, axis=1).to_string())
    parts = {k: fit_attention(att[att.kind == k].assign(kind="one")) for k in ("prefill", "decode")}
    print("   each kind alone: " + "; ".join(
        f"{k}: floor {f * 1e3:.1f} us, attn_eff {a:.2f}, attn_kv_eff {b:.2f}"
        for k, (f, a, b) in parts.items()) + "\n   (a negative or > 1 efficiency: the term "
          "explains nothing there. Prefill of this GQA-8 model is FLOP-bound, so its KV re-reads "
          "are\n   invisible in the profile; decode is KV-bound. Decode's cost per KV token, FLOPs "
          "+ KV, is the same in the joint fit.)")
    print("\n-- after the fit, prefill by cached context: the profiled kernel is slower on a "
          "chunk's own causal square\n   than on its cached context, which one FLOP efficiency "
          "cannot follow")
    pre = att[att.kind == "prefill"]
    print(summarize(pre.assign(ctx=pd.cut(pre.context, [-1, 0, 512, 1024, 2048, 4096])),
                    ["ctx"], "fitted").to_string())
    pre = pre.assign(model_ms=att_floor + pre.flop_ms / ae + pre.mem_ms / ke)
    by = pre.groupby(["tokens", "context"])[["meas_ms", "model_ms"]].median()
    prof, model = by.meas_ms, by.model_ms
    rows = []
    for n_ in (1024, 2048, 4096):
        row = {"prompt": n_}
        for c in (64, 128, 512, 1024):
            keys = [(c, j * c) for j in range(n_ // c)]
            if c < n_ and all(k in prof.index for k in keys):
                row[f"c={c} measured"] = round(prof.loc[keys].sum() / prof.loc[(n_, 0)], 2)
                row[f"c={c} model"] = round(model.loc[keys].sum() / model.loc[(n_, 0)], 2)
        rows.append(row)
    print("\n-- attention alone: chunks of c over one piece (sum of per-chunk times), measured "
          "vs fitted model")
    print(pd.DataFrame(rows).to_string(index=False))

    # ---- all-reduce
    print("\n== All-reduce, predicted/measured; tokens: the message / (8192 x 2 bytes)")
    for gpu in GPUS:
        lat, eff, table = network(root, gpu)
        print(f"-- ring (NCCL, Vidur, one {gpu.upper()} DGX node): link_latency {lat * 1e6:.0f} "
              f"us, link_eff {eff:.2f}")
        print(table.to_string())
        fit[gpu].update(link_eff=round(eff, 2), link_latency_s=float(f"{lat:.2g}"))
    lat1, eff1, table = one_shot(preset("h100")["link_bandwidth"])
    print(f"-- one-shot (vLLM custom all-reduce, H100, sglang PR #2904): fast_ar_latency "
          f"{lat1 * 1e6:.1f} us, fast_ar_eff {eff1:.3f} of NVLink 4; 512 B - 1 MiB")
    print(table.to_string())
    for gpu in GPUS:
        fit[gpu].update(fast_ar_latency_s=float(f"{lat1:.2g}"), fast_ar_eff=round(eff1, 3))

    # ---- CPU
    a, b, table = cpu_overhead()
    print(f"\n== CPU side of an iteration (vLLM v0, Vidur, A100, TP 1): iteration_overhead "
          f"{a * 1e3:.2f} ms + request_overhead {b * 1e3:.3f} ms per request")
    print(table.to_string(index=False))
    for gpu in GPUS:
        fit[gpu].update(iteration_overhead_s=float(f"{a:.2g}"), request_overhead_s=float(
            f"{b:.2g}"), layer_overhead_s=float(f"{(per[gpu]['floor_ms'] + att_floor) * 1e-3:.2g}"))

    print("\n== Fitted preset values. layer_overhead_s = floor of the layer's other kernels + "
          "attention's; H100 has no\n   attention profile and takes A100's attention fit; the "
          "one-shot all-reduce and the CPU terms are one fit for both; H200 takes H100's values")
    print(pd.DataFrame(fit).T.to_string())
    for gpu, vals in fit.items():
        cfg = preset(gpu)
        off = {k: (cfg.get(k), v) for k, v in vals.items()
               if cfg.get(k) is None or not np.isclose(cfg[k], v)}
        print(f"configs/hardware/{GPUS[gpu]}.yaml:", f"differs {off}" if off else "matches")

    print("\n== What chunking costs: prefill of one prompt in chunks of c, total time over one "
          "piece (A100, fitted values;\n   'fixed terms 0': CPU overheads and kernel floors "
          "zeroed)")
    print(chunking_table(fit).to_string(index=False))


if __name__ == "__main__":
    main()
