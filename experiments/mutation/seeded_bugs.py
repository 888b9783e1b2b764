"""Issue 8's six deliberate bugs: apply each in turn, run the tests, restore the file, and say
which tests caught it. A bug that no test catches is a hole in the tests.

    python experiments/mutation/seeded_bugs.py [TEST_PATH ...]   (default: tests/test_metrics.py)

Each bug is a one-line text substitution in the source as of this script's commit; when the code
it patches is rewritten the script stops, naming the bug whose line it cannot find (update the
pattern, do not drop the bug). Exit status 1 if some bug went uncaught.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# name: (file, original text, buggy text)
BUGS = {
    "summary preemptions forced to 0": (
        "sarathi_lab/metrics/summary.py",
        '"preemptions": int(req_df["num_preemptions"].sum()),', '"preemptions": 0,'),
    "stall count forced to 0": (
        "sarathi_lab/metrics/summary.py", '"count": int((gaps > thresh).sum())', '"count": 0'),
    "goodput over all finished requests": (
        "sarathi_lab/metrics/summary.py",
        '"goodput_rps": float(met.sum()) / span', '"goodput_rps": float(len(fin)) / span'),
    "KV utilisation halved": (
        "sarathi_lab/metrics/summary.py",
        "float(used.mean() / kv_blocks_total)", "float(used.mean() / kv_blocks_total / 2)"),
    "max_num_seqs check removed from admission": (
        "sarathi_lab/schedulers/mechanics/admit.py",
        "if len(self.running) >= self.cfg.max_num_seqs:", "if False:"),
    "KV watermark ignored": (
        "sarathi_lab/schedulers/mechanics/admit.py",
        "        if need > self.kv.num_free_blocks - self.watermark:",
        "        if need > self.kv.num_free_blocks:"),
}


def main(tests: list[str]) -> int:
    uncaught = []
    for name, (path, old, new) in BUGS.items():
        f = ROOT / path
        src = f.read_text()
        if src.count(old) != 1:
            sys.exit(f"{name}: cannot find its line in {path} (the code moved; update BUGS)")
        f.write_text(src.replace(old, new))
        try:
            r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rf",
                                "-p", "no:cacheprovider", *tests],
                               cwd=ROOT, capture_output=True, text=True)
        finally:
            f.write_text(src)
        failed = [ln.split(" - ")[0].removeprefix("FAILED ") for ln in r.stdout.splitlines()
                  if ln.startswith("FAILED")]
        if r.returncode not in (0, 1):   # 1: tests failed; anything else: pytest itself did
            sys.exit(f"{name}: pytest exited {r.returncode}:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
        print(f"{name}: caught by {len(failed)} test(s)" if failed else f"{name}: NOT CAUGHT")
        for t in failed:
            print(f"    {t}")
        if not failed:
            uncaught.append(name)
    return 1 if uncaught else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["tests/test_metrics.py"]))
