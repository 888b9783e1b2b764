"""Request traces: load real ones, generate synthetic ones, turn either into Requests.

Every trace ends up as one DataFrame shape, whatever its source:

    arrival_time       float seconds, first request at 0.0, ascending
    num_prompt_tokens  int64 (> 0)
    num_output_tokens  int64 (>= 0)
    prompt_token_ids   lists of ints; only when the source carries them
    priority           int64, lower is more urgent        service columns, each present only
    tenant, slo_class  str                                 when the source has it (README,
    deadline           float seconds after arrival by      "Trace formats")
                       which the first token is due; NaN: none

CSV formats are recognised by their columns, not by file names (JSONL by its name, *.jsonl[.gz]),
so a user's own trace in one of the known layouts loads without any configuration:

    Azure LLM inference 2023/2024   TIMESTAMP, ContextTokens, GeneratedTokens
    Vidur / Splitwise trace replay   arrived_at, num_prefill_tokens, num_decode_tokens
    length-only (Vidur, Sarathi)     num_prefill_tokens, num_decode_tokens (arrivals generated)
    JSONL                            prompt_token_ids or prompt, output_len, optional arrival_time

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
"""
from __future__ import annotations

import csv
import gzip
import inspect
import io
import json
import logging
import os
import re
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd

from sarathi_lab.closed_loop import ClientSettings
from sarathi_lab.config import plain
from sarathi_lab.request import Request
from sarathi_lab.settings import parse, setting

logger = logging.getLogger(__name__)

# Shipped trace name -> file under sarathi_lab/data/traces (origins in ATTRIBUTION.md there).
SHIPPED = {
    "sharegpt": "sharegpt_8k_filtered_stats_llama2_tokenizer.csv.gz",
    "azure_conv": "AzureLLMInferenceTrace_conv.csv.gz",
    "azure_code": "AzureLLMInferenceTrace_code.csv.gz",
    "splitwise_conv": "splitwise_conv.csv.gz",
    "splitwise_code": "splitwise_code.csv.gz",
    "arxiv": "arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv.gz",
}

# (format, time column or None, prompt column, output column), tried in this order: a file with
# all three Vidur columns is a replay trace, not merely a length trace.
_CSV_FORMATS = (
    ("azure", "TIMESTAMP", "ContextTokens", "GeneratedTokens"),
    ("vidur", "arrived_at", "num_prefill_tokens", "num_decode_tokens"),
    ("lengths", None, "num_prefill_tokens", "num_decode_tokens"),
)
ARRIVALS = ("poisson", "gamma", "onoff")
COLUMNS = ["arrival_time", "num_prompt_tokens", "num_output_tokens"]

# Independent random streams, so one knob does not reshuffle the others.
_ARRIVAL_STREAM, _PROMPT_STREAM, _OUTPUT_STREAM, _IDS_STREAM, _SHUFFLE_STREAM = range(5)

# Rows per read when only the head of a (possibly huge, e.g. Azure 2024) trace is needed.
_CHUNK_ROWS = 1 << 16

# Optional per-request service columns, with Request's own defaults (one source of truth).
SERVICE_DEFAULTS = {k: inspect.signature(Request).parameters[k].default
                    for k in ("priority", "tenant", "slo_class", "deadline")}
# What a valid value is, for error messages.
_SERVICE_WHAT = {
    "priority": "a whole number (lower is more urgent)",
    "tenant": "a string",
    "slo_class": "a string",
    "deadline": "a number of seconds > 0 (after arrival, for the first token)",
}
# Counts and priorities beyond this are no longer exact as floats (nor sane as tokens).
_MAX_WHOLE = 2 ** 53
_GZIP_MAGIC = b"\x1f\x8b"


# --------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------

def load_trace(path, *, num_requests=None, qps=None, arrival="poisson", cv=1.0, burst=None,
               max_total_tokens=None, max_prompt_tokens=None, seed=0,
               tokenizer=None, shuffle=False) -> pd.DataFrame:
    """Load a shipped trace (by name) or a trace file.

    The length filters are applied first, then the first ``num_requests`` survivors are kept;
    ``df.attrs["dropped"]`` counts the rows the filters skipped among the rows read to get them.
    ``shuffle`` puts the rows in a random order (seeded by ``seed``) first, so that the requests
    kept are a random sample of the trace rather than its head (as Sarathi-Serve's and Vidur's
    trace length generators do); only for a trace without arrival times.
    ``qps`` re-times a timestamped trace (inter-arrival gaps scaled to that mean rate, burstiness
    kept) and is required for a length-only trace, whose arrivals are then drawn from ``arrival``
    (``poisson``, ``gamma`` with coefficient of variation ``cv``, or ``onoff`` with ``burst`` =
    (on_s, off_s): Poisson arrivals only during on periods). ``tokenizer`` (a local path
    or a tokenizer object) is only needed for a JSONL trace that holds prompt text.
    """
    _check_arrival_options(qps, arrival, cv, burst)
    _check_filters(max_total_tokens, max_prompt_tokens)
    if num_requests is not None:
        if int(num_requests) < 1:
            raise ValueError(f"num_requests must be >= 1 or None, got {num_requests}")
        num_requests = int(num_requests)
    src = resolve_trace(path)
    if _is_json(src):
        raw = _read_jsonl(src, tokenizer)
    else:   # a random sample needs every row; the head only as many as it keeps
        raw = _read_csv(src, None if shuffle else num_requests, max_total_tokens,
                        max_prompt_tokens)
    timed = raw.attrs["format"] != "lengths"
    if not timed and qps is None:
        raise ValueError(
            f"trace {src} has token lengths but no arrival times; give qps (req/s) so that "
            "arrivals can be generated")
    if shuffle:
        if timed:
            raise ValueError(f"trace.shuffle: trace {src} has its own arrival times, which a "
                             "shuffle would part from their requests (it is for length-only "
                             "traces)")
        fmt = raw.attrs["format"]
        raw = raw.iloc[_rng(seed, _SHUFFLE_STREAM).permutation(len(raw))].reset_index(drop=True)
        raw.attrs["format"] = fmt

    df, dropped = _select(raw, src, num_requests, max_total_tokens, max_prompt_tokens)
    if timed and arrival != "poisson":
        raise ValueError(f"trace {src} has its own arrival times, so arrival={arrival!r} is not "
                         "read (qps re-times its own gaps; a mix component with arrival="
                         f"{arrival} draws new ones)")
    if timed:
        t = df["arrival_time"].to_numpy()
        t = (t - t[0]) / 1e9 if t.dtype.kind == "i" else t - t[0]  # Azure: int nanoseconds
        if qps is not None:
            t = _retime(t, qps, src)
    else:
        t = _arrival_times(len(df), qps, arrival, cv, _rng(seed, _ARRIVAL_STREAM), burst)
    df["arrival_time"] = t
    df.attrs.update(source=str(src), format=raw.attrs["format"], dropped=dropped)
    return df


