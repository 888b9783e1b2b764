"""Whole `sarathi-lab` command, two installs side by side: wall time, peak memory and phases.

Each install is a virtual environment with its own editable `sarathi-lab` (say the baseline
commit's and this checkout's). The same command lines run under each, alternately (ABAB...,
the order flipped every repeat), so both see the same load on a shared, noisy machine; the
medians and their ratio are printed per policy. The setting is bench_sim.py's: 10,000 Azure
conversation requests at 1 QPS, Llama-2-70B on two A100s, max_num_seqs 128, sarathi's token
budget 512 (given to sarathi only: the other policies do not read it).

    python experiments/bench/bench_cli_compare.py --base /work/venv-old --new .venv [--repeats 5]

Every repeat runs each command twice: plain (the whole-command time and peak RSS, from
wait4) and through this file as a wrapper (`--phases-child`) that stamps when `runner.run`
starts, when the engine loop ends, when the summary is computed and when `runner.run` returns
(the files written), hooking those functions as their modules load so that nothing is imported
early. Phases: start-up (process start to `runner.run`: interpreter, imports, Hydra
composition, the config check), sim (trace, build and engine loop), tables (request and
iteration tables, summary), write (parquet files and summary.json), exit (printing, shutdown).

Before the timed repeats each command runs once untimed (`--warmup`), so that neither install
is timed reading its files from a cold disk cache. `--bytecode cached` gives each install a
bytecode cache of its own (PYTHONPYCACHEPREFIX, written by the warm-up run), as an installed
package has: a machine that sets PYTHONDONTWRITEBYTECODE (this one does) otherwise recompiles
every module of an editable install at each start, which the larger package pays more for.
`--bytecode env` (the default) keeps whatever the environment says.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PHASES = ("start-up", "sim", "tables", "write", "exit")


def command(install: Path, policy: str, requests: int, qps: float, run_dir: str) -> list[str]:
    return [str(install / "bin" / "sarathi-lab"), f"scheduler={policy}", "trace=azure_conv",
            f"trace.num_requests={requests}", f"trace.qps={qps}", "trace.max_total_tokens=4096",
            "model=llama-2-70b", "executor.tensor_parallel=2", "scheduler.max_num_seqs=128",
            *(["scheduler.token_budget=512"] if policy == "sarathi" else []),
            "progress=false", f"hydra.run.dir={run_dir}"]


def timed_run(cmd: list[str], env: dict, cwd: str) -> tuple[float, float, float]:
    """(wall s, peak RSS MiB, CPU s: user + system) of one command; it must succeed."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE)
    err = p.stderr.read()
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode:
        raise SystemExit(f"failed ({p.returncode}): {' '.join(cmd)}\n{err.decode()[-2000:]}")
    return wall, usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime


def bytecode_env(env: dict, mode: str, folder, name: str) -> dict:
    """`env` for one side of a comparison: with mode "cached", a bytecode cache of its own
    (PYTHONPYCACHEPREFIX under `folder`), written whatever PYTHONDONTWRITEBYTECODE says; with
    "env", as it is."""
    if mode == "cached":
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = tempfile.mkdtemp(dir=folder, prefix=f"pyc-{name}-")
    return env


def bytecode_label(mode: str, cached: str) -> str:
    """How the bytecode is treated, for the heading: `cached`'s words, or the environment's
    setting."""
    return cached if mode == "cached" else \
        f"PYTHONDONTWRITEBYTECODE={os.environ.get('PYTHONDONTWRITEBYTECODE', '')!r}"


