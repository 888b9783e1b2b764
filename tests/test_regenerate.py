"""experiments/regenerate.py covers every committed result with a command that exists, and the
preset studies with no script of their own (policy_compare, capacity) run at toy scale through
the same commands it runs."""
import subprocess
import sys

import pandas as pd
import pytest
from helpers import cli, patience
from study_scripts import REPO

sys.path.insert(0, str(REPO / "experiments"))
import regenerate as R  # noqa: E402


def test_every_committed_result_has_a_study_and_every_output_exists():
    outputs = {o for s in R.STUDIES for o in s.outputs}
    committed = {f"results/{p.name}" for p in (REPO / "results").iterdir() if p.is_dir()}
    assert committed <= outputs, f"results with no regenerating study: {committed - outputs}"
    assert all((REPO / o).exists() for o in outputs), [o for o in outputs
                                                        if not (REPO / o).exists()]
    # every study script of experiments/ is run by some study
    scripts = {str(p.relative_to(REPO)) for p in (REPO / "experiments").glob("*/run.*")}
    run = {a for s in R.STUDIES for st in s.steps for a in st.argv if a.startswith("experiments/")}
    assert scripts <= run, scripts - run
    assert all((REPO / a).is_file() for a in run), run
    assert len({s.name for s in R.STUDIES}) == len(R.STUDIES)


@pytest.mark.slow   # a CLI subprocess
def test_list_select_and_bad_names():
    r = subprocess.run([sys.executable, str(REPO / "experiments" / "regenerate.py"), "--dry-run",
                        "--only", "budget_sweep,capacity"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "$ bash experiments/budget_sweep/run.sh" in r.stdout
    assert "$ sarathi-lab-report outputs/sweeps/capacity --out results/capacity" in r.stdout
    assert "2 studies" in r.stdout and "routing" not in r.stdout
    assert [s.name for s in R.select(None, "routing,fidelity")] == \
        [s.name for s in R.STUDIES if s.name not in ("routing", "fidelity")]
    with pytest.raises(SystemExit, match="unknown study nope"):
        R.select("budget_sweep,nope", None)


def test_a_failing_step_stops_and_is_reported(tmp_path, monkeypatch, capsys):
    bad = R.Study("bad", (R.Step(("python", "-c", "import sys; sys.exit(3)")),), 0,
                  ("results",))
    ok = R.Study("ok", (R.Step(("python", "-c", "pass")),), 0, ("results",))
    monkeypatch.setattr(R, "STUDIES", (bad, ok))
    assert R.main([]) == 1
    out = capsys.readouterr().out
    assert "exited with 3" in out and "not run: ok" in out
    assert R.main(["--keep-going"]) == 1
    assert "ok               ok" in capsys.readouterr().out


def toy(name, tmp_path, *overrides):
    """A preset study's two commands (regenerate's), the sweep at toy scale under tmp_path."""
    sweep, report = R._preset(name)
    r = cli(*sweep.argv[1:], f"results_root={tmp_path}", *overrides, cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    out = tmp_path / "res"
    argv = [a.replace("outputs", str(tmp_path)).replace(f"results/{name}", str(out))
            for a in report.argv[1:]]
    r = subprocess.run([sys.executable, "-m", "sarathi_lab.report", *argv],
                       capture_output=True, text=True, timeout=patience(300))
    assert r.returncode == 0, r.stderr[-3000:]
    return out


@pytest.mark.slow   # a study at toy scale
def test_policy_compare_at_toy_scale(tmp_path):
    """60 ShareGPT-4 requests: whole-prompt vLLM stalls decodes behind prompts, Sarathi-Serve's
    512-token chunks do not (P99 TBT), and the reserving policies run fewer requests at once."""
    out = toy("policy_compare", tmp_path, "trace.num_requests=60")
    df = pd.read_csv(out / "summary.csv").set_index("policy")
    assert set(df.index) == {"request_level", "orca", "vllm", "sarathi"}
    assert df.loc["sarathi", "tbt_p99"] < df.loc["vllm", "tbt_p99"]
    assert (df["num_finished"] == 60).all()
    assert (out / "ttft_cdf.png").stat().st_size > 0 and (out / "report.md").is_file()


@pytest.mark.slow   # a study at toy scale
def test_capacity_at_toy_scale(tmp_path):
    """Two policies, the strict SLO, 80 requests a probe: Sarathi-Serve's capacity under its
    strict TBT SLO is above vLLM's (which stalls decodes for whole prompts)."""
    out = toy("capacity", tmp_path, "trace.num_requests=80", "capacity.precision=0.1",
              "scheduler=vllm,sarathi", "slo=mistral-7b-strict")
    df = pd.read_csv(out / "capacity.csv")
    assert set(df["slo"]) == {"mistral-7b-strict"}
    df = df.set_index("policy")
    assert set(df.index) == {"vllm", "sarathi"}
    assert df.loc["sarathi", "capacity_qps"] > df.loc["vllm", "capacity_qps"] > 0
    assert (out / "capacity.png").stat().st_size > 0
