"""Pipeline parallelism (sarathi_lab/topology/pipeline.py, executor.pipeline_parallel): the stage clock on
hand-computed timelines (uneven micro-batches, a steady state of uniform ones with and without a
CPU side), the send/recv and the stage memory by hand, the virtual engines' timeline through the
runner, PP=1 left as it was, and the settings that cannot be used."""
import json

import numpy as np
import pandas as pd
import pytest
from conftest import req
from helpers import cli, composed

from sarathi_lab.cli.main import check_config
from sarathi_lab.costmodels.base import CostModel, split_step
from sarathi_lab.costmodels.roofline import RooflineCostModel, stage_layers
from sarathi_lab.engine import Engine
from sarathi_lab.run.runner import build, run
from sarathi_lab.settings import ConfigError
from sarathi_lab.topology.pipeline import Pipeline, PipelineReplica

A100 = composed("hardware=a100-80gb")["hardware"]
L70B = composed("model=llama-2-70b")["model"]


# -- the partition ---------------------------------------------------------------------------

def test_layers_are_partitioned_as_vllm_does():
    assert stage_layers(80, 2) == [40, 40]
    assert stage_layers(80, 1) == [80]
    assert stage_layers(10, 4) == [2, 3, 3, 2]     # remainder 2: the middle stages
    assert stage_layers(11, 4) == [3, 3, 3, 2]     # remainder 3: all but the last
    assert stage_layers(7, 2) == [4, 3]
    with pytest.raises(ValueError, match="between 1 and the model's 2 layers"):
        stage_layers(2, 3)


# -- the stage clock, by hand ----------------------------------------------------------------

def test_two_stage_timeline_of_uneven_micro_batches_by_hand():
    p = Pipeline(2)
    # ve0 at 0: host [0,1], stage 0 [1,5], send [5,6] (both stages), stage 1 [6,10]
    assert p.place(0, 0.0, 1.0, [4.0, 4.0], [1.0]) == 10.0
    # ve1 at 0: host [1,2]; stage 0 busy until 6, computes [6,8], then waits (blocked) for
    # stage 1 until 10; send [10,11]; stage 1 [11,13]
    assert p.place(1, 0.0, 1.0, [2.0, 2.0], [1.0]) == 13.0
    # ve0 again when its micro-batch left (10): host [10,11]; stage 0 [11,12], blocked until
    # 13; send [13,14]; stage 1 [14,17]
    assert p.place(0, 10.0, 1.0, [1.0, 3.0], [1.0]) == 17.0
    # ve1 at 13: host [13,14]; stage 0 [14,17]; send [17,18]; stage 1 [18,19]
    assert p.place(1, 13.0, 1.0, [3.0, 1.0], [1.0]) == 19.0
    bubbles = [r[2] for r in p.records]
    # mb0: stage 0 idle during its host time (1), stage 1 until it arrived (5)
    # mb1: stage 0 blocked 2 (8 -> 10), stage 1 none; mb2: stage 0 blocked 1; mb3: none
    assert bubbles == [(1.0, 5.0), (2.0, 0.0), (1.0, 0.0), (0.0, 0.0)]
    assert [r[1] for r in p.records] == [1.0, 6.0, 11.0, 14.0]   # stage 0 took them
    s = p.summary()
    assert s["bubble_s"] == [4.0, 5.0]
    assert s["busy_s"] == [10.0 + 4.0, 10.0 + 4.0]   # compute + four sends on both ends
    assert s["bubble_fraction"] == [4 / 18, 5 / 19]
    assert s["bubble_total_s"] == 9.0 and s["bubble_fraction_total"] == 9 / 37
    assert s["micro_batches"] == 4


def _steady(P, cpu, compute, send, rounds):
    """P virtual engines, each placing its next micro-batch when its last one left (the one
    furthest behind first, as the driver does)."""
    p = Pipeline(P)
    now = [0.0] * P
    for _ in range(rounds * P):
        j = min(range(P), key=lambda i: now[i])
        now[j] = p.place(j, now[j], cpu, compute, send)
    return p


@pytest.mark.parametrize("P,send", [(2, 0.5), (4, 0.0)])
def test_uniform_micro_batches_reach_a_steady_state_without_bubbles(P, send):
    p = _steady(P, 0.0, [3.0] * P, [send] * (P - 1), rounds=6)
    # the fill: stage s waited for the first micro-batch's trip through stages 0..s-1, which
    # took it at 3 + (3 + send) (s - 1)
    assert p.records[0][2] == tuple(0.0 if s == 0 else 3 + (3 + send) * (s - 1)
                                    for s in range(P))
    assert all(r[2] == (0.0,) * P for r in p.records[1:])
    # stage 0 busy from 0 to its last release: the pipeline stays full
    assert p.bubble[0] == 0.0 and p.busy[0] == 6 * P * (3.0 + send)


