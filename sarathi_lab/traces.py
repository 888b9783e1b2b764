"""Request traces: load real ones, generate synthetic ones, turn either into Requests.

Every trace ends up as one DataFrame shape, whatever its source:

    arrival_time       float seconds, first request at 0.0, ascending
    num_prompt_tokens  int64 (> 0)
    num_output_tokens  int64 (>= 0)
    prompt_token_ids   lists of ints; only when the source carries them

Formats are recognised by their columns, not by file names, so a user's own trace in one of the
known layouts loads without any configuration:

    Azure LLM inference 2023/2024   TIMESTAMP, ContextTokens, GeneratedTokens
    Vidur / Splitwise trace replay   arrived_at, num_prefill_tokens, num_decode_tokens
    length-only (Vidur, Sarathi)     num_prefill_tokens, num_decode_tokens (arrivals generated)
    JSONL                            prompt_token_ids or prompt, output_len, optional arrival_time

Any of them may be gzip-compressed. Randomness comes from separate seeded streams (arrivals,
prompt lengths, output lengths, token ids), so changing one knob, say the length distribution,
leaves the arrival times of the same seed unchanged.
"""
from __future__ import annotations

import gzip
import json
import logging
import os
from collections.abc import Mapping
from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd

from sarathi_lab.config import plain
from sarathi_lab.request import Request

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
ARRIVALS = ("poisson", "gamma")
COLUMNS = ["arrival_time", "num_prompt_tokens", "num_output_tokens"]

# Independent random streams, so one knob does not reshuffle the others.
_ARRIVAL_STREAM, _PROMPT_STREAM, _OUTPUT_STREAM, _IDS_STREAM = range(4)

# Rows per read when only the head of a (possibly huge, e.g. Azure 2024) trace is needed.
_CHUNK_ROWS = 1 << 16


# --------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------

def load_trace(path, *, num_requests=None, qps=None, arrival="poisson", cv=1.0,
               max_total_tokens=None, max_prompt_tokens=None, seed=0,
               tokenizer=None) -> pd.DataFrame:
    """Load a shipped trace (by name) or a trace file.

    The length filters are applied first, then the first ``num_requests`` survivors are kept;
    ``df.attrs["dropped"]`` counts the rows the filters skipped among the rows read to get them.
    ``qps`` re-times a timestamped trace (inter-arrival gaps scaled to that mean rate, burstiness
    kept) and is required for a length-only trace, whose arrivals are then drawn from ``arrival``
    (``poisson``, or ``gamma`` with coefficient of variation ``cv``). ``tokenizer`` (a local path
    or a tokenizer object) is only needed for a JSONL trace that holds prompt text.
    """
    _check_arrival_options(qps, arrival, cv)
    _check_filters(max_total_tokens, max_prompt_tokens)
    if num_requests is not None:
        if int(num_requests) < 1:
            raise ValueError(f"num_requests must be >= 1 or None, got {num_requests}")
        num_requests = int(num_requests)
    src = resolve_trace(path)
    if _is_json(src):
        raw = _read_jsonl(src, tokenizer)
    else:
        raw = _read_csv(src, num_requests, max_total_tokens, max_prompt_tokens)
    timed = raw.attrs["format"] != "lengths"
    if not timed and qps is None:
        raise ValueError(
            f"trace {src} has token lengths but no arrival times; give qps (req/s) so that "
            "arrivals can be generated")

    df, dropped = _select(raw, src, num_requests, max_total_tokens, max_prompt_tokens)
    if timed:
        t = df["arrival_time"].to_numpy()
        t = (t - t[0]) / 1e9 if t.dtype.kind == "i" else t - t[0]  # Azure: int nanoseconds
        if qps is not None:
            t = _retime(t, qps, src)
    else:
        t = _arrival_times(len(df), qps, arrival, cv, _rng(seed, _ARRIVAL_STREAM))
    df["arrival_time"] = t
    df.attrs.update(source=str(src), format=raw.attrs["format"], dropped=dropped)
    return df


