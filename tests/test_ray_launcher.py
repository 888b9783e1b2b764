"""Sweeps on a Ray cluster (hydra/launcher=ray): a head node this module starts on 127.0.0.1 and
always stops, and sweeps sent to it behave as under the joblib launcher: the same run
directories and results, sweep.log lines, error.txt, merged jobs, resume, the report, and
SIGTERM stops the sweep with its jobs."""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import slow_fixture
from helpers import patience

from sarathi_lab.report import incomplete_jobs, make_report, run_table

pytestmark = pytest.mark.slow   # Ray clusters and sweeps on them

TESTS = Path(__file__).resolve().parent
TINY = ["trace=synthetic", "trace.num_requests=40"]
# sarathi with a budget of 0 fails; vllm does not read the budget, so its two jobs are one run:
# the budget outermost, so that the first vllm job has claimed the run before the second starts
# vLLM with too small a batch fails as it runs (a value that fails the checks of the settings
# stops the whole sweep before any job: tests/test_sweeps.py); Sarathi does not read the knob,
# so its two jobs are one
GRID = ["scheduler.max_num_batched_tokens=65536,16", "scheduler=vllm,sarathi"]
SLOW = ["trace=synthetic", "trace.num_requests=300000", "fast_forward=false"]
CLI = "from sarathi_lab.cli.main import main; main()"
# Ray binds its servers to the node's address; with this it takes 127.0.0.1 as that address
# (on Linux it would replace 127.0.0.1 by the machine's routable one): nothing listens beyond
# this machine. The head and the sweep's driver both need it.
LOOPBACK = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


def _env(**extra):
    # RAY_AUTH_MODE: Ray 2.60 turns token authentication on when ~/.ray/auth_token exists (a
    # local ray.init elsewhere writes one), and then these heads refuse their own sweeps
    env = {**os.environ, "WANDB_MODE": "disabled", "RAY_AUTH_MODE": "disabled", **LOOPBACK,
           "PYTHONPATH": os.pathsep.join([str(TESTS), str(TESTS.parent),
                                          os.environ.get("PYTHONPATH", "")]), **extra}
    env.pop("RAY_ADDRESS", None)
    return env


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def head_processes(temp: Path) -> list[int]:
    """The head's processes: those with a file open below its temporary directory (every Ray
    process logs there) or naming it on their command line."""
    pids = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit() or int(p.name) == os.getpid():
            continue
        try:
            if str(temp) in (p / "cmdline").read_bytes().decode(errors="replace") or any(
                    os.readlink(fd).startswith(str(temp)) for fd in (p / "fd").iterdir()):
                pids.append(int(p.name))
        except OSError:   # gone meanwhile
            pass
    return pids


def listening(pids: list[int]) -> list[str]:
    """The local addresses (ip:port) of the TCP sockets these processes listen on."""
    inodes = set()
    for pid in pids:
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                link = os.readlink(fd)
                if link.startswith("socket:["):
                    inodes.add(link[8:-1])
        except OSError:
            pass
    out = []
    for table, width in (("tcp", 8), ("tcp6", 32)):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            f = line.split()
            if f[3] == "0A" and f[9] in inodes:      # 0A: LISTEN
                addr, port = f[1].split(":")
                raw = bytes.fromhex(addr)
                # little-endian 32-bit words
                ip = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
                out.append(f"{socket.inet_ntop(socket.AF_INET if width == 8 else socket.AF_INET6, ip)}"
                           f":{int(port, 16)}")
    return out


def stop_head(temp: Path) -> None:
    """SIGTERM to the head's processes (Ray's own shutdown), SIGKILL to any left after 2 s
    (one of them, at least, outlives SIGTERM when the others are gone)."""
    for sig, grace in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 5.0)):
        pids = head_processes(temp)
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        end = time.monotonic() + grace
        while time.monotonic() < end and head_processes(temp):
            time.sleep(0.2)