def test_middle_stages_receive_and_send_so_the_end_stages_wait_for_them():
    # 4 stages of 3 s, sends of 0.5 s: a middle stage spends 4 s per micro-batch (receive,
    # compute, send), the first and last 3.5 s: each waits 0.5 s per micro-batch for them
    p = _steady(4, 0.0, [3.0] * 4, [0.5] * 3, rounds=6)
    assert all(r[2] == (0.5, 0.0, 0.0, 0.5) for r in p.records[1:])


def test_a_cpu_side_longer_than_the_send_leaves_its_excess_each_round():
    # two virtual engines, stage time 4, send 1, host 2: after the fill every round of two
    # micro-batches (11 s: 2 x (4 + 1) + 2 - 1) leaves stage 0 and stage 1 idle 1 s each
    # (the next micro-batch is still on its host)
    p = _steady(2, 2.0, [4.0, 4.0], [1.0], rounds=5)
    b = [r[2] for r in p.records]
    assert b[0] == (2.0, 6.0) and b[1] == (0.0, 0.0)
    for k in range(2, len(b), 2):
        assert b[k] == (1.0, 1.0) and b[k + 1] == (0.0, 0.0)
    ends = [p.records[k][1] for k in range(0, len(b), 2)]
    assert np.diff(ends[1:]).tolist() == [11.0] * (len(ends) - 2)


def test_placements_must_come_in_the_order_scheduled():
    p = Pipeline(2)
    p.place(0, 1.0, 0.0, [1.0, 1.0], [0.0])
    with pytest.raises(AssertionError, match="order scheduled"):
        p.place(1, 0.5, 0.0, [1.0, 1.0], [0.0])
    with pytest.raises(ValueError, match="at least 2 stages"):
        Pipeline(1)


# -- the roofline's stage prices, by hand ----------------------------------------------------

def test_send_recv_and_gather_by_hand():
    cm = RooflineCostModel(L70B, A100, 2)
    # two bf16 tensors of 8192 per token, each TP rank its half: 16384 bytes per token per link
    per_tok_nvlink = 2 * 8192 * 2 / 2 / (300e9 * 0.96)
    assert cm.send_recv_time(512) == pytest.approx(1.3e-5 + 512 * per_tok_nvlink, rel=1e-12)
    assert cm.send_recv_time(512) == pytest.approx(42.13e-6, abs=0.01e-6)
    per_tok_net = 16384 / (25e9 * 0.31)
    assert cm.send_recv_time(512, across_nodes=True) == pytest.approx(
        2.9e-5 + 512 * per_tok_net, rel=1e-12)            # 1.111 ms: 26x NVLink's
    assert cm.send_recv_time(0) == 0.0
    # the receiving pair all-gathers the halves: ring, (2-1)/2 of the 32 KiB per token
    lat, per_tok = cm.gather_terms()
    assert lat == 3.1e-5 and per_tok == pytest.approx(0.5 * 32768 / (300e9 * 0.51), rel=1e-12)
    assert RooflineCostModel(L70B, A100, 1).gather_terms() == (0.0, 0.0)


