import dataclasses

import numpy as np
import pytest
from conftest import LinearCost, make_policy, req

from sarathi_lab.engine import Engine
from sarathi_lab.metrics import iterations_table, requests_table, summarize
from sarathi_lab.run.runner import build
from sarathi_lab.schedulers.mechanics.fast_forward import (
    FastForward,
    advance_chunks,
    sarathi_decode,
)
from sarathi_lab.schedulers.output import SchedulerOutput
from sarathi_lab.schedulers.sarathi import Sarathi


class Stuck(Sarathi):
    name = "stuck"

    def schedule(self, now):
        return SchedulerOutput()


def test_policy_that_schedules_nothing_is_an_error_not_a_hang():
    p = make_policy("sarathi")
    p.__class__ = Stuck
    with pytest.raises(RuntimeError, match="scheduled nothing.*1 waiting"):
        Engine(p, LinearCost()).run([req(0, 4, 2)])


def test_clock_jumps_over_idle_gaps():
    p = make_policy("sarathi", token_budget=64)
    a, b = req(0, 4, 2, t=0.0), req(1, 4, 2, t=100.0)
    eng = Engine(p, LinearCost(base=0.01, per_token=0.0), fast_forward=False)
    eng.run([b, a])                       # unsorted input is fine
    assert a.token_times == pytest.approx([0.01, 0.02])
    assert b.first_scheduled_time == 100.0 and b.token_times == pytest.approx([100.01, 100.02])
    assert eng.num_iterations == 4


def test_metrics_follow_the_definitions():
    p = make_policy("sarathi", token_budget=64)
    a = req(0, 4, 3, t=0.0)
    b = req(1, 8, 1, t=0.005)
    eng = Engine(p, LinearCost(base=0.01, per_token=0.0), fast_forward=False)
    eng.run([a, b])
    rq, it = requests_table([a, b]), iterations_table(eng.iterations())
    # a: tokens at 0.01, 0.02, 0.03; b arrives at 0.005, first scheduled at 0.01, token at 0.02
    assert rq.loc[0, "ttft"] == pytest.approx(0.01)
    assert rq.loc[0, "tpot"] == pytest.approx((0.03 - 0.01) / 2)
    assert rq.loc[1, "scheduling_delay"] == pytest.approx(0.005)
    assert rq.loc[1, "ttft"] == pytest.approx(0.015) and rq.loc[1, "tpot"] != rq.loc[1, "tpot"]
    s = summarize(rq, it, slo={"ttft": 0.012, "tpot": None}, kv_blocks_total=p.kv.num_blocks)
    assert s["tbt"]["max"] == pytest.approx(0.01) and s["num_finished"] == 2
    assert s["slo"]["attainment"] == 0.5                  # b misses the TTFT SLO
    assert s["throughput_rps"] == pytest.approx(2 / 0.03)
    assert list(it["prefill_tokens"]) == [4, 8, 0] and list(it["decode_tokens"]) == [0, 1, 1]


def base_cfg(**over):
    cfg = {"scheduler": {"name": "orca", "block_size": 16},
           "executor": {"name": "sim", "tensor_parallel": 1},
           "model": {"name": "llama-2-7b", "num_layers": 32, "hidden_size": 4096,
                     "intermediate_size": 11008, "num_heads": 32, "num_kv_heads": 32,
                     "head_dim": 128, "vocab_size": 32000, "max_model_len": 4096,
                     "dtype": "bfloat16"},
           "hardware": {"name": "a100", "peak_flops": 312e12, "mem_bandwidth": 2.039e12,
                        "memory_bytes": 80e9, "link_bandwidth": 300e9, "link_latency_s": 3e-5,
                        "compute_eff": 0.7, "attn_eff": 0.3, "mem_eff": 0.75,
                        "iteration_overhead_s": 0.002}}
    for k, v in over.items():
        cfg[k].update(v)
    return cfg


def test_kv_too_small_for_one_max_length_request():
    with pytest.raises(ValueError, match="num_kv_blocks=100 .*cannot hold one request"):
        build(base_cfg(scheduler={"num_kv_blocks": 100}))
    build(base_cfg(scheduler={"num_kv_blocks": 256}))    # exactly one 4096-token reservation


def test_model_that_does_not_fit_the_gpu():
    big = {"name": "llama-2-70b", "num_layers": 80, "hidden_size": 8192,
           "intermediate_size": 28672, "num_heads": 64, "num_kv_heads": 8}
    with pytest.raises(ValueError, match="does not fit"):
        build(base_cfg(model=big))


def test_unknown_executor_lists_known():
    with pytest.raises(ValueError, match="unknown executor 'gpu'.*sim"):
        build(base_cfg(executor={"name": "gpu"}))


