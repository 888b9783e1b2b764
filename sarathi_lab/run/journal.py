"""A served session's journal: what `sarathi-lab-serve` has finished, on disk as it goes, so a
crash (kill -9, an out-of-memory kill, a power cut of the host process) loses only the requests
in flight; `recover` turns a journal whose session never wrote its summary into a run
directory that `sarathi-lab-report` reads, marked partial.

Layout, in the run directory's ``journal/``: ``session.json`` (written once at start-up: the
summary of the session with no requests, and what `metrics.summarize` needs besides the
tables), ``requests.jsonl`` (one line per ended request, appended and flushed when it ends),
``iterations.jsonl`` (the iterations, appended in batches at most every `ITERATIONS_EVERY_S`
seconds when a request ends, and at a clean stop). A clean stop writes the run directory's
usual files and removes the journal.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import time
from pathlib import Path

from sarathi_lab.request import Request, Status
from sarathi_lab.run import rundir

JOURNAL = "journal"
SESSION = "session.json"
REQUESTS = "requests.jsonl"
ITERATIONS = "iterations.jsonl"
# a request's slots not written: hashes of its KV blocks, a simulator's planned answer
_SKIP = frozenset({"block_hashes", "_planned_ids"})
_FIELDS = tuple(s for s in Request.__slots__ if s not in _SKIP)
ITERATIONS_EVERY_S = 1.0


class Journal:
    """The writer, in the process that owns the engine. `start(summary, summarize_args,
    iteration_columns)` once; `ended(reqs, output_lens)` after each step that ended requests;
    `iterations(columns)` with `Engine.iteration_columns()` (only the rows not yet written are
    appended)."""

    def __init__(self, run_dir):
        self.dir = Path(run_dir) / JOURNAL
        self.dir.mkdir(parents=True, exist_ok=True)
        self._req = open(self.dir / REQUESTS, "a", encoding="utf-8")
        self._it = open(self.dir / ITERATIONS, "a", encoding="utf-8")
        self._rows = 0
        self._last = time.monotonic()

    def start(self, summary: dict, summarize_args: dict, iteration_columns: dict) -> None:
        """`iteration_columns`: {name: numpy dtype name} of the iterations table."""
        rundir.write_json(self.dir / SESSION, {
            "summary": summary, "summarize": summarize_args,
            "iteration_columns": iteration_columns,
            "writer": {"host": socket.gethostname(), "pid": os.getpid()}})

    def ended(self, reqs, output_lens: dict) -> None:
        """Requests that ended (finished or rejected): one line each, flushed now (a process
        killed after this keeps them: the lines are in the kernel's buffers)."""
        lines = []
        for r in reqs:
            d = {f: getattr(r, f) for f in _FIELDS}
            d["status"] = int(r.status)
            d["output_len"] = output_lens.get(r.request_id)
            lines.append(json.dumps(d, default=str))
        self._req.write("\n".join(lines) + "\n")
        self._req.flush()

    def due(self) -> bool:
        return time.monotonic() - self._last >= ITERATIONS_EVERY_S

    def iterations(self, cols: dict) -> None:
        names = list(cols)
        n = len(cols[names[0]]) if names else 0
        if n > self._rows:
            if self._rows == 0:
                self._it.write(json.dumps(names) + "\n")
            rows = zip(*(cols[c][self._rows:].tolist() for c in names))
            self._it.write("".join(json.dumps(r) + "\n" for r in rows))
            self._it.flush()
            self._rows = n
        self._last = time.monotonic()

    def close(self, remove: bool = False) -> None:
        self._req.close()
        self._it.close()
        if remove:
            shutil.rmtree(self.dir, ignore_errors=True)


def _jsonl(path: Path) -> list:
    """The lines of a journal file; a last line cut short by the crash is dropped."""
    if not path.exists():
        return []
    out = []
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    for i, ln in enumerate(lines):
        if not ln.strip():
            continue
        try:
            out.append(json.loads(ln))
        except ValueError:
            if i == len(lines) - 1:
                break   # the line being written when the process died
            raise ValueError(f"{path}: line {i + 1} is not JSON") from None
    return out


def partial_dirs(paths) -> tuple[list[Path], list[Path]]:
    """(ended, live): the run directories below `paths` with a journal and no summary.json,
    those of sessions that did not stop cleanly, and those whose writer still runs (same host,
    its process alive: a session still serving)."""
    found = set()
    for p in map(Path, paths):
        if (p / JOURNAL / SESSION).exists():
            found.add(p)
        elif p.is_dir():
            found.update(s.parent.parent for s in p.rglob(f"{JOURNAL}/{SESSION}"))
    ended, live = [], []
    for d in sorted(found):
        if not (d / rundir.SUMMARY).exists():
            (live if writer_alive(d) else ended).append(d)
    return ended, live


def writer_alive(d: Path) -> bool:
    """Whether the process that writes run directory `d`'s journal still runs (on this host;
    a zombie, ended but not yet reaped by its new parent, does not)."""
    try:
        w = rundir.read_json(d / JOURNAL / SESSION).get("writer") or {}
    except ValueError:   # cut short as it was written: the session never served
        return False
    pid = w.get("pid")
    if w.get("host") != socket.gethostname() or not isinstance(pid, int):
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
    except (OSError, IndexError):   # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:   # someone else's process
            return True
        return True


def recover(run_dir) -> dict:
    """Write the run directory of a session that left only its journal: the requests that ended
    and the iterations written before the crash, the summary marked ``served.partial``.
    Returns the summary."""
    from sarathi_lab.metrics import iterations_table, requests_table, summarize
    run_dir = Path(run_dir)
    j = run_dir / JOURNAL
    session = rundir.read_json(j / SESSION)
    reqs, lens = [], {}
    for d in _jsonl(j / REQUESTS):
        r = Request.__new__(Request)
        for f in _FIELDS:
            setattr(r, f, d.get(f))
        r.status = Status(d["status"])
        r.block_hashes, r._planned_ids = [], None
        lens[r.request_id] = d.get("output_len")
        reqs.append(r)
    reqs.sort(key=lambda r: r.request_id)
    rows = _jsonl(j / ITERATIONS)
    import numpy as np
    dtypes = session["iteration_columns"]
    names = rows[0] if rows else list(dtypes)
    data = np.array(rows[1:], float).reshape(-1, len(names))
    cols = {c: data[:, i].astype(dtypes[c]) for i, c in enumerate(names)}
    req_df, it_df = requests_table(reqs, lens), iterations_table(cols)
    summary = dict(session["summary"])
    summary.update(summarize(req_df, it_df, **session["summarize"]))
    summary["served"] = {**summary.get("served", {}), "partial": {
        "why": "the session did not stop cleanly: recovered from its journal; the requests in "
               "flight when it stopped are lost, the iterations after the last flush too",
        "requests_recovered": len(reqs), "iterations_recovered": len(it_df)}}
    rundir.write_parquet(run_dir / rundir.REQUESTS, req_df)
    rundir.write_parquet(run_dir / rundir.ITERATIONS, it_df)
    rundir.write_json(run_dir / rundir.SUMMARY, summary)
    return summary