def synthetic_trace(num_requests, qps, *, arrival="poisson", cv=1.0, prompt_len=512,
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
    _check_arrival_options(qps, arrival, cv)
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
        "arrival_time": _arrival_times(n, qps, arrival, cv, _rng(seed, _ARRIVAL_STREAM)),
        "num_prompt_tokens": np.concatenate(prompts).astype(np.int64),
        "num_output_tokens": np.concatenate(outputs).astype(np.int64),
    })
    df.attrs.update(source="synthetic", format="synthetic", dropped=dropped)
    return df


_CONFIG_KEYS = {"name", "path", "num_requests", "qps", "arrival", "cv", "max_total_tokens",
                "max_prompt_tokens", "seed", "prompt_len", "output_len", "tokenizer"}


def build_trace(cfg) -> pd.DataFrame:
    """Build the trace a ``configs/trace/*.yaml`` entry describes (DictConfig or dict)."""
    cfg = _to_plain_dict(cfg)
    unknown = sorted(set(cfg) - _CONFIG_KEYS)
    if unknown:
        # A warning, not an error: other config groups may extend this schema.
        logger.warning("trace config: ignoring unknown keys %s (known: %s)", unknown,
                       sorted(_CONFIG_KEYS))
    common = dict(
        qps=cfg.get("qps"),
        arrival=cfg.get("arrival") or "poisson",
        cv=1.0 if cfg.get("cv") is None else cfg["cv"],
        max_total_tokens=cfg.get("max_total_tokens"),
        max_prompt_tokens=cfg.get("max_prompt_tokens"),
        seed=0 if cfg.get("seed") is None else cfg["seed"],
    )
    if cfg.get("path") is None:
        for key in ("num_requests", "qps", "prompt_len", "output_len"):
            if cfg.get(key) is None:
                raise ValueError(f"a synthetic trace config (path: null) needs {key!r}")
        df = synthetic_trace(cfg["num_requests"], prompt_len=cfg["prompt_len"],
                             output_len=cfg["output_len"], **common)
    else:
        df = load_trace(cfg["path"], num_requests=cfg.get("num_requests"),
                        tokenizer=cfg.get("tokenizer"), **common)
    df.attrs["name"] = cfg.get("name") or str(cfg.get("path") or "synthetic")
    return df


def to_requests(df: pd.DataFrame, max_tokens=None) -> list[Request]:
    """One Request per row; request ids are row positions 0..N-1. A row with 0 output tokens
    becomes a 1-token request: the forward pass over a prompt always yields a first token
    (a warning counts them)."""
    arrival = df["arrival_time"].to_numpy(dtype=np.float64)
    prompt = df["num_prompt_tokens"].to_numpy(dtype=np.int64)
    output = df["num_output_tokens"].to_numpy(dtype=np.int64)
    if (output < 1).any():
        logger.warning("%s: %d requests with 0 output tokens run as 1-token requests",
                    df.attrs.get("source", "trace"), int((output < 1).sum()))
        output = np.maximum(output, 1)
    ids = df["prompt_token_ids"].tolist() if "prompt_token_ids" in df else [None] * len(df)
    requests = []
    for i in range(len(df)):
        tokens = None if _is_missing(ids[i]) else [int(t) for t in ids[i]]
        if tokens is not None and len(tokens) != prompt[i]:
            raise ValueError(f"row {i}: {len(tokens)} prompt_token_ids but "
                             f"num_prompt_tokens={prompt[i]}")
        requests.append(Request(request_id=i, arrival_time=float(arrival[i]),
                                num_prompt_tokens=int(prompt[i]), output_len=int(output[i]),
                                prompt_token_ids=tokens, max_tokens=max_tokens))
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


