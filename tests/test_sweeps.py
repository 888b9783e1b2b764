"""Hydra multiruns: every combination a directory, resume, failing jobs, parallel launchers."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import slow_fixture
from helpers import patience

from sarathi_lab.report import run_table

TESTS = Path(__file__).resolve().parent
TINY = ["trace=synthetic", "trace.num_requests=40"]
GRID = ["scheduler=orca,sarathi", "scheduler.max_num_seqs=8,16"]


def cli(*args, cwd, timeout=180):
    env = {**os.environ, "WANDB_MODE": "disabled",
           "PYTHONPATH": os.pathsep.join([str(TESTS), str(TESTS.parent),
                                          os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-c", "from sarathi_lab.cli.main import main; main()",
                           *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=patience(timeout))


def log_lines(sweep: Path) -> list[list[str]]:
    return [ln.split("\t") for ln in (sweep / "sweep.log").read_text().splitlines()]


@slow_fixture(scope="module")
def sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep")
    r = cli("-m", f"results_root={root}", "name=grid", *TINY, *GRID, cwd=root)
    assert r.returncode == 0, r.stdout + r.stderr
    return root / "sweeps" / "grid", r


@pytest.mark.slow   # a sweep in CLI subprocesses
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
    assert names[0] == ("scheduler.max_num_seqs=16__scheduler=orca__trace.num_requests=40__"
                        "trace=synthetic")


@pytest.mark.slow   # a sweep in CLI subprocesses
def test_sweep_progress_is_plain_lines(sweep):
    d, r = sweep
    assert json.loads((d / "sweep.json").read_text())["total"] == 4
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("[grid ")]
    assert len(lines) == 4 and all("TBT p99" in ln for ln in lines)
    assert {ln.split()[1] for ln in lines} == {"1/4]", "2/4]", "3/4]", "4/4]"}
    assert "\r" not in r.stdout and "\x1b" not in r.stdout     # no bars, no escapes in a log
    assert [f[2] for f in log_lines(d)] == ["done"] * 4
    assert "4 done, 0 skipped, 0 failed" in r.stdout


@pytest.mark.slow   # a sweep in CLI subprocesses
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


@pytest.mark.slow   # a sweep in CLI subprocesses
def test_a_failing_job_is_recorded_and_the_others_finish(tmp_path):
    missing = tmp_path / "none.csv"   # found missing only when its job reads it
    grid = ["trace.num_requests=40", f"trace.path=sharegpt,{missing},arxiv"]
    r = cli("-m", f"results_root={tmp_path}", "name=bad", *grid, cwd=tmp_path)
    assert r.returncode == 1            # the sweep says something failed...
    d = tmp_path / "sweeps" / "bad"
    assert len(list(d.rglob("summary.json"))) == 2   # ...but the other jobs completed
    errors = list(d.rglob("error.txt"))
    # the job's directory: a name cut to a portable length may lose the path, but the job's
    # recorded overrides keep it
    assert len(errors) == 1 \
        and str(missing) in (errors[0].parent / ".hydra" / "overrides.yaml").read_text()
    assert f"no trace file {str(missing)!r}" in errors[0].read_text()
    failed = [f for f in log_lines(d) if f[2] == "failed"]
    assert len(failed) == 1 and f"trace.path={missing}" in failed[0][3]
    assert "2 done, 0 skipped, 1 failed" in r.stdout
    # fixing nothing and resuming re-runs only the failed job
    r = cli("-m", f"results_root={tmp_path}", "name=bad", "resume=true", *grid, cwd=tmp_path)
    assert "0 done, 2 skipped, 1 failed" in r.stdout


@pytest.mark.slow
def test_a_bad_value_fails_the_sweep_before_any_job_starts(tmp_path):
    r = cli("-m", f"results_root={tmp_path}", "name=bad", *TINY, "scheduler.token_budget=256,0,512",
            cwd=tmp_path)
    assert r.returncode == 1
    assert r.stderr.strip() == (
        "sarathi-lab: error: sweep bad: job 2/3 (trace=synthetic,trace.num_requests=40,"
        "scheduler.token_budget=0): scheduler.token_budget=0: must be >= 1 (allowed: [1, inf)); "
        "no job was started")
    assert not (tmp_path / "sweeps").exists()   # nothing written, no job run
    # a group option that does not exist is found the same way, in its job
    r = cli("-m", f"results_root={tmp_path}", "name=bad", *TINY, "scheduler=vllm,nosuch",
            cwd=tmp_path)
    assert r.returncode == 1 and r.stderr.startswith(
        "sarathi-lab: error: sweep bad: job 2/2 (trace=synthetic,trace.num_requests=40,"
        "scheduler=nosuch): scheduler=nosuch: no such scheduler; choices: custom, edf"), r.stderr
    assert not (tmp_path / "sweeps").exists()


@pytest.mark.slow
def test_a_sweep_name_reused_with_another_grid_is_refused(tmp_path):
    args = ["-m", f"results_root={tmp_path}", "name=g", *TINY]
    assert cli(*args, "scheduler=vllm,orca", cwd=tmp_path).returncode == 0
    d = tmp_path / "sweeps" / "g"
    r = cli(*args, "scheduler=vllm,sarathi", cwd=tmp_path)
    assert r.returncode == 1
    assert r.stderr.strip() == (
        f"sarathi-lab: error: sweep g already ran in {d} with another grid (jobs only there: "
        "scheduler=orca,trace.num_requests=40,trace=synthetic; only here: "
        "scheduler=sarathi,trace.num_requests=40,trace=synthetic), and its runs would be "
        "reported with this one's; give this sweep another name=, or remove that directory")
    assert len(list(d.rglob("summary.json"))) == 2   # the first sweep's, not pooled
    # the same grid in another order, and how it runs (resume, progress), is the same sweep
    r = cli(*args, "scheduler=orca,vllm", "resume=true", "progress=false", cwd=tmp_path)
    assert r.returncode == 0 and "0 done, 2 skipped, 0 failed" in r.stdout, r.stderr


def test_the_grid_check_compares_jobs_and_reads_no_grid_as_a_note(tmp_path):
    from sarathi_lab.sweeps.check import refuse_other_grid
    assert refuse_other_grid(tmp_path, "s", ["a=1"]) is None            # a new directory
    (tmp_path / "sweep.json").write_text(json.dumps({"name": "s", "total": 1}))
    assert refuse_other_grid(tmp_path, "s", ["a=1"]).startswith(
        f"note: {tmp_path} holds an earlier sweep s whose grid was not recorded")
    (tmp_path / "sweep.json").write_text(json.dumps({"name": "s", "grid": ["a=1", "a=2"]}))
    assert refuse_other_grid(tmp_path, "s", ["a=1", "a=2"]) is None
    why = refuse_other_grid(tmp_path, "s", ["a=1", "a=3", "a=4", "a=5"])
    assert "(jobs only there: a=2; only here: a=3; a=4; and 1 more)" in why
    (tmp_path / "sweep.json").write_text('{"name": "s", "gr')
    assert refuse_other_grid(tmp_path, "s", ["a=1"]).startswith(
        f"{tmp_path / 'sweep.json'} cannot be read")


@pytest.mark.slow   # a sweep in CLI subprocesses
def test_parallel_launcher(tmp_path):
    r = cli("-m", f"results_root={tmp_path}", "name=par", "hydra/launcher=parallel",
            "hydra.launcher.n_jobs=2", *TINY, "scheduler=vllm,sarathi", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert len(run_table([tmp_path / "sweeps" / "par"])) == 2
    assert "2 done" in r.stdout


@pytest.mark.slow   # a sweep in CLI subprocesses
def test_submitit_local_launcher(tmp_path):
    r = cli("-m", f"results_root={tmp_path}", "name=sub", "hydra/launcher=submitit_local",
            "hydra.launcher.timeout_min=2", *TINY, "scheduler=vllm,sarathi", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    d = tmp_path / "sweeps" / "sub"
    assert len(run_table([d])) == 2
    assert sorted(f[2] for f in log_lines(d)) == ["done", "done"]


@pytest.mark.slow   # a sweep in CLI subprocesses
def test_the_announced_job_count_is_the_number_of_jobs_run(tmp_path):
    """The preset sweeps scheduler (1 value), token budget and load under hydra.sweeper.params;
    the command line replaces two of those sweeps (one by a range): 1 x 2 x 3 jobs."""
    r = cli("-m", f"results_root={tmp_path}", "name=count", "experiment=budget_sweep", *TINY,
            "scheduler.token_budget=256,512", "trace.qps=range(2,5)", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    d = tmp_path / "sweeps" / "count"
    jobs = [p for p in d.iterdir() if (p / ".hydra").is_dir()]
    assert json.loads((d / "sweep.json").read_text())["total"] == len(jobs) == 6
    assert len(log_lines(d)) == 6 and "sweep count: 6 jobs" in r.stdout


def _sweep_config(task, params=None, sweeper="hydra._internal.core_plugins.basic_sweeper."
                                              "BasicSweeper"):
    from omegaconf import OmegaConf
    return OmegaConf.create({"hydra": {"sweeper": {"_target_": sweeper, "params": params},
                                       "overrides": {"task": task}}})


@pytest.mark.parametrize("task, params, expected", [
    ([], None, 1),
    (["a=1,2,3", "b=x"], None, 3),
    (["a=1,2", "b=range(0,10,2)"], None, 10),
    (["a=choice(1,2)", "+c=tag(t,choice(x,y,z))"], {"b": "1,2"}, 12),
    (["a=1,2"], {"a": "1,2,3,4", "b": "5,6"}, 4),        # the command line replaces a's sweep
    (["a=interval(0,1)"], None, None),                   # the basic sweeper cannot enumerate it
    (["scheduler=glob(*)"], None, None),                 # needs the sweeper's config loader
])
def test_count_jobs_expands_sweeps_as_the_basic_sweeper(task, params, expected):
    from sarathi_lab.sweeps.bookkeeping import count_jobs
    assert count_jobs(_sweep_config(task, params)) == expected


def test_count_jobs_does_not_guess_for_another_sweeper():
    from sarathi_lab.sweeps.bookkeeping import count_jobs
    assert count_jobs(_sweep_config(["a=1,2"], sweeper="hydra_plugins.x.OptunaSweeper")) is None


@pytest.mark.slow   # a CLI subprocess
def test_no_resolver_state_or_private_hydra_at_import():
    """Importing the package registers nothing; the CLI and register_resolvers() do, and Hydra's
    compose API can then resolve the run and sweep directories."""
    code = """
