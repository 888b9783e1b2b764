"""Preemption by swap: the KV manager's swap space, the policies' swapped queue (vLLM v0's
semantics), the guard's swap rules, the simulator's PCIe charge, and every swap metric on a
scenario computed by hand."""
import json

import numpy as np
import pandas as pd
import pytest
from conftest import LinearCost, make_policy, req
from helpers import cli, composed

from sarathi_lab.cli.main import check_config
from sarathi_lab.engine import Engine
from sarathi_lab.engine.guard import RuleViolation
from sarathi_lab.executors.base import StepResult
from sarathi_lab.kv import KVCacheManager
from sarathi_lab.metrics import iterations_table, requests_table, summarize
from sarathi_lab.request import Request, Status
from sarathi_lab.run import runner
from sarathi_lab.schedulers.sarathi import Sarathi
from sarathi_lab.settings import ConfigError


class SwapCost(LinearCost):
    """LinearCost plus a swap charge per direction: `latency` + `per_block` x blocks."""
    supports_swap = True

    def __init__(self, per_block=0.002, latency=0.0005, **kw):
        super().__init__(**kw)
        self.per_block, self.latency = per_block, latency

    def kv_block_bytes(self, block_size):
        return 1000

    def execute(self, out):
        d = super().execute(out).duration
        s = sum(self.latency + self.per_block * len(p)
                for p in (out.blocks_to_swap_out, out.blocks_to_swap_in) if p)
        return StepResult(d + s, swap_s=s)


def swap_policy(name="vllm", *, num_blocks=6, host=8, kv_cls=KVCacheManager, **kw):
    """A policy on a paged KV cache of `num_blocks` blocks of 4 with `host` swap blocks."""
    mode = "swap" if host else "recompute"
    p = make_policy(name, num_blocks=1, block_size=4, preemption_mode=mode,
                    **({"num_swap_blocks": host} if host else {}), **kw)
    kv = kv_cls(num_blocks, 4, max_model_len=64, num_host_blocks=host,
                enable_prefix_caching=p.cfg.enable_prefix_caching)
    return type(p)(p.cfg, kv)


def run(p, reqs, ff=True, executor=None):
    e = Engine(p, executor or SwapCost(), fast_forward=ff)
    e.run(reqs)
    return e


# -- the KV manager's swap space --------------------------------------------------------------------
def test_swap_out_moves_the_computed_blocks_and_swap_in_restores_them_in_order():
    kv = KVCacheManager(8, 4, max_model_len=64, num_host_blocks=4)
    other = req(9, 4, 1)
    kv.allocate_slots(other, 4)            # block 0 taken: the request's blocks are 1, 2, 3
    r = req(0, 10, 5)
    assert kv.allocate_slots(r, 10) == [1, 2, 3]
    r.num_computed_tokens = 10
    assert kv.can_swap_out(r) and kv.swap_out_blocks(r) == 3
    pairs = kv.swap_out(r)
    assert [d for d, _ in pairs] == [1, 2, 3]
    host = [h for _, h in pairs]
    assert kv.host_block_table(r) == host and len(set(host)) == 3
    assert kv.block_table(r) == [] and kv.num_free_blocks == 7
    assert (kv.num_used_host_blocks, kv.num_host_tokens, kv.num_stored_tokens) == (3, 10, 4)
    # the request emitted a token before it was swapped: 11 tokens, 3 blocks to come back to
    r.num_output_tokens = 1
    kv.allocate_slots(req(8, 12, 1), 12)   # blocks 1..3 are taken by another request meanwhile
    assert kv.swap_in_blocks(r) == 3
    back = kv.swap_in(r)
    assert [h for h, _ in back] == host                    # exactly the swapped blocks, in order
    assert [d for _, d in back] == kv.block_table(r) == [4, 5, 6]
    assert (kv.num_used_host_blocks, kv.num_host_tokens, kv.num_stored_tokens) == (0, 0, 26)
    assert kv.host_holders() == []


