"""Engine presets (executor.engine): the CPU side of an iteration each charges, priced by hand."""
import pytest
from helpers import decode_req
from profile_helpers import VIDUR, preset

from sarathi_lab.costmodels import engines
from sarathi_lab.executors.sim import SimExecutor
from sarathi_lab.registry import executor_class
from sarathi_lab.schedulers.output import SchedulerOutput
from sarathi_lab.settings import ConfigError


def sim(**executor):
    cfg = {**preset("executor", "sim"), **executor}
    return SimExecutor.from_config(cfg, preset("model", "llama-2-7b"),
                                   preset("hardware", "a100-80gb"))


def eight_decodes():
    out = SchedulerOutput()
    for i in range(8):
        out.add(decode_req(i, 100 + i), 1)
    return out


def test_one_iterations_host_time_under_two_presets_by_hand():
    v0, none = sim(), sim(engine="none")
    # vllm-v0: the A100 preset's 1.4 ms per iteration + 0.1 ms per request (Vidur's vLLM v0)
    assert v0.cost_model.overhead == 1.4e-3 and v0.cost_model.req_overhead == 1.0e-4
    assert none.cost_model.overhead == 0.0 and none.cost_model.req_overhead == 0.0
    # 8 decodes: 1.4 ms + 8 x 0.1 ms = 2.2 ms more under vllm-v0, the GPU's time the same
    t_v0, t_none = v0.execute(eight_decodes()).duration, none.execute(eight_decodes()).duration
    assert t_v0 - t_none == pytest.approx(1.4e-3 + 8 * 1.0e-4, abs=1e-12)
    assert t_none > 0


def test_the_default_is_vllm_v0_and_keeps_the_hardware_presets_terms():
    assert preset("executor", "sim")["engine"] == engines.DEFAULT == "vllm-v0"
    hw = preset("hardware", "a100-80gb")
    assert engines.engine_hardware("vllm-v0", hw) is hw
    explicit = sim(engine="vllm-v0", iteration_overhead_s=2e-3)   # an override still applies
    assert explicit.cost_model.overhead == 2e-3


def test_the_summary_records_the_engine():
    assert sim().cost_model_record()["engine"] == "vllm-v0"
    assert sim(engine="none").cost_model_record()["engine"] == "none"


def test_a_preset_and_a_hand_set_term_together_are_refused():
    with pytest.raises(ConfigError,
                       match="executor.request_overhead_s=0.001 with executor.engine=none"):
        SimExecutor.parse_config({"engine": "none", "request_overhead_s": 1e-3})
    with pytest.raises(ConfigError, match="executor.engine='trtllm': must be one of vllm-v0, none"):
        SimExecutor.parse_config({"engine": "trtllm"})


def test_a_profile_gives_way_to_the_engine_preset():
    cfg = SimExecutor.parse_config({"engine": "none", "cost_model": "profiled"})
    assert cfg.cost_model_settings.iteration_overhead_s == 0.0
    # Vidur's Llama-2-70B TP2 profile has no overhead rows: vllm-v0 takes the preset's terms
    runs = {e: SimExecutor.from_config(
        {**preset("executor", "sim"), "cost_model": "profiled", "profile": str(VIDUR),
         "tensor_parallel": 2, "engine": e},
        preset("model", "llama-2-70b"), preset("hardware", "a100-80gb")).cost_model
        for e in ("vllm-v0", "none")}
    assert (runs["vllm-v0"].overhead, runs["vllm-v0"].req_overhead) == (1.4e-3, 1.0e-4)
    assert (runs["none"].overhead, runs["none"].req_overhead) == (0.0, 0.0)


def test_the_real_executor_refuses_an_engine_preset():
    with pytest.raises(ConfigError, match="executor.engine: not a setting of executor TorchExecutor"):
        executor_class("torch").parse_config({"engine": "none"})