from omegaconf import OmegaConf
import sarathi_lab.sweeps.bookkeeping, sarathi_lab.cli.main, sarathi_lab.report
assert not OmegaConf.has_resolver("dirname")
from hydra import compose, initialize_config_module
from sarathi_lab.sweeps.bookkeeping import register_resolvers
register_resolvers(); register_resolvers()     # twice is harmless
with initialize_config_module("sarathi_lab.configs", version_base="1.3"):
    cfg = compose("config", overrides=["trace.path=/a/b.csv"], return_hydra_config=True)
print(cfg.hydra.sweep.subdir)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=patience(60))
    assert r.returncode == 0, r.stderr
    from sarathi_lab.sweeps.bookkeeping import dirname
    assert r.stdout.strip() == dirname("trace.path=/a/b.csv")
    import inspect

    from sarathi_lab.cli import main as cli_module
    from sarathi_lab.sweeps import bookkeeping as sweeps
    # the one exception: the CLI's skip of Hydra's mode probe, guarded by Hydra's version
    probe = inspect.getsource(cli_module._no_mode_probe.__wrapped__)
    assert "hydra._internal" in probe
    for mod in (sweeps, cli_module):
        assert "hydra._internal" not in inspect.getsource(mod).replace(probe, "")
    assert not [k for k, v in vars(sweeps).items()
                if not k.startswith("__") and isinstance(v, (list, dict, set))]


