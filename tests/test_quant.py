"""Quantized weights and KV in the roofline: the bytes read and held, the GEMM peak, the KV
capacity and the swap traffic, each computed by hand for Mistral-7B; and the settings refused
where the hardware or the executor cannot run them."""
import json

import pytest
from helpers import cli, composed

from sarathi_lab.cli.main import check_config
from sarathi_lab.costmodels.roofline import RooflineConfig, RooflineCostModel
from sarathi_lab.run import runner
from sarathi_lab.settings import ConfigError, parse

# Mistral-7B per layer: QKV 4096 x (32 + 2 x 8) x 128, O 32 x 128 x 4096, MLP 3 x 4096 x 14336
LINEAR = 4096 * 48 * 128 + 32 * 128 * 4096 + 3 * 4096 * 14336
assert LINEAR == 218_103_808
OTHER = 32 * 2 * 4096 + 4096 + 2 * 32000 * 4096     # norms, final norm, embedding + LM head


def model(hardware="a100-80gb", tp=1, name="mistral-7b", **q):
    cfg = composed(f"model={name}", f"hardware={hardware}")
    return RooflineCostModel(cfg["model"], cfg["hardware"], tp,
                             parse(RooflineConfig, q, "executor"))


def test_weight_bytes_by_weight_dtype():
    assert model().weight_bytes == 2 * (32 * LINEAR + OTHER) == 14_483_464_192
    # 8-bit linear weights; norms, embedding and LM head stay bf16
    for dt in ("int8", "fp8"):
        m = model("h100-sxm", weight_dtype=dt)
        assert m.weight_bytes == 32 * LINEAR + 2 * OTHER == 7_504_142_336
        assert m.lin_weights == pytest.approx(32 * LINEAR / (3.35e12 * 0.93))


def test_the_gemm_peak_follows_the_weights_and_the_hardware():
    per_token = 32 * 2 * LINEAR
    assert model().lin_per_token == pytest.approx(per_token / (312e12 * 0.715))
    # A100: int8 tensor cores at 624 TOPS dense; fp8 only weight-only, at the bf16 peak
    assert model(weight_dtype="int8").lin_per_token == pytest.approx(per_token / (624e12 * 0.715))
    wo = model(weight_dtype="fp8", weight_only=True)
    assert wo.lin_per_token == pytest.approx(per_token / (312e12 * 0.715))
    assert wo.lin_weights == pytest.approx(32 * LINEAR / (2.039e12 * 0.82))
    # H100: fp8 at 1,979 TFLOPS dense
    assert model("h100-sxm", weight_dtype="fp8").lin_per_token \
        == pytest.approx(per_token / (1979e12 * 0.685))
    with pytest.raises(ConfigError, match=r"^executor.weight_dtype=fp8: a100-80gb has no fp8 "
                                          r"tensor cores .* or executor.weight_dtype=int8"):
        model(weight_dtype="fp8")


def test_w8a8_pays_a_quantization_pass_per_gemm_input():
    base, w8 = model("h100-sxm"), model("h100-sxm", weight_dtype="fp8")
    # per layer: inputs of QKV (h), O (32 x 128), gate/up (h), down (14336); read 2 B, write 1 B
    extra = 32 * 3 * (2 * 4096 + 32 * 128 + 14336) / (3.35e12 * 0.93)
    assert w8.ew_per_token - base.ew_per_token == pytest.approx(extra)
    wo = model("h100-sxm", weight_dtype="fp8", weight_only=True)
    assert wo.ew_per_token == pytest.approx(base.ew_per_token)