def test_stage_memory_by_hand():
    """Llama-2-70B at TP2 x PP2 on A100-80GB: each GPU holds 40 layers at TP2, the first stage
    the embedding and the last the norm and LM head, and a block holds 40 layers' KV."""
    cm = RooflineCostModel(L70B, A100, 2)
    h, V = 8192, 32000
    per_layer = h * (32 + 2 * 4) * 128 + 32 * 128 * h + 3 * h * 14336 + 2 * h   # at TP2
    last = 2 * (40 * per_layer + h + V * h / 2)                 # bf16 bytes
    usable = 85899345920 * 0.9
    reserve = 2**30 + 8192 * 2 * (2 * h + 40 * 128 + 3 * 28672 / 2) + 256 * V * 4
    kv_block = 16 * 40 * 2 * 4 * 128 * 2
    assert cm.pipeline_kv_blocks([40, 40], 16) == int((usable - last - reserve) // kv_block)
    assert cm.pipeline_kv_blocks([40, 40], 16) == 31018
    # the last stage holds 8192 more bytes... of norm: it is the one that bounds the cache
    first = 2 * (40 * per_layer + V * h / 2)
    assert int((usable - first - reserve) // kv_block) >= 31018
    # the same 4 GPUs at TP4: the same bytes of weights and KV per token per GPU, near the same
    assert abs(RooflineCostModel(L70B, A100, 4).num_kv_blocks(16) - 31018) < 400
    with pytest.raises(ValueError, match=r"stage 0 \(70 layers\).*try more pipeline stages"):
        RooflineCostModel(L70B, A100, 1).pipeline_kv_blocks([70, 10], 16)


def test_step_parts_add_up_to_step_time_and_a_repriced_subclass_is_not_bypassed():
    from plugins import SlowConfig, SlowRoofline
    cm = RooflineCostModel(L70B, A100, 2)
    reqs = [req(0, 700, 5), req(1, 40, 9), req(2, 300, 4)]
    reqs[1].num_computed_tokens = 40
    reqs[1].num_output_tokens = 1     # decoding: computes its last token
    n = [256, 1, 300]
    cpu, layers, head = cm.step_parts(reqs, n)
    assert cpu + layers + head == pytest.approx(cm.step_time(reqs, n), rel=1e-12)
    assert cpu == cm.overhead + 3 * cm.req_overhead and head == cm.lm_head_time(2)
    assert split_step(cm) == cm.step_parts
    slow = SlowRoofline(L70B, A100, 2, SlowConfig(slowdown=3.0))
    parts = split_step(slow)(reqs, n)
    assert parts == (0.0, pytest.approx(3.0 * cm.step_time(reqs, n), rel=1e-12), 0.0)
    # a plug-in written for iteration_time alone: its time, all of it layers
    from plugins import FixedCost
    fixed = FixedCost(L70B, A100, 2)
    assert split_step(fixed)(reqs, n) == (0.0, 0.01, 0.0)
    assert CostModel.step_parts(fixed, reqs, n) == (0.0, 0.01, 0.0)


# -- through the runner ----------------------------------------------------------------------

def _config(*extra):
    return composed("model=tiny-llama", "hardware=a100-80gb", "progress=false",
                    "executor.pipeline_parallel=2", *extra)


def _run(tmp_path, reqs, *extra):
    c = _config(*extra)
    s = run(c, tmp_path, requests=reqs, resolved=check_config(c))
    return (s, pd.read_parquet(tmp_path / "requests.parquet"),
            pd.read_parquet(tmp_path / "iterations.parquet"))


@pytest.mark.slow   # tiny-llama on an A100: 9.3M KV blocks built per engine (~25 s)
def test_virtual_engines_timeline_by_hand(tmp_path):
    """Two requests at 0, prompt 4 and 3 output tokens each, every iteration 10 ms (5 ms per
    stage), no CPU side: A goes to virtual engine 0 and B to 1; once B's prefill follows A's
    through the pipeline, no stage waits again."""
    s, reqs, it = _run(tmp_path, [req(0, 4, 3), req(1, 4, 3)],
                       "executor.cost_model=plugins:FixedCost", "+executor.step_s=0.01")
    lay = RooflineCostModel(composed("model=tiny-llama")["model"], A100, 1)
    x4, x1, h = lay.send_recv_time(4), lay.send_recv_time(1), 0.005
    assert reqs["virtual_engine"].tolist() == [0, 1]
    a = [2 * h + x4, 4 * h + 2 * x4 + x1, 6 * h + 2 * x4 + 3 * x1]
    b = [3 * h + 2 * x4, 5 * h + 2 * x4 + 2 * x1, 7 * h + 2 * x4 + 4 * x1]
    assert reqs["token_times"][0] == pytest.approx(a, abs=1e-12)
    assert reqs["token_times"][1] == pytest.approx(b, abs=1e-12)
    assert it["virtual_engine"].tolist() == [0, 1, 0, 1, 0, 1]
    starts = [0.0, 0.0, a[0], b[0], a[1], b[1]]
    assert it["start"].to_numpy() == pytest.approx(starts, abs=1e-12)
    assert (it["start"] + it["duration"]).to_numpy() == pytest.approx(
        [a[0], b[0], a[1], b[1], a[2], b[2]], abs=1e-12)
    assert it["pipeline_enter"].to_numpy() == pytest.approx(
        [0.0, h + x4, 2 * h + 2 * x4, 3 * h + 2 * x4 + x1, 4 * h + 2 * x4 + 2 * x1,
         5 * h + 2 * x4 + 3 * x1], abs=1e-12)
    # the only bubble: stage 1 waiting for the first micro-batch's stage 0
    assert it["bubble_stage1"].tolist() == [h, 0, 0, 0, 0, 0]
    assert it["bubble_stage0"].tolist() == [0] * 6 and it["bubble"].sum() == h
    p = s["pipeline"]
    assert p["bubble_s"] == [0.0, h] and p["layers"] == [1, 1]
    sends = 2 * x4 + 4 * x1
    assert p["busy_s"] == pytest.approx([6 * h + sends] * 2, rel=1e-12)
    assert p["virtual_engines"] == 2 and p["requests_per_engine"] == [1, 1]
    assert s["num_gpus"] == 2 and s["kv"]["blocks_total"] % 2 == 0


def test_bubbles_add_up_and_uniform_decodes_leave_only_the_last_stages_extra(tmp_path):
    """Sixteen equal requests on the roofline, no CPU side: the table's bubbles are the
    summary's; once the prefills are through, the decode micro-batches of the two virtual
    engines are alike, and all stage 0 waits for each is the work only the last stage does
    (the LM head and the all-gather of the TP halves it receives)."""
    reqs = [req(i, 64, 40) for i in range(16)]
    s, _, it = _run(tmp_path, reqs, "model=llama-2-70b", "executor.tensor_parallel=2",
                    "executor.iteration_overhead_s=0", "executor.request_overhead_s=0")
    p = s["pipeline"]
    assert p["requests_per_engine"] == [8, 8]
    for st in (0, 1):
        assert it[f"bubble_stage{st}"].sum() == pytest.approx(p["bubble_s"][st], rel=1e-9)
    assert (it[[f"bubble_stage{st}" for st in (0, 1)]] >= 0).all().all()
    assert p["micro_batches"] == len(it) == s["num_iterations"]
    dec = it[it["prefill_tokens"] == 0].iloc[1:]    # after the first, behind a prefill
    assert (dec["num_requests"] == 8).all()
    cm = RooflineCostModel(L70B, A100, 2)
    lat, per_token = cm.gather_terms()
    extra = cm.lm_head_time(8) + lat + 8 * per_token       # 0.19 ms of a 48 ms micro-batch
    # (to 1%: the two engines' contexts differ by a token, which moves a decode by ~0.4 us)
    assert dec["bubble_stage0"].to_numpy() == pytest.approx(extra, rel=1e-2)
    assert (dec["bubble_stage1"] == 0).all()
    busy_span = (it["start"] + it["duration"]).max()
    for st in (0, 1):
        assert p["busy_s"][st] + p["bubble_s"][st] <= busy_span * (1 + 1e-12)


def test_pp1_is_todays_run(tmp_path):
    """pipeline_parallel=1 is the simulator as it was: the same tables bit for bit as a config
    that never names the setting, fast-forward on, no pipeline section."""
    reqs = lambda: [req(i, 100 + 37 * i, 30 + 11 * i, t=0.05 * i) for i in range(12)]   # noqa
    base = composed("model=llama-2-70b", "executor.tensor_parallel=4", "progress=false")
    del base["executor"]["pipeline_parallel"]
    s0 = run(base, tmp_path / "a", requests=reqs(), resolved=check_config(base))
    one = composed("model=llama-2-70b", "executor.tensor_parallel=4", "progress=false",
                   "executor.pipeline_parallel=1")
    s1 = run(one, tmp_path / "b", requests=reqs(), resolved=check_config(one))
    for f in ("requests.parquet", "iterations.parquet"):
        pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "a" / f),
                                      pd.read_parquet(tmp_path / "b" / f))
    assert "pipeline" not in s1 and s1["num_iterations"] == s0["num_iterations"]
    policy, ex = build(one)
    eng = Engine(policy, ex)
    assert eng.fast_forward
    eng.run(reqs())
    assert len(eng.rows) < eng.num_iterations    # decode runs skipped, as before