def test_start_collecting_sets_start_up_aside_once_and_turns_the_collector_on():
    import gc

    from sarathi_lab.sweeps.bookkeeping import start_collecting
    was = gc.isenabled()
    gc.disable()
    try:
        before = gc.get_freeze_count()
        start_up = [[] for _ in range(1000)]   # noqa: F841 -- objects start-up made
        start_collecting()
        assert gc.isenabled() and gc.get_freeze_count() > before
        frozen = gc.get_freeze_count()
        later = [[] for _ in range(1000)]   # noqa: F841 -- a job's objects
        start_collecting()                  # a later job: nothing more set aside
        # (<=, not ==: a frozen object another test's thread still held may be freed meanwhile)
        assert gc.get_freeze_count() <= frozen
    finally:
        gc.unfreeze()
        (gc.enable if was else gc.disable)()


@pytest.mark.slow   # a sweep in CLI subprocesses
def test_a_run_and_a_sweep_collect_garbage_while_their_jobs_run(tmp_path):
    # runner.run reports the collector's state as the job sees it
    probe = ("import gc, sys, sarathi_lab.run.runner as r\n"
             "run = r.run\n"
             "def seen(*a, **k):\n"
             "    print('collector', gc.isenabled(), gc.get_freeze_count() > 0, flush=True)\n"
             "    return run(*a, **k)\n"
             "r.run = seen\n"
             "from sarathi_lab.cli.main import main\n"
             "main()\n")
    env = {**os.environ, "WANDB_MODE": "disabled"}
    for mode in ([], ["-m"]):
        r = subprocess.run([sys.executable, "-c", probe, *mode, *TINY, f"results_root={tmp_path}",
                            f"name=gc{len(mode)}"], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=patience(180))
        assert r.returncode == 0, r.stdout + r.stderr
        assert "collector True True" in r.stdout, r.stdout
