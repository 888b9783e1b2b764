"""Multi-turn sessions (traces/sessions.py, topology/clients.py `Sessions`): prompts that grow by
exactly the previous turn, the prefix-cache hit rate worked out by hand, send times = previous
finish + think time, the settings' errors, and the CLI (trace=multi_turn)."""
import dataclasses
import json

import numpy as np
import pandas as pd
import pytest
from conftest import LinearCost, make_policy
from helpers import cli

from sarathi_lab.engine import Engine
from sarathi_lab.run.config import resolve
from sarathi_lab.settings import ConfigError
from sarathi_lab.topology import Sessions, Single, drive
from sarathi_lab.traces import build_trace, parse_trace_config, to_requests
from sarathi_lab.traces.clients import ThinkTime

MSG, ANS = 20, 12


def node(**kw):
    return {"sessions": 1, "session_rate": 1.0, "turns": 3, "message_len": MSG,
            "answer_len": ANS, **kw}


def serve(frame, think, block_size=16, base=1.0, caching=True, fast_forward=True):
    """Serve the sessions of `frame` on one engine whose iterations take `base` s each."""
    policy = make_policy("sarathi", token_budget=512, block_size=block_size, num_blocks=400,
                         max_model_len=1024, enable_prefix_caching=caching)
    engine = Engine(policy, LinearCost(base, 0.0), fast_forward=fast_forward)
    reqs = to_requests(frame)
    load = Sessions(reqs, frame["session"], frame["turn"], think)
    drive(Single(engine), load)
    return engine, reqs, load


@pytest.mark.parametrize("system", [0, 8])
def test_a_turns_prompt_is_the_previous_turn_plus_its_answer_plus_a_message(system):
    df = build_trace(node(system_prompt_len=system))
    ids = df["prompt_token_ids"].tolist()
    assert df["turn"].tolist() == [0, 1, 2] and df["session"].tolist() == [0, 0, 0]
    assert df["num_prompt_tokens"].tolist() == [system + MSG, system + 2 * MSG + ANS,
                                                system + 3 * MSG + 2 * ANS]
    assert df["num_output_tokens"].tolist() == [ANS] * 3
    for k in (1, 2):   # the whole previous prompt, then its answer's ids, then the new message
        prev = ids[k - 1]
        assert ids[k][:len(prev)] == prev
        assert len(ids[k]) == len(prev) + ANS + MSG
    answer1 = ids[1][len(ids[0]):len(ids[0]) + ANS]
    assert ids[2][len(ids[0]):len(ids[0]) + ANS] == answer1   # history is kept as it was sent
    assert answer1 != ids[1][-MSG:][:ANS]   # an answer is other ids than the message after it


def test_sessions_share_the_system_prompt_and_nothing_else():
    df = build_trace(node(sessions=2, turns=1, system_prompt_len=16))
    a, b = df["prompt_token_ids"].tolist()
    assert a[:16] == b[:16] and a[16:] != b[16:]


def test_prefix_cache_hit_rate_of_a_three_turn_session_by_hand():
    """Block size 16, messages of 20 tokens, answers of 13: prompts P1 = 20, P2 = 20 + 13 + 20
    = 53, P3 = 53 + 13 + 20 = 86. The simulator emits each turn's planned answer, so the blocks
    its decodes fill are cached too; a turn computes P + A - 1 tokens (its last token is never
    run), so it leaves floor((P + A - 1) / 16) full blocks, here = floor((P + A) / 16) as
    P + A = 33, 66 is no multiple of 16. Turn 2 hits floor(33 / 16) = 2 blocks (32 tokens:
    turn 1's prompt and 12 of its answer), turn 3 floor(66 / 16) = 4 blocks (64 tokens); the
    prompts alone would give floor(20/16) + floor(53/16) = 1 + 3 blocks (64 tokens)."""
    engine, reqs, _ = serve(build_trace(node(answer_len=ANS + 1)), ThinkTime("constant", 0.5))
    stats = engine.kv.prefix_cache_stats()
    assert [r.num_prompt_tokens for r in reqs] == [20, 53, 86]
    assert stats == {"hit_tokens": 32 + 64, "query_tokens": 20 + 53 + 86}
    assert all(r.finish_time is not None for r in reqs)


def test_a_turn_emits_its_planned_answer_which_the_next_prompt_repeats():
    """The requests table's output ids are the trace's planned answer, token for token, with
    prefix caching on or off (off: nothing is looked up, so no hit), and the next turn's prompt
    holds them right after the previous prompt."""
    df = build_trace(node(answer_len=ANS + 1))
    from sarathi_lab.metrics.tables import requests_table
    for caching in (True, False):
        engine, reqs, _ = serve(df, ThinkTime("constant", 0.5), caching=caching)
        table = requests_table(reqs)
        assert [list(x) for x in table["output_token_ids"]] == df["output_token_ids"].tolist()
        for prev, nxt in zip(reqs, reqs[1:]):
            assert nxt.prompt_token_ids[:prev.num_tokens] == prev.all_token_ids()
    assert engine.kv.prefix_cache_stats() is None   # caching off: no hit, none looked up
    assert engine.kv.pool.cached == {}


