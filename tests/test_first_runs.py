"""What a new user tripped on (issue 40, item 5) and rejected requests made prominent (issue 35,
item 5): the printed summary's labels, a run refused at start-up, the help text, the README's
commands."""
import pytest
from helpers import cli, composed

from sarathi_lab.run.runner import run
from sarathi_lab.run.summary_text import format_summary

SMALL = ["trace=synthetic", "trace.num_requests=4", "trace.prompt_len=64", "trace.output_len=4",
         "trace.qps=50", "progress=false"]


def test_a_model_from_a_config_json_is_labelled_with_its_name():
    s = run(composed("model=hf", "model.hf_config=qwen2.5-7b", "slo=mistral-7b-strict", *SMALL),
            None, write=False)
    assert s["config"]["model"]["name"] is None   # as composed: named after its config.json
    assert format_summary(s).splitlines()[0].startswith("sarathi | qwen2.5-7b on simulated ")


@pytest.mark.slow   # CLI subprocesses
def test_a_run_refused_while_building_leaves_no_run_directory(tmp_path):
    """A bound checked once the trace is built (resources.py) refuses the run as a setting
    error does: no directory holding only error.txt for a report to meet."""
    r = cli("trace=multi_turn", "trace.turns=1000000000", f"hydra.run.dir={tmp_path}/run",
            env={"SARATHI_LAB_MEMORY_GIB": "1"}, cwd=tmp_path)
    assert r.returncode == 1
    assert r.stderr.startswith("sarathi-lab: error: trace.turns: the run would hold about"), \
        r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "run").exists()
    # a failure that is not a setting's keeps its traceback, in a directory a report lists as
    # failed, with no result in it
    r = cli("scheduler.controller=test_plugin_errors:Raises", *SMALL,
            f"hydra.run.dir={tmp_path}/bug", cwd=tmp_path)
    assert r.returncode == 1 and (tmp_path / "bug" / "error.txt").exists()
    assert not (tmp_path / "bug" / "summary.json").exists()


def test_help_lists_only_options_a_user_can_choose():
    from sarathi_lab.cli.main import public_help
    text = "cluster: default, disagg\nscheduler: common, custom, vllm\nscheduler:\n  name: x\n"
    assert public_help(text) == ("cluster: default, disagg\nscheduler: custom, vllm\n"
                                 "scheduler:\n  name: x\n")


@pytest.mark.slow   # a CLI subprocess
def test_cli_help():
    r = cli("--help")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("sarathi-lab: one serving run")
    groups = dict(ln.split(": ", 1) for ln in r.stdout.splitlines()
                  if ln.startswith("scheduler: "))
    assert groups["scheduler"].split(", ")[:2] == ["custom", "edf"]
    assert "common" not in groups["scheduler"] and "token_budget: 512" in r.stdout


def test_the_settings_page_admission_example_runs():
    """settings.md's admission-control example (it once named a trace without deadlines,
    which deadline admission refuses), on its first 40 requests."""
    from helpers import ROOT
    line = next(ln for ln in (ROOT / "sarathi_lab" / "docs" / "settings.md").read_text()
                .splitlines() if "deadline_admission=true" in ln and ln.startswith("sarathi-lab"))
    args = line.split("#")[0].split()[1:]
    s = run(composed(*args, "trace.num_requests=40", "progress=false"), None, write=False)
    assert s["num_requests"] == 40 and s["num_finished"] + s["num_rejected"] == 40


@pytest.mark.parametrize("limit, most", [(450, False), (200, True)])
def test_rejected_requests_are_counted_with_their_share_and_reason(limit, most):
    """scheduler.max_model_len on prompts of 64-512 tokens: the longer ones are rejected (6
    of 40 within 450 tokens, 28 within 200). The printout gives their count and share, the
    reason with the limit written in (no placeholder), and says the SLO attainment counts
    them as missed; with most rejected, a banner says so."""
    s = run(composed(*SMALL, "trace.num_requests=40", f"scheduler.max_model_len={limit}",
                     "trace.prompt_len={dist: uniform, low: 64, high: 512}"), None, write=False)
    n, rej = s["num_requests"], s["num_rejected"]
    assert n == 40 and 0 < rej < 40 and s["slo"]["attainment"] <= (n - rej) / n
    lines = format_summary(s).splitlines()
    share = f"{100 * rej / n:.3g}%"
    line = next(ln for ln in lines if ln.startswith("  REJECTED"))
    assert line.startswith(f"  REJECTED {rej} of 40 requests ({share}), never served (no "
                           "latency; missed in the SLO attainment): ")
    assert f"prompt leaves no room to generate within max_model_len={limit}" in line
    assert " N " not in line and "=N" not in line
    slo = next(ln for ln in lines if ln.startswith("SLO "))
    assert f"(of all 40 requests: the {rej} rejected count as missed)" in slo
    banner = any(ln.startswith("!!! MOST REQUESTS WERE REJECTED") for ln in lines)
    assert banner == most == (2 * rej >= n)