def synthetic_trace(num_requests, qps, *, arrival="poisson", cv=1.0, burst=None, prompt_len=512,
                    output_len=128, seed=0, max_total_tokens=None,
                    max_prompt_tokens=None) -> pd.DataFrame:
    """A generated trace: arrivals at ``qps`` and lengths from two small specs.

    A length spec is an int (every request the same), ``{"dist": "uniform", "low", "high"}``
    (inclusive), ``{"dist": "lognormal", "mean", "sigma"}`` (``mean`` is the mean length in
    tokens, ``sigma`` the shape: the sigma of the underlying normal) or ``{"trace": name_or_path}``
    (rows drawn with replacement from a trace; when both specs name the same trace, prompt and
    output come from the same rows, so their correlation is kept). Lengths over the optional
    filters are redrawn; ``attrs["dropped"]`` says how many.
    """
    _check_arrival_options(qps, arrival, cv, burst)
    _check_filters(max_total_tokens, max_prompt_tokens)
    n = int(num_requests)
    if n < 1:
        raise ValueError(f"num_requests must be >= 1, got {num_requests}")
    if qps is None:
        raise ValueError("a synthetic trace needs qps (req/s)")
    draw = _length_sampler(prompt_len, output_len, seed)

    # Redraw until enough lengths pass the filters; this samples from the truncated
    # distribution rather than silently returning fewer requests than asked for.
    prompts, outputs, kept, dropped = [], [], 0, 0
    for _ in range(1000):
        p, o = draw(n - kept)
        ok = _length_mask(p, o, max_total_tokens, max_prompt_tokens)
        prompts.append(p[ok])
        outputs.append(o[ok])
        kept += int(ok.sum())
        dropped += int((~ok).sum())
        if kept == n:
            break
    else:
        raise ValueError(
            f"only {kept} of {kept + dropped} drawn lengths fit max_total_tokens="
            f"{max_total_tokens}, max_prompt_tokens={max_prompt_tokens}; loosen the filters or "
            "the length specs")
    if dropped:
        logger.info("synthetic trace: redrew %d requests longer than %s", dropped,
                    _describe_filters(max_total_tokens, max_prompt_tokens))
    df = pd.DataFrame({
        "arrival_time": _arrival_times(n, qps, arrival, cv, _rng(seed, _ARRIVAL_STREAM), burst),
        "num_prompt_tokens": np.concatenate(prompts).astype(np.int64),
        "num_output_tokens": np.concatenate(outputs).astype(np.int64),
    })
    df.attrs.update(source="synthetic", format="synthetic", dropped=dropped)
    return df


@dataclass
class TraceConfig(ClientSettings):
    """A ``configs/trace/*.yaml`` entry: a trace to load (``path``) or to generate (``path:
    null`` with ``prompt_len`` and ``output_len`` specs); with ``clients``, served by that many
    closed-loop users instead of at its arrival times (closed_loop.py)."""
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
        else:
            for key in ("prompt_len", "output_len"):
                if getattr(self, key) is not None:
                    raise ValueError(f"{key}={getattr(self, key)!r}: read only for a generated "
                                     "trace (path: null)")
        check_arrival_settings(self)
        self.check_clients()


def check_arrival_settings(c) -> None:
    """The cross-setting rules of `arrival`, `cv`, `on_s` and `off_s` (a trace's or a workload
    component's)."""
    if c.cv != 1.0 and c.arrival != "gamma":
        raise ValueError(f"cv={c.cv}: read only with arrival=gamma")
    for key in ("on_s", "off_s"):
        if (getattr(c, key) is None) == (c.arrival == "onoff"):
            raise ValueError(f"{key}={getattr(c, key)!r}: " + (
                "arrival=onoff needs it" if c.arrival == "onoff" else
                "read only with arrival=onoff"))