class Raises(Sarathi):
    name = "raises"

    def schedule(self, now):
        if now > 0:
            raise KeyError("boom")
        return super().schedule(now)


def test_a_plugin_that_raises_is_named():
    p = make_policy("sarathi")
    p.__class__ = Raises
    with pytest.raises(KeyError, match=r"test_engine\.Raises\.schedule\(\) at t=0\.0\d+s "
                                       r"\(iteration 1\): 'boom'"):
        Engine(p, LinearCost()).run([req(0, 4, 3)])


def test_same_config_and_seed_give_the_same_run(tmp_path):
    import pandas as pd
    from hydra import compose, initialize_config_module

    from sarathi_lab.run.runner import run

    def once(seed, where):
        with initialize_config_module("sarathi_lab.configs", version_base="1.3"):
            cfg = compose("config", overrides=["trace=synthetic", "trace.num_requests=60",
                                               "trace.qps=8", f"seed={seed}", "progress=false"])
        run(cfg, tmp_path / where)
        return pd.read_parquet(tmp_path / where / "requests.parquet")

    a, b, c = once(1, "a"), once(1, "b"), once(2, "c")
    pd.testing.assert_frame_equal(a, b)
    assert not a["arrival_time"].equals(c["arrival_time"])


def _ff_pair(name, reqs_of, **kw):
    """The same run with fast-forward on and off, and how many times each called schedule()."""
    runs, calls = {}, {}
    for ff in (True, False):
        reqs, p = reqs_of(), make_policy(name, **kw)
        calls[ff] = 0

        def counted(now, _schedule=p.schedule, _ff=ff):
            calls[_ff] += 1
            return _schedule(now)
        p.schedule = counted
        eng = Engine(p, LinearCost(base=0.01, per_token=1e-4), fast_forward=ff)
        eng.run(reqs)
        runs[ff] = (eng, reqs)
    return runs, calls


def test_fast_forward_starts_right_after_the_prefill_and_ends_requests_in_its_runs():
    # one prefill then 9 decodes: iteration 1 prefills, then a run of 9 whose last iteration
    # finishes b (recorded as a row of its own, as stepping records it); a, alone and steady,
    # runs on to its own finish in a second run of 30
    runs, calls = _ff_pair("vllm", lambda: [req(0, 4, 40), req(1, 4, 10)], max_model_len=64)
    (eng, reqs), (ref_eng, ref) = runs[True], runs[False]
    assert [r.token_times for r in reqs] == [r.token_times for r in ref]
    assert [(r.finish_time, r.finish_reason, r.status) for r in reqs] == \
        [(r.finish_time, r.finish_reason, r.status) for r in ref]
    assert (eng.iterations() == ref_eng.iterations()).all()
    # stepped: the prefill only; skipped: 8 + 29 decodes, and the two finishing iterations
    assert eng.num_iterations == ref_eng.num_iterations == calls[False] == 40
    assert calls[True] == 1
    assert eng._n_skipped == 8 + 29 and len(eng.rows) == 3
    assert eng.kv.num_used_blocks == 0 and eng.num_done == 2


def test_iterations_asked_during_a_run_are_a_prefix_of_the_final_table():
    seen = []
    eng = Engine(make_policy("vllm", max_model_len=64), LinearCost(base=0.01, per_token=1e-4),
                 progress=lambda done, tokens: seen.append(eng.iterations().copy()))
    eng.run([req(0, 4, 40), req(1, 4, 10, t=0.05), req(2, 8, 20, t=0.3)])
    final = eng.iterations()
    assert len(final) == eng.num_iterations and len(seen) > 3
    assert all(0 < len(s) <= len(final) and (s == final[:len(s)]).all() for s in seen)
    # clock and token counts run on across stepped and skipped rows
    assert (final[1:, 0] == final[:-1, 0] + final[:-1, 1]).all()
    assert final[:, 3].sum() + 3 == 40 + 10 + 20