@slow_fixture(scope="module")
def head():
    """A Ray head on 127.0.0.1 with two CPUs: its temporary files and logs in a directory of its
    own, every port chosen free (two sessions' heads do not collide), stopped at the end however
    the tests went."""
    temp = Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))   # short: Ray's socket paths
    (temp / "head").mkdir()
    ray = Path(sys.executable).parent / "ray"
    try:
        # up to 3 starts: under load (the suite's other xdist worker on a 2-core machine) the
        # head's own GCS can miss Ray's ~30 s deadline for its node info ("RPC error: Deadline
        # Exceeded"); that is the head not starting, not anything the tests check
        for attempt in range(3):
            gcs, client, agent, agent_grpc, env_agent, dash, dash_metric, scaler_metric = \
                free_ports(8)
            r = subprocess.run(
                [str(ray), "start", "--head", "--node-ip-address=127.0.0.1", f"--port={gcs}",
                 "--num-cpus=2", "--include-dashboard=false", f"--temp-dir={temp}",
                 "--disable-usage-stats", f"--ray-client-server-port={client}",
                 f"--dashboard-port={dash}", f"--dashboard-agent-listen-port={agent}",
                 f"--dashboard-agent-grpc-port={agent_grpc}",
                 f"--runtime-env-agent-port={env_agent}", "--log-style=record"],
                cwd=temp / "head", capture_output=True, text=True, timeout=patience(120),
                env=_env(DASHBOARD_METRIC_PORT=str(dash_metric),
                         AUTOSCALER_METRIC_PORT=str(scaler_metric), RAY_USAGE_STATS_ENABLED="0"))
            if r.returncode == 0 or "Deadline Exceeded" not in r.stdout + r.stderr:
                break
            stop_head(temp)
        assert r.returncode == 0, r.stdout + r.stderr
        yield {"address": f"127.0.0.1:{gcs}", "temp": temp, "cwd": temp / "head"}
    finally:
        stop_head(temp)
        shutil.rmtree(temp, ignore_errors=True)


def cli(*args, cwd, timeout=180):
    return subprocess.run([sys.executable, "-c", CLI, *args], cwd=cwd, env=_env(),
                          capture_output=True, text=True, timeout=patience(timeout))


def on_ray(head) -> list[str]:
    return ["hydra/launcher=ray", f"hydra.launcher.ray.init.address={head['address']}"]


def log_lines(sweep: Path) -> list[list[str]]:
    return [ln.split("\t") for ln in (sweep / "sweep.log").read_text().splitlines()]


def job_files(sweep: Path) -> dict[str, list[str]]:
    """Each job directory's files, Hydra's log (named after the task) aside."""
    return {d.name: sorted(str(f.relative_to(d)) for f in d.rglob("*")
                           if f.is_file() and f.suffix != ".log")
            for d in sweep.iterdir() if (d / ".hydra").is_dir()}


@slow_fixture(scope="module")
def sweeps(head, tmp_path_factory):
    """The same failing, merging grid under Ray (results_root relative to the command's
    directory, which the head's workers do not start in) and under joblib."""
    root = tmp_path_factory.mktemp("raysweep")
    ray = cli("-m", "results_root=out", "name=grid", *on_ray(head), *TINY, *GRID, cwd=root)
    joblib = cli("-m", "results_root=out", "name=jl", "hydra/launcher=parallel",
                 "hydra.launcher.n_jobs=2", *TINY, *GRID, cwd=root)
    return root / "out" / "sweeps", ray, joblib


def test_the_head_listens_on_loopback_only(head):
    pids = head_processes(head["temp"])
    assert len(pids) >= 4, pids          # gcs, raylet, the agents: the test would stop them
    addrs = listening(pids)
    assert any(a.endswith(":" + head["address"].split(":")[1]) for a in addrs), addrs
    assert all(a.split(":")[0] == "127.0.0.1" or a.startswith("::ffff:127.0.0.1:")
               for a in addrs), addrs