@pytest.mark.parametrize("caching", [True, False])
def test_fast_forward_emits_and_caches_the_same_answer_blocks(caching):
    """Six sessions whose turns overlap: fast-forward on (it skips decode runs, and with
    caching off chunk runs too) and off give the same times, output ids and cache hits."""
    df = build_trace(node(sessions=6, session_rate=0.5, answer_len={"dist": "uniform",
                                                                     "low": 5, "high": 60},
                          turns={"dist": "uniform", "low": 2, "high": 4}, seed=5))
    runs = [serve(df, ThinkTime("constant", 0.5), base=0.05, caching=caching, fast_forward=ff)
            for ff in (True, False)]
    (on, a, _), (off, b, _) = runs
    assert on._n_skipped > 0 and off._n_skipped == 0   # the skip did run
    assert [r.token_times for r in a] == [r.token_times for r in b]
    assert [r.output_token_ids for r in a] == [r.output_token_ids for r in b] \
        == df["output_token_ids"].tolist()
    assert on.kv.prefix_cache_stats() == off.kv.prefix_cache_stats()
    if caching:   # the answers' blocks were hit: without planned ids, fewer hits
        unplanned, _, _ = serve(df.drop(columns="output_token_ids"),
                                ThinkTime("constant", 0.5), base=0.05)
        assert unplanned.kv.prefix_cache_stats()["hit_tokens"] \
            < on.kv.prefix_cache_stats()["hit_tokens"]


def test_planned_ids_of_another_length_than_the_output_are_refused():
    df = build_trace(node())
    df.loc[1, "output_token_ids"] = [1, 2, 3]   # an answer of 3 ids for 12 output tokens
    with pytest.raises(ValueError, match="row 1: 3 output_token_ids but num_output_tokens=12"):
        to_requests(df)


def test_send_times_are_the_previous_finish_plus_the_think_time():
    """Iterations of 1 s; the first turn (20-token prompt, 12 tokens out) runs 12 iterations
    from its session's start, the next is sent 0.5 s after it ends, and so on; with several
    sessions, every later turn leaves exactly its predecessor's finish + 0.5 s."""
    df = build_trace(node())
    _, reqs, load = serve(df, ThinkTime("constant", 0.5))
    assert [r.arrival_time for r in reqs] == [0.0, 12.5, 25.0]
    assert [r.finish_time for r in reqs] == [12.0, 24.5, 37.0]
    assert load.describe()["mode"] == "sessions"

    df = build_trace(node(sessions=6, session_rate=0.2, turns={"dist": "uniform", "low": 1,
                                                                "high": 4}, seed=3))
    starts = df.groupby("session")["arrival_time"].first().to_numpy()
    _, reqs, load = serve(df, ThinkTime("constant", 0.5), base=0.25)
    assert load.columns() == {"session": df["session"].tolist(), "turn": df["turn"].tolist()}
    for s in range(6):
        mine = [r for r, v in zip(reqs, df["session"]) if v == s]
        arrive = np.array([r.arrival_time for r in mine])
        finish = np.array([r.finish_time for r in mine])
        assert arrive[0] == starts[s]
        np.testing.assert_allclose(arrive[1:], finish[:-1] + 0.5)
    assert len(set(df["turn"].groupby(df["session"]).max())) > 1   # sessions of other lengths


def test_max_total_tokens_ends_a_session_before_a_longer_turn(caplog):
    # turn 1: prompt 52 + answer 12 = 64 fits; turn 2: 84 + 12 does not, and is not sent
    df = build_trace(node(max_total_tokens=2 * MSG + 2 * ANS))
    assert df["turn"].tolist() == [0, 1]
    assert df.attrs["cut_turns"] == 1
    with pytest.raises(ValueError, match="max_total_tokens=8: shorter than every session's"):
        build_trace(node(max_total_tokens=8))


