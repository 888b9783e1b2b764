"""No module outside the engine touches an engine's private state.

The engine's private names are those its own modules define on it: every `self._name` that
`Engine` (engine/core.py) and the fast-forward runs it inherits (engine/fast_forward.py) read, write or
define as a method. Any other module of the package that reads or writes `<x>._name` with one of
those names, on anything but its own `self`/`cls`, or passes it to getattr/setattr/hasattr/delattr,
is reported: a topology, the server's worker or the run layer moves an engine only through its
public calls (`advance`, `wake`, `add_request`, ...). A name another class uses for its own state
(a fleet's `self._where`) is not flagged: it is read on `self`.
"""
from __future__ import annotations

import ast
from pathlib import Path

import sarathi_lab

PKG = Path(sarathi_lab.__file__).parent
ENGINE_MODULES = ("engine/core.py", "engine/fast_forward.py")   # sarathi_lab/<these>: the engine
OWN = ("self", "cls")


def private_names(paths) -> set[str]:
    names = set()
    for path in paths:
        tree = ast.parse(path.read_text())
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)
                    and n.name in ("Engine", "FastForwardRuns")):
            for node in ast.walk(cls):
                if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                        and node.value.id == "self" and _private(node.attr):
                    names.add(node.attr)
                elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                        and _private(node.name):
                    names.add(node.name)
    return names


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def touches(source: str, names: set[str]) -> list[tuple[int, str]]:
    """(line, what) for every access of one of `names` on an object that is not `self`/`cls`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in names and not (
                isinstance(node.value, ast.Name) and node.value.id in OWN):
            found.append((node.lineno, f"{ast.unparse(node.value)}.{node.attr}"))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in ("getattr", "setattr", "hasattr", "delattr") \
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) \
                and node.args[1].value in names:
            found.append((node.lineno, f"{node.func.id}(..., {node.args[1].value!r})"))
    return found


def engine_private_names() -> set[str]:
    return private_names(PKG / m for m in ENGINE_MODULES)


def test_the_engine_has_private_state_to_protect():
    names = engine_private_names()
    # the state the topologies used to write (`Single.submit`: blocked and the resume point)
    # and what fast-forward keeps between calls are among them
    assert {"_blocked", "_decoding", "_step", "_fast_forward", "_runs"} <= names


def test_no_module_outside_the_engine_touches_its_private_attributes():
    names = engine_private_names()
    bad = []
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG)
        if str(rel) in ENGINE_MODULES:
            continue
        bad += [f"sarathi_lab/{rel}:{line}: {what}"
                for line, what in touches(path.read_text(), names)]
    assert not bad, "private engine state touched outside the engine:\n" + "\n".join(bad)


def test_the_scan_finds_the_writes_it_forbids():
    """A mutant: what `Single.submit` used to inline (Engine.wake and a reset of the resume
    point, written on the engine from outside) is reported, and so is a getattr by name."""
    names = engine_private_names()
    mutant = ("def submit(self, req, t):\n"
              "    e = self.engines[0]\n"
              "    e._blocked = False\n"
              "    self.engines[0]._decoding = False\n"
              "    getattr(e, '_runs')\n"
              "    self._blocked = True\n")   # its own attribute of that name: not flagged
    assert [line for line, _ in touches(mutant, names)] == [3, 4, 5]
