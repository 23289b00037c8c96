"""Layers depend one way: no import circle in iepm/, counting every import (top-level, deferred
inside functions, under TYPE_CHECKING), as ../shared/hooks/import_cycles.py counts them. A
package's ``__init__`` importing its own submodules is its face, not an edge back."""

from __future__ import annotations

import ast
from pathlib import Path

import iepm

ROOT = Path(iepm.__file__).parent


def module_files() -> dict[str, Path]:
    files = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        files[".".join(parts)] = path
    return files


def import_graph() -> dict[str, set[str]]:
    files = module_files()

    def resolve(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, set[str]] = {m: set() for m in files}
    for module, path in files.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    package = module if is_package else module.rpartition(".")[0]
                    for _ in range(node.level - 1):
                        package = package.rpartition(".")[0]
                    base = f"{package}.{node.module}" if node.module else package
                names = [
                    f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names
                ]
            else:
                continue
            for name in names:
                target = resolve(name) if name.split(".")[0] == "iepm" else None
                if target is None or target == module:
                    continue
                if is_package and target.startswith(module + "."):
                    continue
                edges[module].add(target)
    return edges


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def reachable(edges: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo.extend(edges[module])
    return seen


def test_no_import_circle_in_iepm() -> None:
    found = circles(import_graph())
    assert found == [], "import circles: " + "; ".join(" ↔ ".join(c) for c in found)


def test_the_circle_finder_finds_circles() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert circles(edges) == [["a", "b", "c"]]


def test_deferred_and_type_checking_imports_count() -> None:
    # probes/iperf3.run once imported remote/ inside the function: that is an edge too.
    edges = import_graph()
    assert "iepm.remote.lease" in edges["iepm.scheduler"]  # a top-level import
    assert "iepm.remote.lease" in edges["iepm.cli"]  # a deferred one, inside a command


def test_probes_do_not_import_remote_and_the_agent_does_not_import_probes() -> None:
    edges = import_graph()
    probe_side = set().union(*(reachable(edges, m) for m in edges if m.startswith("iepm.probes")))
    assert not {m for m in probe_side if m.startswith("iepm.remote")}
    agent_side = reachable(edges, "iepm.remote.agent")
    assert not {m for m in agent_side if m.startswith(("iepm.probes", "iepm.config"))}