def _read_csv(src: Path, num_requests, max_total, max_prompt) -> pd.DataFrame:
    """Read, validate and normalise a CSV trace; only as many rows as the request needs."""
    try:
        reader = pd.read_csv(src, chunksize=_CHUNK_ROWS)
    except pd.errors.EmptyDataError:
        raise ValueError(f"trace {src} is empty (no header, no rows)") from None
    parts, offset, kept = [], 0, 0
    with reader:
        try:
            for chunk in reader:
                if not parts:
                    fmt, cols = _detect(chunk.columns, src)
                parts.append(_normalise(chunk, fmt, cols, src, offset))
                offset += len(chunk)
                if num_requests is not None:
                    last = parts[-1]
                    kept += int(_length_mask(last["num_prompt_tokens"].to_numpy(),
                                             last["num_output_tokens"].to_numpy(),
                                             max_total, max_prompt).sum())
                    if kept >= num_requests:
                        break
        except (pd.errors.ParserError, UnicodeDecodeError) as e:   # not a CSV at all
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


def _detect(columns, src):
    """Pick the format whose columns are all present (names matched ignoring case/blanks)."""
    found = {str(c).strip().lower(): c for c in columns}
    for fmt, *needed in _CSV_FORMATS:
        wanted = [c for c in needed if c is not None]
        if all(c.lower() in found for c in wanted):
            return fmt, [None if c is None else found[c.lower()] for c in needed]
    accepted = " | ".join("(" + ", ".join(c for c in need if c) + ")"
                          for _, *need in _CSV_FORMATS)
    raise ValueError(f"trace {src}: missing required columns; it needs one of {accepted}, "
                     f"but its columns are ({', '.join(map(str, columns))})")


def _normalise(chunk, fmt, cols, src, offset) -> pd.DataFrame:
    time_col, prompt_col, output_col = cols
    out = pd.DataFrame({
        "num_prompt_tokens": _lengths(chunk[prompt_col], prompt_col, src, offset),
        "num_output_tokens": _lengths(chunk[output_col], output_col, src, offset),
    })
    _check_prompts(out["num_prompt_tokens"].to_numpy(), prompt_col, src, offset)
    if fmt == "azure":
        out.insert(0, "arrival_time", _timestamps(chunk[time_col], time_col, src, offset))
    elif fmt == "vidur":
        t = pd.to_numeric(chunk[time_col], errors="coerce").to_numpy(dtype=np.float64)
        _first_bad(~np.isfinite(t), chunk[time_col], time_col, src, offset,
                   "is not a time in seconds")
        out.insert(0, "arrival_time", t)
    return out


def _lengths(col: pd.Series, name, src, offset) -> np.ndarray:
    """Token counts as int64; anything else is an error that points at the row."""
    v = pd.to_numeric(col, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    with np.errstate(invalid="ignore"):
        bad = ~np.isfinite(v) | (v < 0) | (v != np.floor(v))
    _first_bad(bad, col, name, src, offset, "is not a non-negative whole number of tokens")
    return v.astype(np.int64)


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
        row = offset + i + 1
        raise ValueError(f"trace {src}: data row {row} (line {row + 1} of the file, counting the "
                         f"header as line 1), column {name!r}: {value!r} {what}")


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
    opener = gzip.open if src.name.lower().endswith(".gz") else open
    ids, texts, outputs, times, lines = [], {}, [], [], []
    with opener(src, "rt", encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if line.strip():
                tokens, text, out, t = _parse_json_line(line, src, lineno)
                if text is not None:
                    texts[len(ids)] = text
                ids.append(tokens)
                outputs.append(out)
                times.append(t)
                lines.append(lineno)
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
    """-> (token ids or None, prompt text or None, output_len, arrival_time or None)."""
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
    if not (_is_int(out) and out >= 0):
        raise bad(f"output_len must be a non-negative int, got {out!r}")
    t = obj.get("arrival_time")
    if t is not None and not ((_is_int(t) or isinstance(t, float)) and np.isfinite(t)):
        raise bad(f"arrival_time must be a number of seconds, got {t!r}")
    return tokens, text, out, t


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


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


def _arrival_times(n, qps, arrival, cv, rng) -> np.ndarray:
    """n arrival times, the first at 0.0, with independent gaps of mean 1 / qps."""
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


def _check_arrival_options(qps, arrival, cv):
    if qps is not None and not qps > 0:
        raise ValueError(f"qps must be > 0, got {qps}")
    if arrival not in ARRIVALS:
        raise ValueError(f"unknown arrival process {arrival!r}; use one of {ARRIVALS}")
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
