"""Decode-step time of the torch executor on a GPU against the memory-bandwidth bound.

A decode step must read every weight once plus each request's whole KV context, so it cannot be
faster than (weight bytes + KV bytes read) / HBM bandwidth. This builds a ~1B-parameter random
Llama (bf16: 16 layers, hidden 2048, 32 heads, 8 KV heads, intermediate 8192), fills the paged
cache of B requests of ~1k context (random K/V: decode cost does not depend on the values) and
times full executor steps (batch building + forward + sampling) at each batch size, printing
measured / bound. Runs in well under 2 minutes on an H200.

    python experiments/gpu_check/gpu_check_executor.py [--bandwidth 4.8e12] [--batches 1,16,64]
    python experiments/gpu_check/gpu_check_executor.py --smoke     # a tiny model on the CPU
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from sarathi_lab.executors.torch_exec import TorchConfig, TorchExecutor
from sarathi_lab.kv import KVCacheManager
from sarathi_lab.request import Request
from sarathi_lab.schedulers.output import SchedulerOutput

BIG = dict(name="llama-1b-random", num_layers=16, hidden_size=2048, intermediate_size=8192,
           num_heads=32, num_kv_heads=8, head_dim=64, vocab_size=32000, max_model_len=4096,
           rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False, init_seed=0,
           random_weights=True)   # 1.3B parameters: random weights asked for (models/loader.py)
TINY = dict(BIG, name="tiny-llama", num_layers=2, hidden_size=64, intermediate_size=128,
            num_heads=4, num_kv_heads=2, head_dim=16, vocab_size=512, max_model_len=512)


def decode_batch(ex: TorchExecutor, kv: KVCacheManager, batch: int, context: int):
    """`batch` requests that each hold `context` tokens of KV and decode their next token."""
    out = SchedulerOutput()
    for i in range(batch):
        r = Request(f"b{batch}-{i}", 0.0, context, 10**6, prompt_token_ids=[1] * context)
        r.output_token_ids, r.num_output_tokens = [2], 1
        ex.add_request(r, None)                  # its stop rule: the model's length
        if kv.allocate_slots(r, context + 1) is None:
            raise SystemExit("KV cache too small for the batch")
        r.num_computed_tokens = context          # the prompt is "in" the cache; decode token 2
        out.add(r, 1)
    return out


def measure(ex, out, iters, warmup):
    for _ in range(warmup):                      # Triton compiles, allocator warms up
        ex.execute(out)
    steps, fwds = [], []
    for _ in range(iters):
        f0 = ex.timers["forward"]
        steps.append(ex.execute(out).duration)
        fwds.append(ex.timers["forward"] - f0)
    return statistics.median(steps), statistics.median(fwds)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bandwidth", type=float, default=4.8e12, help="HBM bytes/s (H200: 4.8e12)")
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--context", type=int, default=1024, help="tokens of KV per request")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--backend", default="auto", help="attention backend: auto | triton | torch")
    ap.add_argument("--smoke", action="store_true", help="tiny model, CPU, fp32: checks it runs")
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    if args.smoke:
        model, exe = TINY, {"device": "cpu", "dtype": "float32", "attention_backend": "torch"}
        args.context, args.iters = min(args.context, 128), min(args.iters, 3)
    else:
        if not torch.cuda.is_available():
            raise SystemExit("needs a CUDA GPU (use --smoke to check the script on a CPU)")
        model, exe = BIG, {"device": "cuda", "dtype": "bfloat16"}
    exe["attention_backend"] = exe.get("attention_backend", args.backend)
    t0 = time.perf_counter()
    ex = TorchExecutor(TorchConfig(**exe), model)
    a, bs = ex.args, args.block_size
    num_blocks = sum(batches) * -(-(args.context + 1) // bs) + 8
    kv = KVCacheManager(num_blocks, bs, max_model_len=a.max_model_len)
    ex.bind(kv)
    ex.kv_cache.normal_()   # random K/V: real values, no NaN traps, same cost as a prefill's
    elem = ex.kv_cache.element_size()
    # bytes a decode step reads: all weights but the embedding table (B rows of it only)
    embed = 0 if a.tie_word_embeddings else a.vocab_size * a.hidden_size
    weight_bytes = (a.num_params() - embed) * elem
    kv_token_bytes = 2 * a.num_layers * a.num_kv_heads * a.head_dim * elem
    dev = torch.cuda.get_device_name() if ex.device.type == "cuda" else "cpu"
    print(f"{model['name']}: {a.num_params() / 1e6:.1f}M params, {ex.dtype}, {dev}, attention "
          f"{ex.backend}, block {bs}, context {args.context}; "
          f"setup {time.perf_counter() - t0:.1f} s")
    print(f"bound = (weights {weight_bytes / 1e9:.2f} GB + KV read) / "
          f"{args.bandwidth / 1e12:.2f} TB/s\n")
    print(f"{'batch':>6}{'step ms':>10}{'forward ms':>12}{'bound ms':>10}{'step/bound':>12}"
          f"{'GB/s achieved':>15}")
    for b in batches:
        out = decode_batch(ex, kv, b, args.context)
        step, fwd = measure(ex, out, args.iters, warmup=3)
        read = weight_bytes + b * (args.context + 1) * kv_token_bytes
        bound = read / args.bandwidth
        print(f"{b:>6}{step * 1e3:>10.3f}{fwd * 1e3:>12.3f}{bound * 1e3:>10.3f}"
              f"{step / bound:>11.2f}x{read / step / 1e9:>15.0f}")
        for r in out.reqs:
            kv.free(r)
    print(f"\ntotal {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
