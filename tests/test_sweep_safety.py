"""Sweeps are safe together and against their environment: one sweep per directory (a lock that
a killed sweep does not leave behind), temporary files of their own, killing a sweep stops its
workers, a full disk or a directory that cannot be made is one line and no result that looks
complete; and sarathi-lab-report lists the jobs without a result."""
import errno
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from helpers import patience

from sarathi_lab.report import incomplete_jobs, make_report
from sarathi_lab.report import main as report_main
from sarathi_lab.run.rundir import atomic_write
from sarathi_lab.sweeps import bookkeeping as sweeps

TESTS = Path(__file__).resolve().parent
TINY = ["trace=synthetic", "trace.num_requests=40"]
# jobs that run for minutes: stopped long before they could finish
SLOW = ["trace=synthetic", "trace.num_requests=300000", "fast_forward=false"]
CLI = "from sarathi_lab.cli.main import main; main()"


def _env(**extra):
    return {**os.environ, "WANDB_MODE": "disabled",
            "PYTHONPATH": os.pathsep.join([str(TESTS), str(TESTS.parent),
                                           os.environ.get("PYTHONPATH", "")]), **extra}


def cli(*args, cwd, code=CLI, timeout=180):
    return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, env=_env(),
                          capture_output=True, text=True, timeout=patience(timeout))


def start(*args, cwd, **env):
    """A sarathi-lab command in the background, Ctrl-C reaching it as on a terminal (a test
    runner started in the background would hand it SIGINT ignored)."""
    return subprocess.Popen([sys.executable, "-c", CLI, *args], cwd=cwd, env=_env(**env),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def marked(mark: str) -> list[int]:
    """Processes whose environment carries SWEEP_MARK=mark: a command and all it started."""
    pids = []
    for p in Path("/proc").iterdir():
        try:
            if p.name.isdigit() and f"SWEEP_MARK={mark}".encode() in \
                    (p / "environ").read_bytes().split(b"\0"):
                pids.append(int(p.name))
        except OSError:   # gone meanwhile, or not ours to read
            pass
    return pids


def wait_for(cond, timeout: float, what: str):
    timeout = patience(timeout)   # for an idle machine
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = cond()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def kill_all(mark: str) -> None:
    for pid in marked(mark):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# ------------------------------------------------------------------------------------------
# one sweep per directory
# ------------------------------------------------------------------------------------------

def test_a_second_lock_on_a_sweep_is_refused_naming_the_first(tmp_path, monkeypatch):
    monkeypatch.setattr(sweeps, "LOCK_PATIENCE_S", 0.1)
    first = sweeps.lock_sweep(tmp_path, "grid")
    assert sweeps.sweep_holder(tmp_path).startswith(f"pid {os.getpid()} on ")
    with pytest.raises(sweeps.Abort, match=rf"sweep grid is already running in .*pid "
                                           rf"{os.getpid()} on .*another name="):
        sweeps.lock_sweep(tmp_path, "grid")
    first.close()
    assert sweeps.sweep_holder(tmp_path) is None
    sweeps.lock_sweep(tmp_path, "grid").close()     # free again


def test_a_killed_sweep_leaves_no_stale_lock(tmp_path):
    code = ("import sys, time; from pathlib import Path; from sarathi_lab.sweeps.bookkeeping import "
            "lock_sweep; f = lock_sweep(Path(sys.argv[1]), 'x'); print('held', flush=True); "
            "time.sleep(600)")
    p = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE,
                         text=True)
    try:
        assert p.stdout.readline().strip() == "held"
        assert sweeps.sweep_holder(tmp_path).startswith(f"pid {p.pid} ")
        p.kill()
        p.wait(timeout=10)
        assert sweeps.sweep_holder(tmp_path) is None
        sweeps.lock_sweep(tmp_path, "x").close()
    finally:
        p.kill()


