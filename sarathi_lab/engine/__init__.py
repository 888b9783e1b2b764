"""The engine: one GPU (or one replica) stepping on its own clock.

Modules, top to bottom: `core` (the `Engine`: admit, schedule, execute, update, record; its one
stepping call `advance(until)` returns what happened, an `Advanced`), `fast_forward` (the
engine's side of fast-forward: runs of identical iterations taken in one call, inside
`advance`), `guard` (`BatchGuard`: the rules every batch obeys, checked before it runs).
The names below are what the layers above use.
"""
from sarathi_lab.engine.core import (
    FLOAT_COLUMNS,
    HOST_COLUMN,
    ITER_COLUMNS,
    SPEC_COLUMNS,
    Advanced,
    Engine,
)

__all__ = ["FLOAT_COLUMNS", "HOST_COLUMN", "ITER_COLUMNS", "SPEC_COLUMNS", "Advanced", "Engine"]