def burst_of(c) -> tuple | None:
    return (c.on_s, c.off_s) if c.arrival == "onoff" else None


def parse_trace_config(cfg):
    """The trace node checked as what it describes: a `workloads.MixConfig` when it has
    ``components``, else a `TraceConfig`."""
    c = _to_plain_dict(cfg)
    if "components" in c:
        from sarathi_lab.workloads import MixConfig
        return parse(MixConfig, c, "trace", "a workload mix")
    return parse(TraceConfig, c, "trace")


def build_trace(cfg) -> pd.DataFrame:
    """Build the trace a ``configs/trace/*.yaml`` entry describes (a TraceConfig, a MixConfig,
    a DictConfig or a dict, checked by `parse_trace_config`)."""
    tc = cfg if isinstance(cfg, TraceConfig) else parse_trace_config(cfg)
    if not isinstance(tc, TraceConfig):
        from sarathi_lab.workloads import build_mix
        return build_mix(tc)
    common = dict(qps=tc.qps, arrival=tc.arrival, cv=tc.cv, burst=burst_of(tc),
                  max_total_tokens=tc.max_total_tokens,
                  max_prompt_tokens=tc.max_prompt_tokens, seed=tc.seed)
    if tc.path is None:
        df = synthetic_trace(tc.num_requests, prompt_len=tc.prompt_len,
                             output_len=tc.output_len, **common)
    else:
        df = load_trace(tc.path, num_requests=tc.num_requests, tokenizer=tc.tokenizer,
                        shuffle=tc.shuffle, **common)
    df.attrs["name"] = tc.name or str(tc.path or "synthetic")
    return df


def to_requests(df: pd.DataFrame, max_tokens=None) -> list[Request]:
    """One Request per row; request ids are row positions 0..N-1. A row with 0 output tokens
    becomes a 1-token request: the forward pass over a prompt always yields a first token
    (a warning counts them). Service columns present in ``df`` are passed on, a relative
    ``deadline`` as the absolute time ``arrival_time + deadline``; absent ones keep Request's
    defaults."""
    arrival = df["arrival_time"].to_numpy(dtype=np.float64)
    prompt = df["num_prompt_tokens"].to_numpy(dtype=np.int64)
    output = df["num_output_tokens"].to_numpy(dtype=np.int64)
    if (output < 1).any():
        logger.warning("%s: %d requests with 0 output tokens run as 1-token requests",
                    df.attrs.get("source", "trace"), int((output < 1).sum()))
        output = np.maximum(output, 1)
    ids = df["prompt_token_ids"].tolist() if "prompt_token_ids" in df else [None] * len(df)
    service = {k: df[k].tolist() for k in SERVICE_DEFAULTS if k in df}
    if "deadline" in service:
        service["deadline"] = [None if _is_missing(d) else a + d
                               for a, d in zip(arrival.tolist(), service["deadline"])]
    # rows as Python values, zipped: indexing numpy arrays element by element costs more than
    # building the requests themselves
    keys = list(service)
    rows = zip(arrival.tolist(), prompt.tolist(), output.tolist(), ids,
               *(service[k] for k in keys))
    requests = []
    for i, (a, p, o, row_ids, *extra) in enumerate(rows):
        tokens = None if _is_missing(row_ids) else [int(t) for t in row_ids]
        if tokens is not None and len(tokens) != p:
            raise ValueError(f"row {i}: {len(tokens)} prompt_token_ids but "
                             f"num_prompt_tokens={p}")
        requests.append(Request(i, a, p, o, tokens, max_tokens, **dict(zip(keys, extra))))
    return requests


def attach_prompt_ids(df: pd.DataFrame, vocab_size: int, *, seed=0,
                      shared_prefix_len=0) -> pd.DataFrame:
    """A copy of ``df`` with seeded random prompt token ids in [0, vocab_size).

    For replaying a length-only trace on a real model. With ``shared_prefix_len > 0`` every
    prompt opens with the same "system prompt" of that many tokens (cut to the prompt's own
    length), which gives prefix caching something to find. A trace that already carries its own
    ids keeps them (checked against the vocabulary), so callers may apply this unconditionally.
    """
    vocab_size = int(vocab_size)
    if vocab_size < 1:
        raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
    if shared_prefix_len < 0:
        raise ValueError(f"shared_prefix_len must be >= 0, got {shared_prefix_len}")
    out = df.copy()
    if "prompt_token_ids" in df and not df["prompt_token_ids"].map(_is_missing).any():
        top = max((max(ids) for ids in df["prompt_token_ids"] if len(ids)), default=-1)
        if top >= vocab_size:
            raise ValueError(f"the trace's own prompt_token_ids reach {top}, outside the "
                             f"vocabulary of {vocab_size}")
        logger.info("attach_prompt_ids: the trace carries its own prompt ids; keeping them")
        return out

    rng = _rng(seed, _IDS_STREAM)
    prefix = rng.integers(0, vocab_size, int(shared_prefix_len), dtype=np.int64)
    lengths = df["num_prompt_tokens"].to_numpy(dtype=np.int64)
    # One draw for all prompts, then sliced: fast, and row i's ids do not depend on how the
    # caller iterates.
    flat = rng.integers(0, vocab_size, int(lengths.sum()), dtype=np.int64)
    ends = np.cumsum(lengths)
    ids = []
    for end, n in zip(ends, lengths):
        row = flat[end - n:end]
        k = min(n, len(prefix))
        row[:k] = prefix[:k]
        ids.append(row.tolist())
    out["prompt_token_ids"] = pd.Series(ids, index=out.index, dtype=object)
    return out