def phase_run(cmd: list[str], env: dict, cwd: str) -> dict[str, float]:
    """The phases of one command, run through this file as a wrapper."""
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        env = {**env, "BENCH_T0": repr(time.time()), "BENCH_OUT": f.name}
        python = str(Path(cmd[0]).parent / "python")
        t0 = time.perf_counter()
        subprocess.run([python, os.path.abspath(__file__), "--phases-child", *cmd[1:]],
                       env=env, cwd=cwd, check=True, stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - t0
        s = json.loads(Path(f.name).read_text())
    return {"start-up": s["run_enter"], "sim": s["engine_end"] - s["run_enter"],
            "tables": s["summary_end"] - s["engine_end"],
            "write": s["run_exit"] - s["summary_end"], "exit": wall - s["run_exit"]}


def _phases_child(argv: list[str]) -> None:
    """Run `sarathi-lab argv` in this process with time stamps (seconds since BENCH_T0, the
    parent's clock when it started this process) written to BENCH_OUT at exit."""
    import atexit
    import importlib.abc
    t0 = float(os.environ["BENCH_T0"])
    stamps: dict[str, float] = {}

    def stamp(name):
        stamps[name] = time.time() - t0

    def wrap(fn, before=None, after=None):
        def wrapper(*a, **k):
            if before:
                stamp(before)
            out = fn(*a, **k)
            if after:
                stamp(after)
            return out
        return wrapper

    def on_runner(m):
        m.run = wrap(m.run, "run_enter", "run_exit")

    def on_metrics(m):
        # patched as the module loads, so every module that imports it later calls the wrapper
        # (a fleet summarizes each replica too: the last call's end is the summary's)
        m.summarize = wrap(m.summarize, after="summary_end")

    def on_engine(m):   # an install before topology/: the runner called Engine.run
        m.Engine.run = wrap(m.Engine.run, after="engine_end")

    def on_driver(m):   # topology/: the runner drives every topology through Driver.run
        m.Driver.run = wrap(m.Driver.run, after="engine_end")

    # the runner is sarathi_lab.run.runner since the package moves (issue 40), sarathi_lab.runner
    # in an install from before them
    hooks = {"sarathi_lab.run.runner": on_runner, "sarathi_lab.runner": on_runner,
             "sarathi_lab.metrics": on_metrics,
             "sarathi_lab.engine": on_engine, "sarathi_lab.topology.driver": on_driver}

    class Hook(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name not in hooks:
                return None
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    break
            else:
                return None
            exec_module, then = spec.loader.exec_module, hooks[name]

            def patched(module):
                exec_module(module)
                then(module)
            spec.loader.exec_module = patched
            return spec

    sys.meta_path.insert(0, Hook())
    atexit.register(lambda: Path(os.environ["BENCH_OUT"]).write_text(json.dumps(stamps)))
    sys.argv = ["sarathi-lab", *argv]
    try:
        from sarathi_lab.cli.main import main
    except ModuleNotFoundError:   # an install from before the package moves: sarathi_lab.cli
        from sarathi_lab.cli import main
    main()


def install_args(ap: argparse.ArgumentParser) -> None:
    """The options every two-install bench takes (this one and bench_identical.py)."""
    ap.add_argument("--base", type=Path, required=True, help="baseline virtual environment")
    ap.add_argument("--new", type=Path, default=Path(sys.prefix), help="(default: this one)")
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--qps", type=float, default=1.0)
    ap.add_argument("--policies", default="sarathi,vllm,orca,request_level")


def report(res: dict, installs: dict, policies: list[str], cols: list[str], repeats: int):
    print(f"\nmedians over {repeats} repeats, seconds (peak RSS MiB); ratio new/base")
    print(f"{'policy':<14}{'':<6}" + "".join(f"{c:>10}" for c in cols) + f"{'RSS MiB':>10}")
    for policy in policies:
        med = {k: {c: statistics.median(v) for c, v in res[policy, k].items() if v}
               for k in installs}
        for k in installs:
            print(f"{policy:<14}{k:<6}" + "".join(f"{med[k][c]:>10.2f}" for c in cols)
                  + f"{med[k]['rss']:>10.0f}")
        print(f"{'':<14}{'ratio':<6}" + "".join(
            f"{med['new'][c] / med['base'][c]:>10.2f}" if med['base'][c] > 0.005 else f"{'':>10}"
            for c in cols) + f"{med['new']['rss'] / med['base']['rss']:>10.2f}")
    print("wall: whole command (plain run); cpu: its user + system CPU time (steadier than "
          "wall on a loaded machine); the phases come from a second, wrapped run; "
          "min/max of wall:")
    for policy in policies:
        print(f"  {policy}: " + ", ".join(
            f"{k} {min(res[policy, k]['wall']):.2f}-{max(res[policy, k]['wall']):.2f}"
            for k in installs))
    sys.stdout.flush()


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--phases-child":
        return _phases_child(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    install_args(ap)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--no-phases", action="store_true", help="whole-command times only")
    ap.add_argument("--warmup", type=int, default=1,
                    help="untimed runs of each command before the repeats (default 1)")
    ap.add_argument("--bytecode", choices=("env", "cached"), default="env",
                    help="env: as the environment says; cached: a bytecode cache per install")
    args = ap.parse_args()
    if args.repeats < 1 or args.warmup < 0:
        ap.error(f"--repeats {args.repeats} must be >= 1 and --warmup {args.warmup} >= 0")
    if args.bytecode == "cached" and not args.warmup:
        ap.error("--bytecode cached needs a warm-up run to fill the caches (--warmup >= 1)")
    installs = {"base": args.base.absolute(), "new": args.new.absolute()}
    cwd = tempfile.mkdtemp()   # not a checkout: `sarathi_lab` comes from each install
    envs = {kind: bytecode_env({**os.environ, "WANDB_MODE": "disabled"}, args.bytecode, cwd, kind)
            for kind in installs}
    print(f"base {installs['base']}, new {installs['new']}; bytecode: "
          + bytecode_label(args.bytecode, "a cache per install")
          + f"; {args.warmup} warm-up run(s), {args.repeats} repeats")
    for _ in range(args.warmup):
        for policy in args.policies.split(","):
            for kind in installs:
                timed_run(command(installs[kind], policy, args.requests, args.qps,
                                  tempfile.mkdtemp(dir=cwd)), envs[kind], cwd)
    res = {(p, k): {"wall": [], "rss": [], "cpu": [], **{ph: [] for ph in PHASES}}
           for p in args.policies.split(",") for k in installs}
    cols = ["wall", "cpu"] + ([] if args.no_phases else list(PHASES))
    for i in range(args.repeats):
        for policy in args.policies.split(","):
            order = list(installs) if i % 2 == 0 else list(installs)[::-1]
            for kind in order:
                cmd = command(installs[kind], policy, args.requests, args.qps,
                              tempfile.mkdtemp(dir=cwd))
                env = envs[kind]
                wall, rss, cpu = timed_run(cmd, env, cwd)
                r = res[policy, kind]
                r["wall"].append(wall)
                r["rss"].append(rss)
                r["cpu"].append(cpu)
                if not args.no_phases:
                    cmd[-1] = f"hydra.run.dir={tempfile.mkdtemp(dir=cwd)}"
                    for ph, v in phase_run(cmd, env, cwd).items():
                        r[ph].append(v)
        print(f"repeat {i + 1}/{args.repeats} done", file=sys.stderr, flush=True)
        if i + 1 < args.repeats:   # so far (a run cut short still leaves its figures)
            report(res, installs, args.policies.split(","), cols, i + 1)
    report(res, installs, args.policies.split(","), cols, args.repeats)


if __name__ == "__main__":
    main()