def test_a_ray_sweep_records_what_a_joblib_sweep_does(sweeps, head):
    d, ray, joblib = sweeps
    assert ray.returncode == joblib.returncode == 1, ray.stdout + ray.stderr
    assert "Traceback" not in ray.stderr and "UserWarning" not in ray.stderr, ray.stderr
    for out in (ray.stdout, joblib.stdout):
        assert "2 done, 0 skipped, 1 merged, 1 failed" in out, out
    # the jobs ran where the sweep was started, not in the head's directory, and Ray left
    # nothing of its own in either
    assert not list(head["cwd"].iterdir())
    assert [p.name for p in d.parent.parent.iterdir()] == ["out"]
    g, j = d / "grid", d / "jl"
    # which of the two sarathi jobs runs and which is merged into it depends on which starts
    # first, under either launcher
    assert sorted(job_files(g).values()) == sorted(job_files(j).values())
    assert set(job_files(g)) == set(job_files(j)) and len(job_files(g)) == 4
    assert sorted(f[2] for f in log_lines(g)) == sorted(f[2] for f in log_lines(j))
    assert sorted(f[3] for f in log_lines(g)) == sorted(f[3] for f in log_lines(j))
    # the same results: the simulator is deterministic
    results = {}
    for sweep in (g, j):
        for run in sweep.glob("*/summary.json"):
            s = json.loads(run.read_text())
            policy = s["settings"]["scheduler"]["class"].split(":")[1]
            results.setdefault(policy, []).append((s["tbt"], s["ttft"], s["makespan_s"]))
    assert sorted(results) == ["Sarathi", "VLLM"]
    assert all(len(v) == 2 and v[0] == v[1] for v in results.values())
    (error,) = g.rglob("error.txt")
    assert "scheduler=vllm" in error.parent.name and "batched_tokens=16" in error.parent.name
    assert "scheduler.max_num_batched_tokens=16 is smaller than max_model_len" in error.read_text()
    assert error.read_text().splitlines()[-1] == \
        (j / error.parent.name / "error.txt").read_text().splitlines()[-1]
    merged = json.loads(next(g.rglob("merged.json")).read_text())
    assert "scheduler=sarathi" in merged["same_as"]
    # one plain line per job on the terminal, as printed (Ray's prefix, colours and folding of
    # similar lines are off), numbered as in any sweep
    def job_lines(out, name):
        return sorted(ln.split()[1:3] for ln in out.splitlines() if ln.startswith(f"[{name} ")
                      and ln.split()[2] != "note:")
    assert "\x1b" not in ray.stdout and "repeated" not in ray.stdout
    # (the two launchers are compared through sweep.log above: a joblib job's terminal line was
    # once missing from the captured output, the log never)
    mine = job_lines(ray.stdout, "grid")
    assert [n for n, _ in mine] == ["1/4]", "2/4]", "3/4]", "4/4]"]
    assert sorted(s for _, s in mine) == sorted(f[2] for f in log_lines(g))


def test_resume_on_ray_reruns_only_the_failed_job(sweeps, head):
    d, _, _ = sweeps
    before = {p: p.stat().st_mtime_ns for p in (d / "grid").rglob("summary.json")}
    r = cli("-m", "results_root=out", "name=grid", "resume=true", *on_ray(head), *TINY, *GRID,
            cwd=d.parent.parent)
    assert r.returncode == 1
    assert "0 done, 2 skipped, 1 merged, 1 failed" in r.stdout, r.stdout + r.stderr
    after = {p: p.stat().st_mtime_ns for p in (d / "grid").rglob("summary.json")}
    assert before == after and len(after) == 2
    assert sorted(f[2] for f in log_lines(d / "grid")[-4:]) == \
        ["failed", "merged", "skipped", "skipped"]


