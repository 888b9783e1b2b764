"""The command line: the default run, malformed settings, plugin policies, start-up cost."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from sarathi_lab.cli import check_config
from sarathi_lab.schedulers.sarathi import Sarathi

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


class TinyChunks(Sarathi):
    """A plugin policy for the test below: Sarathi with chunks capped by its own setting
    (`+scheduler.chunk=N`, which lands in SchedulerConfig.extra)."""
    name = "tiny_chunks"

    def __init__(self, cfg, kv):
        cfg.token_budget = min(cfg.token_budget, int(cfg.extra.get("chunk", 64)))
        super().__init__(cfg, kv)


def cli(*args, cwd=None, env=None, timeout=120):
    """Run `sarathi-lab` in a subprocess (the test modules importable, wandb off)."""
    e = {**os.environ, "WANDB_MODE": "disabled",
         "PYTHONPATH": os.pathsep.join([str(TESTS), str(ROOT), os.environ.get("PYTHONPATH", "")]),
         **(env or {})}
    return subprocess.run([sys.executable, "-c", "from sarathi_lab.cli import main; main()", *args],
                          cwd=cwd, env=e,
                          capture_output=True, text=True, timeout=timeout)


def composed(*overrides) -> dict:
    with initialize_config_module("sarathi_lab.configs", version_base="1.3"):
        cfg = compose("config", overrides=list(overrides))
    return OmegaConf.to_container(cfg, resolve=True)


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


def test_bad_run_exits_nonzero_with_a_clear_message(tmp_path):
    r = cli(f"hydra.run.dir={tmp_path}/bad", "trace.qps=-2", cwd=tmp_path)
    assert r.returncode != 0
    assert "sarathi-lab: error: trace.qps=-2" in r.stderr
    assert "Traceback" not in r.stderr          # a config error is not a crash
    assert "trace.qps" in (tmp_path / "bad" / "error.txt").read_text()
    assert not (tmp_path / "bad" / "summary.json").exists()
    # an unknown option of a config group is Hydra's to report, also non-zero
    r = cli(f"hydra.run.dir={tmp_path}/bad2", "scheduler=no_such_policy", cwd=tmp_path)
    assert r.returncode != 0 and "scheduler/no_such_policy" in r.stderr


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


def test_startup_imports_no_heavy_packages(tmp_path):
    """A sim run never imports torch, wandb or matplotlib (start-up stays fast)."""
    code = ("import sys; import sarathi_lab.cli as c; "
            f"sys.argv = ['sarathi-lab', 'hydra.run.dir={tmp_path}/run', 'trace=synthetic', "
            "'trace.num_requests=10']; c.main(); "
            "print('HEAVY', sorted(m for m in ('torch', 'wandb', 'matplotlib') "
            "if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                       env={**os.environ, "WANDB_MODE": "disabled"}, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "HEAVY []" in r.stdout


def test_run_directory_names_stay_short_and_flat():
    from sarathi_lab.sweeps import dirname
    long = ",".join(f"scheduler.knob_{i}=value_{i}" for i in range(20))
    name = dirname(long)
    assert len(name) <= 120 and name == dirname(long) and name != dirname(long + "x")
    assert dirname("trace.path=/data/t.csv") == "trace.path=%data%t.csv"
    assert dirname("") == "defaults"