def test_a_prefill_under_way_swaps_its_computed_blocks_and_gets_its_whole_prompt_back():
    kv = KVCacheManager(8, 4, max_model_len=64, num_host_blocks=4)
    r = req(0, 16, 5)
    kv.allocate_slots(r, 4, lookahead=12)   # admission: the whole prompt's 4 blocks
    r.num_computed_tokens = 6               # two chunks of 3 done
    assert kv.swap_out_blocks(r) == 2
    assert len(kv.swap_out(r)) == 2 and kv.num_free_blocks == 8   # the empty blocks are freed
    assert kv.swap_in_blocks(r) == 4 and len(kv.swap_in(r)) == 2
    assert len(kv.block_table(r)) == 4
    assert kv.allocate_slots(r, 10) == []   # the rest of the prompt needs no new block


def test_swap_space_limits_and_reservation_mode():
    kv = KVCacheManager(8, 4, max_model_len=64, num_host_blocks=2)
    r = req(0, 12, 1)
    kv.allocate_slots(r, 12)
    r.num_computed_tokens = 12
    assert not kv.can_swap_out(r)           # 3 blocks, 2 host blocks
    assert not KVCacheManager(8, 4, max_model_len=64).can_swap_out(r)   # no swap space
    with pytest.raises(ValueError, match="paged KV"):
        KVCacheManager(8, 4, max_model_len=64, reserve=True, num_host_blocks=2)


def test_a_swapped_in_prompt_is_cached_again_for_prefix_hits():
    kv = KVCacheManager(8, 4, max_model_len=64, enable_prefix_caching=True, num_host_blocks=4)
    ids = list(range(9))
    r = req(0, 9, 2, ids=ids)
    kv.allocate_slots(r, 9)
    r.num_computed_tokens = 9
    kv.swap_out(r)
    for i in range(8):                      # evict every cached block of its prompt
        kv.allocate_slots(req(100 + i, 4, 1, ids=[50 + i] * 4), 4)
    assert kv.get_computed_blocks(req(1, 9, 1, ids=ids))[1] == 0
    for i in range(8):
        kv.free(Request(100 + i, 0.0, 4, 1, prompt_token_ids=[50 + i] * 4))
    kv.swap_in(r)
    hit, n = kv.get_computed_blocks(req(1, 9, 1, ids=ids))
    assert n == 8 and [b.block_id for b in hit] == kv.block_table(r)[:2]


# -- the scenario, by hand ---------------------------------------------------------------------------
# 6 blocks of 4 tokens; A and B, prompts of 8, outputs of 6, both at t=0 (watermark: 0 blocks).
# LinearCost: 0.01 s + 0.001 s per token; SwapCost: + 0.0005 s + 0.002 s per block, per direction.
#   it 1  prefill A, B (16 tokens)                       0.026   4 blocks
#   it 2  decodes A, B (each takes its 3rd block)        0.038   6 blocks, none free
#   it 3-5  decodes (tokens 10-12 fit the 3rd blocks)    0.050 0.062 0.074
#   it 6  A needs a 4th block: B (latest admitted) is swapped out, its 12 computed tokens in 3
#         blocks; A decodes alone and ends: 0.011 + 0.0005 + 0.006 = 0.0175 -> 0.0915
#   it 7  B is swapped in (3 blocks back, into 4: room for its 13 tokens) and decodes its last
#         token: 0.0175 -> 0.109
# By recompute instead, it 6 costs 0.011 (-> 0.085) and B recomputes its 13 tokens in it 7:
# 0.01 + 0.013 = 0.023 -> 0.108.
TIMES_A = [0.026, 0.038, 0.050, 0.062, 0.074]


