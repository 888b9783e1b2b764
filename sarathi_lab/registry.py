"""Find a policy or executor class by registered name (entry points) or dotted path."""
from __future__ import annotations

import importlib
from importlib.metadata import entry_points

# Fallback when the package runs from a source tree without its entry points installed.
BUILTIN = {
    "sarathi_lab.schedulers": {
        "request_level": "sarathi_lab.schedulers.request_level:RequestLevel",
        "orca": "sarathi_lab.schedulers.orca:Orca",
        "vllm": "sarathi_lab.schedulers.vllm:VLLM",
        "sarathi": "sarathi_lab.schedulers.sarathi:Sarathi",
    },
    "sarathi_lab.executors": {
        "sim": "sarathi_lab.executors.sim:SimExecutor",
        "torch": "sarathi_lab.executors.torch_exec:TorchExecutor",
    },
}


def known(group: str) -> dict[str, str]:
    names = dict(BUILTIN[group])
    names.update({ep.name: ep.value for ep in entry_points(group=group)})
    return names


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
        raise ValueError(f"cannot load {what} {target!r}: {e}") from e
    return obj


def resolve(group: str, name: str, what: str):
    """`name` is a registered name, or a dotted path `pkg.module:Class` / `pkg.module.Class`."""
    table = known(group)
    if name in table:
        return _import(table[name], what)
    if "." in name or ":" in name:
        return _import(name, what)
    raise ValueError(f"unknown {what} {name!r}; known: {', '.join(sorted(table))} "
                     "(or give a dotted path, e.g. my_pkg.module:MyClass)")


def policy_class(name: str):
    return resolve("sarathi_lab.schedulers", name, "scheduler")


def executor_class(name: str):
    return resolve("sarathi_lab.executors", name, "executor")
