"""CSV traces, recognised by their columns (Azure 2023/2024, Vidur/Splitwise replay, length-only),
read strictly (every bad cell is an error naming the file and the row), in chunks when only the
head is needed.
"""
from __future__ import annotations

import csv
import re
from pathlib import Path

import numpy as np
import pandas as pd

from sarathi_lab.traces.files import DECODE_ERRORS, is_gz, open_text, unreadable
from sarathi_lab.traces.filters import length_mask
from sarathi_lab.traces.frame import MAX_WHOLE, SERVICE_DEFAULTS, SERVICE_WHAT
from sarathi_lab.traces.precision import MAX_ARRIVAL_S

# (format, time column or None, prompt column, output column), tried in this order: a file with
# all three Vidur columns is a replay trace, not merely a length trace.
_CSV_FORMATS = (
    ("azure", "TIMESTAMP", "ContextTokens", "GeneratedTokens"),
    ("burstgpt", "Timestamp", "Request tokens", "Response tokens"),
    ("vidur", "arrived_at", "num_prefill_tokens", "num_decode_tokens"),
    ("lengths", None, "num_prefill_tokens", "num_decode_tokens"),
)


# Columns a format needs besides its time and lengths: BurstGPT's labels, which its filters
# (`select`) read, as its documented schema has them.
_LABELS = {"burstgpt": ("Model", "Log Type")}
_SELECT_KEYS = {"Model": "trace.models", "Log Type": "trace.log_types"}   # their settings


# Rows per read when only the head of a (possibly huge, e.g. Azure 2024) trace is needed.
_CHUNK_ROWS = 1 << 16


def read_csv(src: Path, num_requests, max_total, max_prompt, select=None) -> pd.DataFrame:
    """Read, validate and normalise a CSV trace; only as many rows as the request needs.
    `select` (BurstGPT only): {"Model": values, "Log Type": values}, the rows to keep (values
    matched ignoring case and surrounding blanks); None: all. A BurstGPT row of 0 response tokens
    (a failed call in its log) is dropped and counted (``attrs["failed"]``), and so is one of 0
    request tokens that has a response (``attrs["no_prompt"]``: no prompt to prefill)."""
    select = {k: v for k, v in (select or {}).items() if v is not None}
    try:
        header = _csv_header(src)
        fmt, cols = _detect(header, src)
        if select and fmt != "burstgpt":
            key = " and ".join(_SELECT_KEYS[c] for c in select)
            raise ValueError(f"{key}: read only for a BurstGPT trace (columns Timestamp, Model, "
                             f"Request tokens, Response tokens, Log Type); trace {src} is in the "
                             f"{fmt} format")
        burst = _BurstRows(src, _names(header, src), select) if fmt == "burstgpt" else None
        service = _service_columns(header, src)
        # Labels as written ("01" stays "01"); no cell is turned into NaN behind our back
        # ("NA" in a count is an error, an empty label the default).
        reader = pd.read_csv(src, chunksize=_CHUNK_ROWS, index_col=False, keep_default_na=False,
                             compression="gzip" if is_gz(src) else None, encoding="utf-8",
                             dtype={service[k]: str for k in ("tenant", "slo_class")
                                    if k in service})
        parts, offset, kept = [], 0, 0
        with reader:
            for chunk in reader:
                part = _normalise(chunk, fmt, cols, service, src, offset)
                parts.append(part if burst is None else burst.keep(chunk, part, offset))
                offset += len(chunk)
                if num_requests is not None:
                    last = parts[-1]
                    kept += int(length_mask(last["num_prompt_tokens"].to_numpy(),
                                             last["num_output_tokens"].to_numpy(),
                                             max_total, max_prompt).sum())
                    if kept >= num_requests:
                        break
    except DECODE_ERRORS as e:
        raise unreadable(src, e) from None
    except pd.errors.ParserError as e:
        m = re.search(r"Expected \d+ fields in line (\d+), saw (\d+)", str(e))
        if m:
            raise _too_many_fields(src, int(m[1]), int(m[2]), len(header)) from None
        raise ValueError(f"trace {src} is not a readable CSV: {e}") from None
    if not parts:  # a header and nothing else
        raise ValueError(f"trace {src} has a header but no requests")
    raw = pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]
    if burst is not None:
        burst.check(raw.empty, offset)
    if raw.empty:
        raise ValueError(f"trace {src} has a header but no requests")
    if fmt not in ("lengths", "burstgpt"):   # BurstGPT's are checked before its filters
        _check_sorted(raw["arrival_time"].to_numpy(), src)
    raw.attrs["format"] = fmt
    if burst is not None:
        raw.attrs.update(failed=burst.failed, no_prompt=burst.no_prompt,
                         filtered=burst.filtered)
    return raw


