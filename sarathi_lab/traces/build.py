"""A ``configs/trace/*.yaml`` entry, typed (`TraceConfig`, or a mix's `MixConfig`), and the
trace it describes (`build_trace`): a file loaded, lengths generated, or a mix of components."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import pandas as pd

from sarathi_lab.settings import parse, plain, setting
from sarathi_lab.traces.arrivals import ARRIVALS, burst_of, check_arrival_settings
from sarathi_lab.traces.clients import ClientSettings
from sarathi_lab.traces.files import SHIPPED
from sarathi_lab.traces.load import load_trace
from sarathi_lab.traces.mixes import MixConfig, build_mix
from sarathi_lab.traces.precision import check_arrivals
from sarathi_lab.traces.sessions import SessionConfig, build_sessions
from sarathi_lab.traces.synthetic import synthetic_trace


@dataclass
class TraceConfig(ClientSettings):
    """A ``configs/trace/*.yaml`` entry: a trace to load (``path``) or to generate (``path:
    null`` with ``prompt_len`` and ``output_len`` specs); with ``clients``, served by that many
    closed-loop users instead of at its arrival times (traces/clients.py)."""
    name: str | None = setting(None, help="label used in reports")
    path: str | None = setting(None, help="a shipped trace's name or a file; null: generated")
    num_requests: int | None = setting(None, ge=1, help="the first N; null: the whole trace")
    qps: float | None = setting(None, gt=0, help="arrival rate, req/s; null: the trace's times")
    arrival: str = setting("poisson", choices=ARRIVALS, help="arrival process for qps")
    cv: float = setting(1.0, gt=0, help="gamma: coefficient of variation of the gaps")
    on_s: float | None = setting(None, gt=0, help="onoff: seconds of each burst")
    off_s: float | None = setting(None, gt=0, help="onoff: seconds of silence between bursts")
    max_total_tokens: int | None = setting(None, ge=2, help="drop longer requests")
    max_prompt_tokens: int | None = setting(None, ge=1, help="drop longer prompts")
    shuffle: bool = setting(False, help="a random sample (trace.seed) instead of the first "
                            "num_requests; length-only trace files")
    seed: int = setting(0, ge=0, help="arrivals, lengths, token ids and shuffle")
    prompt_len: int | dict | None = setting(None, help="generated: a length spec")
    output_len: int | dict | None = setting(None, help="generated: a length spec")
    tokenizer: str | None = setting(None, help="a local tokenizer dir for text prompts")
    chat_template: bool | str = setting("auto", help="text prompts in the tokenizer's chat "
                                        "template: auto (when it has one) | true | false")
    models: str | list[str] | None = setting(None, help="BurstGPT: keep rows whose Model is "
                                             "one of these (ignoring case); null: all")
    log_types: str | list[str] | None = setting(None, help="BurstGPT: keep rows whose Log Type "
                                                "is one of these (ignoring case); null: all")

    def validate(self) -> None:
        if self.path is None:
            for key in ("num_requests", "qps", "prompt_len", "output_len"):
                if getattr(self, key) is None:
                    raise ValueError(f"{key}: a generated trace (path: null) needs it")
            if self.tokenizer is not None:
                raise ValueError("tokenizer: read only for a trace file (path)")
            if self.shuffle:
                raise ValueError("shuffle: read only for a trace file (path); a generated "
                                 "trace is a random draw already")
            for key in ("models", "log_types"):
                if getattr(self, key) is not None:
                    raise ValueError(f"{key}={getattr(self, key)!r}: read only for a BurstGPT "
                                     "trace file (path)")
        else:
            if self.path == "???":   # OmegaConf's mark of a value the preset leaves to the user
                raise ValueError("path: this preset ships no trace file (trace=burstgpt: its "
                                 "data is not bundled); name yours with trace.path=FILE")
            for key in ("prompt_len", "output_len"):
                if getattr(self, key) is not None:
                    raise ValueError(f"{key}={getattr(self, key)!r}: read only for a generated "
                                     "trace (path: null)")
        if isinstance(self.chat_template, str) and self.chat_template != "auto":
            raise ValueError(f"chat_template={self.chat_template!r}: must be auto, true or "
                             "false")
        if self.chat_template != "auto" and self.tokenizer is None:
            raise ValueError(f"chat_template={self.chat_template}: read only with "
                             "trace.tokenizer (a JSONL trace of prompt text)")
        check_arrival_settings(self)
        self.check_clients()


def parse_trace_config(cfg):
    """The trace node checked as what it describes: a `mixes.MixConfig` when it has
    ``components``, a `sessions.SessionConfig` when it has ``turns``, else a `TraceConfig`."""
    c = _to_plain_dict(cfg)
    if "components" in c:
        return parse(MixConfig, c, "trace", "a workload mix")
    if "turns" in c:
        return parse(SessionConfig, c, "trace", "multi-turn sessions")
    return parse(TraceConfig, c, "trace")


def build_trace(cfg) -> pd.DataFrame:
    """Build the trace a ``configs/trace/*.yaml`` entry describes (a TraceConfig, a MixConfig,
    a SessionConfig, a DictConfig or a dict, checked by `parse_trace_config`)."""
    tc = cfg if isinstance(cfg, (TraceConfig, SessionConfig)) else parse_trace_config(cfg)
    if isinstance(tc, SessionConfig):
        df = build_sessions(tc)
        df.attrs["name"] = tc.name or "multi_turn"
        check_arrivals(df, df.attrs["name"])
        return df
    if not isinstance(tc, TraceConfig):
        df = build_mix(tc)
        check_arrivals(df, "mix")
        return df
    common = dict(qps=tc.qps, arrival=tc.arrival, cv=tc.cv, burst=burst_of(tc),
                  max_total_tokens=tc.max_total_tokens,
                  max_prompt_tokens=tc.max_prompt_tokens, seed=tc.seed)
    if tc.path is None:
        df = synthetic_trace(tc.num_requests, prompt_len=tc.prompt_len,
                             output_len=tc.output_len, **common)
    else:
        df = load_trace(tc.path, num_requests=tc.num_requests, tokenizer=tc.tokenizer,
                        shuffle=tc.shuffle, chat_template=tc.chat_template, models=tc.models,
                        log_types=tc.log_types, **common)
    df.attrs["name"] = tc.name or str(tc.path or "synthetic")
    check_arrivals(df, str(tc.path) if tc.path is not None else df.attrs["name"])
    return df


def own_trace_defaults(node: dict, user: list[str]) -> dict:
    """The trace node for a file the user named on the command line (``trace.path=...``, one of
    `user`'s dotted keys): the preset's rate, count and label describe the preset's trace, not
    this one, so the file keeps its own arrival times and all its requests (``qps``,
    ``num_requests``: null) and is labelled by its path, unless the user set ``trace.qps``,
    ``trace.num_requests`` or ``trace.name`` too. A shipped trace named so (``trace.path=arxiv``)
    is labelled by its name and keeps the preset's documented rate and count, as its own preset
    does. Any other node is returned unchanged."""
    if "trace.path" not in user or "components" in node or node.get("path") is None:
        return node
    out = dict(node)
    if "trace.name" not in user:
        out["name"] = str(node["path"])
    if str(node["path"]) in SHIPPED:
        return out
    for key in ("qps", "num_requests"):
        if f"trace.{key}" not in user:
            out[key] = None
    return out


def describe_trace(df: pd.DataFrame) -> dict:
    """summary.json's ``trace``: what was served and what was done to it. ``arrivals``: own (the
    file's times), retimed (its gaps scaled to ``qps``), drawn (generated at ``qps``) or mix;
    ``cut_to``: N when only the first N requests were kept (``trace.num_requests``), else null;
    multi-turn sessions (arrivals: sessions): how many, started at what rate, and the turns
    not sent for ``max_total_tokens``."""
    a = df.attrs
    if a.get("format") == "sessions":
        return {"name": a.get("name"), "source": a.get("source"), "num_requests": len(df),
                "arrivals": "sessions", "sessions": a.get("sessions"),
                "session_rate": a.get("session_rate"), "cut_turns": a.get("cut_turns")}
    out = {"name": a.get("name"), "source": a.get("source"), "num_requests": len(df),
           **({"arrivals": "mix"} if a.get("format") == "mix" else   # its components' own
              {"arrivals": a.get("arrivals"), "qps": a.get("qps"), "cut_to": a.get("cut_to")})}
    if a.get("format") == "burstgpt":   # the rows read and dropped: failed calls and others
        out["dropped_rows"] = {"failed_calls": a["failed"], "no_prompt": a["no_prompt"],
                               "filtered": a["filtered"]}
    return out


def _to_plain_dict(cfg) -> dict:
    cfg = plain(cfg)
    if not isinstance(cfg, Mapping):
        raise TypeError(f"trace config must be a mapping, got {type(cfg).__name__}")
    return dict(cfg)
