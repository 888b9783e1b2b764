"""Regenerate every committed result: each study's command, in order, then its outputs in
results/ (and the calibration reports under experiments/).

    python experiments/regenerate.py                  # everything (~2 h on 2 shared cores)
    python experiments/regenerate.py --list           # the studies, their commands and times
    python experiments/regenerate.py --only budget_sweep,capacity
    python experiments/regenerate.py --skip capacity_grid,routing --keep-going
    python experiments/regenerate.py --dry-run        # print the commands, run nothing

Each study is the command its README gives (sweeps go to outputs/, as there); the times are
those the READMEs report on this 2-core machine under other sessions' load. A failing command
stops the script (with --keep-going: the next study goes on) and the summary at the end lists
every study's status and time. The commit the results were made at is each README's to record:
the script prints it at the start.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Step:
    argv: tuple[str, ...]          # "python" is this interpreter; console scripts from its venv
    stdout: str | None = None      # a file (repository-relative) the command's output goes to


@dataclass(frozen=True)
class Study:
    name: str
    steps: tuple[Step, ...]
    minutes: float                 # the README's figure on this machine
    outputs: tuple[str, ...]       # repository-relative: what the steps rewrite

    def __post_init__(self):
        assert self.steps and self.outputs, self.name


def _py(script: str, *args: str, stdout: str | None = None) -> Step:
    return Step(("python", f"experiments/{script}", *args), stdout)


def _preset(name: str, *overrides: str) -> tuple[Step, Step]:
    """A preset's multirun and its report (policy_compare, capacity, ...)."""
    return (Step(("sarathi-lab", "-m", f"experiment={name}", *overrides)),
            Step(("sarathi-lab-report", f"outputs/sweeps/{name}", "--out", f"results/{name}")))


STUDIES = (
    Study("calibration", (_py("calibration/calibrate_roofline.py",
                              stdout="experiments/calibration/calibrate_roofline.txt"),
                          _py("pipeline/calibrate_send_recv.py",
                              stdout="experiments/pipeline/calibrate_send_recv.txt")),
          1, ("experiments/calibration/calibrate_roofline.txt",
              "experiments/pipeline/calibrate_send_recv.txt")),
    Study("policy_compare", _preset("policy_compare"), 0.5, ("results/policy_compare",)),
    Study("budget_sweep", (Step(("bash", "experiments/budget_sweep/run.sh")),
                           Step(("sarathi-lab-report", "outputs/sweeps/budget_sweep",
                                 "outputs/sweeps/budget_sweep_vllm",
                                 "--out", "results/budget_sweep"))), 0.5,
          ("results/budget_sweep",)),
    Study("capacity", _preset("capacity", "hydra/launcher=parallel"), 1, ("results/capacity",)),
    Study("open_vs_closed", (_py("open_vs_closed/run.py"),), 1.5, ("results/open_vs_closed",)),
    Study("cost", (_py("cost/run.py"),), 4, ("results/cost",)),
    Study("admission", (Step(("bash", "experiments/admission/run.sh")),), 0.5,
          ("results/admission",)),
    Study("priorities", (Step(("bash", "experiments/priorities/run.sh")),), 1,
          ("results/priorities",)),
    Study("fairness", (Step(("bash", "experiments/fairness/run.sh")),), 1, ("results/fairness",)),
    Study("routing", (_py("routing/run.py"),), 20, ("results/routing",)),
    Study("memory", (_py("memory/run.py"),), 7, ("results/memory",)),
    Study("pipeline", (_py("pipeline/run.py"),), 5, ("results/pipeline",)),
    Study("disaggregation", (_py("disaggregation/run.py"),
                             _py("disaggregation/run.py", "--steady", "2000")), 20,
          ("results/disaggregation",)),
    Study("capacity_grid", (_py("capacity_grid/run.py"),), 23, ("results/capacity_grid",)),
    Study("planning", (_py("planning/run.py"),), 22, ("results/planning",)),
    Study("ablation", (_py("ablation/run.py"),), 5, ("results/ablation",)),
    Study("paging", (_py("paging/run.py"),), 4, ("results/paging",)),
    Study("adaptive_chunking", (_py("adaptive_chunking/run.py", "--toy"),
                                _py("adaptive_chunking/run.py", "--medium"),
                                _py("adaptive_chunking/run.py", "--noise"),
                                _py("adaptive_chunking/run.py", "--full", "--fresh")), 58,
          ("results/adaptive_chunking",)),
    Study("speculation", (_py("speculation/run.py"),), 20, ("results/speculation",)),
    Study("long_context", (_py("long_context/run.py"),), 4, ("results/long_context",)),
    # real runs of the torch executor on this CPU
    Study("chunk_overhead", (_py("chunk_overhead/run.py"),), 4, ("results/chunk_overhead",)),
    Study("fidelity", (_py("fidelity/run.py"),), 10, ("results/fidelity",)),
    Study("serve_check", (_py("serve_check/run.py"),), 1, ("results/serve_check",)),
    Study("real_check", (Step(("sarathi-lab-prepare-model", "smollm2")),
                         _py("real_check/run.py")), 15, ("results/real_check",)),
)