@pytest.mark.slow   # a sweep in CLI subprocesses
def test_a_second_sweep_with_the_same_name_is_refused(tmp_path):
    mark = uuid.uuid4().hex
    first = start("-m", f"results_root={tmp_path}", "name=same", *SLOW, cwd=tmp_path,
                  SWEEP_MARK=mark)
    d = tmp_path / "sweeps" / "same"
    try:
        # the lock is taken first, sweep.json written just after it: wait for both
        wait_for(lambda: sweeps.sweep_holder(d) and (d / "sweep.json").exists(), 60,
                 "the first sweep's lock and sweep.json")
        before = (d / "sweep.json").read_text()
        r = cli("-m", f"results_root={tmp_path}", "name=same", *TINY, cwd=tmp_path)
        assert r.returncode == 1
        assert r.stderr.strip() == (f"sarathi-lab: error: sweep same is already running in {d} "
                                    f"({(d / sweeps.LOCK).read_text().strip()}"
                                    "); wait for it to end, or give this one another name=")
        assert f"pid {first.pid} on " in r.stderr
        assert (d / "sweep.json").read_text() == before      # the first sweep's, untouched
        assert not list(d.rglob("summary.json"))
        first.send_signal(signal.SIGTERM)
        first.wait(timeout=patience(30))
        r = cli("-m", f"results_root={tmp_path}", "name=same", *TINY, cwd=tmp_path)
        # the lock went with the first: what refuses this one now is the grid, checked under it
        assert r.returncode == 1 and "sweep same already ran in" in r.stderr \
            and "with another grid" in r.stderr, r.stderr
    finally:
        first.kill()
        kill_all(mark)


# ------------------------------------------------------------------------------------------
# killing a sweep
# ------------------------------------------------------------------------------------------

@pytest.mark.slow   # a sweep in CLI subprocesses
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_killing_a_parallel_sweep_stops_its_workers(tmp_path, sig):
    mark = uuid.uuid4().hex
    p = start("-m", f"results_root={tmp_path}", "name=kill", "hydra/launcher=parallel",
              "hydra.launcher.n_jobs=2", *SLOW, "scheduler=vllm,sarathi", cwd=tmp_path,
              SWEEP_MARK=mark)
    try:
        # the command, joblib's two workers and its resource trackers; both jobs started
        d = tmp_path / "sweeps" / "kill"
        wait_for(lambda: len(marked(mark)) >= 4, 90, "the sweep's worker processes")
        wait_for(lambda: len(list(d.glob("*/.hydra/overrides.yaml"))) == 2, 60, "both jobs")
        workers = set(marked(mark)) - {p.pid}
        t0 = time.monotonic()
        p.send_signal(sig)
        out, err = p.communicate(timeout=patience(30))
        assert p.returncode == 128 + sig
        assert err.strip().splitlines()[-1] == (
            f"sarathi-lab: stopped by {sig.name}; finished jobs keep their results "
            "(resume=true runs the rest)")
        assert "Traceback" not in err
        wait_for(lambda: not (workers & set(marked(mark))), 15, "the workers to end")
        assert time.monotonic() - t0 < patience(45)
        assert not list(d.rglob("summary.json"))
        # the interrupted jobs are listed as unfinished, the sweep as no longer running
        rows = incomplete_jobs([d])
        assert sorted(rows["status"]) == ["unfinished", "unfinished"]
        assert not rows["detail"].str.contains("running").any()
    finally:
        p.kill()
        kill_all(mark)


# ------------------------------------------------------------------------------------------
# temporary files, full disks, directories that cannot be made
# ------------------------------------------------------------------------------------------