def test_the_report_of_a_ray_sweep_is_the_joblib_sweeps(sweeps, tmp_path):
    d, _, _ = sweeps
    mine, theirs = run_table([d / "grid"]), run_table([d / "jl"])
    # all but where and how long; and the batch column, the sarathi run's being that of
    # whichever of its two jobs ran first
    cols = [c for c in mine.columns if c not in ("run_dir", "wall_time_s",
                                                 "scheduler.max_num_batched_tokens")]
    assert len(mine) == 2 and "tbt_p99" in cols
    assert mine[cols].sort_values("scheduler").reset_index(drop=True).equals(
        theirs[cols].sort_values("scheduler").reset_index(drop=True))
    rows = incomplete_jobs([d / "grid"])
    assert list(rows["status"]) == ["failed"]
    assert "scheduler.max_num_batched_tokens=16 is smaller than max_model_len" in rows["detail"][0]
    make_report([d / "grid"], tmp_path / "rep")
    assert len((tmp_path / "rep" / "summary.csv").read_text().splitlines()) == 3


def test_sigterm_stops_a_ray_sweep_and_its_jobs(head, tmp_path):
    p = subprocess.Popen([sys.executable, "-c", CLI, "-m", f"results_root={tmp_path}",
                          "name=kill", *on_ray(head), *SLOW, "scheduler=vllm,sarathi"],
                         cwd=tmp_path, env=_env(), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    d = tmp_path / "sweeps" / "kill"

    def running_jobs():
        return [pid for pid in head_processes(head["temp"])
                if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"ray::_run_job")]
    try:
        end = time.monotonic() + 60
        while time.monotonic() < end and not (
                len(list(d.glob("*/.hydra/overrides.yaml"))) == 2 and len(running_jobs()) == 2):
            assert p.poll() is None, p.communicate()
            time.sleep(0.2)
        assert len(running_jobs()) == 2
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=patience(60))
        assert p.returncode == 128 + signal.SIGTERM, out + err
        assert err.strip().splitlines()[-1] == (
            "sarathi-lab: stopped by SIGTERM; finished jobs keep their results "
            "(resume=true runs the rest)")
        assert "Traceback" not in err
        end = time.monotonic() + 20
        while time.monotonic() < end and running_jobs():
            time.sleep(0.2)
        assert not running_jobs()
        assert sorted(incomplete_jobs([d])["status"]) == ["unfinished", "unfinished"]
    finally:
        p.kill()


def test_an_address_where_no_cluster_answers_is_one_line_at_once(tmp_path):
    """Ray itself would retry for minutes; nothing of the sweep is written."""
    (port,) = free_ports(1)
    r = cli("-m", f"results_root={tmp_path}", "name=nowhere", "hydra/launcher=ray",
            f"hydra.launcher.ray.init.address=127.0.0.1:{port}", *TINY, cwd=tmp_path, timeout=60)
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == [
        "sarathi-lab: error: no Ray cluster answers at hydra.launcher.ray.init.address="
        f"127.0.0.1:{port}: [Errno 111] Connection refused"], r.stderr
    assert list(tmp_path.iterdir()) == []


def _job_under(launcher: dict):
    """The job's view of itself in a multirun under `launcher`."""
    from hydra.conf import HydraConf
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import OmegaConf

    from sarathi_lab.sweeps.bookkeeping import _Job
    hc = OmegaConf.structured(HydraConf)
    hc.mode, hc.launcher = RunMode.MULTIRUN, launcher
    hc.runtime.output_dir, hc.sweep.dir = "/x/a=1", "/x"
    hc.job.override_dirname, hc.job.num = "a=1", 0
    before = HydraConfig.instance().cfg
    HydraConfig.instance().set_config(OmegaConf.create({"hydra": hc}))
    try:
        return _Job()
    finally:
        HydraConfig.instance().cfg = before


@pytest.mark.parametrize("launcher, parallel", [
    ({"_target_": "hydra_plugins.hydra_ray_launcher.ray_launcher.RayLauncher"}, True),
    ({"_target_": "hydra_plugins.hydra_ray_launcher.ray_aws_launcher.RayAWSLauncher"}, True),
    ({"_target_": "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher",
      "n_jobs": 2}, True),
    ({"_target_": "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher",
      "n_jobs": 1}, False),
    ({"_target_": "hydra._internal.core_plugins.basic_launcher.BasicLauncher"}, False),
])
def test_ray_jobs_count_as_parallel_one_torch_thread_each(launcher, parallel):
    assert _job_under(launcher).parallel is parallel
