"""What a cell of a report table holds: a value read back from a column with gaps. Below the
tables, the seed statistics and the plots, which all read cells."""
from __future__ import annotations

import numpy as np


def plain(v):
    """A column with gaps turns ints into floats: 256.0 reads as 256."""
    return int(v) if isinstance(v, float) and v.is_integer() else v


def missing(v) -> bool:
    return v is None or (isinstance(v, float) and np.isnan(v))
