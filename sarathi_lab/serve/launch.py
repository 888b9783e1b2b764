"""Waiting for a `sarathi-lab-serve` started in a subprocess: the address it bound is the line
it prints at start-up (command.py), the one place a script or a test learns a free port's number
(`serve.port=0`)."""
from __future__ import annotations

import re
import select
import subprocess
import time

# command.py's start-up line: "sarathi-lab-serve: serving 'NAME' on http://HOST:PORT/v1 (...)"
ADDRESS = re.compile(r": serving .* on (http://[^\s/]+:(\d+)/v1)")


def wait_for_address(proc: subprocess.Popen, timeout: float = 180) -> tuple[str, int, list[str]]:
    """(base URL, port, the lines read) once `proc` (text stdout piped) prints its address; a
    RuntimeError holding what it printed if it exits or `timeout` seconds pass first (it is
    killed then)."""
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while True:
        ready, _, _ = select.select([proc.stdout], [], [], 1.0)
        if ready:
            line = proc.stdout.readline()
            lines.append(line)
            m = ADDRESS.search(line)
            if m:
                return m.group(1), int(m.group(2)), lines
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            why = f"exited with {proc.returncode}" if proc.returncode is not None else \
                f"printed no address in {timeout:g} s"
            raise RuntimeError(f"sarathi-lab-serve {why}:\n{''.join(lines)}")