def resolve_trace(path) -> Path:
    """A shipped trace name or a file path -> an existing file."""
    if isinstance(path, str) and path in SHIPPED:
        return Path(str(resources.files("sarathi_lab") / "data" / "traces" / SHIPPED[path]))
    if path is None or str(path) == "":
        raise ValueError(f"no trace given; shipped traces are: {', '.join(SHIPPED)}")
    p = Path(os.path.expanduser(str(path)))
    if p.is_file():
        return p
    if p.is_dir():
        raise IsADirectoryError(f"trace {str(p)!r} is a directory, not a trace file; "
                                "name a file in it")
    if not p.is_absolute():
        # Under Hydra with job.chdir the working directory is the run's output folder, not the
        # one the user launched from; relative trace paths mean the latter.
        try:
            from hydra.core.hydra_config import HydraConfig
            from hydra.utils import get_original_cwd
            if HydraConfig.initialized() and (Path(get_original_cwd()) / p).is_file():
                return Path(get_original_cwd()) / p
        except ImportError:  # pragma: no cover - hydra is a dependency
            pass
    if os.sep not in str(path) and "." not in str(path):
        raise ValueError(f"unknown trace name {str(path)!r}; shipped traces are: "
                         f"{', '.join(SHIPPED)} (or give a file path)")
    raise FileNotFoundError(f"no trace file {str(p)!r}; shipped traces are: "
                            f"{', '.join(SHIPPED)}")


# --------------------------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------------------------

def _is_json(path: Path) -> bool:
    name = path.name.lower()
    return name.endswith((".jsonl", ".jsonl.gz"))


def _is_gz(path: Path) -> bool:
    return path.name.lower().endswith(".gz")


def _open_text(src: Path):
    """The trace as UTF-8 text, gunzipped when named .gz, after the checks that a file of the
    wrong kind fails with its name rather than deep inside a parser."""
    with open(src, "rb") as f:
        magic = f.read(2)
    if magic == _GZIP_MAGIC and not _is_gz(src):
        raise ValueError(f"trace {src} holds gzip-compressed data but its name does not end in "
                         f".gz; rename it to {src.name}.gz")
    if _is_gz(src) and magic != _GZIP_MAGIC:
        raise ValueError(f"trace {src} is named .gz but is not gzip-compressed; rename it "
                         "without the .gz")
    raw = gzip.open(src, "rb") if _is_gz(src) else open(src, "rb")
    try:
        head = raw.read(1 << 13)
        raw.seek(0)
    except Exception:
        raw.close()
        raise
    if b"\0" in head:  # text never holds NUL bytes; binaries and other compressions do
        raw.close()
        raise ValueError(f"trace {src} is a binary file, not a text trace (CSV or JSONL; of "
                         "compressions only gzip, named .gz, is read)")
    # utf-8-sig: spreadsheet programs start their CSVs with a byte-order mark.
    return io.TextIOWrapper(raw, encoding="utf-8-sig", newline="")


def _unreadable(src: Path, e: Exception) -> ValueError:
    """The error for a file that failed to decode: the first line that is not UTF-8, or the
    gzip stream's fault."""
    if not isinstance(e, UnicodeDecodeError):
        return ValueError(f"trace {src}: its gzip data is corrupt or truncated ({e})")
    with (gzip.open if _is_gz(src) else open)(src, "rb") as f:
        for lineno, line in enumerate(f, 1):  # "\n" is never part of a multi-byte character
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as bad:
                return ValueError(f"trace {src}: line {lineno} is not UTF-8 text (byte "
                                  f"{line[bad.start]:#04x} at position {bad.start + 1}); save "
                                  "the file as UTF-8")
    return ValueError(f"trace {src} is not UTF-8 text ({e})")


# What failing to decode a file raises, from the codec or the gzip stream.
_DECODE_ERRORS = (UnicodeDecodeError, EOFError, zlib.error, gzip.BadGzipFile)


def _read_csv(src: Path, num_requests, max_total, max_prompt) -> pd.DataFrame:
    """Read, validate and normalise a CSV trace; only as many rows as the request needs."""
    try:
        header = _csv_header(src)
        fmt, cols = _detect(header, src)
        service = _service_columns(header, src)
        # Labels as written ("01" stays "01"); no cell is turned into NaN behind our back
        # ("NA" in a count is an error, an empty label the default).
        reader = pd.read_csv(src, chunksize=_CHUNK_ROWS, index_col=False, keep_default_na=False,
                             compression="gzip" if _is_gz(src) else None, encoding="utf-8",
                             dtype={service[k]: str for k in ("tenant", "slo_class")
                                    if k in service})
        parts, offset, kept = [], 0, 0
        with reader:
            for chunk in reader:
                parts.append(_normalise(chunk, fmt, cols, service, src, offset))
                offset += len(chunk)
                if num_requests is not None:
                    last = parts[-1]
                    kept += int(_length_mask(last["num_prompt_tokens"].to_numpy(),
                                             last["num_output_tokens"].to_numpy(),
                                             max_total, max_prompt).sum())
                    if kept >= num_requests:
                        break
    except _DECODE_ERRORS as e:
        raise _unreadable(src, e) from None
    except pd.errors.ParserError as e:
        m = re.search(r"Expected \d+ fields in line (\d+), saw (\d+)", str(e))
        if m:
            raise _too_many_fields(src, int(m[1]), int(m[2]), len(header)) from None
        raise ValueError(f"trace {src} is not a readable CSV: {e}") from None
    if not parts:  # a header and nothing else
        raise ValueError(f"trace {src} has a header but no requests")
    raw = pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]
    if raw.empty:
        raise ValueError(f"trace {src} has a header but no requests")
    if fmt != "lengths":
        _check_sorted(raw["arrival_time"].to_numpy(), src)
    raw.attrs["format"] = fmt
    return raw


