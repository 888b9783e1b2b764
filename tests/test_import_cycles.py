"""No import cycles in the package: the graph of which module imports which, read from the source
(every import statement, inside functions too; not those under `if TYPE_CHECKING:`, which never
run), has no cycle. A cycle hidden in a function still makes the two modules one to understand
and to move, and the layer contract (tests/test_layers.py) only sees cycles across its layers."""
from __future__ import annotations

import ast
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the package's folders: the wheel ships kernels/ as sarathi_lab.kernels (pyproject's package-dir)
PACKAGE = {"sarathi_lab": ROOT / "sarathi_lab", "sarathi_lab.kernels": ROOT / "kernels"}


def module_files(roots: dict[str, Path]) -> dict[str, tuple[Path, bool]]:
    """module name -> (its file, whether it is a package's __init__)."""
    out = {}
    for name, folder in roots.items():
        for f in sorted(folder.rglob("*.py")):
            parts = list(f.relative_to(folder).with_suffix("").parts)
            init = parts[-1] == "__init__"
            out[".".join([name, *(parts[:-1] if init else parts)])] = (f, init)
    return out


def _runs(node: ast.AST):
    """The statements below `node` that run, skipping `if TYPE_CHECKING:` bodies."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
            for other in child.orelse:
                yield other
                yield from _runs(other)
            continue
        yield child
        yield from _runs(child)


def import_graph(roots: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the package's modules it imports (the module each import names, or the
    nearest package above it that exists)."""
    files = module_files(roots)
    top = tuple(roots)

    def known(name: str) -> str | None:
        while name not in files and "." in name:
            name = name.rsplit(".", 1)[0]
        return name if name in files and name.startswith(top) else None

    graph: dict[str, set[str]] = {}
    for name, (path, init) in files.items():
        out = set()
        for node in _runs(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                out |= {known(a.name) for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    package = name if init else name.rsplit(".", 1)[0]
                    package = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                    base = f"{package}.{base}" if base else package
                for a in node.names:
                    sub = known(f"{base}.{a.name}")
                    out.add(sub if sub == f"{base}.{a.name}" else known(base))
        graph[name] = {m for m in out if m and m != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found = []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_package_has_no_import_cycle():
    graph = import_graph(PACKAGE)
    assert len(graph) > 100 and "sarathi_lab.kernels.reference" in graph   # the whole package
    assert "sarathi_lab.engine" in graph["sarathi_lab.run.runner"]   # the graph has its edges
    found = cycles(graph)
    assert not found, "import cycles (move what both modules need below both): " + "; ".join(
        " <-> ".join(c) for c in found)


def test_a_cycle_through_a_function_import_is_found(tmp_path):
    """The package with one function-level import added upward (the request model importing
    the command line, which imports everything) has a cycle."""
    copy = tmp_path / "sarathi_lab"
    shutil.copytree(PACKAGE["sarathi_lab"], copy,
                    ignore=lambda d, names: [n for n in names if not n.endswith(".py")
                                             and not (Path(d) / n).is_dir()])
    request = copy / "request.py"
    request.write_text(request.read_text() + "\n\ndef _mutant():\n"
                       "    from sarathi_lab.cli.main import main\n    return main\n")
    found = cycles(import_graph({"sarathi_lab": copy}))
    assert any({"sarathi_lab.request", "sarathi_lab.cli.main"} <= set(c) for c in found), found


def test_the_graph_reads_relative_imports_and_skips_type_checking(tmp_path):
    pkg = tmp_path / "p"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from . import b\n")
    (pkg / "a.py").write_text("from .sub.b import X\n")
    (pkg / "sub" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from p import a\n"
        "else:\n    import os\nX = 1\ndef f():\n    from .. import c\n")
    (pkg / "c.py").write_text("def g():\n    from .sub import b\n")
    graph = import_graph({"p": pkg})
    assert graph == {"p": set(), "p.sub": {"p.sub.b"}, "p.a": {"p.sub.b"},
                     "p.sub.b": {"p.c"}, "p.c": {"p.sub.b"}}
    # b -> a only under TYPE_CHECKING: no cycle there; b and c import each other in functions
    assert cycles(graph) == [["p.c", "p.sub.b"]]