@pytest.mark.parametrize("name", ["vllm", "sarathi"])
@pytest.mark.parametrize("ff", [True, False])
def test_swap_scenario_by_hand(name, ff):
    p = swap_policy(name)
    a, b = req(0, 8, 6), req(1, 8, 6)
    e = run(p, [a, b], ff)
    assert a.token_times == pytest.approx(TIMES_A + [0.0915])
    assert b.token_times == pytest.approx(TIMES_A + [0.109])
    assert (b.num_preemptions, b.num_swap_outs, b.num_swap_ins, b.num_swap_fallbacks,
            b.num_swapped_blocks) == (1, 1, 1, 0, 3)
    assert b.swap_time_s == pytest.approx(0.013) and a.swap_time_s == 0
    assert (a.num_preemptions, a.num_swap_outs) == (0, 0)
    it = iterations_table(e.iterations())
    assert len(it) == 7
    cols = ["swap_outs", "swap_ins", "swap_out_blocks", "swap_in_blocks", "swap_fallbacks",
            "host_blocks_used", "preemptions", "num_requests"]
    assert it.loc[5, cols].tolist() == [1, 0, 3, 0, 0, 3, 1, 1]
    assert it.loc[6, cols].tolist() == [0, 1, 0, 3, 0, 0, 0, 1]
    assert it["swap_s"].tolist() == pytest.approx([0] * 5 + [0.0065, 0.0065])
    assert it["host_blocks_used"].tolist() == [0] * 5 + [3, 0]
    assert it.loc[6, "kv_blocks_used"] == 0 and it.loc[5, "kv_blocks_used"] == 0  # all freed
    rq = requests_table([a, b], e.output_lens)
    assert rq["num_swap_outs"].tolist() == [0, 1] and rq["num_swapped_blocks"].tolist() == [0, 3]
    assert rq["swap_time_s"].tolist() == pytest.approx([0, 0.013])
    s = summarize(rq, it, kv_blocks_total=6, block_size=4, swap_space=e.swap_space())["swap"]
    assert s == pytest.approx({
        "host_blocks_total": 8, "kv_block_bytes": 1000, "swap_outs": 1, "swap_ins": 1,
        "recompute_preemptions": 0, "fallbacks_to_recompute": 0, "blocks_out": 3,
        "blocks_in": 3, "bytes_out": 3000, "bytes_in": 3000, "time_s": 0.013,
        "time_share": 0.013 / 0.109, "host_utilization_max": 3 / 8})


@pytest.mark.parametrize("name", ["vllm", "sarathi"])
def test_the_same_scenario_by_recompute(name):
    p = swap_policy(name, host=0)
    a, b = req(0, 8, 6), req(1, 8, 6)
    e = run(p, [a, b])
    assert a.token_times == pytest.approx(TIMES_A + [0.085])
    assert b.token_times == pytest.approx(TIMES_A + [0.108])
    assert (b.num_preemptions, b.num_swap_outs) == (1, 0)
    assert e.swap_space() is None
    it = iterations_table(e.iterations())
    assert it["prefill_tokens"].tolist()[-1] == 13 and it["swap_s"].sum() == 0


def test_a_swap_that_does_not_fit_the_host_falls_back_to_recompute():
    p = swap_policy("vllm", host=2)         # B's 3 blocks do not fit 2 host blocks
    a, b = req(0, 8, 6), req(1, 8, 6)
    e = run(p, [a, b])
    assert b.token_times == pytest.approx(TIMES_A + [0.108])   # exactly the recompute run
    assert (b.num_preemptions, b.num_swap_outs, b.num_swap_fallbacks) == (1, 0, 1)
    it = iterations_table(e.iterations())
    assert it["swap_fallbacks"].tolist() == [0] * 5 + [1, 0]
    s = summarize(requests_table([a, b], e.output_lens), it, swap_space=e.swap_space())["swap"]
    assert (s["swap_outs"], s["recompute_preemptions"], s["fallbacks_to_recompute"],
            s["time_s"]) == (0, 1, 1, 0.0)


