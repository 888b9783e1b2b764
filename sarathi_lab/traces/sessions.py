"""Multi-turn chat sessions: each turn's prompt is the whole conversation so far plus a new message.

A session of N turns opens at its start time (sessions start as a Poisson process at
``session_rate``) with an optional system prompt shared by every session; turn k's prompt is the
system prompt, every earlier turn's message and answer, and turn k's new message, carried as
token ids so that prefix caching and the ``prefix_affinity`` router see the reuse. The answers'
ids are drawn here, as the history the next turn sends back, and planned as each turn's output
(the frame's ``output_token_ids``): the simulator emits them, so the KV blocks a turn's decodes
fill are cached and the next turn hits its predecessor's prompt and answer. A real model's own
answer is other tokens (the real executor samples its own), so there a turn reuses its
predecessor's prompt only.

The frame has one row per turn, sessions in start order and their turns in order, with the
session's start as every turn's ``arrival_time`` (a lower bound: a later turn is sent, at run
time, when the previous one ended plus a think time; ``topology.clients.Sessions``, which draws
the think times) and the columns ``session`` and ``turn`` that the load reads.

Randomness: turns per session, message and answer lengths, session starts and token ids each
have a stream of their own (`streams`), seeded by the trace's seed.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import pandas as pd

from sarathi_lab.resources import ID_BYTES, REQUEST_BYTES, TOKEN_BYTES, check_memory
from sarathi_lab.settings import ConfigError, plain, setting
from sarathi_lab.traces.arrivals import arrival_times
from sarathi_lab.traces.clients import ClientSettings, ThinkTime
from sarathi_lab.traces.lengths import distribution, length_sampler
from sarathi_lab.traces.streams import ARRIVAL_STREAM, IDS_STREAM, TURNS_STREAM, stream_rng
from sarathi_lab.traces.tokens import DEFAULT_VOCAB

logger = logging.getLogger(__name__)


@dataclass
class SessionConfig(ClientSettings):
    """A ``configs/trace/multi_turn.yaml`` entry: multi-turn sessions (a trace node with
    ``turns``). ``think_time`` is the pause between an answer and the session's next prompt;
    ``clients`` must stay null (each session is a closed loop of its own)."""
    name: str | None = setting(None, help="label used in reports")
    sessions: int = setting(100, ge=1, help="number of sessions")
    session_rate: float = setting(0.5, gt=0, help="sessions started per second (Poisson)")
    turns: int | dict = setting(3, help="turns per session: an int or {dist: uniform, low, "
                                        "high} / {dist: lognormal, mean, sigma}")
    message_len: int | dict = setting(256, help="tokens of each turn's new message: a length "
                                                "spec (as trace.prompt_len)")
    answer_len: int | dict = setting(256, help="tokens of each answer: a length spec (as "
                                               "trace.output_len)")
    system_prompt_len: int = setting(0, ge=0, help="tokens of a system prompt every session "
                                                   "opens with (the same ids in all)")
    max_total_tokens: int | None = setting(None, ge=2, help="a session ends before a turn whose "
                                                            "prompt + answer would exceed it")
    vocab_size: int = setting(DEFAULT_VOCAB, ge=1, help="token ids are drawn below it")
    seed: int = setting(0, ge=0, help="session starts, turns, lengths and token ids")

    def validate(self) -> None:
        if self.clients is not None:
            raise ValueError(f"clients={self.clients}: not read by multi-turn sessions, where "
                             "each session sends its next turn after its answer (trace.sessions "
                             "sets how many; unset trace.clients)")
        try:
            ThinkTime.from_spec(self.think_time, "think_time")
        except ConfigError as e:
            raise ValueError(str(e)) from None
        if isinstance(self.turns, int) and self.turns < 1:
            raise ValueError(f"turns={self.turns}: must be >= 1")

    def think(self) -> ThinkTime:
        return ThinkTime.from_spec(self.think_time)


def _id_parts(cfg: SessionConfig, turns, msg_len, ans_len) -> list:
    """What the kept turns hold (for `check_memory`): their records, their planned answers and
    the token ids of their prompts and answers. A turn's prompt + answer is the system prompt
    plus its session's lengths so far, which only grows, so the turns `max_total_tokens` keeps
    are exactly those within it (as `build_sessions` cuts them)."""
    grown = msg_len.astype(np.float64) + ans_len
    total = np.cumsum(grown)
    first = np.cumsum(turns) - turns   # each session's first turn
    so_far = total - np.repeat(total[first] - grown[first], turns) + cfg.system_prompt_len
    kept = (so_far <= cfg.max_total_tokens if cfg.max_total_tokens is not None
            else np.ones(len(so_far), dtype=bool))
    limit = f"trace.max_total_tokens={cfg.max_total_tokens or 'null'}"
    return [(f"{limit} (the turns kept)", int(kept.sum()), REQUEST_BYTES, "turn"),
            (f"{limit} (the answers' tokens)", int(ans_len[kept].sum()), TOKEN_BYTES,
             "output token"),
            (f"{limit} (the token ids of prompts and answers)", int(so_far[kept].sum()),
             ID_BYTES, "token id")]


def build_sessions(cfg: SessionConfig) -> pd.DataFrame:
    """The turns of `cfg`'s sessions as a trace frame (module docstring)."""
    n = cfg.sessions
    # each stage checked before what it draws is allocated (resources.py): a session has a
    # turn at least; every turn drawn has its lengths; every turn kept has its token ids
    check_memory([(f"trace.sessions={n}", n, REQUEST_BYTES, "session (a turn at least)")])
    turns = distribution(plain(cfg.turns), stream_rng(cfg.seed, TURNS_STREAM), "turns")(n)
    check_memory([(f"trace.turns={plain(cfg.turns)} (over trace.sessions={n})",
                   int(turns.sum()), REQUEST_BYTES, "turn")])
    starts = arrival_times(n, cfg.session_rate, "poisson", 1.0,
                           stream_rng(cfg.seed, ARRIVAL_STREAM))
    msg_len, ans_len = length_sampler(cfg.message_len, cfg.answer_len, cfg.seed)(int(turns.sum()))
    check_memory(_id_parts(cfg, turns, msg_len, ans_len))
    ids = stream_rng(cfg.seed, IDS_STREAM)
    system = ids.integers(0, cfg.vocab_size, cfg.system_prompt_len).tolist()
    rows, j, cut, empty = [], 0, 0, 0
    for s in range(n):
        history, kept = system, 0
        for k in range(int(turns[s])):
            m, a = int(msg_len[j + k]), int(ans_len[j + k])
            if cfg.max_total_tokens is not None and len(history) + m + a > cfg.max_total_tokens:
                cut += int(turns[s]) - k
                break
            prompt = history + ids.integers(0, cfg.vocab_size, m).tolist()
            answer = ids.integers(0, cfg.vocab_size, a).tolist()
            rows.append((float(starts[s]), len(prompt), a, prompt, s, k, answer))
            history = prompt + answer
            kept += 1
        j += int(turns[s])
        empty += kept == 0
    if cut:
        logger.info("sessions: %d turns not sent (%d sessions with none), their prompt + answer "
                    "longer than max_total_tokens=%d", cut, empty, cfg.max_total_tokens)
    if not rows:
        raise ValueError(f"trace.max_total_tokens={cfg.max_total_tokens}: shorter than every "
                         "session's first prompt + answer, so no turn is left")
    # sessions renumbered 0.. over those with a turn, in start order
    session = np.array([r[4] for r in rows], dtype=np.int64)
    _, session = np.unique(session, return_inverse=True)
    df = pd.DataFrame({
        "arrival_time": np.array([r[0] for r in rows], dtype=np.float64),
        "num_prompt_tokens": np.array([r[1] for r in rows], dtype=np.int64),
        "num_output_tokens": np.array([r[2] for r in rows], dtype=np.int64),
        "prompt_token_ids": pd.Series([r[3] for r in rows], dtype=object),
        "output_token_ids": pd.Series([r[6] for r in rows], dtype=object),
        "session": session.astype(np.int64),
        "turn": np.array([r[5] for r in rows], dtype=np.int64),
    })
    df.attrs.update(source="generated", format="sessions", arrivals="sessions",
                    sessions=int(session.max()) + 1, session_rate=cfg.session_rate,
                    cut_turns=cut)
    return df