@pytest.mark.slow   # tiny-llama on an A100: 9.3M KV blocks built per engine (~25 s)
def test_fast_forward_setting_does_not_change_a_pipelined_run(tmp_path):
    reqs = lambda: [req(i, 50 + 13 * i, 20 + 7 * i, t=0.1 * i) for i in range(10)]   # noqa
    _, r1, i1 = _run(tmp_path / "ff", reqs(), "fast_forward=true")
    _, r2, i2 = _run(tmp_path / "step", reqs(), "fast_forward=false")
    pd.testing.assert_frame_equal(i1, i2)
    pd.testing.assert_frame_equal(r1.drop(columns="token_times"), r2.drop(columns="token_times"))


def test_kv_blocks_are_shared_out_among_the_virtual_engines():
    c = composed("model=llama-2-70b", "executor.tensor_parallel=2", "executor.pipeline_parallel=2")
    policy, ex = build(c, check_config(c))
    assert policy.kv.num_blocks == 31018 // 2
    assert ex.num_kv_blocks(16) == 15509
    c4 = composed("model=llama-2-70b", "executor.tensor_parallel=2",
                  "executor.pipeline_parallel=2", "scheduler.num_kv_blocks=15510")
    with pytest.raises(ConfigError, match="per virtual engine"):
        build(c4, check_config(c4))