def test_iteration_columns_are_the_iterations_typed_and_new_at_each_call():
    from sarathi_lab.engine import FLOAT_COLUMNS, ITER_COLUMNS
    runs, _ = _ff_pair("vllm", lambda: [req(0, 4, 40), req(1, 4, 10), req(2, 6, 12, t=0.2)],
                       max_model_len=64)
    for eng, _ in runs.values():   # skipped runs and stepped rows interleaved; stepped only
        cols = eng.iteration_columns()
        table = eng.iterations()
        assert list(cols) == list(ITER_COLUMNS) and table.shape == (eng.num_iterations, 16)
        for i, c in enumerate(ITER_COLUMNS):
            assert cols[c].dtype == (float if c in FLOAT_COLUMNS else np.int64), c
            assert (cols[c] == table[:, i]).all(), c
        # by hand: 3 prefills of 4, 4 and 6 tokens; 39 + 9 + 11 decodes
        assert cols["prefill_tokens"].sum() == 14 and cols["decode_tokens"].sum() == 59
        assert (cols["start"][1:] == cols["start"][:-1] + cols["duration"][:-1]).all()
        cols["start"][:] = -1   # the caller's own arrays: the engine's records are untouched
        assert (eng.iteration_columns()["start"] == table[:, 0]).all()
        assert (eng.iterations()[:, 0] >= 0).all()
    ff, plain = runs[True][0].iteration_columns(), runs[False][0].iteration_columns()
    assert all((ff[c] == plain[c]).all() for c in ITER_COLUMNS)
    assert runs[True][0]._n_skipped > 0 and not runs[False][0]._n_skipped


def _chunk_pair(reqs_of, cost=None, **kw):
    """Sarathi (budget 8) with fast-forward on and off: {ff: (engine, requests)}, the
    (request id, chunks) of every skipped chunked prefill, and {ff: schedule() calls}."""
    chunks, runs, calls = [], {}, {True: 0, False: 0}
    for ff in (True, False):
        p, rs = make_policy("sarathi", **{"token_budget": 8, "max_model_len": 64, **kw}), reqs_of()

        def recorded(policy, times, r, c, _advance=p.fast_forward.advance_chunks):
            chunks.append((r.request_id, c))
            return _advance(policy, times, r, c)

        def counted(now, _schedule=p.schedule, _ff=ff):
            calls[_ff] += 1
            return _schedule(now)
        # on the instance: the engine reads the declaration of the policy it is given
        p.fast_forward = dataclasses.replace(p.fast_forward, advance_chunks=recorded)
        p.schedule = counted
        eng = Engine(p, LinearCost(**(cost or {"base": 0.01, "per_token": 1e-4})),
                     fast_forward=ff)
        eng.run(rs)
        runs[ff] = (eng, rs)
    return runs, chunks, calls


def test_a_chunked_prefill_beside_decodes_is_skipped_as_stepping_runs_it():
    # budget 8: a (4 + 30) decodes alone until b (30 + 5) arrives at 0.05; b's admission batch
    # takes a's decode and 7 of b's tokens, then 7, 7, 7 and 2 with a's decodes: one skipped
    # chunk run of 4 batches, the last of which gives b its first token; then plain decodes
    runs, chunks, calls = _chunk_pair(lambda: [req(0, 4, 30), req(1, 30, 5, t=0.05)],
                                      {"base": 0.01, "per_token": 1e-4, "per_ctx": 1e-6})
    (eng, rs), (ref_eng, ref) = runs[True], runs[False]
    assert eng._chunks and not ref_eng._chunks
    assert chunks == [(1, [7, 7, 7, 2])]
    assert (eng.iterations() == ref_eng.iterations()).all()
    assert [r.token_times for r in rs] == [r.token_times for r in ref]
    assert [(r.finish_time, r.status) for r in rs] == [(r.finish_time, r.status) for r in ref]
    # the chunk run's batches are recorded one row each: 7, 7, 7, 2 prefill tokens beside 1
    it = eng.iterations()
    pre = it[:, 2][it[:, 2] > 0].tolist()
    assert pre == [4, 7, 7, 7, 7, 2]
    # stepped: a's prompt and b's admission only (decode runs end b and a in their last batch)
    assert calls[False] == eng.num_iterations and calls[True] == 2
    assert eng.kv.num_used_blocks == 0


def test_a_chunk_run_stops_at_an_arrival_and_steps_the_last_chunk_while_a_request_waits():
    # as above, and c (4 + 3) arrives at 0.07, during b's first skipped chunk (0.0616-0.0724):
    # the run stops after it; with c waiting, b's 7 and 7 are skipped but its last chunk is
    # stepped, which leaves 8 - 1 - 2 = 5 tokens of budget to admit c in the same batch
    runs, chunks, _ = _chunk_pair(
        lambda: [req(0, 4, 30), req(1, 30, 5, t=0.05), req(2, 4, 3, t=0.07)])
    (eng, rs), (ref_eng, ref) = runs[True], runs[False]
    assert chunks == [(1, [7]), (1, [7, 7])]
    assert (eng.iterations() == ref_eng.iterations()).all()
    assert [r.token_times for r in rs] == [r.token_times for r in ref]
    it = eng.iterations()
    # the stepped batch after the runs: a's decode, b's last 2 tokens and c's whole prompt
    row = it[it[:, 2] == 2 + 4][0]
    assert row[3] == 1 and row[4] == 3


