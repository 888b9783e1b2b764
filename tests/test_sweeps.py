"""Hydra multiruns: every combination a directory, resume, failing jobs, parallel launchers."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sarathi_lab.report import run_table

TESTS = Path(__file__).resolve().parent
TINY = ["trace=synthetic", "trace.num_requests=40"]
GRID = ["scheduler=orca,sarathi", "scheduler.max_num_seqs=8,16"]


def cli(*args, cwd, timeout=180):
    env = {**os.environ, "WANDB_MODE": "disabled",
           "PYTHONPATH": os.pathsep.join([str(TESTS), str(TESTS.parent),
                                          os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-c", "from sarathi_lab.cli import main; main()",
                           *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def log_lines(sweep: Path) -> list[list[str]]:
    return [ln.split("\t") for ln in (sweep / "sweep.log").read_text().splitlines()]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep")
    r = cli("-m", f"results_root={root}", "name=grid", *TINY, *GRID, cwd=root)
    assert r.returncode == 0, r.stdout + r.stderr
    return root / "sweeps" / "grid", r


def test_every_combination_has_its_run_directory(sweep):
    d, r = sweep
    table = run_table([d])
    assert len(table) == 4
    assert {"scheduler", "scheduler.max_num_seqs"} <= set(table.columns)
    got = set(zip(table["scheduler"], table["scheduler.max_num_seqs"]))
    assert got == {("orca", 8), ("orca", 16), ("sarathi", 8), ("sarathi", 16)}
    # the overrides are what the jobs ran with
    assert (table["policy"] == table["scheduler"]).all()
    assert (table["max_num_seqs"] == table["scheduler.max_num_seqs"]).all()
    # the directory names come from the overrides alone: the same sweep lands in the same place
    names = sorted(Path(p).name for p in table["run_dir"])
    assert names[0] == ("scheduler.max_num_seqs=16,scheduler=orca,trace.num_requests=40,"
                        "trace=synthetic")


def test_sweep_progress_is_plain_lines(sweep):
    d, r = sweep
    assert json.loads((d / "sweep.json").read_text())["total"] == 4
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("[grid ")]
    assert len(lines) == 4 and all("TBT p99" in ln for ln in lines)
    assert {ln.split()[1] for ln in lines} == {"1/4]", "2/4]", "3/4]", "4/4]"}
    assert "\r" not in r.stdout and "\x1b" not in r.stdout     # no bars, no escapes in a log
    assert [f[2] for f in log_lines(d)] == ["done"] * 4
    assert "4 done, 0 skipped, 0 failed" in r.stdout


def test_resume_skips_finished_jobs(sweep):
    d, _ = sweep
    before = {p: p.stat().st_mtime_ns for p in d.rglob("summary.json")}
    r = cli("-m", f"results_root={d.parent.parent}", "name=grid", "resume=true", *TINY, *GRID,
            cwd=d.parent.parent)
    assert r.returncode == 0, r.stderr
    assert "0 done, 4 skipped, 0 failed" in r.stdout
    after = {p: p.stat().st_mtime_ns for p in d.rglob("summary.json")}
    assert before == after and len(after) == 4
    assert [f[2] for f in log_lines(d)][-4:] == ["skipped"] * 4


def test_a_failing_job_is_recorded_and_the_others_finish(tmp_path):
    r = cli("-m", f"results_root={tmp_path}", "name=bad", *TINY, "scheduler.token_budget=256,0,512",
            cwd=tmp_path)
    assert r.returncode == 1            # the sweep says something failed...
    d = tmp_path / "sweeps" / "bad"
    assert len(list(d.rglob("summary.json"))) == 2   # ...but the other jobs completed
    errors = list(d.rglob("error.txt"))
    assert len(errors) == 1 and "token_budget=0" in errors[0].parent.name
    assert "scheduler.token_budget=0: must be >= 1" in errors[0].read_text()
    failed = [f for f in log_lines(d) if f[2] == "failed"]
    assert len(failed) == 1 and "scheduler.token_budget=0" in failed[0][3]
    assert "2 done, 0 skipped, 1 failed" in r.stdout
    # fixing nothing and resuming re-runs only the failed job
    r = cli("-m", f"results_root={tmp_path}", "name=bad", "resume=true", *TINY,
            "scheduler.token_budget=256,0,512", cwd=tmp_path)
    assert "0 done, 2 skipped, 1 failed" in r.stdout


def test_parallel_launcher(tmp_path):
    r = cli("-m", f"results_root={tmp_path}", "name=par", "hydra/launcher=parallel",
            "hydra.launcher.n_jobs=2", *TINY, "scheduler=vllm,sarathi", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert len(run_table([tmp_path / "sweeps" / "par"])) == 2
    assert "2 done" in r.stdout


def test_submitit_local_launcher(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    r = cli("-m", f"results_root={tmp_path}", "name=sub", "hydra/launcher=submitit_local",
            "hydra.launcher.timeout_min=2", *TINY, "scheduler=vllm,sarathi", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    d = tmp_path / "sweeps" / "sub"
    assert len(run_table([d])) == 2
    assert sorted(f[2] for f in log_lines(d)) == ["done", "done"]