def command(step: Step) -> list[str]:
    """The step's argv with this interpreter for "python"."""
    head, *rest = step.argv
    return [sys.executable if head == "python" else head, *rest]


def child_env() -> dict:
    """This venv's console scripts first on PATH (the run.sh scripts call `sarathi-lab`);
    wandb never blocks a regeneration."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.setdefault("WANDB_MODE", "disabled")
    return env


def select(only: str | None, skip: str | None) -> list[Study]:
    names = [s.name for s in STUDIES]
    chosen = only.split(",") if only else names
    skipped = skip.split(",") if skip else []
    unknown = sorted(set(chosen + skipped) - set(names))
    if unknown:
        raise SystemExit(f"regenerate: unknown study {', '.join(unknown)} (studies: "
                         f"{', '.join(names)})")
    return [s for s in STUDIES if s.name in chosen and s.name not in skipped]


def shown(step: Step) -> str:
    return " ".join(step.argv) + (f" > {step.stdout}" if step.stdout else "")


def run_study(study: Study, env: dict) -> str | None:
    """Runs the study's steps in order; None, or what failed."""
    for step in study.steps:
        print(f"  $ {shown(step)}", flush=True)
        if step.stdout:
            out = REPO / step.stdout
            tmp = out.with_name(out.name + ".part")
            with open(tmp, "w") as f:
                r = subprocess.run(command(step), cwd=REPO, env=env, stdout=f)
            if r.returncode == 0:
                tmp.replace(out)      # a failed calibration leaves the committed report alone
            else:
                tmp.unlink(missing_ok=True)
        else:
            r = subprocess.run(command(step), cwd=REPO, env=env)
        if r.returncode:
            return f"`{shown(step)}` exited with {r.returncode}"
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", help="comma-separated studies to run (default: all)")
    ap.add_argument("--skip", help="comma-separated studies to leave out")
    ap.add_argument("--list", action="store_true", help="list the studies and exit")
    ap.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    ap.add_argument("--keep-going", action="store_true",
                    help="after a failing study, go on with the next")
    a = ap.parse_args(argv)
    studies = select(a.only, a.skip)
    total = sum(s.minutes for s in studies)
    if a.list or a.dry_run:
        for s in studies:
            print(f"{s.name} (~{s.minutes:g} min) -> {', '.join(s.outputs)}")
            for step in s.steps:
                print(f"  $ {shown(step)}")
        print(f"{len(studies)} studies, ~{total:g} min")
        return 0
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                            capture_output=True, text=True).stdout.strip() or "unknown"
    print(f"regenerating {len(studies)} studies at commit {commit}, ~{total:g} min", flush=True)
    env, done, t_all = child_env(), [], time.perf_counter()
    for i, s in enumerate(studies, 1):
        print(f"[{i}/{len(studies)}] {s.name} (~{s.minutes:g} min)", flush=True)
        t0 = time.perf_counter()
        err = run_study(s, env)
        done.append((s.name, err, time.perf_counter() - t0))
        if err and not a.keep_going:
            break
    print(f"\n{'study':16} {'status':8} time")
    for name, err, secs in done:
        print(f"{name:16} {'failed' if err else 'ok':8} {secs / 60:5.1f} min"
              + (f"  {err}" if err else ""))
    left = [s.name for s in studies[len(done):]]
    if left:
        print(f"not run: {', '.join(left)}")
    print(f"total {(time.perf_counter() - t_all) / 60:.1f} min")
    return 1 if any(err for _, err, _ in done) or left else 0


if __name__ == "__main__":
    sys.exit(main())