def test_atomic_write_uses_a_temporary_file_of_its_own(tmp_path):
    target, seen = tmp_path / "summary.json", []

    def write(p):
        seen.append(p)
        p.write_text("new")
    atomic_write(target, write)
    atomic_write(target, write)
    assert target.read_text() == "new" and len(set(seen)) == 2
    assert all(f".{os.getpid()}." in p.name and p.parent == tmp_path for p in seen)

    def fails(p):
        p.write_text("half")
        raise OSError(errno.ENOSPC, "No space left on device")
    with pytest.raises(OSError):
        atomic_write(target, fails)
    assert target.read_text() == "new"                     # the old file, not a half one
    assert sorted(f.name for f in tmp_path.iterdir()) == ["summary.json"]


# Python run before the CLI in its process: writes of the run's results (and, with FULL=all,
# of anything through Path.write_text, error.txt included) fail as on a full disk, after
# writing part of the file.
FULL_DISK = """
import errno, os, pathlib, pandas, pyarrow.parquet
def _full(path):
    with open(path, "wb") as f:
        f.write(b"PAR1 half a file")
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
pandas.DataFrame.to_parquet = lambda self, path, **kw: _full(path)
pyarrow.parquet.write_table = lambda table, path, **kw: _full(path)
_write_text = pathlib.Path.write_text
def write_text(self, *a, **kw):
    if os.environ["FULL"] == "all" or "error.txt" in self.name:
        _full(self)
    return _write_text(self, *a, **kw)
pathlib.Path.write_text = write_text
"""


def no_partial_results(d: Path):
    left = sorted(f.name for f in d.iterdir() if f.name != ".hydra" and not f.suffix == ".log")
    assert left == [], left


@pytest.mark.slow   # a CLI subprocess
def test_a_full_disk_in_a_single_run_is_one_error_and_no_partial_result(tmp_path):
    run = tmp_path / "run"
    r = subprocess.run([sys.executable, "-c", FULL_DISK + CLI, f"hydra.run.dir={run}", *TINY],
                       cwd=tmp_path, env=_env(FULL="all"), capture_output=True, text=True,
                       timeout=patience(120))
    assert r.returncode == 1
    assert "Traceback" not in r.stderr and "During handling" not in r.stderr
    err = r.stderr.strip().splitlines()
    assert err[0].startswith("sarathi-lab: error: [Errno 28] No space left on device: ")
    assert err[1].startswith("(traceback not saved: [Errno 28] No space left on device: ")
    assert str(run / ".error.txt.") in err[1]
    assert len(err) == 2
    no_partial_results(run)            # no summary.json, parquet, error.txt or temporary file


@pytest.mark.slow   # a sweep in CLI subprocesses
def test_a_full_disk_in_a_sweep_is_recorded_and_listed(tmp_path):
    r = subprocess.run([sys.executable, "-c", FULL_DISK + CLI, "-m", f"results_root={tmp_path}",
                        "name=full", *TINY], cwd=tmp_path, env=_env(FULL="error.txt"),
                       capture_output=True, text=True, timeout=patience(120))
    assert r.returncode == 1
    assert "Traceback" not in r.stderr + r.stdout
    d = tmp_path / "sweeps" / "full"
    job = next(p for p in d.iterdir() if (p / ".hydra").is_dir())
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("[full 1/1]"))
    assert " failed " in line and "OSError: [Errno 28] No space left on device" in line
    assert "(traceback not saved: [Errno 28]" in line
    assert "0 done, 0 skipped, 1 failed" in r.stdout
    no_partial_results(job)
    # the report names it from sweep.log, as there is no error.txt
    rows = incomplete_jobs([d])
    assert list(rows["status"]) == ["failed"] and list(rows["run_dir"]) == [str(job)]
    assert rows["detail"][0].startswith("OSError: [Errno 28] No space left on device")