def test_no_request_is_admitted_while_one_is_swapped():
    # A decodes 8 tokens: in its 7th and 8th iterations it holds 4 blocks, B needs 4 to come
    # back and 2 are free; C, arriving during it 6 with a 4-token prompt (1 block), would fit
    # but waits for B, who is swapped in when A ends (it 9) and decodes its last token
    p = swap_policy("vllm")
    a, b, c = req(0, 8, 8), req(1, 8, 6), req(2, 4, 2, t=0.08)
    run(p, [a, b, c])
    assert b.num_swap_ins == 1 and b.token_times[-2] < c.arrival_time < a.token_times[6]
    assert c.first_scheduled_time == b.finish_time > a.finish_time
    # by recompute, B returns to the waiting queue's head: C waits behind it all the same
    p = swap_policy("vllm", host=0)
    a, b, c = req(0, 8, 8), req(1, 8, 6), req(2, 4, 2, t=0.08)
    run(p, [a, b, c])
    assert c.first_scheduled_time >= b.first_scheduled_time


def test_swapped_requests_come_back_in_arrival_order():
    # three requests in 9 blocks outgrow them: the latest admitted is swapped out first (2),
    # then 1; they come back oldest arrival first, 1 then 2, in one batch when 0 ends
    p = swap_policy("sarathi", num_blocks=9, host=16, token_budget=64)
    outs, ins = [], []
    swap_out, swap_in = p.kv.swap_out, p.kv.swap_in
    p.kv.swap_out = lambda r: outs.append(r.request_id) or swap_out(r)
    p.kv.swap_in = lambda r: ins.append(r.request_id) or swap_in(r)
    reqs = [req(i, 8, 12, t=0.001 * i) for i in range(3)]
    e = run(p, reqs, ff=False)
    assert (outs, ins) == ([2, 1], [1, 2])
    it = iterations_table(e.iterations())
    assert it["swap_ins"].tolist().count(2) == 1 and it["swap_outs"].sum() == 2
    assert all(r.status is Status.FINISHED for r in reqs)
    assert p.swapped == [] and p.kv.num_used_host_blocks == 0


class SwapLongOnes(Sarathi):
    """A plug-in's per-victim choice: swap requests with more than 8 tokens computed,
    recompute the others."""
    def preemption_mode_for(self, req):
        return "swap" if req.num_computed_tokens > 8 else "recompute"


def test_a_policy_chooses_the_mode_per_victim():
    base = swap_policy("sarathi")
    p = SwapLongOnes(base.cfg, base.kv)
    short, long_ = req(0, 8, 6), req(1, 8, 6)
    run(p, [short, long_])
    assert long_.num_swap_outs == 1          # 12 tokens computed when it was preempted
    base = swap_policy("sarathi")
    p = SwapLongOnes(base.cfg, base.kv)
    p.preemption_mode_for = lambda r: "spill"
    with pytest.raises(ValueError, match="'spill'"):
        run(p, [req(0, 8, 6), req(1, 8, 6)])


def test_swap_modes_need_swap_space():
    p = make_policy("sarathi", num_blocks=6, block_size=4)
    p.preemption_mode_for = lambda r: "swap"
    with pytest.raises(ValueError, match="no swap space"):
        run(p, [req(0, 8, 6), req(1, 8, 6)])


# -- the guard's swap rules ------------------------------------------------------------------------
class ReversedSwapIn(KVCacheManager):
    """Restores a swapped request's host blocks in the wrong order."""
    def swap_in(self, req):
        pairs = super().swap_in(req)
        dest = [d for _, d in pairs]
        return list(zip([h for h, _ in pairs][::-1], dest))


class ShortSwapOut(KVCacheManager):
    """Swaps out one block fewer than the request's computed tokens fill."""
    def swap_out(self, req):
        pairs = super().swap_out(req)
        self.host.release(self.host_blocks[req.request_id][-1:])
        del self.host_blocks[req.request_id][-1]
        return pairs[:-1]


class KeepsHostBlocks(KVCacheManager):
    """Forgets to free the host blocks of a request it swaps in."""
    def swap_in(self, req):
        host = list(self.host_blocks[req.request_id])
        pairs = super().swap_in(req)
        for b in host:
            self.host.free.remove(b)
        self.host_blocks[req.request_id] = host
        return pairs


