"""A cell of a report table read back from a column with gaps (a missing one: settings.missing).
Below the tables, the seed statistics and the plots, which all read cells."""
from __future__ import annotations


def plain(v):
    """A column with gaps turns ints into floats: 256.0 reads as 256."""
    return int(v) if isinstance(v, float) and v.is_integer() else v
