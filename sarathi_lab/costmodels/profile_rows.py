"""What the profile readers (profiles.py, rewarm.py) share, below both: the error a profile
that cannot be used raises, a number read from one of its rows, and the pooling that makes
measured times monotone."""
from __future__ import annotations

import numpy as np


class ProfileError(ValueError):
    """A profile that cannot be read, or one made for another model, TP, dtype or device."""


def monotone(y) -> np.ndarray:
    """The nondecreasing sequence nearest to y in absolute deviation (isotonic regression by
    pooling adjacent violators, each pool at its median). Unlike a running maximum, one point
    measured while another job held the core (noise that only adds time) is outvoted by its
    neighbours instead of raising every larger point to it."""
    pools: list[list[float]] = []
    level: list[float] = []
    for v in np.asarray(y, dtype=float):
        pools.append([v])
        level.append(v)
        while len(pools) > 1 and level[-2] > level[-1]:
            last = pools.pop()
            pools[-1] += last
            level.pop()
            level[-1] = float(np.median(pools[-1]))
    return np.repeat(level, [len(p) for p in pools])


def number(row, key, where):
    v = row.get(key)
    try:
        return float(v)
    except (TypeError, ValueError):
        raise ProfileError(f"{where}: column {key!r} must be a number, got {v!r}") from None