def _csv_header(src: Path) -> list[str]:
    """The header's names. Checks the first data row's width here: given more fields than
    names, pandas silently makes the surplus leading ones an index and shifts every column."""
    with _open_text(src) as f:
        try:
            reader = csv.reader(f)
            rows = (r for r in reader if r)  # pandas skips blank lines, too
            header, first = next(rows, None), next(rows, None)
            line = reader.line_num
        except csv.Error as e:
            raise ValueError(f"trace {src} is not a readable CSV: {e}") from None
    if header is None:
        raise ValueError(f"trace {src} is empty (no header, no rows)")
    if first is not None and len(first) > len(header):
        raise _too_many_fields(src, line, len(first), len(header))
    return header


def _too_many_fields(src, line, fields, names) -> ValueError:
    return ValueError(f"trace {src}: the row on line {line} has {fields} fields but the header "
                      f"has {names} (an unquoted comma in a value, or a trailing comma?)")


def _detect(columns, src):
    """Pick the format whose columns are all present (names matched ignoring case/blanks)."""
    found = _names(columns, src)
    for fmt, *needed in _CSV_FORMATS:
        wanted = [c for c in needed if c is not None]
        if all(c.lower() in found for c in wanted):
            return fmt, [None if c is None else found[c.lower()] for c in needed]
    accepted = " | ".join("(" + ", ".join(c for c in need if c) + ")"
                          for _, *need in _CSV_FORMATS)
    raise ValueError(f"trace {src}: missing required columns; it needs one of {accepted}, "
                     f"but its columns are ({', '.join(map(str, columns))})")


def _service_columns(columns, src) -> dict:
    """Service column -> its name in the file, for those present."""
    found = _names(columns, src)
    return {k: found[k] for k in SERVICE_DEFAULTS if k in found}


def _names(columns, src) -> dict:
    """Normalised name -> name, for the names this module reads; one of them twice is an
    error, since either column could be meant."""
    known = {c.lower() for _, *cs in _CSV_FORMATS for c in cs if c} | set(SERVICE_DEFAULTS)
    found = {}
    for c in columns:
        key = str(c).strip().lower()
        if key in found and key in known:
            raise ValueError(f"trace {src}: column {key!r} appears twice (names are matched "
                             "ignoring case and surrounding blanks)")
        found.setdefault(key, c)
    return found


def _normalise(chunk, fmt, cols, service, src, offset) -> pd.DataFrame:
    time_col, prompt_col, output_col = cols
    out = pd.DataFrame({
        "num_prompt_tokens": _lengths(chunk[prompt_col], prompt_col, src, offset),
        "num_output_tokens": _lengths(chunk[output_col], output_col, src, offset),
    })
    _check_prompts(out["num_prompt_tokens"].to_numpy(), prompt_col, src, offset)
    if fmt == "azure":
        out.insert(0, "arrival_time", _timestamps(chunk[time_col], time_col, src, offset))
    elif fmt == "vidur":
        out.insert(0, "arrival_time", _numbers(chunk[time_col], time_col, src, offset,
                                               "a time in seconds", np.isfinite))
    for key, name in service.items():
        out[key] = _service_values(key, chunk[name], name, src, offset)
    return out


def _lengths(col: pd.Series, name, src, offset) -> np.ndarray:
    """Token counts as int64; anything else is an error that points at the row."""
    return _numbers(col, name, src, offset, "a non-negative whole number of tokens (< 2**53)",
                    lambda v: (v >= 0) & (v == np.floor(v)) & (v < _MAX_WHOLE)).astype(np.int64)


def _service_values(key, col: pd.Series, name, src, offset) -> np.ndarray:
    """One service column of a CSV chunk, validated; empty cells get the default."""
    what = _SERVICE_WHAT[key]
    if key == "priority":
        return _numbers(col, name, src, offset, what,
                        lambda v: (v == np.floor(v)) & (np.abs(v) < _MAX_WHOLE),
                        empty=0).astype(np.int64)
    if key == "deadline":
        return _numbers(col, name, src, offset, what, lambda v: v > 0, empty=np.nan)
    labels = col.astype(str).str.strip()
    return labels.mask(labels == "", SERVICE_DEFAULTS[key]).to_numpy(dtype=object)