@pytest.mark.slow   # a sweep in CLI subprocesses
def test_a_job_whose_line_cannot_reach_sweep_log_fails_the_sweep(tmp_path):
    code = ("import errno, sarathi_lab.sweeps.bookkeeping as s\n"
            "def full(*a): raise OSError(errno.ENOSPC, 'No space left on device')\n"
            "s._append = full\n" + CLI)
    r = cli("-m", f"results_root={tmp_path}", "name=nolog", *TINY, "scheduler=vllm,sarathi",
            cwd=tmp_path, code=code)
    assert r.returncode == 1
    assert r.stderr.count("cannot append to sweep.log: [Errno 28] No space left on device") == 2
    assert "0 done, 0 skipped, 0 failed, 2 without a line in sweep.log" in r.stdout
    assert len(list((tmp_path / "sweeps" / "nolog").rglob("summary.json"))) == 2


@pytest.mark.slow   # a sweep in CLI subprocesses
@pytest.mark.parametrize("multirun", [False, True])
def test_a_results_root_that_cannot_be_made_is_one_line(tmp_path, multirun):
    """Tests run as root, whom permissions do not stop: a results root below a regular file
    cannot be made by anyone."""
    (tmp_path / "file").write_text("")
    root = tmp_path / "file" / "out"
    r = cli(*(["-m", "name=nowhere"] if multirun else []), f"results_root={root}", *TINY,
            cwd=tmp_path)
    assert r.returncode == 1
    what = "the directory of sweep nowhere" if multirun else "the run directory"
    assert r.stderr.startswith(f"sarathi-lab: error: cannot write {what} (results_root={root}): "
                               "[Errno 20] Not a directory: ")
    assert len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "outputs").exists()


# ------------------------------------------------------------------------------------------
# the report lists the jobs without a result
# ------------------------------------------------------------------------------------------

@pytest.mark.slow   # a sweep in CLI subprocesses
def test_report_lists_failed_unfinished_and_missing_jobs(tmp_path, capsys, monkeypatch):
    # a job that fails when it runs (its trace file is missing), not when it is checked
    r = cli("-m", f"results_root={tmp_path}", "name=mixed", "trace.num_requests=40",
            f"trace.path=sharegpt,{tmp_path / 'none.csv'}", cwd=tmp_path)
    assert r.returncode == 1
    d = tmp_path / "sweeps" / "mixed"
    # a job killed before it wrote anything but Hydra's files
    done = next(p.parent for p in d.rglob("summary.json"))
    killed = d / "trace.num_requests=40__trace.path=arxiv"
    (killed / ".hydra").mkdir(parents=True)
    (killed / ".hydra" / "overrides.yaml").write_text((done / ".hydra" / "overrides.yaml")
                                                      .read_text())
    # and a job that never got a directory: the sweep announced 4
    meta = json.loads((d / "sweep.json").read_text())
    (d / "sweep.json").write_text(json.dumps({**meta, "total": 4}))

    rows = incomplete_jobs([d]).sort_values("status").reset_index(drop=True)
    assert list(rows["status"]) == ["failed", "not started", "unfinished"]
    failed = next(p.parent for p in d.rglob("error.txt"))
    assert list(rows["run_dir"]) == [str(failed), str(d), str(killed)]
    assert rows["detail"][0].endswith(f"FileNotFoundError: no trace file "
                                      f"{str(tmp_path / 'none.csv')!r}; shipped traces are: "
                                      "sharegpt, azure_conv, azure_code, splitwise_conv, "
                                      "splitwise_code, arxiv, mooncake")
    assert rows["detail"][1] == "1 of the sweep's 4 jobs have no directory"
    assert rows["detail"][2] == "no summary.json, capacity.json or error.txt"

    out = tmp_path / "rep"
    report_main([str(d), "--out", str(out), "--timeline", "none"])
    printed = capsys.readouterr().out
    assert "3 job(s) without a result (not in the table):" in printed
    assert f"  failed       mixed/{failed.name}  FileNotFoundError: no trace file " in printed
    assert f"  unfinished   mixed/{killed.name}  no summary.json" in printed
    assert "  not started  mixed  1 of the sweep's 4 jobs have no directory" in printed
    import pandas as pd
    csv = pd.read_csv(out / "incomplete.csv")
    assert sorted(csv["status"]) == ["failed", "not started", "unfinished"]
    assert set(csv["run_dir"]) == {f"mixed/{failed.name}", "mixed", f"mixed/{killed.name}"}
    md = (out / "report.md").read_text()
    assert "## Jobs without a result (3)" in md and f"| unfinished | mixed/{killed.name} |" in md
    assert len(pd.read_csv(out / "summary.csv")) == 1           # the table: the finished job

    # while a sweep holds the directory, its unfinished jobs say so
    lock = sweeps.lock_sweep(d, "mixed")
    try:
        rows = incomplete_jobs([d])
        assert rows.loc[rows["status"] == "unfinished", "detail"].str.contains(
            rf"the sweep is running \(pid {os.getpid()} ").all()
    finally:
        lock.close()
    # a job that failed after an earlier success is failed, not finished
    (done / "error.txt").write_text("Traceback ...\nOSError: disk on fire\n")
    rows = incomplete_jobs([d])
    assert "OSError: disk on fire (an earlier result is also there, and in the table)" in \
        list(rows["detail"])


