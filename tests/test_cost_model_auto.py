"""executor.cost_model=auto: a measured profile matching the run's model, dtype, hardware and TP
is chosen and named at start-up, else the roofline, also said; the summary records which cost
model priced the run and from which profile."""
import json
import logging

import pytest
from helpers import cli
from profile_helpers import VIDUR, VIDUR_RUN, preset, synthetic_rows, write_csv

from sarathi_lab.costmodels import auto
from sarathi_lab.costmodels.profiled import ProfiledCostModel
from sarathi_lab.costmodels.roofline import RooflineConfig, RooflineCostModel
from sarathi_lab.executors.sim import SimExecutor
from sarathi_lab.settings import ConfigError

FIXTURES = VIDUR.parents[2]          # tests/data/vidur: <device>/<org>/<model>/


def choose(model, tp, dirs, hardware="a100-80gb", roof=None):
    return auto.choose(preset("model", model), preset("hardware", hardware), tp, roof, dirs)


def test_a_matching_profile_is_chosen_and_named(caplog):
    with caplog.at_level(logging.INFO, logger="sarathi_lab.costmodels.auto"):
        cm, why = choose("llama-2-70b", 2, str(FIXTURES))
    assert isinstance(cm, ProfiledCostModel) and cm.profile.source == str(VIDUR)
    assert why == (f"auto: the measured profile {VIDUR} matches model=llama-2-70b "
                   "dtype=bfloat16 hardware=a100-80gb tensor_parallel=2")
    assert [r.getMessage() for r in caplog.records] == [f"cost model: profiled ({why})"]


def test_no_match_falls_back_to_the_roofline_saying_why(caplog, monkeypatch):
    with caplog.at_level(logging.INFO, logger="sarathi_lab.costmodels.auto"):
        cm, why = choose("llama-2-7b", 1, str(FIXTURES))
    assert isinstance(cm, RooflineCostModel)
    assert "no measured profile for model=llama-2-7b" in why and str(FIXTURES) in why
    assert caplog.records[-1].getMessage() == f"cost model: roofline ({why})"
    # the right model at another TP: Vidur's rows say which TP they hold; the refusal is told
    cm, why = choose("llama-2-70b", 4, str(FIXTURES))
    assert isinstance(cm, RooflineCostModel)
    assert "refused" in why and "it was measured at [2]" in why
    # another device
    cm, why = choose("llama-2-70b", 2, str(FIXTURES), hardware="h100-sxm")
    assert isinstance(cm, RooflineCostModel)
    # no folders at all: the setting and the environment variable named
    monkeypatch.delenv(auto.ENV, raising=False)
    cm, why = choose("llama-2-70b", 2, None)
    assert isinstance(cm, RooflineCostModel) and "SARATHI_LAB_PROFILES are unset" in why
    # the environment variable is the default of profile_dirs
    monkeypatch.setenv(auto.ENV, str(FIXTURES))
    assert isinstance(choose("llama-2-70b", 2, None)[0], ProfiledCostModel)
    with pytest.raises(ConfigError, match="executor.profile_dirs: /nonexistent is not a dir"):
        choose("llama-2-70b", 2, "/nonexistent")


def test_a_project_profile_is_found_by_its_metadata(tmp_path):
    (tmp_path / "deep").mkdir()
    write_csv(tmp_path / "deep" / "x.csv", synthetic_rows())
    (tmp_path / "notes.csv").write_text("a,b\n1,2\n")    # not a profile: passed over
    cm, why = choose("llama-2-7b", 1, str(tmp_path))
    assert isinstance(cm, ProfiledCostModel) and str(tmp_path / "deep" / "x.csv") in why


def test_roofline_settings_are_refused_when_a_profile_prices_the_run():
    with pytest.raises(ConfigError, match=r"executor.compute_eff: a setting of the roofline, "
                                          r"but cost_model=auto chose the measured profile"):
        choose("llama-2-70b", 2, str(FIXTURES), roof=RooflineConfig(compute_eff=0.5))
    # ... and used where the roofline prices it
    cm, _ = choose("llama-2-7b", 1, str(FIXTURES), roof=RooflineConfig(compute_eff=0.5))
    assert cm.hw.compute_eff == 0.5


def test_profile_dirs_is_read_only_by_auto():
    with pytest.raises(ConfigError, match=r"executor.profile_dirs=/x: read only with "
                                          r"executor.cost_model=auto"):
        SimExecutor.parse_config({"cost_model": "roofline", "profile_dirs": "/x"})
    cfg = SimExecutor.parse_config({"cost_model": "auto", "profile_dirs": "/x"})
    assert cfg.profile_dirs == "/x"
    with pytest.raises(ConfigError, match=r"executor.profile=/p with executor.cost_model=auto: "
                                          r".*set executor.cost_model=profiled"):
        SimExecutor.parse_config({"cost_model": "auto", "profile": "/p"})


def test_the_summary_records_the_cost_model(tmp_path):
    common = (*VIDUR_RUN, "trace.num_requests=10")
    r = cli(f"hydra.run.dir={tmp_path}/auto", *common, "executor.cost_model=auto",
            f"executor.profile_dirs={FIXTURES}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert f"cost model: profiled (auto: the measured profile {VIDUR}" in r.stdout + r.stderr
    rec = json.loads((tmp_path / "auto" / "summary.json").read_text())["cost_model"]
    assert rec["name"] == "profiled" and rec["profile"] == str(VIDUR)
    assert rec["device"] == "a100" and "Vidur" in rec["measured_with"]
    assert rec["chosen_by"].startswith("auto: the measured profile")
    assert set(rec["from_roofline"]) == {"overhead", "lm_head", "allreduce"}
    assert rec["engine"] == "vllm-v0"   # the CPU side's preset (executor.engine)
    r = cli(f"hydra.run.dir={tmp_path}/roof", *common, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    rec = json.loads((tmp_path / "roof" / "summary.json").read_text())["cost_model"]
    assert rec == {"name": "roofline", "hardware": "a100-80gb", "engine": "vllm-v0"}