@pytest.mark.parametrize("extra, message", [
    ({"clients": 4}, "trace.clients=4: not read by multi-turn sessions"),
    ({"qps": 2.0}, "trace.qps: not a setting of multi-turn sessions"),
    ({"think_time": {"dist": "uniform", "mean": 1.0}},
     "trace.think_time.mean=1.0: not read by dist=uniform"),
    ({"turns": 0}, "trace.turns=0: must be >= 1"),
    ({"session_rate": 0}, "trace.session_rate=0.0: must be > 0"),
])
def test_bad_settings_are_named(extra, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[")):
        parse_trace_config(node(**extra))


def test_capacity_mode_is_refused():
    from helpers import composed
    c = composed("trace=multi_turn", "mode=capacity")
    with pytest.raises(ConfigError, match="trace.turns: multi-turn sessions .* mode=capacity"):
        resolve(c)


def test_requests_without_their_frame_are_refused():
    from sarathi_lab.run.runner import build_load
    with pytest.raises(ValueError, match="need the trace they were built as"):
        build_load([], node(), None)


def test_labels_out_of_order_are_refused():
    df = build_trace(node())
    with pytest.raises(ValueError, match="request 1 is turn 2 of session 0"):
        Sessions(to_requests(df), [0, 0, 0], [0, 2, 1], ThinkTime("constant", 0.0))


@pytest.mark.slow   # a CLI subprocess
def test_cli_multi_turn(tmp_path):
    r = cli("trace=multi_turn", "trace.sessions=8", "trace.session_rate=1.0",
            "trace.think_time=0.5", "scheduler.enable_prefix_caching=true",
            f"hydra.run.dir={tmp_path}/run", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["load"]["mode"] == "sessions" and s["load"]["sessions"] == 8
    assert s["trace"]["arrivals"] == "sessions" and s["trace"]["sessions"] == 8
    assert "multi-turn sessions: 8, think time 0.5 s between turns" in r.stdout
    assert f"trace multi_turn (8 sessions started at 1/s, {s['num_requests']} turns)" in r.stdout
    rq = pd.read_parquet(tmp_path / "run" / "requests.parquet")
    assert s["num_finished"] == len(rq) > 8
    assert sorted(rq["session"].unique()) == list(range(8))
    for _, mine in rq.groupby("session"):
        mine = mine.sort_values("turn")
        assert mine["turn"].tolist() == list(range(len(mine)))
        np.testing.assert_allclose(mine["arrival_time"].to_numpy()[1:],
                                   mine["arrival_time"].to_numpy()[:-1]
                                   + mine["e2e"].to_numpy()[:-1] + 0.5)
        # each turn emitted the answer its successor's prompt repeats
        turns = list(zip(mine["prompt_token_ids"], mine["output_token_ids"]))
        for (prompt, answer), (nxt, _) in zip(turns, turns[1:]):
            assert len(answer) > 0
            assert list(nxt[:len(prompt) + len(answer)]) == list(prompt) + list(answer)
    assert s["prefix_cache"]["hit_tokens"] > 0


def test_the_preset_writes_every_setting():
    from helpers import CONFIGS
    from omegaconf import OmegaConf

    from sarathi_lab.traces.sessions import SessionConfig
    raw = OmegaConf.load(CONFIGS / "trace" / "multi_turn.yaml")
    assert set(raw.keys()) == {f.name for f in dataclasses.fields(SessionConfig)}
    df = build_trace(OmegaConf.to_container(OmegaConf.create({"seed": 0, "t": raw}),
                                            resolve=True)["t"])
    assert df.attrs["sessions"] == 100 and df.attrs["name"] == "multi_turn"
    assert set(df.groupby("session")["turn"].max() + 1) <= {2, 3, 4, 5, 6}


def test_replay_against_a_server_is_refused(tmp_path):
    """sarathi-lab-replay sends a trace's requests itself and feeds no answer back, so a
    session's later turns could not wait for theirs: refused before anything is sent."""
    from sarathi_lab.replay.command import run_replay
    from sarathi_lab.replay.loads import Endpoint
    ep = Endpoint("http://127.0.0.1:9/v1", "stub-model", 1.0, 1.0, 1)
    with pytest.raises(ConfigError, match="trace.turns: multi-turn sessions are not replayed"):
        run_replay(["trace=multi_turn"], ep, tmp_path / "out")


def test_a_rejected_turn_is_answered_and_the_session_goes_on():
    """max_model_len 60: turn 1 (20 + 12 tokens) runs; turns 2 (52 + 12) and 3 (84 + 12) can
    never fit and are rejected on arrival (the engine idle: at once), each sent 0.5 s after
    its predecessor ended."""
    df = build_trace(node())
    policy = make_policy("sarathi", token_budget=512, block_size=16, num_blocks=400,
                         max_model_len=60, enable_prefix_caching=True)
    engine = Engine(policy, LinearCost(1.0, 0.0))
    reqs = to_requests(df)
    drive(Single(engine), Sessions(reqs, df["session"], df["turn"], ThinkTime("constant", 0.5)))
    assert [r.status.name for r in reqs] == ["FINISHED", "REJECTED", "REJECTED"]
    assert reqs[1].arrival_time == reqs[0].finish_time + 0.5 == 12.5
    assert reqs[2].arrival_time == 13.0   # turn 2 rejected at 12.5, then 0.5 s of thought
    assert "exceeds max_model_len=60" in reqs[1].rejection_reason