def test_chunk_runs_are_off_for_a_policy_that_reschedules_below_their_declaration():
    class Resched(Sarathi):
        def schedule(self, now):
            return super().schedule(now)

    class Reupdate(Sarathi):
        def update(self, out, step, start, end):
            return super().update(out, step, start, end)

    class Both(Resched):             # vouches for Sarathi's declaration with its schedule()
        fast_forward = Sarathi.fast_forward

    class DecodesOnly(Sarathi):      # declares decode runs only
        fast_forward = FastForward(steady_decode=sarathi_decode)
    base = make_policy("sarathi")
    for cls, chunks in ((Sarathi, True), (Resched, False), (Reupdate, False), (Both, True),
                        (DecodesOnly, False), (type(make_policy("vllm")), False)):
        eng = Engine(cls(cls.config_class(block_size=4), base.kv), LinearCost())
        assert eng._chunks is chunks, cls
    # an executor that does not price such batches is stepped through them
    p = make_policy("sarathi", token_budget=8, max_model_len=64)

    class NoChunks(LinearCost):
        def chunk_run(self, *a):
            return None
    eng = Engine(p, NoChunks(base=0.01, per_token=1e-4))
    eng.run([req(0, 4, 30), req(1, 30, 5, t=0.05)])
    assert eng._chunks and sum(1 for r in eng.rows if r[2] > 0) == 6


def test_a_chunk_run_that_advance_chunks_gets_wrong_is_an_error():
    def lazy(policy, times, req, chunks):
        advance_chunks(policy, times, req, chunks[:-1])

    class Lazy(Sarathi):
        fast_forward = dataclasses.replace(Sarathi.fast_forward, advance_chunks=lazy)
    base = make_policy("sarathi", token_budget=8, max_model_len=64)
    eng = Engine(Lazy(base.cfg, base.kv), LinearCost(base=0.01, per_token=1e-4))
    with pytest.raises(AssertionError, match="advance_chunks did not do what k batches would"):
        eng.run([req(0, 4, 30), req(1, 30, 5, t=0.05)])


def test_a_recomputed_requests_last_token_is_stepped_as_the_decode_a_batch_counts_it():
    # 9 blocks of 4, one kept free at admission, budget 8: c (7 + 26) is preempted after 10
    # tokens and recomputes 17 = 8 + 8 + 1; its last token alone is, for a batch, a decode
    # (it is the last emitted one), so that batch is stepped and recorded with 1 decode token
    runs, chunks, _ = _chunk_pair(
        lambda: [req(0, 23, 3), req(1, 5, 16), req(2, 7, 26, t=0.02)],
        {"base": 0.01, "per_token": 1e-3}, num_blocks=9, kv_watermark=0.2)
    (eng, rs), (ref_eng, ref) = runs[True], runs[False]
    assert [r.num_preemptions for r in rs] == [0, 0, 1]
    assert chunks == [(0, [8]), (2, [8])]
    assert (eng.iterations() == ref_eng.iterations()).all()
    assert [r.token_times for r in rs] == [r.token_times for r in ref]


def test_a_chunk_run_stops_before_the_batch_that_ends_a_decode():
    # as the first chunk test, with a's output 10: after its prompt, 4 skipped decodes and the
    # admission batch it has 4 tokens left, so the run takes 7, 7, 7 and the batch with b's
    # last 2 tokens, which ends a, is a decode run's (fold) or a step of its own
    runs, chunks, _ = _chunk_pair(lambda: [req(0, 4, 10), req(1, 30, 5, t=0.05)])
    (eng, rs), (ref_eng, ref) = runs[True], runs[False]
    assert chunks == [(1, [7, 7, 7])]
    assert (eng.iterations() == ref_eng.iterations()).all()
    assert [len(r.token_times) for r in rs] == [10, 5]
    assert [r.token_times for r in rs] == [r.token_times for r in ref]


def test_sarathi_with_deadline_admission_steps_its_prefills_so_the_rate_sees_every_chunk():
    # admission control measures the prefill rate from every batch's prefill tokens and time;
    # a chunk run would hide b's chunks from it, and c's predicted TTFT would differ
    from sarathi_lab.request import Request
    runs, chunks, _ = _chunk_pair(
        lambda: [req(0, 4, 30), Request(1, 0.05, 30, 5, deadline=10.0),
                 Request(2, 0.12, 4, 3, deadline=10.0)], deadline_admission=True)
    (eng, rs), (ref_eng, ref) = runs[True], runs[False]
    assert chunks == [] and eng.fast_forward
    assert rs[2].extra["predicted_ttft"] == ref[2].extra["predicted_ttft"] > 0
    assert (eng.iterations() == ref_eng.iterations()).all()
