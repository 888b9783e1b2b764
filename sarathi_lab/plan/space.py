"""The deployment space: which configurations a plan compares, and each one's exact config.

A `Candidate` is one point of hardware x layout (executor settings: tensor_parallel,
pipeline_parallel, expert_parallel where the executor has it, ...) x split (colocated, or a P:D
disaggregated unit) x policy x token budget; the number of units (replicas, or P:D groups) is
searched, not enumerated. Its config is `sarathi-lab`'s, composed once per group choice (hardware,
policy, cluster) and then given its settings by key, so that each candidate costs no Hydra
composition; the same settings, written as overrides, are the command that reproduces it."""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import itertools
import json
import re

from sarathi_lab.settings import ConfigError

# set by the space, so not by the user's own overrides
SPACE_GROUPS = ("hardware", "scheduler", "cluster", "mode")
SPLIT = re.compile(r"^(\d+):(\d+)$")


@dataclasses.dataclass(frozen=True)
class Candidate:
    hardware: str
    layout: tuple[tuple[str, int], ...]   # (executor key, value), in the space's order
    split: tuple[int, int] | None         # (prefill, decode) replicas per unit; None: colocated
    policy: str
    token_budget: int | None              # None: the policy does not read it

    def label(self) -> str:
        lay = " ".join(f"{_short(k)}{v}" for k, v in self.layout)
        split = "colocated" if self.split is None else f"disagg {self.split[0]}:{self.split[1]}"
        budget = "" if self.token_budget is None else f"/{self.token_budget}"
        return f"{self.hardware} {lay} {split} {self.policy}{budget}"

    def groups(self) -> list[str]:
        return [f"hardware={self.hardware}", f"scheduler={self.policy}"] + \
            (["cluster=disagg"] if self.split else [])

    def settings(self, units: int, price: float) -> list[tuple[str, object]]:
        """(dotted key, value) of this candidate with `units` units, besides its groups."""
        out = [(f"executor.{k}", v) for k, v in self.layout]
        if self.token_budget is not None:
            out.append(("scheduler.token_budget", self.token_budget))
        if self.split is None:
            out.append(("cluster.num_replicas", units))
        else:
            out += [("cluster.prefill.num_replicas", self.split[0] * units),
                    ("cluster.decode.num_replicas", self.split[1] * units)]
        out.append(("hardware.price_per_gpu_hour", price))
        return out

    def replicas(self, units: int) -> int:
        return units * (1 if self.split is None else sum(self.split))


def _short(key: str) -> str:
    """tensor_parallel -> tp, pipeline_parallel -> pp, expert_parallel -> ep; others as named."""
    return {"tensor_parallel": "tp", "pipeline_parallel": "pp",
            "expert_parallel": "ep"}.get(key, key + "=")


def override(key: str, value) -> str:
    """`key=value` as Hydra parses it back to `value`."""
    if isinstance(value, bool):
        return f"{key}={str(value).lower()}"
    if isinstance(value, float):
        return f"{key}={value!r}"
    return f"{key}={value}"


def set_key(c: dict, key: str, value) -> None:
    """Set dotted `key` of the plain config `c`; an error when the key is not one of its settings
    (as Hydra would refuse `key=value` for a key the config does not have)."""
    *path, last = key.split(".")
    node = c
    for part in path:
        node = node.get(part) if isinstance(node, dict) else None
    if not isinstance(node, dict) or last not in node:
        raise ConfigError(f"{key}: not a setting of this configuration")
    node[last] = value


def _list(space: dict, key: str) -> list:
    v = space.get(key)
    if not isinstance(v, list) or not v:
        raise ConfigError(f"plan.space.{key}={v!r}: must be a non-empty list")
    return v


def parse_split(s) -> tuple[int, int] | None:
    if s == "colocated":
        return None
    m = SPLIT.match(str(s))
    if not m or int(m[1]) < 1 or int(m[2]) < 1:
        raise ConfigError(f"plan.space.split: {s!r} must be colocated or P:D (prefill:decode "
                          "replicas per unit, each >= 1, e.g. 1:2)")
    return int(m[1]), int(m[2])


