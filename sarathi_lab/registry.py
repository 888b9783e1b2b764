"""Find a plug-in class -- policy, executor, cost model, queue, router, budget controller -- by
registered name or by dotted path.

Names come from the entry-point groups below (a plug-in package registers its classes in its own
``pyproject.toml``) and, when the package runs from a source tree without its entry points
installed, from the built-in table. A dotted path (``pkg.module:Class`` or ``pkg.module.Class``)
loads any importable class without registering it.
"""
from __future__ import annotations

import functools
import importlib
from importlib.metadata import entry_points

GROUPS = {
    "scheduler": "sarathi_lab.schedulers",
    "executor": "sarathi_lab.executors",
    "cost model": "sarathi_lab.cost_models",
    "queue": "sarathi_lab.queues",
    "router": "sarathi_lab.routers",
    "controller": "sarathi_lab.controllers",
}

# The contract each kind of plug-in must subclass, named by dotted path like the plug-ins
# themselves: the registry loads classes by name and imports no module of the project, so it sits
# at the bottom of the layers (sarathi_lab/DESIGN.md, "Layers") and any layer may look a plug-in
# up: the policy contract its queue, the simulator its cost model.
CONTRACTS = {
    "scheduler": "sarathi_lab.schedulers.base:Policy",
    "executor": "sarathi_lab.executors.base:Executor",
    "cost model": "sarathi_lab.costmodels.base:CostModel",
    "queue": "sarathi_lab.schedulers.queues:RequestQueue",
    "router": "sarathi_lab.topology.routers:Router",
    "controller": "sarathi_lab.schedulers.controllers.base:BudgetController",
}

BUILTIN = {
    "sarathi_lab.schedulers": {
        "request_level": "sarathi_lab.schedulers.request_level:RequestLevel",
        "orca": "sarathi_lab.schedulers.orca:Orca",
        "vllm": "sarathi_lab.schedulers.vllm:VLLM",
        "sarathi": "sarathi_lab.schedulers.sarathi:Sarathi",
        "sarathi_priority": "sarathi_lab.schedulers.sarathi_priority:SarathiPriority",
        "edf": "sarathi_lab.schedulers.edf:EDF",
        "vtc": "sarathi_lab.schedulers.vtc:VTC",
    },
    "sarathi_lab.executors": {
        "sim": "sarathi_lab.executors.sim:SimExecutor",
        "torch": "sarathi_lab.executors.torch_exec:TorchExecutor",
    },
    "sarathi_lab.cost_models": {
        "roofline": "sarathi_lab.costmodels.roofline:RooflineCostModel",
        "profiled": "sarathi_lab.costmodels.profiled:ProfiledCostModel",
    },
    "sarathi_lab.queues": {
        "fcfs": "sarathi_lab.schedulers.queues:RequestQueue",
        "priority": "sarathi_lab.schedulers.queues:PriorityQueue",
        "edf": "sarathi_lab.schedulers.queues:DeadlineQueue",
        "spf": "sarathi_lab.schedulers.queues:ShortestPromptQueue",
    },
    "sarathi_lab.routers": {
        "round_robin": "sarathi_lab.topology.routers:RoundRobin",
        "least_loaded": "sarathi_lab.topology.routers:LeastLoaded",
        "power_of_two": "sarathi_lab.topology.routers:PowerOfTwo",
        "prefix_affinity": "sarathi_lab.topology.routers:PrefixAffinity",
    },
    "sarathi_lab.controllers": {
        "static": "sarathi_lab.schedulers.controllers.static:Static",
        "tbt_target": "sarathi_lab.schedulers.controllers.tbt_target:TBTTarget",
        "slack": "sarathi_lab.schedulers.controllers.slack:Slack",
        "slo_dp": "sarathi_lab.schedulers.controllers.slo_dp:SLODP",
    },
}


@functools.cache
def _registered() -> dict[str, dict[str, str]]:
    """Every group's entry points, from one scan of the installed distributions' metadata per
    process: a scan reads each one's entry_points.txt (a few hundred files), and a run looks
    up four plug-ins, a capacity search that many per probe."""
    every = entry_points()
    return {group: {ep.name: ep.value for ep in every.select(group=group)} for group in BUILTIN}


def known(group: str) -> dict[str, str]:
    return {**BUILTIN[group], **_registered()[group]}


def _import(target: str, what: str):
    if ":" in target:
        mod, attr = target.split(":", 1)
    else:
        mod, _, attr = target.rpartition(".")
    try:
        obj = importlib.import_module(mod)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as e:
        hint = ""
        if isinstance(e, ModuleNotFoundError) and mod.split(".")[0] == e.name:
            # the console scripts do not look in the current folder, unlike `python`
            hint = (f" (Python finds a plug-in module on PYTHONPATH: for {e.name}.py in the "
                    "current folder, run PYTHONPATH=$PWD sarathi-lab ...; "
                    "sarathi_lab/docs/plugins.md)")
        raise ValueError(f"cannot load {what} {target!r}: {e}{hint}") from e
    return obj


def resolve(what: str, name: str, base: type | None = None):
    """The class registered as `name` for `what` (a key of GROUPS), or at the dotted path
    `name`; checked to subclass `base` when given."""
    group = GROUPS[what]
    table = known(group)
    if not isinstance(name, str) or not name:
        raise ValueError(f"{what} name {name!r}: must be a registered name or a dotted path")
    if name in table:
        cls = _import(table[name], what)
    elif "." in name or ":" in name:
        cls = _import(name, what)
    else:
        raise ValueError(f"unknown {what} {name!r}; known: {', '.join(sorted(table))} "
                         "(or give a dotted path, e.g. my_pkg.module:MyClass)")
    if base is not None and not (isinstance(cls, type) and issubclass(cls, base)):
        raise ValueError(f"{what} {name!r} is {cls!r}, not a subclass of "
                         f"{base.__module__}.{base.__qualname__}")
    return cls


def _contract(what: str) -> type:
    """The class every `what` plug-in must subclass, loaded by its dotted path (`CONTRACTS`)."""
    return _import(CONTRACTS[what], f"{what} contract")


def policy_class(name: str):
    return resolve("scheduler", name, _contract("scheduler"))


def executor_class(name: str):
    return resolve("executor", name, _contract("executor"))


def cost_model_class(name: str):
    return resolve("cost model", name, _contract("cost model"))


def queue_class(name: str):
    return resolve("queue", name, _contract("queue"))


def router_class(name: str):
    return resolve("router", name, _contract("router"))


def controller_class(name: str):
    return resolve("controller", name, _contract("controller"))
