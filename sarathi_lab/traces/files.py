"""Where a trace is (`resolve_trace`: a shipped name or a file) and how its bytes are read: UTF-8
text, gzip-compressed exactly when named ``.gz``; decoding errors name the file.
"""
from __future__ import annotations

import gzip
import io
import json
import os
import zlib
from importlib import resources
from pathlib import Path

# Shipped trace name -> file under sarathi_lab/data/traces (origins in ATTRIBUTION.md there).
SHIPPED = {
    "sharegpt": "sharegpt_8k_filtered_stats_llama2_tokenizer.csv.gz",
    "azure_conv": "AzureLLMInferenceTrace_conv.csv.gz",
    "azure_code": "AzureLLMInferenceTrace_code.csv.gz",
    "splitwise_conv": "splitwise_conv.csv.gz",
    "splitwise_code": "splitwise_code.csv.gz",
    # Vidur's file, clipped at prompt + output <= 4,096: `arxiv` (the name committed results
    # use) and `arxiv_4k` (the name that says so) are the same file
    "arxiv": "arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv.gz",
    "arxiv_4k": "arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv.gz",
    # FITTED to Sarathi-Serve's Table 2 (<= 16,384), not measured: experiments/paper_workloads
    "arxiv_16k_fitted": "arxiv_16k_fitted_table2.csv.gz",
    "mooncake": "mooncake_conversation_trace_head300.jsonl.gz",
}


_GZIP_MAGIC = b"\x1f\x8b"


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


def is_json(path: Path) -> bool:
    name = path.name.lower()
    return name.endswith((".jsonl", ".jsonl.gz"))


def is_gz(path: Path) -> bool:
    return path.name.lower().endswith(".gz")


def open_text(src: Path):
    """The trace as UTF-8 text, gunzipped when named .gz, after the checks that a file of the
    wrong kind fails with its name rather than deep inside a parser."""
    with open(src, "rb") as f:
        magic = f.read(2)
    if magic == _GZIP_MAGIC and not is_gz(src):
        raise ValueError(f"trace {src} holds gzip-compressed data but its name does not end in "
                         f".gz; rename it to {src.name}.gz")
    if is_gz(src) and magic != _GZIP_MAGIC:
        raise ValueError(f"trace {src} is named .gz but is not gzip-compressed; rename it "
                         "without the .gz")
    raw = gzip.open(src, "rb") if is_gz(src) else open(src, "rb")
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


def unreadable(src: Path, e: Exception) -> ValueError:
    """The error for a file that failed to decode: the first line that is not UTF-8, or the
    gzip stream's fault."""
    if not isinstance(e, UnicodeDecodeError):
        return ValueError(f"trace {src}: its gzip data is corrupt or truncated ({e})")
    with (gzip.open if is_gz(src) else open)(src, "rb") as f:
        for lineno, line in enumerate(f, 1):  # "\n" is never part of a multi-byte character
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as bad:
                return ValueError(f"trace {src}: line {lineno} is not UTF-8 text (byte "
                                  f"{line[bad.start]:#04x} at position {bad.start + 1}); save "
                                  "the file as UTF-8")
    return ValueError(f"trace {src} is not UTF-8 text ({e})")


# What failing to decode a file raises, from the codec or the gzip stream.
DECODE_ERRORS = (UnicodeDecodeError, EOFError, zlib.error, gzip.BadGzipFile)


def line_error(src: Path, lineno: int, msg: str) -> ValueError:
    """An error in line `lineno` of the JSONL trace `src`."""
    return ValueError(f"trace {src}: line {lineno}: {msg}")


def json_object(line: str, src: Path, lineno: int) -> dict:
    """One JSONL line as the object it must be; else an error naming the file and the line."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise line_error(src, lineno, f"not valid JSON ({e.msg})") from None
    if not isinstance(obj, dict):
        raise line_error(src, lineno, "expected a JSON object")
    return obj


def json_lines(src: Path):
    """(line number, line) for each non-blank line of the JSONL trace `src` (blank lines count
    in the numbering); a file that fails to decode is an error naming it (`unreadable`)."""
    try:
        with open_text(src) as f:
            for lineno, line in enumerate(f, 1):
                if line.strip():
                    yield lineno, line
    except DECODE_ERRORS as e:
        raise unreadable(src, e) from None
