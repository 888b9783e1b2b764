"""Request traces: load real ones, generate synthetic ones, mix them, turn any into Requests.

Every trace ends up as one DataFrame shape, whatever its source:

    arrival_time       float seconds, first request at 0.0, ascending
    num_prompt_tokens  int64 (> 0)
    num_output_tokens  int64 (>= 0)
    prompt_token_ids   lists of ints; only when the source carries them
    prompt_text        str; a JSONL trace's `prompt` text (tokenized into prompt_token_ids),
                       kept for clients that send text (sarathi-lab-replay --prompt text)
    priority           int64, lower is more urgent        service columns, each present only
    tenant, slo_class  str                                 when the source has it (README,
    deadline           float seconds after arrival by      "Trace formats")
                       which the first token is due; NaN: none

CSV formats are recognised by their columns, not by file names (JSONL by its name, *.jsonl[.gz]),
so a user's own trace in one of the known layouts loads without any configuration:

    Azure LLM inference 2023/2024   TIMESTAMP, ContextTokens, GeneratedTokens
    BurstGPT                         Timestamp, Model, Request tokens, Response tokens, Log Type
    Vidur / Splitwise trace replay   arrived_at, num_prefill_tokens, num_decode_tokens
    length-only (Vidur, Sarathi)     num_prefill_tokens, num_decode_tokens (arrivals generated)
    JSONL                            prompt_token_ids or prompt, output_len, optional arrival_time
    Mooncake JSONL                   timestamp (ms), input_length, output_length, hash_ids

Any of them may also carry the optional service columns (JSONL: keys) ``priority``, ``tenant``,
``slo_class`` and ``deadline``; an empty cell, a missing key or ``null`` means the default, that of
``Request``. A column the source lacks is not added, so plain traces keep their shape; requests
built from them get the defaults. Deadlines stay relative in the frame (re-timing moves arrivals,
not service targets); ``to_requests`` makes them absolute.

Parsing is strict: a file must be UTF-8 text, gzip-compressed exactly when named ``.gz``; a row
with more fields than the header, a boolean, negative, fractional, missing or non-numeric count, a
bad service value and unsorted or missing times are errors naming the file and the row (JSONL:
the line). Randomness comes from separate seeded streams (arrivals, prompt lengths, output
lengths, token ids), so changing one knob, say the length distribution, leaves the arrival times
of the same seed unchanged.

One module per idea, each importing only modules above it in this list (the `traces` contract of
pyproject.toml, checked by tests/test_layers.py):

    streams      seeded random streams, one per knob
    clients      the closed-loop users' settings (ClientSettings, ThinkTime), which every
                 trace may set; topology.clients runs them as events
    frame        the frame's columns; to_requests
    files        shipped names and files; reading text and gzip
    filters      the length filters
    precision    arrival times the clock can resolve
    tokens       tokenizer loading; attach_prompt_ids
    csv_formats  CSV formats, recognised by their columns
    jsonl        JSONL traces
    mooncake     Mooncake traces: block hash ids made token ids
    arrivals     arrival processes; re-timing
    lengths      length specs for generated traces
    synthetic    synthetic_trace
    load         load_trace
    sessions     multi-turn sessions: SessionConfig, build_sessions
    mixes        workload mixes (classes, tenants): MixConfig, build_mix
    build        TraceConfig, parse_trace_config, build_trace (one trace or a mix)

This package sits just above `request`, `settings` and `resources` (bounds on what a
generated trace may hold) and imports nothing else of the project.
"""
from sarathi_lab.traces.arrivals import ARRIVALS, burst_of, check_arrival_settings
from sarathi_lab.traces.build import (
                                      TraceConfig,
                                      build_trace,
                                      describe_trace,
                                      own_trace_defaults,
                                      parse_trace_config,
)
from sarathi_lab.traces.files import SHIPPED, resolve_trace
from sarathi_lab.traces.frame import COLUMNS, SERVICE_DEFAULTS, to_requests
from sarathi_lab.traces.load import load_trace
from sarathi_lab.traces.mixes import ComponentConfig, MixConfig, build_mix
from sarathi_lab.traces.sessions import SessionConfig, build_sessions
from sarathi_lab.traces.synthetic import synthetic_trace
from sarathi_lab.traces.tokens import attach_prompt_ids

__all__ = ["ARRIVALS", "COLUMNS", "SERVICE_DEFAULTS", "SHIPPED", "ComponentConfig", "MixConfig",
           "SessionConfig", "TraceConfig", "attach_prompt_ids", "build_mix", "build_sessions",
           "build_trace", "burst_of", "describe_trace", "own_trace_defaults",
           "check_arrival_settings", "load_trace", "parse_trace_config", "resolve_trace",
           "synthetic_trace", "to_requests"]
