"""Fit the pipeline's activation transfer (NCCL send/recv between two GPUs) to Vidur's measured
profiles: t = latency + bytes / (bandwidth x eff).

  python experiments/pipeline/calibrate_send_recv.py [--profiles DIR]   (> calibrate_send_recv.txt)

Data: network/{a100_dgx,h100_dgx}/send_recv.csv of ../shared/profiles/vidur (github.com/microsoft/
vidur, MIT License; DIR/SOURCES.md): one send/recv between two GPUs, `size` in bytes (Vidur
converts it to tokens as size / hidden / 2), rows with devices_per_node = 2 on one node (NVLink,
NVSwitch) and devices_per_node = 1 on two nodes (InfiniBand). Each row's median is used.

Fit, per link: latency = the median of the transfers of <= 64 KiB; eff from least squares of
the relative error over every size above 1 MiB (bandwidth-bound), with the latency fixed. The
preset's bandwidth is its datasheet figure (link_bandwidth within a node, net_bandwidth across
nodes); the ratio printed is predicted / measured by message size, in tokens of Llama-2-70B
activations (8192 bf16 values each; a stage sends two such tensors, hidden states and
residual, per token).
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

REPO = Path(__file__).resolve().parents[2]
NETS = {"a100-80gb": "a100_dgx", "h100-sxm": "h100_dgx"}   # hardware preset -> profile folder
LINKS = {2: ("link_bandwidth", "p2p_eff", "p2p_latency_s", "one node (NVLink)"),
         1: ("net_bandwidth", "net_p2p_eff", "net_p2p_latency_s", "two nodes (InfiniBand)")}
BINS = [0, 64 * 2**10, 2**20, 16 * 2**20, np.inf]
LABELS = ["<=64 KiB", "64 KiB-1 MiB", "1-16 MiB", ">16 MiB"]


def fit(d: pd.DataFrame, bandwidth: float) -> tuple[float, float, pd.DataFrame]:
    t = d["median_ms"].to_numpy() * 1e-3
    size = d["size"].to_numpy(float)
    lat = float(np.median(t[size <= 64 * 2**10]))
    big = size > 2**20
    # t ~ lat + size * slope: least squares of (pred - t) / t over the big messages
    x, y = size[big] / t[big], 1 - lat / t[big]
    slope = float((x * y).sum() / (x * x).sum())
    eff = 1 / (slope * bandwidth)
    d = d.assign(ratio=(lat + size * slope) / t,
                 range=pd.cut(d["size"], BINS, labels=LABELS))
    return lat, eff, d


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profiles", type=Path, default=Path("/work/shared/profiles/vidur"))
    args = ap.parse_args(argv)
    for preset, net in NETS.items():
        hw = yaml.safe_load((REPO / "configs" / "hardware" / f"{preset}.yaml").read_text())
        raw = pd.read_csv(args.profiles / "network" / net / "send_recv.csv")
        for dpn, (bw_key, eff_key, lat_key, where) in LINKS.items():
            d = raw[(raw.collective == "send_recv") & (raw.devices_per_node == dpn)]
            d = d.groupby("size")["time_stats.send_recv.median"].median().rename(
                "median_ms").reset_index()
            lat, eff, d = fit(d, float(hw[bw_key]))
            print(f"== {preset} ({net}), {where}: {len(d)} sizes, {bw_key} "
                  f"{float(hw[bw_key]) / 1e9:.0f} GB/s")
            print(f"   {lat_key}: {lat:.2g}   {eff_key}: {eff:.2g}   "
                  f"(effective {float(hw[bw_key]) * eff / 1e9:.1f} GB/s)")
            table = d.groupby("range", observed=True)["ratio"].describe(
                percentiles=[0.1, 0.5, 0.9])[["count", "10%", "50%", "90%"]]
            print("   predicted / measured by message size:")
            print("   " + table.round(3).to_string().replace("\n", "\n   "))


if __name__ == "__main__":
    main()
