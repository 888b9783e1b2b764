"""What a new user tripped on (issue 40, item 5) and rejected requests made prominent (issue 35,
item 5): the printed summary's labels, a run refused at start-up, the help text, the README's
commands."""
import pytest
from helpers import cli, composed

from sarathi_lab.runner import run
from sarathi_lab.summary_text import format_summary

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
    from sarathi_lab.cli import public_help
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