def _numbers(col: pd.Series, name, src, offset, what, ok, empty=None) -> np.ndarray:
    """A numeric column as float64. A boolean, a non-number or a value failing ``ok`` is an
    error naming its row; so is an empty cell, unless the column is optional and ``empty``
    gives its value."""
    if pd.api.types.is_bool_dtype(col.dtype):  # pandas reads True/False as 1/0 otherwise
        _first_bad(np.ones(len(col), dtype=bool), col, name, src, offset, f"is a boolean, "
                   f"not {what}")
    v = pd.to_numeric(col, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    blank = np.zeros(len(v), dtype=bool)
    if empty is not None and not pd.api.types.is_numeric_dtype(col.dtype):
        blank = (col.astype(str).str.strip() == "").to_numpy()
    with np.errstate(invalid="ignore"):
        bad = ~blank & ~(np.isfinite(v) & ok(v))
    _first_bad(bad, col, name, src, offset, f"is not {what}")
    return np.where(blank, empty, v) if blank.any() else v


def _check_prompts(prompt, name, src, offset):
    # An empty prompt has nothing to prefill and no position to emit a first token from.
    _first_bad(prompt == 0, prompt, name, src, offset, "is a prompt of 0 tokens")


def _timestamps(col: pd.Series, name, src, offset) -> np.ndarray:
    """Wall-clock timestamps -> int64 nanoseconds (rebased to seconds once all rows are in)."""
    # ISO8601 mode is vectorised and copes with 6 or 7 fractional digits, none at all, and a
    # UTC offset (the 2024 Azure traces have one); utc=True keeps mixed inputs comparable.
    # Integers, not float seconds: float64 epoch seconds would lose the 100 ns digit.
    ts = pd.to_datetime(col, format="ISO8601", errors="coerce", utc=True)
    _first_bad(ts.isna().to_numpy(), col, name, src, offset, "is not a timestamp")
    return ts.dt.as_unit("ns").dt.tz_localize(None).to_numpy().view(np.int64)


def _first_bad(bad, values, name, src, offset, what):
    if bad.any():
        i = int(np.argmax(bad))
        value = values.iloc[i] if isinstance(values, pd.Series) else values[i]
        if isinstance(value, np.generic):  # shown as 1e+30, not np.float64(1e+30)
            value = value.item()
        row = offset + i + 1
        where = (f"trace {src}: data row {row} (line {row + 1} of the file, counting the "
                 f"header as line 1), column {name!r}")
        shown = "an empty cell" if isinstance(value, str) and not value.strip() else repr(value)
        raise ValueError(f"{where}: {shown} {what}")


def _check_sorted(t, src):
    back = np.flatnonzero(np.diff(t) < 0)
    if len(back):
        i = int(back[0]) + 1  # 0-based index of the first row that arrives too early
        shown = pd.to_datetime(t[i - 1:i + 1]) if t.dtype.kind == "i" else t[i - 1:i + 1]
        raise ValueError(f"trace {src}: arrival times are not sorted ascending: data row {i + 1} "
                         f"(line {i + 2} of the file) arrives at {shown[1]}, before the previous "
                         f"request ({shown[0]})")


def _read_jsonl(src: Path, tokenizer) -> pd.DataFrame:
    """One JSON object per line; errors give the line number (blank lines count, too)."""
    ids, texts, outputs, times, service, lines = [], {}, [], [], [], []
    try:
        with _open_text(src) as f:
            for lineno, line in enumerate(f, 1):
                if line.strip():
                    tokens, text, out, t, extra = _parse_json_line(line, src, lineno)
                    if text is not None:
                        texts[len(ids)] = text
                    ids.append(tokens)
                    outputs.append(out)
                    times.append(t)
                    service.append(extra)
                    lines.append(lineno)
    except _DECODE_ERRORS as e:
        raise _unreadable(src, e) from None
    if not ids:
        raise ValueError(f"trace {src} has no requests")
    if texts:
        tok = _load_tokenizer(tokenizer, src)
        for row, toks in zip(texts, tok(list(texts.values()))["input_ids"]):
            if not toks:
                raise ValueError(f"trace {src}: line {lines[row]}: the prompt tokenizes to "
                                 "0 tokens")
            ids[row] = list(toks)

    timed = [t is not None for t in times]
    if any(timed) and not all(timed):
        row = timed.index(not timed[0])
        raise ValueError(f"trace {src}: line {lines[row]}: arrival_time must be given on every "
                         "line or on none")
    raw = pd.DataFrame({
        "num_prompt_tokens": np.array([len(x) for x in ids], dtype=np.int64),
        "num_output_tokens": np.array(outputs, dtype=np.int64),
        "prompt_token_ids": pd.Series(ids, dtype=object),
    })
    # A key given on any line makes a column; lines without it get the default.
    for key, default in SERVICE_DEFAULTS.items():
        if any(key in extra for extra in service):
            values = [extra.get(key, default) for extra in service]
            raw[key] = (np.array(values, dtype=np.float64) if key == "deadline" else
                        np.array(values, dtype=np.int64 if key == "priority" else object))
    raw.attrs["format"] = "lengths"
    if all(timed):
        t = np.array(times, dtype=np.float64)
        back = np.flatnonzero(np.diff(t) < 0)
        if len(back):
            i = int(back[0]) + 1
            raise ValueError(f"trace {src}: arrival times are not sorted ascending: line "
                             f"{lines[i]} arrives at {t[i]!r}, before the previous request "
                             f"({t[i - 1]!r})")
        raw.insert(0, "arrival_time", t)
        raw.attrs["format"] = "jsonl"
    return raw


def _parse_json_line(line, src, lineno):
    """-> (token ids or None, prompt text or None, output_len, arrival_time or None,
    {service key: value} for the service keys given)."""
    def bad(msg):
        return ValueError(f"trace {src}: line {lineno}: {msg}")

    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise bad(f"not valid JSON ({e.msg})") from None
    if not isinstance(obj, dict):
        raise bad("expected a JSON object")
    tokens, text = obj.get("prompt_token_ids"), None
    if tokens is not None:
        if not (isinstance(tokens, list) and all(_is_int(t) and t >= 0 for t in tokens)):
            raise bad("prompt_token_ids must be a list of non-negative ints")
        if not tokens:
            raise bad("prompt_token_ids is empty (a prompt of 0 tokens)")
    elif isinstance(obj.get("prompt"), str):
        text = obj["prompt"]
    else:
        raise bad("needs 'prompt_token_ids' (a list of ints) or 'prompt' (text)")
    out = obj.get("output_len")
    if not (_is_int(out) and 0 <= out < _MAX_WHOLE):
        raise bad(f"output_len must be a non-negative int (< 2**53), got {out!r}")
    t = obj.get("arrival_time")
    if t is not None and not (_is_number(t) and np.isfinite(t)):
        raise bad(f"arrival_time must be a number of seconds, got {t!r}")
    extra = {}
    for key in SERVICE_DEFAULTS:
        v = obj.get(key)
        if v is None or (isinstance(v, str) and not v.strip()):
            continue  # the default, as an empty CSV cell
        if key == "priority":
            ok = _is_int(v) and abs(v) < _MAX_WHOLE
        elif key == "deadline":
            ok = _is_number(v) and np.isfinite(v) and v > 0
        else:
            ok = isinstance(v, str)
            v = v.strip() if ok else v
        if not ok:
            raise bad(f"{key} must be {_SERVICE_WHAT[key]}, got {v!r}")
        extra[key] = v
    return tokens, text, out, t, extra


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x) -> bool:
    return _is_int(x) or isinstance(x, float)