@pytest.mark.slow   # a sweep in CLI subprocesses
def test_report_without_results_still_lists_the_failures(tmp_path):
    missing = tmp_path / "none.csv"   # found missing when the job runs
    r = cli("-m", f"results_root={tmp_path}", "name=allbad", "trace.num_requests=40",
            f"trace.path={missing}", cwd=tmp_path)
    assert r.returncode == 1
    d = tmp_path / "sweeps" / "allbad"
    with pytest.raises(FileNotFoundError) as e:
        make_report([d], tmp_path / "rep")
    lines = str(e.value).splitlines()
    assert lines[0] == f"no summary.json or capacity.json below {d}"
    assert lines[1] == "1 job(s) without a result (not in the table):"
    job = sweeps.dirname(f"trace.num_requests=40,trace.path={missing}")
    assert lines[2].startswith(f"  failed  allbad/{job}")
    assert lines[2].endswith(f"FileNotFoundError: no trace file {str(missing)!r}; shipped "
                             "traces are: sharegpt, azure_conv, azure_code, splitwise_conv, "
                             "splitwise_code, arxiv, mooncake")


@pytest.mark.slow
def test_a_stopped_single_run_says_that_nothing_of_it_is_kept(tmp_path):
    mark = uuid.uuid4().hex
    p = start(f"results_root={tmp_path}", *SLOW, cwd=tmp_path, SWEEP_MARK=mark)
    try:
        runs = tmp_path / "runs"
        wait_for(lambda: list(runs.glob("*/.hydra/overrides.yaml")), 60, "the run's directory")
        time.sleep(1.0)   # into the run
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=patience(30))
        assert p.returncode == 128 + signal.SIGINT
        assert err.strip().splitlines()[-1] == (
            "sarathi-lab: stopped by SIGINT; the run did not finish and no result of it is kept "
            "(its directory is removed)")
        assert not list(runs.iterdir())
    finally:
        p.kill()
        kill_all(mark)


def test_a_stop_silences_rays_reports_of_the_jobs_it_stops(monkeypatch):
    """The signal raises `Interrupted` in the command and, from then on, Ray's driver does not
    log the stopped jobs' dead workers as unhandled errors after the stop's last line (it reads
    RAY_IGNORE_UNHANDLED_ERRORS when it would log one); before a stop Ray reports as it does."""
    from sarathi_lab.sweeps.bookkeeping import Interrupted, stop_on_signals
    monkeypatch.delenv("RAY_IGNORE_UNHANDLED_ERRORS", raising=False)
    with pytest.raises(Interrupted):
        with stop_on_signals() as received:
            assert "RAY_IGNORE_UNHANDLED_ERRORS" not in os.environ
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)   # the handler raises at the next bytecode; never reached
    assert received.signum == signal.SIGTERM
    assert os.environ["RAY_IGNORE_UNHANDLED_ERRORS"] == "1"
