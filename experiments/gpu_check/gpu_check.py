"""Checks that need a GPU, in one bounded run:
`python experiments/gpu_check/gpu_check.py [--only SECTION]`.

Sections (run in order, each a function that returns True when everything passed):
  kernels   Triton write_kv / paged_attention vs the torch reference at real sizes (bf16, head dims
            64/128, block sizes 16/32, contexts up to 16k, mixed prefill+decode batches, GQA 32/8),
            with the max abs error, PASS/FAIL and the time of each.

`--smoke` shrinks every case to a few tokens so that the script runs on a CPU under the Triton
interpreter (it sets TRITON_INTERPRET=1 itself when no GPU is present). Exit status 1 if any check
failed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass

import torch

# ----------------------------------------------------------------------------- kernels section


@dataclass
class KernelCase:
    name: str
    dtype: torch.dtype
    num_heads: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    specs: list[tuple[int, int]]  # (seq_len, q_len) per sequence


# Max |triton - reference| allowed, as atol + rtol * |reference|. Both outputs are rounded to the
# output dtype, so a couple of ulps at |out| ~ 1-3 is the floor; bf16 has 8 mantissa bits.
_TOL = {torch.bfloat16: (2e-2, 2e-2), torch.float16: (4e-3, 4e-3), torch.float32: (1e-4, 1e-4)}


def _mixed(gen: torch.Generator, chunks: list[tuple[int, int]], num_decodes: int, max_ctx: int):
    """Prefill chunks given as (context before the chunk, chunk length), then decodes with random
    contexts in [1, max_ctx)."""
    ctx = torch.randint(1, max_ctx, (num_decodes,), generator=gen).tolist()
    return [(c + n, n) for c, n in chunks] + [(c + 1, 1) for c in ctx]


def kernel_cases(smoke: bool, seed: int = 0) -> list[KernelCase]:
    gen = torch.Generator().manual_seed(seed)
    bf16 = torch.bfloat16
    if smoke:
        # Tiny shapes for the interpreter, which also gets bf16 wrong: fp32 and fp16 only.
        mixed = _mixed(gen, [(0, 12), (9, 7), (21, 16)], 5, 40)
        return [
            KernelCase("smoke-mixed-gqa-bs4", torch.float32, 4, 2, 16, 4, mixed),
            KernelCase("smoke-mixed-mha-bs16", torch.float32, 4, 4, 32, 16, mixed),
            KernelCase("smoke-decode-fp16", torch.float16, 4, 2, 32, 4, _mixed(gen, [], 6, 50)),
        ]
    # Sarathi-style batch: a few 512-token chunks at different depths of long prompts plus many
    # decodes, with contexts up to 16k.
    mixed_16k = _mixed(gen, [(0, 512), (1536, 512), (7680, 512), (15872, 512)], 60, 16384)
    mixed_8k = _mixed(gen, [(0, 512), (3584, 512), (7680, 512)], 48, 8192)
    return [
        KernelCase("mixed-gqa32/8-d128-bs16-16k", bf16, 32, 8, 128, 16, mixed_16k),
        KernelCase("mixed-gqa32/8-d128-bs32-16k", bf16, 32, 8, 128, 32, mixed_16k),
        KernelCase("mixed-gqa32/8-d64-bs16-8k", bf16, 32, 8, 64, 16, mixed_8k),
        KernelCase("mixed-gqa32/8-d64-bs32-8k", bf16, 32, 8, 64, 32, mixed_8k),
        KernelCase("decode-mha32-d128-bs16-8k", bf16, 32, 32, 128, 16, _mixed(gen, [], 64, 8192)),
        KernelCase("prefill-gqa32/8-d128-bs32", bf16, 32, 8, 128, 32, [(4096, 4096), (4096, 4096), (1000, 1000)]),
        # Qwen2-7B's 28/4 heads: a group of 7 is not a power of two.
        KernelCase("mixed-gqa28/4-d128-bs16-4k", bf16, 28, 4, 128, 16, _mixed(gen, [(0, 512), (2048, 512)], 32, 4096)),
        KernelCase("mixed-gqa32/8-d128-bs16-fp16", torch.float16, 32, 8, 128, 16, mixed_8k),
        KernelCase("mixed-gqa32/8-d128-bs16-fp32", torch.float32, 32, 8, 128, 16,
                   _mixed(gen, [(0, 256), (1000, 256)], 16, 2048)),
    ]


def _build_cache(case: KernelCase, device: str, gen: torch.Generator, dev_gen: torch.Generator):
    """Random paged cache with shuffled block ids; the batch's new tokens are left for write_kv."""
    bs = case.block_size
    blocks_per_seq = [-(-s // bs) for s, _ in case.specs]
    num_blocks = sum(blocks_per_seq) + 8
    ids = torch.randperm(num_blocks, generator=gen)
    tables = torch.full((len(case.specs), max(blocks_per_seq)), -1, dtype=torch.int32)
    used = 0
    for i, nb in enumerate(blocks_per_seq):
        tables[i, :nb] = ids[used : used + nb].to(torch.int32)
        used += nb
    shape = (num_blocks, bs, case.num_kv_heads, case.head_dim)
    # Drawn on the device: the largest cases hold ~1G elements, too slow to draw on the host.
    k_cache = torch.randn(shape, generator=dev_gen, device=device, dtype=case.dtype)
    v_cache = torch.randn(shape, generator=dev_gen, device=device, dtype=case.dtype)

    # Slots of each sequence's new tokens, plus a few padding tokens (slot -1) at the end.
    slots = []
    for i, (seq_len, q_len) in enumerate(case.specs):
        pos = torch.arange(seq_len - q_len, seq_len)
        slots.append(tables[i, pos // bs].long() * bs + pos % bs)
    slots.append(torch.full((3,), -1, dtype=torch.long))
    q_lens = torch.tensor([q for _, q in case.specs])
    qsl = torch.cat([torch.zeros(1, dtype=torch.long), q_lens.cumsum(0)]).to(torch.int32)
    seq_lens = torch.tensor([s for s, _ in case.specs], dtype=torch.int32)
    return (k_cache, v_cache, tables.to(device), qsl.to(device), seq_lens.to(device),
            torch.cat(slots).to(device))


def _time_ms(fn, device: str, reps: int) -> float:
    """Median wall time of fn() in ms, after one warm-up call (which also compiles) when reps > 1."""
    if reps > 1:
        fn()
    times = []
    for _ in range(reps):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times)[len(times) // 2]


def run_kernel_case(case: KernelCase, device: str, reps: int, seed: int = 0) -> bool:
    from sarathi_lab.kernels import paged_attention_torch, write_kv_torch
    from sarathi_lab.kernels.triton_attention import paged_attention_triton
    from sarathi_lab.kernels.triton_kv import write_kv_triton

    gen = torch.Generator().manual_seed(seed)
    dev_gen = torch.Generator(device=device).manual_seed(seed)
    k_cache, v_cache, tables, qsl, seq_lens, slots = _build_cache(case, device, gen, dev_gen)
    num_new = slots.shape[0]
    kv_shape = (num_new, case.num_kv_heads, case.head_dim)
    rand = lambda *shape: torch.randn(shape, generator=dev_gen, device=device, dtype=case.dtype)  # noqa: E731
    key, value = rand(*kv_shape), rand(*kv_shape)
    num_q = num_new - 3  # the padding tokens carry no query
    q = rand(num_q, case.num_heads, case.head_dim)
    scale = case.head_dim**-0.5

    # write_kv: both implementations must leave bit-identical caches.
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    write_kv_torch(key, value, k_ref, v_ref, slots)
    write_kv_triton(key, value, k_cache, v_cache, slots)
    write_ok = torch.equal(k_ref, k_cache) and torch.equal(v_ref, v_cache)
    del k_ref, v_ref

    args = (q, k_cache, v_cache, tables, qsl, seq_lens, scale)
    ref = paged_attention_torch(*args)
    out = paged_attention_triton(*args)
    err = (out.float() - ref.float()).abs()
    atol, rtol = _TOL[case.dtype]
    attn_ok = bool((err <= atol + rtol * ref.float().abs()).all()) and bool(torch.isfinite(out).all())
    t_tri = _time_ms(lambda: paged_attention_triton(*args), device, reps)
    t_ref = _time_ms(lambda: paged_attention_torch(*args), device, max(1, reps // 3))

    num_decodes = sum(1 for _, n in case.specs if n == 1)
    ctx_tokens = int(seq_lens.sum())
    # K and V of every context token read once: the floor on traffic, so decode-heavy cases can be
    # held against the memory bandwidth (~4.8 TB/s on an H200).
    kv_bytes = 2 * ctx_tokens * case.num_kv_heads * case.head_dim * k_cache.element_size()
    ok = write_ok and attn_ok
    print(f"{'PASS' if ok else 'FAIL'}  {case.name:30s} {str(case.dtype).split('.')[-1]:8s} "
          f"seqs={len(case.specs):3d} (decodes {num_decodes:3d}) q={num_q:5d} ctx={ctx_tokens:7d}  "
          f"write_kv={'ok' if write_ok else 'MISMATCH'}  max_abs_err={err.max().item():.2e}  "
          f"triton={t_tri:8.3f} ms ({kv_bytes / t_tri / 1e6:6.0f} GB/s KV)  ref={t_ref:8.3f} ms "
          f"({t_ref / t_tri:5.1f}x)", flush=True)
    return ok


def check_kernels(device: str, smoke: bool) -> bool:
    print(f"== kernels ({device}{', smoke' if smoke else ''})", flush=True)
    reps = 1 if smoke else 10
    results = [run_kernel_case(case, device, reps) for case in kernel_cases(smoke)]
    print(f"kernels: {sum(results)}/{len(results)} passed", flush=True)
    return all(results)


# ----------------------------------------------------------------------------- driver

SECTIONS = {
    "kernels": check_kernels,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", action="append", choices=list(SECTIONS),
                        help="run only this section (repeatable); default: all")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes; runs on a CPU via the Triton interpreter")
    args = parser.parse_args(argv)

    if torch.cuda.is_available():
        device = "cuda"
        print(f"device: {torch.cuda.get_device_name()}", flush=True)
    elif args.smoke:
        # Must happen before the Triton kernels are imported (they are imported lazily).
        os.environ.setdefault("TRITON_INTERPRET", "1")
        device = "cpu"
        print("device: cpu (Triton interpreter)", flush=True)
    else:
        print("no CUDA device: run with --smoke to check on a CPU under the Triton interpreter", file=sys.stderr)
        return 2

    t0 = time.perf_counter()
    ok = True
    for name in args.only or list(SECTIONS):
        ok &= SECTIONS[name](device, args.smoke)
    print(f"{'ALL PASSED' if ok else 'SOME CHECKS FAILED'} in {time.perf_counter() - t0:.1f} s", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