def _load_tokenizer(tokenizer, src):
    if tokenizer is None:
        raise ValueError(f"trace {src} holds prompt text; give tokenizer= (a local tokenizer "
                         "path) to count its tokens")
    if not isinstance(tokenizer, (str, os.PathLike)):
        return tokenizer  # already a tokenizer object
    from transformers import AutoTokenizer  # heavy import, only when text needs it
    return AutoTokenizer.from_pretrained(str(tokenizer), local_files_only=True)


# --------------------------------------------------------------------------------------------
# Selecting, timing, sampling
# --------------------------------------------------------------------------------------------

def _length_mask(prompt, output, max_total, max_prompt) -> np.ndarray:
    keep = np.ones(len(prompt), dtype=bool)
    if max_total is not None:
        keep &= (prompt + output) <= max_total
    if max_prompt is not None:
        keep &= prompt <= max_prompt
    return keep


def _describe_filters(max_total, max_prompt):
    parts = []
    if max_total is not None:
        parts.append(f"max_total_tokens={max_total}")
    if max_prompt is not None:
        parts.append(f"max_prompt_tokens={max_prompt}")
    return " or ".join(parts)


def _select(raw, src, num_requests, max_total, max_prompt):
    """Filter by length, then keep the first ``num_requests``; return (frame, dropped)."""
    keep = _length_mask(raw["num_prompt_tokens"].to_numpy(), raw["num_output_tokens"].to_numpy(),
                        max_total, max_prompt)
    idx = np.flatnonzero(keep)
    if num_requests is not None and len(idx) >= num_requests:
        idx = idx[:num_requests]
        scanned = int(idx[-1]) + 1  # rows after the last kept one were never considered
    else:
        scanned = len(raw)
        if num_requests is not None:
            logger.warning("trace %s: asked for %d requests but only %d are available%s", src,
                           num_requests, len(idx),
                           " after filtering" if len(idx) < len(raw) else "")
    dropped = scanned - len(idx)
    if len(idx) == 0:
        raise ValueError(f"trace {src}: all {len(raw)} requests are longer than "
                         f"{_describe_filters(max_total, max_prompt)}")
    if dropped:
        logger.info("trace %s: dropped %d of the first %d requests, longer than %s", src,
                    dropped, scanned, _describe_filters(max_total, max_prompt))
    df = raw.iloc[idx].reset_index(drop=True)
    df.attrs = {}
    if "arrival_time" not in df:
        df.insert(0, "arrival_time", 0.0)
    return df, dropped


def _retime(t, qps, src):
    """Scale inter-arrival gaps so the mean rate is ``qps``; the pattern of bursts is kept."""
    if len(t) < 2:
        return t
    if t[-1] <= 0:
        raise ValueError(f"trace {src}: all requests arrive at the same instant, so they cannot "
                         f"be re-timed to qps={qps}")
    # (n - 1) gaps span t[-1]; make their mean exactly 1 / qps.
    return t * ((len(t) - 1) / qps / t[-1])