def test_fp8_kv_halves_the_kv_bytes_and_doubles_the_blocks():
    bf, f8 = model(), model(kv_cache_dtype="fp8")
    assert bf.kv_bytes_per_token == 32 * 2 * 8 * 128 * 2 == 131072
    assert f8.kv_bytes_per_token == 65536
    assert f8.kv_block_bytes(16) == 2**20
    assert f8.attn_per_kv_token == pytest.approx(bf.attn_per_kv_token / 2)
    # the KV write: 2 x 8 x 128 elements a token per layer, 1 byte instead of 2
    assert bf.ew_per_token - f8.ew_per_token == pytest.approx(32 * 2 * 8 * 128 / (2.039e12 * 0.82))
    free = 85899345920 * 0.9 - bf.weight_bytes - 2**30 - bf.activation_bytes(8192)
    assert bf.num_kv_blocks(16) == int(free // (16 * 131072))
    assert f8.num_kv_blocks(16) == int(free // (16 * 65536))
    # attention FLOPs stay at the bf16 peak: fp8 KV is converted in the kernel
    assert f8.attn_per_pair == bf.attn_per_pair
    # a decode at 1000 tokens of context reads half the KV bytes
    assert bf.chunk_attention_time(1, 1000) - f8.chunk_attention_time(1, 1000) \
        == pytest.approx(1001 * bf.attn_per_kv_token / 2)


def test_int8_weights_and_fp8_kv_together_on_llama_70b():
    bf = model("a100-80gb", tp=2, name="llama-2-70b")
    q = model("a100-80gb", tp=2, name="llama-2-70b", weight_dtype="int8", kv_cache_dtype="fp8")
    # 80 layers x 2 x 4 KV heads per GPU x 128: 160 KiB a token per GPU in bf16
    assert (bf.kv_bytes_per_token, q.kv_bytes_per_token) == (163840, 81920)
    assert q.num_kv_blocks(16) > 2 * bf.num_kv_blocks(16)   # weights halved too


@pytest.mark.parametrize("overrides, key", [
    (["executor.kv_cache_dtype=int8"], "executor.kv_cache_dtype"),
    (["executor.weight_dtype=int4"], "executor.weight_dtype"),
    (["executor.weight_only=true"], "executor.weight_only"),
    (["executor.cost_model=profiled", "executor.profile=x", "executor.kv_cache_dtype=fp8"],
     "executor.kv_cache_dtype"),
])
def test_quantization_settings_are_checked(overrides, key):
    with pytest.raises(ValueError, match=f"^{key}"):
        check_config(composed("trace=synthetic", *overrides), overrides)


def test_the_torch_executor_refuses_quantized_settings():
    from sarathi_lab.executors.torch_exec import TorchExecutor
    for key, value in (("kv_cache_dtype", "fp8"), ("weight_dtype", "int8"),
                       ("weight_only", True)):
        with pytest.raises(ConfigError, match=f"^executor.{key}={value!r}: the torch executor "
                                              "runs weights and KV in executor.dtype"):
            TorchExecutor.parse_config({key: value})


def test_fp8_kv_halves_the_bytes_a_swap_moves():
    policy, ex = runner.build(composed("trace=synthetic", "executor.kv_cache_dtype=fp8",
                                       "scheduler.preemption_mode=swap"))
    ex.bind(policy.kv)
    assert ex.kv_block_bytes(16) == 2**20
    assert policy.kv.num_host_blocks == 4096            # 4 GiB of 1 MiB blocks
    assert ex.swap_time(10) == pytest.approx(1e-5 + 10 * 2**20 / (32e9 * 0.8))


@pytest.mark.slow   # a CLI subprocess
def test_cli_records_the_quantization_and_the_capacity(tmp_path):
    runs = {}
    for name, args in (("bf16", []), ("fp8", ["executor.kv_cache_dtype=fp8",
                                              "executor.weight_dtype=int8"])):
        r = cli(f"hydra.run.dir={tmp_path}/{name}", "trace=synthetic", "trace.num_requests=10",
                *args, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        runs[name] = json.loads((tmp_path / name / "summary.json").read_text())
    q = runs["fp8"]["settings"]["executor"]["cost_model_settings"]
    assert (q["kv_cache_dtype"], q["weight_dtype"], q["weight_only"]) == ("float8", "int8", None)
    blocks = {k: s["settings"]["scheduler"]["num_kv_blocks"] for k, s in runs.items()}
    assert blocks["fp8"] > 2 * blocks["bf16"]
    assert blocks == {k: s["kv"]["blocks_total"] for k, s in runs.items()}
