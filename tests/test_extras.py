"""Optional extras are checked before any job starts, with the line that installs them. A missing
package is simulated (find_spec says it is not there), never uninstalled."""
import importlib.util
import os
import subprocess
import sys

import pytest
from helpers import patience

from sarathi_lab.extras import MissingExtra, check_extras, choices


def hide(monkeypatch, *modules):
    real = importlib.util.find_spec

    def find_spec(name, *a, **k):
        return None if name in modules else real(name, *a, **k)
    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def test_choices_reads_overrides_and_sweeps_only():
    got = choices(["-m", "-cn", "config", "--cfg", "job", "logger=csv,wandb",
                   "hydra/launcher=parallel", "~trace", "trace.qps=1,2"])
    assert {("logger", "csv"), ("logger", "wandb"), ("hydra/launcher", "parallel")} <= got
    assert not any(k == "trace" for k, _ in got)


@pytest.mark.parametrize("argv, module, extra, package", [
    (["logger=wandb"], "wandb", "wandb", "wandb"),
    (["logger.name=wandb"], "wandb", "wandb", "wandb"),
    (["-m", "logger=none,csv,wandb"], "wandb", "wandb", "wandb"),
    (["-m", "hydra/launcher=parallel"], "hydra_plugins.hydra_joblib_launcher", "joblib",
     "hydra-joblib-launcher"),
    (["-m", "hydra/launcher=submitit_local"], "hydra_plugins.hydra_submitit_launcher", "slurm",
     "hydra-submitit-launcher"),
    (["-m", "hydra/launcher=slurm"], "hydra_plugins.hydra_submitit_launcher", "slurm",
     "hydra-submitit-launcher"),
    (["-m", "hydra/launcher=ray"], "hydra_plugins.hydra_ray_launcher", "ray",
     "hydra-ray-launcher"),
])
def test_missing_extra_names_the_choice_and_the_fix(monkeypatch, argv, module, extra, package):
    hide(monkeypatch, module)
    with pytest.raises(MissingExtra) as e:
        check_extras(argv)
    msg = str(e.value)
    assert f"needs the optional package {package}, which is not installed" in msg
    assert f"pip install 'sarathi-lab[{extra}]'" in msg
    setting = argv[-1].split("=")[0]
    assert f"{setting}={argv[-1].split(',')[-1].split('=')[-1]} needs" in msg   # as typed


def test_a_missing_parent_package_counts_as_missing(monkeypatch):
    def find_spec(name, *a, **k):
        raise ModuleNotFoundError(f"No module named {name.split('.')[0]!r}")
    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    with pytest.raises(MissingExtra, match=r"sarathi-lab\[joblib\]"):
        check_extras(["hydra/launcher=joblib"])


def test_nothing_needed_nothing_checked(monkeypatch):
    hide(monkeypatch, "wandb", "hydra_plugins.hydra_joblib_launcher")
    check_extras(["logger=csv", "scheduler=vllm", "trace.qps=1,2", "-m"])
    check_extras(["logger=wandb("])     # malformed: left for Hydra to report


def test_installed_extras_pass():
    # the dev install has wandb and the joblib and submitit launchers
    check_extras(["logger=wandb", "hydra/launcher=parallel"])
    check_extras(["hydra/launcher=submitit_local"])


def test_cli_fails_at_start_up_before_any_job(tmp_path):
    hider = ("import importlib.util as u; f = u.find_spec; "
             "u.find_spec = lambda n, *a, **k: None if n in ('wandb', "
             "'hydra_plugins.hydra_joblib_launcher') else f(n, *a, **k); "
             "from sarathi_lab.cli.main import main; main()")
    env = {**os.environ, "WANDB_MODE": "disabled"}
    r = subprocess.run([sys.executable, "-c", hider, "-m", "name=x", f"results_root={tmp_path}",
                        "logger=wandb", "hydra/launcher=parallel", "trace.num_requests=5"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=patience(120))
    assert r.returncode != 0
    assert "logger=wandb needs the optional package wandb" in r.stderr
    assert "pip install 'sarathi-lab[wandb]'" in r.stderr
    assert "hydra/launcher=parallel needs the optional package hydra-joblib-launcher" in r.stderr
    assert "pip install 'sarathi-lab[joblib]'" in r.stderr
    assert not any(tmp_path.iterdir())   # no sweep directory: no job started
