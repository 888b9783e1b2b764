"""One-request decodes timed the engine's way and the profiler's way, side by side in one process.

    python experiments/fidelity/decode_warmth.py [--rounds 30] [--context 256] [--csv PATH]

Per round, on experiments/fidelity's model (one torch thread, the CPU clock), interleaved:

- **stream**: one request prefilled to `context - 26` tokens, then 40 decode steps back to back,
  as the engine runs a request that decodes alone (the step index after its prefill kept);
- **profiler, one prime**: the profile's decode point (1, context) as `sarathi-lab-profile`
  timed it before `--warm-steps`: after another grid point (a 256-token prompt), one unmeasured
  step that brings the request to its context, then the measured step;
- **profiler, warm**: the same point after `measure.WARM_STEPS` decode steps of its own.

It prints the stream's median step time by step index (how a decode speeds up over the first
steps of a stream), and per round and overall the stream's steady time (its steps 16-39, contexts
about `context` - 10 .. `context` + 13) against each profiler way, with the CPU the other
processes used during the round (cores, from /proc/stat): the gain of a stream is a matter of
the caches, which other jobs share.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fidelity_lib.runs import CLOCK, MODEL  # noqa: E402

STEPS = 40          # decode steps of a stream
STEADY = 16         # its steps from here on are its steady state


class Stream:
    """One request decoding step after step through the executor, as the engine runs it."""

    def __init__(self, ex, request_id: int, prompt: int, vocab: int):
        from sarathi_lab.request import Request
        ids = np.random.default_rng(request_id).integers(0, vocab, prompt).tolist()
        self.ex, self.r = ex, Request(request_id, 0.0, prompt, prompt_token_ids=ids)
        ex.add_request(self.r, STEPS + 1)
        self.step(prompt)

    def step(self, n: int = 1) -> float:
        from sarathi_lab.schedulers.output import SchedulerOutput
        out = SchedulerOutput()
        out.add(self.r, n)
        self.ex.kv.assign(out.reqs)          # its block table grows with its tokens
        res = self.ex.execute(out)
        self.r.num_computed_tokens += n
        self.r.output_token_ids.append(res.sampled[0])
        self.r.num_output_tokens += 1
        return res.duration

    def close(self) -> None:
        self.ex.sequence_kv.drop([self.r.request_id])


def _busy() -> float:
    """Seconds of CPU time used by every process since boot (/proc/stat)."""
    v = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


def rounds(n: int, context: int, log=print) -> list[dict]:
    import torch

    from sarathi_lab.profiler import WARM_STEPS, Harness, build_executor
    torch.set_num_threads(1)
    ex, _ = build_executor([*MODEL, "executor.device=cpu", "executor.dtype=float32", CLOCK])
    h = Harness(ex)
    h.bind(4096)
    point = [(1, context)]
    for _ in range(3):
        h.run(point, warm=WARM_STEPS)
    rows = []
    for i in range(n):
        b0, c0, w0 = _busy(), time.process_time(), time.perf_counter()
        s = Stream(ex, 1000 + i, context - 26, ex.args.vocab_size)
        stream = [s.step() for _ in range(STEPS)]
        s.close()
        prime, warm = [], []
        for _ in range(3):
            h.run([(256, 0)])                     # another grid point before it
            prime.append(h.run(point)["total"])
            warm.append(h.run(point, warm=WARM_STEPS)["total"])
        others = (_busy() - b0 - (time.process_time() - c0)) / (time.perf_counter() - w0)
        rows.append({"round": i, "others_cores": others, "stream": stream,
                     "steady": float(np.median(stream[STEADY:])),
                     "prime": float(np.median(prime)), "warm": float(np.median(warm))})
        r = rows[-1]
        log(f"round {i}: others {others:.2f} cores; stream steady {r['steady'] * 1e3:.2f} ms, "
            f"profiler one prime {r['prime'] * 1e3:.2f}, warm {r['warm'] * 1e3:.2f}")
    return rows


def summary(rows: list[dict]) -> str:
    curve = np.median([r["stream"] for r in rows], axis=0) * 1e3
    steady = np.array([r["steady"] for r in rows])
    prime = np.array([r["prime"] for r in rows])
    warm = np.array([r["warm"] for r in rows])
    others = np.array([r["others_cores"] for r in rows])
    return (f"{len(rows)} rounds; other processes used {np.median(others):.2f} cores (median, "
            f"{others.min():.2f}-{others.max():.2f})\n"
            f"stream, median ms by decode step after the prefill: "
            f"{' '.join(f'{x:.2f}' for x in curve[:12])} ... {np.median(curve[STEADY:]):.2f}\n"
            f"stream steady / profiler with one prime: median {np.median(steady / prime):.3f} "
            f"(ratio of medians {np.median(steady) / np.median(prime):.3f})\n"
            f"stream steady / profiler warm: median {np.median(steady / warm):.3f} "
            f"(ratio of medians {np.median(steady) / np.median(warm):.3f})\n")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--csv", help="write each round's figures here")
    a = p.parse_args(argv)
    if a.rounds < 1 or not 32 <= a.context <= 960:
        sys.exit(f"--rounds={a.rounds} must be >= 1 and --context={a.context} in 32..960")
    rows = rounds(a.rounds, a.context)
    if a.csv:
        import pandas as pd
        pd.DataFrame([{k: v for k, v in r.items() if k != "stream"} for r in rows]) \
            .to_csv(a.csv, index=False)
    print(summary(rows))


if __name__ == "__main__":
    main()