def test_cost_counts_every_gpu(tmp_path):
    reqs = [req(i, 64, 8, t=0.1 * i) for i in range(6)]
    s, _, _ = _run(tmp_path, reqs, "model=llama-2-70b", "executor.tensor_parallel=2",
                   "slo=llama-2-70b-strict")
    assert s["num_gpus"] == 4 and s["cost"]["num_gpus"] == 4
    assert s["cost"]["gpu_hours"] == pytest.approx(s["makespan_s"] / 3600 * 4, rel=1e-12)
    assert s["slo"]["goodput_rps_per_gpu"] == pytest.approx(s["slo"]["goodput_rps"] / 4,
                                                            rel=1e-12)


@pytest.mark.slow   # tiny-llama on an A100: 9.3M KV blocks built per engine (~25 s)
def test_stage_boundary_across_nodes_is_priced_on_the_nic():
    def links(*extra):
        c = composed("model=llama-2-70b", "executor.pipeline_parallel=2", *extra)
        return build(c, check_config(c))[1].stage_pricing["links"]
    cm = RooflineCostModel(L70B, A100, 4)
    assert links("executor.tensor_parallel=4") == [cm.send_recv_terms(False)]
    assert links("executor.tensor_parallel=4", "hardware.gpus_per_node=4") == \
        [cm.send_recv_terms(True)]
    with pytest.raises(ConfigError, match=r"a stage.s GPUs must share a node of "
                                          r"hardware.gpus_per_node=6 \(their product must "
                                          r"divide it\)"):
        links("executor.tensor_parallel=4", "hardware.gpus_per_node=6")


@pytest.mark.slow   # tiny-llama on an A100: 9.3M KV blocks built per engine (~25 s)
def test_the_replica_checks_its_engines():
    c = _config()
    r = check_config(c)
    with pytest.raises(ValueError, match="fast_forward=False"):
        PipelineReplica([Engine(*build(c, r)), Engine(*build(c, r))])
    with pytest.raises(ValueError, match="one per stage"):
        PipelineReplica([Engine(*build(c, r), fast_forward=False)])
    policy, ex = build(c, r)
    with pytest.raises(RuntimeError, match="runs inside a pipeline"):
        Engine(policy, ex, fast_forward=False).run([req(0, 8, 2)])


# -- settings that cannot be used ------------------------------------------------------------

@pytest.mark.parametrize("overrides,match", [
    (("executor=torch", "+executor.pipeline_parallel=2"),
     "executor 'torch' does not run pipeline stages"),
    (("executor=custom", "executor.name=plugins:FixedStep", "+executor.pipeline_parallel=2"),
     "does not run pipeline stages"),
    (("executor.pipeline_parallel=2", "cluster.num_replicas=2"), "fleet of pipeline-parallel"),
    (("executor.pipeline_parallel=0",), r"pipeline_parallel=0: must be >= 1"),
    (("executor.pipeline_parallel=1.5",), "pipeline_parallel"),
])
def test_unusable_pipeline_settings_are_named(overrides, match):
    with pytest.raises(ConfigError, match=match):
        check_config(composed(*overrides))


def test_more_stages_than_layers_is_refused():
    c = composed("model=tiny-llama", "executor.pipeline_parallel=3")
    with pytest.raises(ConfigError, match="executor.pipeline_parallel=3: must be between 1 and "
                       "the model's 2 layers"):
        build(c, check_config(c))


@pytest.mark.slow   # a CLI subprocess
def test_cli_runs_pipeline_stages(tmp_path):
    r = cli(f"hydra.run.dir={tmp_path}/run", "model=llama-2-70b", "executor.tensor_parallel=2",
            "executor.pipeline_parallel=2", "trace.num_requests=40", "trace.qps=4",
            "trace.max_total_tokens=4096", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "pipeline: 2 stages (40+40 layers), 2 virtual engines" in r.stdout
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["settings"]["executor"]["pipeline_parallel"] == 2 and s["num_gpus"] == 4
    it = pd.read_parquet(tmp_path / "run" / "iterations.parquet")
    assert {"virtual_engine", "pipeline_enter", "bubble", "bubble_stage0",
            "bubble_stage1"} <= set(it.columns)
    assert s["pipeline"]["bubble_s"] == pytest.approx(
        [it["bubble_stage0"].sum(), it["bubble_stage1"].sum()], rel=1e-9)