class _BurstRows:
    """BurstGPT's rows, chunk by chunk: times checked ascending over every row (filtered or
    not, so an error names the file's row), failed calls (0 response tokens, BurstGPT's mark of
    a failure) and rows of 0 request tokens (nothing to prefill) dropped and counted, and the
    `select` filters applied, remembering the label values seen for the errors."""

    def __init__(self, src, names: dict, select: dict):
        absent = [c for c in _LABELS["burstgpt"] if c.lower() not in names]
        if absent:
            raise ValueError(f"trace {src}: a BurstGPT trace needs the columns Timestamp, Model, "
                             f"Request tokens, Response tokens and Log Type; it lacks "
                             f"{', '.join(absent)}")
        self.src, self.cols = src, {c: names[c.lower()] for c in _LABELS["burstgpt"]}
        self.select = {c: {str(v).strip().lower() for v in vs} for c, vs in select.items()}
        self.asked = select
        self.seen: dict[str, set] = {c: set() for c in select}
        self.last, self.failed, self.no_prompt, self.filtered = None, 0, 0, 0

    def keep(self, chunk, part, offset) -> pd.DataFrame:
        t = part["arrival_time"].to_numpy()
        if self.last is not None and len(t) and t[0] < self.last:
            _check_sorted(np.array([self.last, t[0]]), self.src, offset - 1)
        _check_sorted(t, self.src, offset)
        if len(t):
            self.last = t[-1]
        answered = part["num_output_tokens"].to_numpy() > 0
        keep = answered & (part["num_prompt_tokens"].to_numpy() > 0)
        self.failed += int((~answered).sum())
        self.no_prompt += int((answered & ~keep).sum())
        for col, wanted in self.select.items():
            labels = chunk[self.cols[col]].astype(str).str.strip()
            self.seen[col].update(labels.unique())
            match = labels.str.lower().isin(wanted).to_numpy()
            self.filtered += int((keep & ~match).sum())
            keep &= match
        return part[keep]

    def check(self, none_kept: bool, rows: int) -> None:
        """Every value asked for matches a row read (a typo is an error, not an empty
        selection)."""
        for col, wanted in self.asked.items():
            seen = {v.lower() for v in self.seen[col]}
            lost = [v for v in wanted if str(v).strip().lower() not in seen]
            if lost:
                raise ValueError(
                    f"trace {self.src}: {col} {', '.join(map(repr, lost))} matches no row of "
                    f"the {rows} read; its {col} values there are "
                    f"{', '.join(sorted(self.seen[col])) or '(none)'}")
        if none_kept:
            why = " after the filters" if self.asked else ""
            raise ValueError(f"trace {self.src}: no request left{why} ({self.failed} of its rows "
                             f"have 0 response tokens, failed calls, and {self.no_prompt} have 0 "
                             "request tokens; both are dropped)")


def _csv_header(src: Path) -> list[str]:
    """The header's names. Checks the first data row's width here: given more fields than
    names, pandas silently makes the surplus leading ones an index and shifts every column."""
    with open_text(src) as f:
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
    """Service column -> its name in the file, for those present (and the per-request
    columns an executor reads, `EXECUTOR_COLUMNS`)."""
    found = _names(columns, src)
    return {k: found[k] for k in (*SERVICE_DEFAULTS, *EXECUTOR_COLUMNS) if k in found}


#: optional per-request columns kept for the executor, not the request: the simulator's
#: speculative decoding reads each request's draft acceptance rate (executor.acceptance=trace)
EXECUTOR_COLUMNS = {"acceptance_rate": "a probability in [0, 1] (a draft token's acceptance)"}


def _names(columns, src) -> dict:
    """Normalised name -> name, for the names this module reads; one of them twice is an
    error, since either column could be meant."""
    known = {c.lower() for _, *cs in _CSV_FORMATS for c in cs if c} | set(SERVICE_DEFAULTS) \
        | set(EXECUTOR_COLUMNS)
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
    if fmt != "burstgpt":   # BurstGPT's rows of 0 tokens are dropped and counted (_BurstRows)
        _check_prompts(out["num_prompt_tokens"].to_numpy(), prompt_col, src, offset)
    if fmt == "azure":
        out.insert(0, "arrival_time", _timestamps(chunk[time_col], time_col, src, offset))
    elif fmt == "vidur":
        out.insert(0, "arrival_time", _numbers(chunk[time_col], time_col, src, offset,
                                               "a time in seconds", np.isfinite))
    elif fmt == "burstgpt":
        out.insert(0, "arrival_time", _numbers(
            chunk[time_col], time_col, src, offset,
            f"a time in seconds, >= 0 and below {MAX_ARRIVAL_S:.6g} (2**33)",
            lambda v: (v >= 0) & (v < MAX_ARRIVAL_S)))
    for key, name in service.items():
        out[key] = _service_values(key, chunk[name], name, src, offset)
    return out


def _lengths(col: pd.Series, name, src, offset) -> np.ndarray:
    """Token counts as int64; anything else is an error that points at the row."""
    return _numbers(col, name, src, offset, "a non-negative whole number of tokens (< 2**53)",
                    lambda v: (v >= 0) & (v == np.floor(v)) & (v < MAX_WHOLE)).astype(np.int64)


def _service_values(key, col: pd.Series, name, src, offset) -> np.ndarray:
    """One service column of a CSV chunk, validated; empty cells get the default."""
    if key in EXECUTOR_COLUMNS:
        return _numbers(col, name, src, offset, EXECUTOR_COLUMNS[key],
                        lambda v: (v >= 0) & (v <= 1))
    what = SERVICE_WHAT[key]
    if key == "priority":
        return _numbers(col, name, src, offset, what,
                        lambda v: (v == np.floor(v)) & (np.abs(v) < MAX_WHOLE),
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


def _check_sorted(t, src, offset=0):
    """Times ascending; `offset`: data rows before t[0] in the file (a later chunk's)."""
    back = np.flatnonzero(np.diff(t) < 0)
    if len(back):
        j = int(back[0])
        i = offset + j + 1  # 0-based index in the file of the first row that arrives too early
        pair = t[j:j + 2]
        shown = pd.to_datetime(pair) if t.dtype.kind == "i" else pair
        raise ValueError(f"trace {src}: arrival times are not sorted ascending: data row {i + 1} "
                         f"(line {i + 2} of the file) arrives at {shown[1]}, before the previous "
                         f"request ({shown[0]})")