@pytest.mark.parametrize("kv_cls, rule", [
    (ReversedSwapIn, "a swap-in restores exactly the swapped blocks"),
    (ShortSwapOut, "a swap-out moves the blocks of every computed token"),
    (KeepsHostBlocks, "a swap-in restores exactly the swapped blocks"),
])
def test_the_guard_checks_what_a_swap_moves(kv_cls, rule):
    p = swap_policy("vllm", kv_cls=kv_cls)
    with pytest.raises(RuleViolation, match=rule):
        run(p, [req(0, 8, 6), req(1, 8, 6)])


class RunsSwapped(Sarathi):
    """Schedules a swapped request (its KV is in host memory)."""
    def schedule(self, now):
        out = super().schedule(now)
        if self.swapped and out.reqs:
            out.add(self.swapped[0], 1)
        return out


class LosesSwapped(Sarathi):
    """Drops a swapped request from the swapped queue without swapping it in."""
    def schedule(self, now):
        out = super().schedule(now)
        if self.swapped:
            self.swapped.pop()
        return out


class SwapsBothWays(Sarathi):
    """In a batch that swaps a request in, takes another out of the batch and swaps it out."""
    def schedule(self, now):
        out = super().schedule(now)
        first = out.swapped_in[0][0] if out.swapped_in else None
        other = next((i for i, r in enumerate(out.reqs) if r is not first), None)
        if first is not None and other is not None:
            victim = out.reqs.pop(other)
            out.num_new_tokens.pop(other)
            out.num_decodes = None
            self.preempt(victim, out, mode="swap")
        return out


@pytest.mark.parametrize("cls, rule, spec", [
    (RunsSwapped, "only running requests", [(8, 6), (8, 6)]),
    (LosesSwapped, "never lost", [(8, 6), (8, 6)]),
    (SwapsBothWays, "no batch swaps both ways", [(8, 12), (8, 12), (8, 12)]),
])
def test_the_guard_checks_the_swapped_queue(cls, rule, spec):
    base = swap_policy("sarathi", num_blocks=9 if len(spec) == 3 else 6, host=16)
    p = cls(base.cfg, base.kv)
    with pytest.raises(RuleViolation, match=rule):
        run(p, [req(i, a, b, t=0.001 * i) for i, (a, b) in enumerate(spec)], ff=False)


def test_the_guard_finds_swapped_requests_and_host_blocks_left_at_the_end():
    p = swap_policy("vllm")
    e = Engine(p, SwapCost())
    r = req(0, 8, 6)
    p.kv.allocate_slots(r, 8)
    r.num_computed_tokens, r.status = 8, Status.RUNNING
    p.running.append(r)
    from sarathi_lab.schedulers.output import SchedulerOutput
    p.preempt(r, SchedulerOutput())
    assert r.status is Status.SWAPPED
    with pytest.raises(RuleViolation, match="0 waiting, 1 swapped and 0 running"):
        e.guard.finished()
    p.swapped.clear()
    with pytest.raises(RuleViolation, match="every host block is freed"):
        e.guard.finished()


# -- the simulator's charge, settings, the command line --------------------------------------------
def sim_cfg(*overrides):
    return composed("trace=synthetic", "trace.num_requests=20", *overrides)


