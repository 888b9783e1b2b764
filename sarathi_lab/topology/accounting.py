"""The end-of-run check every topology shares: each request of the load ended exactly once.

Each engine's own check (`Engine.finish`: nothing queued, swapped or running, no KV block held)
sees only what its policy's queues still hold. A plug-in that takes a request out of a queue
without rejecting it (a router that changes the replica it was told to read, a policy that
forgets a request) leaves it in no queue and never ended: the run would report it as neither
finished nor rejected and exit as if nothing happened. So after every run: every request the
load holds is finished or rejected, and every engine ended exactly the requests it took (no
request ended twice, or on an engine it was never given).
"""
from __future__ import annotations

from sarathi_lab.engine.guard import RuleViolation
from sarathi_lab.request import Status

_ENDED = (Status.FINISHED, Status.REJECTED)
SHOWN = 10   # request ids named per engine in the message


def plugin(obj) -> str:
    """A plug-in as messages name it: its registered name (if any) and its class."""
    cls = type(obj)
    path = f"{cls.__module__}.{cls.__qualname__}"
    name = getattr(obj, "name", "")
    return f"{name!r} ({path})" if name else path


def _ids(reqs) -> str:
    ids = [r.request_id for r in reqs[:SHOWN]]
    more = f" and {len(reqs) - SHOWN} more" if len(reqs) > SHOWN else ""
    return f"{ids}{more}"


def check_accounted(topology, requests) -> None:
    """RuleViolation unless every one of `requests` (the load's) is finished or rejected and
    every engine of `topology` ended as many requests as it took. The message names the
    topology (`describe`), each engine concerned with its policy, the requests and their
    status, and the topology's router if it has one."""
    named = topology.named_engines()
    problems = []
    left = [r for r in requests if r.status not in _ENDED]
    if not left:   # (a request left unended also leaves its engine's count short)
        for where, e in named:
            taken = len(e.output_lens)
            if e.num_done != taken:
                problems.append(f"{where} (policy {plugin(e.policy)}) took {taken} requests "
                                f"and ended {e.num_done}")
    else:
        by_engine: dict[str, list] = {}
        for r in left:   # the last engine that took it (a decode replica after its prefill one)
            where = next((f"{w} (policy {plugin(e.policy)})" for w, e in reversed(named)
                          if r.request_id in e.output_lens), "no engine (never sent)")
            by_engine.setdefault(where, []).append(r)
        for where, reqs in by_engine.items():
            status = sorted({r.status.name.lower() for r in reqs})
            problems.append(f"{where}: requests {_ids(reqs)} left {'/'.join(status)}, in no "
                            "queue")
    if not problems:
        return
    head = (f"the run on {topology.describe()} ended with "
            + (f"{len(left)} of {len(requests)} requests neither finished nor rejected"
               if left else "requests not accounted for"))
    raise RuleViolation(f"{head}: " + "; ".join(problems) + ". Every request ends finished "
                        "or rejected exactly once: a policy ends or rejects what it takes "
                        "(Policy.reject), and a router only reads the replicas it is shown "
                        "(routers.py)")
