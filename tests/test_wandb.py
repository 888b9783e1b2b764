"""Loggers: wandb offline (never blocking, never online without a key) and the CSV log."""
import csv
import os
import subprocess
import sys

import pytest
from helpers import patience
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from sarathi_lab.cli.loggers import CSV_COLUMNS, log_csv, wandb_mode
from sarathi_lab.run.runner import run


def tiny_config(*overrides) -> dict:
    with initialize_config_module("sarathi_lab.configs", version_base="1.3"):
        cfg = compose("config", overrides=["trace=synthetic", "trace.num_requests=15",
                                           "progress=false", *overrides])
    return OmegaConf.to_container(cfg, resolve=True)


@pytest.mark.slow   # a CLI subprocess
def test_wandb_offline_writes_its_run_files(tmp_path):
    wdir = tmp_path / "wandb_dir"
    wdir.mkdir()
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_DIR": str(wdir),
           "WANDB_API_KEY": "", "HOME": str(tmp_path)}   # no key anywhere: must not block
    r = subprocess.run(
        [sys.executable, "-c", "from sarathi_lab.cli.main import main; main()",
         f"hydra.run.dir={tmp_path}/run", "logger=wandb", "name=wb_group",
         "trace=synthetic", "trace.num_requests=15"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=patience(240))
    assert r.returncode == 0, r.stdout + r.stderr
    runs = list((wdir / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    run_dir = runs[0]
    assert list(run_dir.glob("run-*.wandb"))                       # the run's record
    media = run_dir / "files" / "media"
    assert list(media.rglob("requests*.table.json"))              # the per-request table
    images = {p.name.split("_")[0] for p in media.rglob("*.png")}
    assert {"ttft", "tbt", "timeline"} <= images                   # the single-run plots


def test_wandb_mode_defaults_offline_and_never_online_without_key(monkeypatch, tmp_path):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("NETRC", str(tmp_path / "no_netrc"))
    assert wandb_mode({}) == "offline"
    assert wandb_mode({"mode": "online"}) == "offline"   # would wait for a login: refused
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert wandb_mode({}) == "disabled"                  # the user's environment wins
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert wandb_mode({"mode": "online"}) == "online"


def test_csv_logger_appends_one_row_per_run(tmp_path):
    path = tmp_path / "runs.csv"
    for budget in (128, 512):
        c = tiny_config("logger=csv", f"logger.path={path}",
                        f"scheduler.token_budget={budget}")
        summary = run(c, tmp_path / f"run{budget}")
        log_csv(c, tmp_path / f"run{budget}", summary)
    rows = list(csv.DictReader(path.open()))
    assert len(rows) == 2 and tuple(rows[0]) == CSV_COLUMNS
    assert [r["token_budget"] for r in rows] == ["128", "512"]
    assert all(float(r["tbt_p99"]) > 0 and r["policy"] == "sarathi" for r in rows)
    assert rows[0]["num_finished"] == "15"
