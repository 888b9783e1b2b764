"""Why requests were rejected, counted by kind (the reason with its numbers taken out)."""
from __future__ import annotations

import re

import pandas as pd

_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def rejection_kind(reason: str | None) -> str:
    """A rejection reason with its numbers replaced by N: reasons that differ only in lengths
    and sizes fall in one kind ("prompt of N tokens leaves no room ... max_model_len=N")."""
    if not reason:
        return "no reason given"
    return _NUMBER.sub("N", reason)


def rejections(req_df: pd.DataFrame) -> dict[str, int]:
    """Rejected requests per reason kind, the most frequent first."""
    rej = req_df.loc[req_df["status"] == "rejected", "rejection_reason"]
    counts = rej.map(rejection_kind).value_counts(sort=False)
    return {k: int(v) for k, v in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))}
