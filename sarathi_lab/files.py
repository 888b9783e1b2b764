"""Writing result files so that a reader never takes a partial file for a finished one."""
from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path


def atomic_write(path, write) -> None:
    """`write(tmp)` fills a temporary file beside `path`, which is then renamed onto `path`: a
    crash, a full disk or a kill mid-write leaves the old file (or none), never a partial one.
    The temporary name is unique per writer (pid and a random part), so two processes writing
    the same path never write into each other's file; a failed write removes its own."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):   # the original error is the one worth reporting
            tmp.unlink(missing_ok=True)
        raise