def test_the_simulator_charges_pcie_bytes_per_direction():
    policy, ex = runner.build(sim_cfg("scheduler.preemption_mode=swap"))
    ex.bind(policy.kv)
    # Mistral-7B: 32 layers x 2 x 8 KV heads x 128 x 2 bytes = 128 KiB per token, 2 MiB a block
    assert ex.kv_block_bytes(16) == 2 * 2**20
    # A100 preset: PCIe Gen4 x16 32 GB/s at 0.8, 10 us per copy
    assert ex.swap_time(204) == pytest.approx(1e-5 + 204 * 2**21 / (32e9 * 0.8))
    assert ex.swap_time(0) == 0.0
    # 4 GiB (vLLM's default swap_space) of 2 MiB blocks
    assert policy.kv.num_host_blocks == 2048
    policy, ex = runner.build(sim_cfg("scheduler.preemption_mode=swap",
                                      "executor.tensor_parallel=2", "model=llama-2-70b",
                                      "hardware=h100-sxm", "scheduler.swap_space_gib=10"))
    ex.bind(policy.kv)
    # Llama-2-70B at TP2: 80 layers x 2 x 4 KV heads per GPU x 128 x 2 bytes x 16 tokens
    assert ex.kv_block_bytes(16) == 80 * 2 * 4 * 128 * 2 * 16
    assert policy.kv.num_host_blocks == 10 * 2**30 // (80 * 2 * 4 * 128 * 2 * 16)
    assert ex.swap_time(10) == pytest.approx(1e-5 + 10 * 2621440 / (64e9 * 0.8))


@pytest.mark.parametrize("overrides, key", [
    (["scheduler=orca", "scheduler.preemption_mode=swap"], "scheduler.preemption_mode"),
    (["scheduler.swap_space_gib=8"], "scheduler.swap_space_gib"),   # recompute reads no space
    (["scheduler.num_swap_blocks=8"], "scheduler.num_swap_blocks"),
    (["scheduler.preemption_mode=evict"], "scheduler.preemption_mode"),
    (["scheduler.preemption_mode=swap", "scheduler.swap_space_gib=0"], "scheduler.swap_space_gib"),
    (["scheduler.preemption_mode=swap", "scheduler.swap_space_gib=4",
      "scheduler.num_swap_blocks=8"], "scheduler"),
])
def test_swap_settings_are_checked(overrides, key):
    with pytest.raises(ValueError, match=f"^{key}"):
        check_config(sim_cfg(*overrides), overrides)


def test_a_swap_space_that_holds_no_block_is_an_error():
    with pytest.raises(ConfigError, match="scheduler.swap_space_gib=0.001: holds no KV block"):
        runner.build(sim_cfg("scheduler.preemption_mode=swap", "scheduler.swap_space_gib=0.001"))


def test_an_executor_that_does_not_swap_refuses_swap():
    with pytest.raises(ConfigError, match="does not copy swapped KV blocks"):
        runner.build(sim_cfg("scheduler.preemption_mode=swap", "scheduler.num_swap_blocks=4",
                             "executor=custom", "executor.name=plugins:FixedStep"))


def test_multirun_notes_a_swap_space_that_recompute_does_not_read():
    ov = ["scheduler.preemption_mode=recompute", "scheduler.swap_space_gib=8"]
    r = check_config(sim_cfg(*ov), ov, multirun=True)
    assert r.notes == ["scheduler.swap_space_gib: read only with scheduler.preemption_mode=swap"]
    assert r.policy_cfg.swap_space_gib is None