def candidates(space: dict, reads_budget, executor_keys: set[str]) -> list[Candidate]:
    """Every candidate of `space` (the plan.space node). `reads_budget(policy)`: whether that
    policy reads scheduler.token_budget (the others get one candidate, without a budget);
    `executor_keys`: the executor's settings, which the layout's keys must be."""
    hardware, policies = _list(space, "hardware"), _list(space, "policy")
    splits = [parse_split(s) for s in _list(space, "split")]
    budgets = _list(space, "token_budget")
    layout = space.get("layout")
    if not isinstance(layout, dict) or not layout:
        raise ConfigError(f"plan.space.layout={layout!r}: must map executor settings to lists "
                          "of values (tensor_parallel: [1, 2], ...)")
    for k, values in layout.items():
        if k not in executor_keys:
            raise ConfigError(f"plan.space.layout.{k}: executor.{k} is not a setting of this "
                              f"executor (its settings: {', '.join(sorted(executor_keys))})")
        if not isinstance(values, list) or not values or \
                not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in values):
            raise ConfigError(f"plan.space.layout.{k}={values!r}: must be a non-empty list of "
                              "integers >= 1")
    mr = space.get("max_replicas")
    if not isinstance(mr, int) or isinstance(mr, bool) or mr < 1:
        raise ConfigError(f"plan.space.max_replicas={mr!r}: must be an integer >= 1")
    for b in budgets:
        if not isinstance(b, int) or isinstance(b, bool) or b < 1:
            raise ConfigError(f"plan.space.token_budget: {b!r} must be an integer >= 1")
    out = []
    layouts = [tuple(zip(layout, vals)) for vals in itertools.product(*layout.values())]
    for hw, lay, split, pol in itertools.product(hardware, layouts, splits, policies):
        for b in (budgets if reads_budget(pol) else [None]):
            out.append(Candidate(hw, lay, split, pol, b))
    return out


class Composer:
    """`sarathi-lab`'s config for a candidate: composed once per group choice (the user's
    overrides + the candidate's groups), then the candidate's settings set by key."""

    def __init__(self, base: list[str]):
        for o in base:
            key = o.split("=", 1)[0].lstrip("+~")
            if key in SPACE_GROUPS:
                where = {"hardware": "plan.space.hardware", "scheduler": "plan.space.policy",
                         "cluster": "plan.space.split", "mode": "the plan (mode=capacity)"}
                raise ConfigError(f"{o}: chosen by {where[key]}, not on the command line")
        self.base = list(base)
        self._cache: dict[tuple, dict] = {}

    def composed(self, groups: list[str]) -> dict:
        from sarathi_lab.sweeps.bookkeeping import compose_config
        key = tuple(groups)
        if key not in self._cache:
            self._cache[key] = compose_config(self.base + ["mode=capacity"] + groups)
        return self._cache[key]

    def config(self, cand: Candidate, units: int, price: float,
               extra: list[tuple[str, object]] = ()) -> tuple[dict, list[str]]:
        """(config, overrides): the config `sarathi-lab <overrides>` runs."""
        groups = cand.groups()
        settings = cand.settings(units, price) + list(extra)
        c = copy.deepcopy(self.composed(groups))
        for k, v in settings:
            set_key(c, k, v)
        return c, self.base + ["mode=capacity"] + groups + [override(k, v) for k, v in settings]


def with_settings(c: dict, overrides: list[str], settings: list[tuple[str, object]]
                  ) -> tuple[dict, list[str]]:
    """A copy of (config, overrides) with `settings` set: an override of the same key (also
    written `+key=` or `++key=`) is replaced where it stands, so that the command holds each
    key once; the others are appended."""
    c = copy.deepcopy(c)
    new = {k: override(k, v) for k, v in settings}
    out, done = [], set()
    for o in overrides:
        key = o.split("=", 1)[0].lstrip("+~")
        if key in new:
            if key not in done:
                out.append(new[key])
                done.add(key)
        else:
            out.append(o)
    for k, v in settings:
        set_key(c, k, v)
        if k not in done:
            out.append(new[k])
            done.add(k)
    return c, out


def fingerprint(c: dict, load: float, method: str, requests_per_unit: int) -> str:
    """A short hash of what an evaluation depends on (its config without the run's name, the
    load, the method, the requests each unit replays): a rerun reuses a result only when they
    are the same. (The requests per unit are hashed apart from the config's trace.num_requests,
    so that evaluations written before a deployment's requests were scaled with its units are
    not taken for today's.)"""
    c = {k: v for k, v in c.items() if k not in ("name", "progress", "results_root")}
    blob = json.dumps([c, load, method, {"requests_per_unit": requests_per_unit}],
                      sort_keys=True, default=str)
    return hashlib.sha1(blob.encode()).hexdigest()[:10]


def slug(cand: Candidate) -> str:
    return re.sub(r"[^A-Za-z0-9_.=-]+", "_", cand.label().replace(":", "-").replace("/", "_b"))
