"""The command line: the default run, malformed settings, plugin policies, start-up cost."""
import dataclasses
import json
import os
import re
import subprocess
import sys

import pandas as pd
import pytest
from helpers import ROOT, cli, composed, patience
from hydra import compose, initialize_config_module

from sarathi_lab.cli.main import check_config
from sarathi_lab.schedulers.sarathi import Sarathi, SarathiConfig
from sarathi_lab.settings import setting


@dataclasses.dataclass
class TinyChunksConfig(SarathiConfig):
    chunk: int = setting(64, ge=1, help="cap on a chunk")


class TinyChunks(Sarathi):
    """A plugin policy for the tests below: Sarathi with chunks capped by its own typed setting
    (`+scheduler.chunk=N`)."""
    name = "tiny_chunks"
    config_class = TinyChunksConfig

    def __init__(self, cfg, kv, queue=None):
        super().__init__(dataclasses.replace(cfg, token_budget=min(cfg.token_budget, cfg.chunk)),
                         kv, queue)


@pytest.mark.slow   # a CLI subprocess
def test_default_run_writes_the_three_files(tmp_path):
    r = cli(f"hydra.run.dir={tmp_path}/run", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    run = tmp_path / "run"
    for f in ("requests.parquet", "iterations.parquet", "summary.json"):
        assert (run / f).stat().st_size > 0
    s = json.loads((run / "summary.json").read_text())
    assert s["num_finished"] == s["num_requests"] == 1000
    assert "run directory" in r.stdout and "ttft" in r.stdout


@pytest.mark.parametrize("override, setting", [
    ("trace.qps=-1", "trace.qps"),
    ("trace.qps=0", "trace.qps"),
    ("scheduler.name=no_such_policy", "scheduler.name"),
    ("scheduler.token_budget=0", "scheduler.token_budget"),
    ("trace.num_requests=0", "trace.num_requests"),
    ("mode=sideways", "mode"),
    ("slo.attainment_target=1.5", "slo.attainment_target"),
    ("executor.name=no_such_executor", "executor.name"),
])
def test_malformed_settings_name_the_setting(override, setting):
    with pytest.raises(ValueError, match=f"^{setting}"):
        check_config(composed(override))


def test_capacity_settings_are_checked():
    with pytest.raises(ValueError, match="capacity.qps_high"):
        check_config(composed("mode=capacity", "capacity.qps_low=2", "capacity.qps_high=1"))
    check_config(composed("experiment=capacity"))   # the preset itself is valid


@pytest.mark.slow   # a CLI subprocess
def test_bad_run_exits_nonzero_with_a_clear_message(tmp_path):
    r = cli(f"hydra.run.dir={tmp_path}/bad", "trace.qps=-2", cwd=tmp_path)
    assert r.returncode != 0
    assert "sarathi-lab: error: trace.qps=-2" in r.stderr
    assert "Traceback" not in r.stderr          # a config error is not a crash
    assert not (tmp_path / "bad").exists()      # and leaves no run directory behind
    # an unknown option of a config group: found by Hydra, said in one line, also non-zero
    r = cli(f"hydra.run.dir={tmp_path}/bad2", "scheduler=no_such_policy", cwd=tmp_path)
    assert r.returncode != 0 and r.stderr.startswith(
        "sarathi-lab: error: scheduler=no_such_policy: no such scheduler; choices: ")


@pytest.mark.slow   # a CLI subprocess
def test_plugin_policy_by_dotted_path(tmp_path):
    r = cli(f"hydra.run.dir={tmp_path}/run", "scheduler.name=test_cli:TinyChunks",
            "+scheduler.chunk=48", "trace=synthetic", "trace.num_requests=20", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["config"]["scheduler"]["name"] == "test_cli:TinyChunks"
    assert s["num_finished"] == 20
    it = pd.read_parquet(tmp_path / "run" / "iterations.parquet")
    # the plugin's own setting took effect: no iteration exceeds its chunk cap
    assert (it["prefill_tokens"] + it["decode_tokens"]).max() <= 48
    assert it["prefill_tokens"].max() > 0


@pytest.mark.slow   # a CLI subprocess
def test_startup_imports_no_heavy_packages(tmp_path):
    """A sim run never imports torch, wandb or matplotlib (start-up stays fast)."""
    code = ("import sys; import sarathi_lab.cli.main as c; "
            f"sys.argv = ['sarathi-lab', 'hydra.run.dir={tmp_path}/run', 'trace=synthetic', "
            "'trace.num_requests=10']; c.main(); "
            "print('HEAVY', sorted(m for m in ('torch', 'wandb', 'matplotlib') "
            "if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                       env={**os.environ, "WANDB_MODE": "disabled"}, timeout=patience(120))
    assert r.returncode == 0, r.stderr
    assert "HEAVY []" in r.stdout


@pytest.mark.filterwarnings(r"ignore:\s*'hydra/launcher/ray' is validated")
def test_no_packaged_config_sets_the_hydra_mode():
    """What lets the command skip Hydra's mode probe (cli._no_mode_probe): whatever preset or
    launcher is chosen, the composed hydra.mode is unset, as the probe would find it."""
    presets = sorted(p.stem for p in (ROOT / "configs" / "experiment").glob("*.yaml"))
    launchers = sorted(p.stem for p in (ROOT / "configs" / "hydra" / "launcher").glob("*.yaml"))
    assert len(presets) >= 10 and "parallel" in launchers
    with initialize_config_module("sarathi_lab.configs", version_base="1.3"):
        for ov in [[]] + [[f"experiment={p}"] for p in presets] \
                + [[f"hydra/launcher={x}"] for x in launchers if _plugin_installed(x)]:
            cfg = compose("config", overrides=ov, return_hydra_config=True)
            assert cfg.hydra.mode is None, ov


def _plugin_installed(launcher):
    from sarathi_lab.extras import NEEDS, installed
    need = NEEDS.get(("hydra/launcher", launcher))
    return need is None or installed(need[0])


@pytest.mark.parametrize("argv,known", [
    (["scheduler=vllm", "trace.num_requests=10", "+experiment=capacity"], True),
    (["-m", "scheduler=vllm,sarathi", "hydra/launcher=parallel"], True),
    (["hydra.mode=MULTIRUN", "scheduler=vllm,sarathi"], False),
    (["++hydra.mode=RUN"], False),
    (["--config-dir", "/my/configs", "experiment=mine"], False),
    (["-cn", "other"], False),
    (["hydra.searchpath=[file:///my/configs]"], False),
])
def test_the_mode_probe_is_skipped_only_where_its_answer_is_known(argv, known):
    from sarathi_lab.cli.main import _mode_is_known
    assert _mode_is_known(argv) is known


@pytest.mark.slow   # a sweep in CLI subprocesses
def test_a_mode_given_on_the_command_line_still_rules(tmp_path):
    # no -m: the override alone makes it a multirun, as in plain Hydra (the probe is kept)
    r = cli("hydra.mode=MULTIRUN", f"results_root={tmp_path}", "name=s", "trace=synthetic",
            "trace.num_requests=5", "scheduler=vllm,orca", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert len(list((tmp_path / "sweeps" / "s").glob("*/summary.json"))) == 2


def test_run_directory_names_stay_short_and_flat():
    from sarathi_lab.sweeps.bookkeeping import dirname
    long = ",".join(f"scheduler.knob_{i}=value_{i}" for i in range(20))
    name = dirname(long)
    assert len(name) <= 120 and name == dirname(long) and name != dirname(long + "x")
    assert dirname("") == "defaults"


@pytest.mark.parametrize("overrides", [
    "trace.path=/data/t.csv", r"trace.path=C:\data\t.csv", "trace.path=/my trace.csv",
    "scheduler=vllm,trace.qps=2", "trace.path=/tmp/résumé.csv", "a=1,_b=2", "a=1_,b=2"])
def test_run_directory_names_are_portable_and_keep_jobs_apart(overrides):
    from sarathi_lab.sweeps.bookkeeping import dirname
    name = dirname(overrides)
    assert re.fullmatch(r"[A-Za-z0-9._=+@~-]+", name), name   # no , : \\ / space or non-ASCII
    others = ["trace.path=_data_t.csv", "trace.path=/data/t_csv", "a=1,_b=2", "a=1_,b=2",
              "scheduler=vllm__trace.qps=2"]
    assert all(dirname(o) != name for o in others if o != overrides)


def test_items_of_a_job_are_joined_readably():
    from sarathi_lab.sweeps.bookkeeping import dirname
    assert dirname("scheduler=vllm,trace.qps=2") == "scheduler=vllm__trace.qps=2"


@pytest.mark.slow   # a CLI subprocess
@pytest.mark.parametrize("args,key", [
    (["scheduler=vllm", "scheduler.token_budget=128"], "scheduler.token_budget"),
    (["+scheduler.budget=512"], "scheduler.budget"),
    (["scheduler=custom", "scheduler.name=test_cli:TinyChunks", "+scheduler.chunk=4.5"],
     "scheduler.chunk"),
    (["scheduler=custom", "scheduler.name=test_cli:TinyChunks", "+scheduler.chunks=4"],
     "scheduler.chunks"),
    (["executor.tensor_parallel=0"], "executor.tensor_parallel"),
    (["+executor.mem_eff=1.5"], "executor.mem_eff"),
    (["+executor.no_such_knob=1"], "executor.no_such_knob"),
    (["scheduler.queue=lifo"], "scheduler.queue"),
    (["capacity.qps_low=1"], "capacity.qps_low"),           # read only with mode=capacity
    (["scheduler.max_num_seqs=null"], "scheduler.max_num_seqs=null"),
    (["model.path=/nonexistent"], "model.path"),             # the simulator reads no weights
])
def test_a_setting_no_component_reads_or_accepts_is_an_error(tmp_path, args, key):
    r = cli(f"hydra.run.dir={tmp_path}/run", "trace=synthetic", "trace.num_requests=5", *args,
            cwd=tmp_path)
    assert r.returncode != 0
    assert f"sarathi-lab: error: {key}" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "run").exists()


def test_unknown_key_lists_what_the_policy_accepts():
    with pytest.raises(ValueError) as e:
        check_config(composed("scheduler=vllm", "+scheduler.budget=3"))
    msg = str(e.value)
    assert "not a setting of policy 'vllm'" in msg and "max_num_batched_tokens" in msg


@pytest.mark.slow   # a sweep in CLI subprocesses
def test_multirun_merges_combinations_that_differ_only_in_unread_settings(tmp_path):
    r = cli("-m", f"results_root={tmp_path}", "name=m", "trace=synthetic",
            "trace.num_requests=10", "scheduler=vllm,sarathi", "scheduler.token_budget=256,512",
            cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    sweep = tmp_path / "sweeps" / "m"
    lines = [ln.split("\t") for ln in (sweep / "sweep.log").read_text().splitlines()]
    status = sorted(ln[2] for ln in lines)
    assert status == ["done", "done", "done", "merged"]
    merged = next(ln for ln in lines if ln[2] == "merged")
    assert "scheduler=vllm" in merged[3] and "scheduler.token_budget" in merged[4]
    assert "3 done, 0 skipped, 1 merged, 0 failed" in r.stdout
    runs = sorted(p.parent.name for p in sweep.glob("*/summary.json"))
    assert len(runs) == 3
    vllm = json.loads(next(p for p in sweep.glob("*/summary.json") if "vllm" in str(p))
                      .read_text())
    assert vllm["settings"]["unread"] == ["scheduler.token_budget: not read by policy 'vllm'"]
    assert "token_budget" not in vllm["settings"]["scheduler"]


@pytest.mark.slow   # a CLI subprocess
def test_executor_and_cost_model_by_dotted_path(tmp_path):
    # one request at a time: the same iterations whatever they cost
    one = ("trace=synthetic", "trace.num_requests=10", "scheduler.max_num_seqs=1")
    r = cli(f"hydra.run.dir={tmp_path}/a", *one,
            "executor.cost_model=plugins:SlowRoofline", "+executor.slowdown=2.0", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    slow = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert slow["settings"]["executor"]["cost_model_settings"]["slowdown"] == 2.0
    r = cli(f"hydra.run.dir={tmp_path}/b", *one, cwd=tmp_path)
    base = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert slow["makespan_s"] > base["makespan_s"]
    it_a = pd.read_parquet(tmp_path / "a" / "iterations.parquet")
    it_b = pd.read_parquet(tmp_path / "b" / "iterations.parquet")
    assert len(it_a) == len(it_b)
    assert it_a["duration"].to_numpy() == pytest.approx(2 * it_b["duration"].to_numpy())
    # an executor plug-in by dotted path, with its own typed setting
    r = cli(f"hydra.run.dir={tmp_path}/c", "trace=synthetic", "trace.num_requests=10",
            "executor=custom", "executor.name=plugins:FixedStep", "+executor.step_s=0.5",
            cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    it = pd.read_parquet(tmp_path / "c" / "iterations.parquet")
    assert (it["duration"] == 0.5).all()
    s = json.loads((tmp_path / "c" / "summary.json").read_text())
    assert s["simulated"] is True and "simulated" in r.stdout


def test_the_job_line_names_only_the_criteria_the_slo_defines():
    from sarathi_lab.cli.main import _key_metrics
    base = {"tbt": {"p99": 0.05}, "ttft": {"p50": 0.3}, "throughput_rps": 2.0}
    distserve = {"goodput_rps": 1.5, "meets_tbt_slo": False, "meets_attainment": True,
                 "criteria": [{"criterion": "attainment", "met": True}]}
    line = _key_metrics("run", {**base, "slo": distserve})
    assert "attainment met" in line and "TBT SLO" not in line
    strict = {"goodput_rps": 1.5, "meets_tbt_slo": False, "meets_attainment": True,
              "criteria": [{"criterion": "tbt", "met": False}]}
    line = _key_metrics("run", {**base, "slo": strict})
    assert "TBT SLO missed" in line and "attainment" not in line


# ------------------------------------------------------------------------------------------
# Hydra's composition errors, said so that a user can act on them (sarathi_lab.run.hydra_errors)
# ------------------------------------------------------------------------------------------

def _composition_error(*overrides) -> Exception:
    from sarathi_lab.sweeps.bookkeeping import register_resolvers
    register_resolvers()
    with pytest.raises(Exception) as e:
        composed(*overrides)
    return e.value


@pytest.mark.parametrize("override,message", [
    ("scheduler.token_budgt=1024",
     "scheduler.token_budgt: no such setting; did you mean scheduler.token_budget?"),
    ("sede=1", "sede: no such setting; did you mean seed or scheduler?"),
    ("scheduler.zzz=1", "scheduler.zzz: no such setting; the settings of scheduler are: "
                        "acceptance_prior_drafts, aging_rate, assumed_acceptance, block_size, "),
])
def test_an_unknown_key_offers_the_close_accepted_ones_and_no_plus(override, message):
    from sarathi_lab.run.hydra_errors import explain
    said = explain(_composition_error(override), [override])
    assert said.startswith(message), said
    assert "+" not in said


def test_an_unknown_option_lists_the_choices_without_the_bases():
    from sarathi_lab.run.hydra_errors import explain
    said = explain(_composition_error("scheduler=vlm"), ["scheduler=vlm"])
    assert said == ("scheduler=vlm: no such scheduler; did you mean vllm? choices: custom, edf, "
                    "orca, request_level, sarathi, sarathi_priority, vllm, vtc")
    assert "common" not in said


@pytest.mark.parametrize("argv,message", [
    (["trace.path=/tmp/résumé.csv"],
     "trace.path: Hydra's override grammar cannot read the value '/tmp/résumé.csv'; a value "
     "with spaces, non-ASCII letters or brackets needs quotes: 'trace.path=\"/tmp/résumé.csv\"'"),
    (["trace.path=/tmp/a(1).csv"], "needs quotes: 'trace.path=\"/tmp/a(1).csv\"'"),
    (["trace.path=/tmp/my", "trace.csv"],
     "'trace.csv' is not an override (no '='): if it is the rest of 'trace.path=/tmp/my', split "
     "at a space by the shell, quote the whole: 'trace.path=\"/tmp/my trace.csv\"'"),
])
def test_a_path_hydra_cannot_parse_gets_its_quoted_form(argv, message):
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from sarathi_lab.run.hydra_errors import explain
    with pytest.raises(Exception) as e:
        OverridesParser.create().parse_overrides(argv)
    said = explain(e.value, argv)
    assert said.endswith(message), said
    # and the quoted form it shows is one Hydra reads back as the path
    import shlex
    quoted = shlex.split(said.rsplit(": ", 1)[1])[0]
    value = OverridesParser.create().parse_overrides([quoted])[0].value()
    assert value == " ".join(argv).split("=", 1)[1]


@pytest.mark.slow
def test_composition_errors_through_the_command(tmp_path):
    r = cli(f"results_root={tmp_path}", "scheduler.token_budgt=1024", cwd=tmp_path)
    assert r.returncode == 1
    assert r.stderr.strip() == ("sarathi-lab: error: scheduler.token_budgt: no such setting; "
                                "did you mean scheduler.token_budget?")
    r = cli(f"results_root={tmp_path}", "scheduler=nosuch", cwd=tmp_path)
    assert r.returncode == 1
    assert r.stderr.strip() == ("sarathi-lab: error: scheduler=nosuch: no such scheduler; "
                                "choices: custom, edf, orca, request_level, sarathi, "
                                "sarathi_priority, vllm, vtc")
    r = cli(f"results_root={tmp_path}", "trace.path=/tmp/résumé.csv", cwd=tmp_path)
    assert r.returncode == 1 and r.stderr.strip().endswith(
        "needs quotes: 'trace.path=\"/tmp/résumé.csv\"'"), r.stderr
    # an error this does not recognise keeps Hydra's words, one message, no traceback
    r = cli(f"results_root={tmp_path}", "~nosuch", cwd=tmp_path)
    assert r.returncode == 1
    assert r.stderr.strip() == ("sarathi-lab: error: Could not delete from config. 'nosuch' "
                                "does not exist.")
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_a_trace_path_naming_a_directory_says_so(tmp_path):
    r = cli(f"results_root={tmp_path}", f"trace.path={tmp_path}", cwd=tmp_path)
    assert r.returncode == 1
    assert r.stderr.startswith(f"sarathi-lab: error: trace {str(tmp_path)!r} is a directory, "
                               "not a trace file; name a file in it\n"), r.stderr