@pytest.mark.slow   # a CLI subprocess
def test_cli_swap_run_records_the_swap_metrics(tmp_path):
    # Mistral-7B with 40 blocks of 16 tokens: ShareGPT's long requests preempt each other
    r = cli(f"hydra.run.dir={tmp_path}/run", "scheduler=vllm", "trace.num_requests=40",
            "trace.qps=4", "scheduler.num_kv_blocks=160", "scheduler.preemption_mode=swap",
            "scheduler.swap_space_gib=0.5", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    run_dir = tmp_path / "run"
    s = json.loads((run_dir / "summary.json").read_text())
    sw = s["swap"]
    assert sw["swap_outs"] > 0 and sw["swap_outs"] == sw["swap_ins"]
    assert sw["host_blocks_total"] == 256 == s["settings"]["scheduler"]["num_swap_blocks"]
    assert s["settings"]["scheduler"]["swap_space_gib"] == 0.5
    assert sw["bytes_out"] == sw["blocks_out"] * 2**21
    assert sw["recompute_preemptions"] + sw["swap_outs"] == s["preemptions"]
    assert (f"swap: {sw['swap_outs']} swapped out and {sw['swap_ins']} in, "
            f"{sw['recompute_preemptions']} recomputed") in r.stdout
    it = pd.read_parquet(run_dir / "iterations.parquet")
    rq = pd.read_parquet(run_dir / "requests.parquet")
    assert it["swap_out_blocks"].sum() == sw["blocks_out"] == rq["num_swapped_blocks"].sum()
    assert it["swap_s"].sum() == pytest.approx(sw["time_s"]) \
        == pytest.approx(rq["swap_time_s"].sum())
    # every swap of the iteration: latency + bytes over PCIe at 0.8 of 32 GB/s (A100)
    moved = it[it["swap_outs"] > 0]
    assert np.allclose(moved["swap_s"], 1e-5 + moved["swap_out_blocks"] * 2**21 / 25.6e9)
    assert (it["swap_s"] <= it["duration"]).all()


def test_design_defines_every_swap_figure_and_column():
    import re
    from pathlib import Path

    from sarathi_lab.engine import ITER_COLUMNS
    design_name = "DESIGN" + ".md"   # spelled apart, as in test_docs: this file is scanned
    design = (Path(__file__).resolve().parents[1] / "sarathi_lab" / design_name).read_text()
    defined = set(re.findall(r"`([^`]+)`", re.sub(r"```.*?```", "", design, flags=re.S)))
    words = {w for d in defined for w in re.split(r"[^\w]+", d) if w}
    p = swap_policy("vllm")
    a, b = req(0, 8, 6), req(1, 8, 6)
    e = run(p, [a, b])
    rq, it = requests_table([a, b], e.output_lens), iterations_table(e.iterations())
    s = summarize(rq, it, swap_space=e.swap_space())
    swap_cols = [c for c in rq.columns if "swap" in c] + [c for c in ITER_COLUMNS if "swap" in c
                                                          or "host" in c]
    missing = sorted(k for k in [*s["swap"], *swap_cols] if k not in words)
    assert len(swap_cols) == 5 + 7 and not missing, missing


@pytest.mark.parametrize("policy", ["vllm", "sarathi", "sarathi_priority", "vtc", "edf"])
def test_fast_forward_with_swapped_requests_equals_stepping(policy, tmp_path):
    # ShareGPT-4 on 120 blocks of 16 tokens: requests are swapped out and wait to come back
    # while the others decode; skipping those decode runs must change nothing
    tables = []
    for ff in (True, False):
        cfg = composed(f"scheduler={policy}", "trace=sharegpt", "trace.num_requests=40",
                      "trace.qps=4", "scheduler.num_kv_blocks=120",
                      "scheduler.preemption_mode=swap", "scheduler.num_swap_blocks=200",
                      f"fast_forward={str(ff).lower()}")
        s = runner.run(cfg, tmp_path / str(ff))
        tables.append(pd.read_parquet(tmp_path / str(ff) / "iterations.parquet"))
        assert s["swap"]["swap_outs"] > 0
    pd.testing.assert_frame_equal(*tables)


def test_a_fleet_sums_its_replicas_swaps(tmp_path):
    cfg = composed("scheduler=vllm", "trace=sharegpt", "trace.num_requests=60", "trace.qps=8",
                   "scheduler.num_kv_blocks=120", "scheduler.preemption_mode=swap",
                   "scheduler.num_swap_blocks=200", "cluster.num_replicas=2")
    s = runner.run(cfg, tmp_path)
    per = [r["swap"] for r in s["replicas"]]
    assert s["swap"]["host_blocks_total"] == 400 and [p["host_blocks_total"] for p in per] \
        == [200, 200]
    for k in ("swap_outs", "swap_ins", "blocks_out", "recompute_preemptions"):
        assert s["swap"][k] == sum(p[k] for p in per)
    assert s["swap"]["swap_outs"] > 0
    assert s["swap"]["host_utilization_max"] == max(p["host_utilization_max"] for p in per)