def _arrival_times(n, qps, arrival, cv, rng, burst=None) -> np.ndarray:
    """n arrival times, the first at 0.0, at a mean rate of qps: independent gaps (poisson,
    gamma), or (onoff) a Poisson process that runs only during the first on_s seconds of every
    on_s + off_s, at qps x (on_s + off_s) / on_s while on."""
    if arrival == "onoff":
        on, off = burst
        # a Poisson process on the clock that runs only while on, then laid out on real time
        u = np.concatenate([[0.0], np.cumsum(rng.exponential(on / (qps * (on + off)), n - 1))])
        return np.floor(u / on) * (on + off) + np.mod(u, on)
    if arrival == "poisson":
        gaps = rng.exponential(1.0 / qps, n - 1)
    else:
        shape = 1.0 / cv ** 2  # a gamma's CV is 1/sqrt(shape)
        gaps = rng.gamma(shape, 1.0 / (qps * shape), n - 1)
    return np.concatenate([[0.0], np.cumsum(gaps)])


def _length_sampler(prompt_spec, output_spec, seed):
    """A function n -> (prompt lengths, output lengths) for the two specs."""
    prompt_spec, output_spec = plain(prompt_spec), plain(output_spec)
    rng_p, rng_o = _rng(seed, _PROMPT_STREAM), _rng(seed, _OUTPUT_STREAM)
    tables = {}

    def table(spec):
        src = resolve_trace(spec["trace"])
        if src not in tables:
            raw = _read_jsonl(src, None) if _is_json(src) else _read_csv(src, None, None, None)
            tables[src] = (raw["num_prompt_tokens"].to_numpy(),
                           raw["num_output_tokens"].to_numpy())
        return tables[src]

    def one(spec, rng, which, what):
        if isinstance(spec, Mapping) and "trace" in spec:
            cols = table(spec)
            return lambda n: cols[which][rng.integers(0, len(cols[which]), n)]
        return _distribution(spec, rng, what)

    same_trace = (isinstance(prompt_spec, Mapping) and isinstance(output_spec, Mapping)
                  and "trace" in prompt_spec and "trace" in output_spec
                  and resolve_trace(prompt_spec["trace"]) == resolve_trace(output_spec["trace"]))
    if same_trace:
        tp, to = table(prompt_spec)

        def joint(n):
            rows = rng_p.integers(0, len(tp), n)
            return tp[rows], to[rows]
        return joint
    draw_p = one(prompt_spec, rng_p, 0, "prompt_len")
    draw_o = one(output_spec, rng_o, 1, "output_len")
    return lambda n: (draw_p(n), draw_o(n))


def _distribution(spec, rng, what):
    if isinstance(spec, (int, np.integer)) and not isinstance(spec, bool):
        if spec < 1:
            raise ValueError(f"{what} must be >= 1, got {spec}")
        return lambda n: np.full(n, int(spec), dtype=np.int64)
    if not isinstance(spec, Mapping) or "dist" not in spec:
        raise ValueError(f"{what}: expected an int, {{dist: uniform, low, high}}, "
                         f"{{dist: lognormal, mean, sigma}} or {{trace: name}}, got {spec!r}")
    dist = spec["dist"]
    if dist == "uniform":
        low, high = int(spec["low"]), int(spec["high"])
        if not 1 <= low <= high:
            raise ValueError(f"{what}: need 1 <= low <= high, got low={low}, high={high}")
        return lambda n: rng.integers(low, high, n, endpoint=True, dtype=np.int64)
    if dist == "lognormal":
        mean, sigma = float(spec["mean"]), float(spec["sigma"])
        if mean <= 0 or sigma < 0:
            raise ValueError(f"{what}: lognormal needs mean > 0 and sigma >= 0")
        mu = np.log(mean) - sigma ** 2 / 2  # so that the lengths themselves average `mean`
        return lambda n: np.maximum(np.rint(rng.lognormal(mu, sigma, n)), 1).astype(np.int64)
    raise ValueError(f"{what}: unknown dist {dist!r}; use uniform or lognormal")


# --------------------------------------------------------------------------------------------
# Small helpers
# --------------------------------------------------------------------------------------------

def _rng(seed, stream) -> np.random.Generator:
    if seed is None:
        return np.random.default_rng()
    return np.random.default_rng([int(stream), int(seed)])


def _check_arrival_options(qps, arrival, cv, burst=None):
    if qps is not None and not qps > 0:
        raise ValueError(f"qps must be > 0, got {qps}")
    if arrival not in ARRIVALS:
        raise ValueError(f"unknown arrival process {arrival!r}; use one of {ARRIVALS}")
    if (burst is not None) != (arrival == "onoff"):
        raise ValueError(f"burst={burst!r}: (on_s, off_s) is needed by arrival=onoff and "
                         "read by nothing else")
    if burst is not None and not (len(burst) == 2 and all(x > 0 for x in burst)):
        raise ValueError(f"burst={burst!r}: must be (on_s > 0, off_s > 0)")
    if not cv > 0:
        raise ValueError(f"cv must be > 0, got {cv}")
    if arrival == "poisson" and cv != 1.0:
        logger.warning("cv=%s is ignored for poisson arrivals (their CV is 1); use "
                       "arrival=gamma", cv)


def _check_filters(max_total, max_prompt):
    for name, v in (("max_total_tokens", max_total), ("max_prompt_tokens", max_prompt)):
        if v is not None and v < 1:
            raise ValueError(f"{name} must be >= 1 or None, got {v}")


def _is_missing(x) -> bool:
    return x is None or (isinstance(x, float) and np.isnan(x))


def _to_plain_dict(cfg) -> dict:
    cfg = plain(cfg)
    if not isinstance(cfg, Mapping):
        raise TypeError(f"trace config must be a mapping, got {type(cfg).__name__}")
    return dict(cfg)
