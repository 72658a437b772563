"""The package layers hold: read every import of `optico` (module level and inside functions,
not `if TYPE_CHECKING:` blocks) and check the rules of docs/architecture.md ("Layers")."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "optico"

# package -> packages it must not import (directly or lazily)
FORBIDDEN: dict[str, set[str]] = {
    "perfmodel": {"pool", "agents", "launchers", "service"},
    "pool": {"agents", "launchers", "service"},
    "launchers": {"agents", "pool", "service"},
    "agents": {"service", "bench"},
}
# Known cycles, each with its owner and the fix; the test fails when one disappears, so the list
# only shrinks. None today: the agents' typed contracts live in optico/agent_contracts.py, which
# both agents/ and llm/ read.
KNOWN_CYCLES: dict[frozenset[str], str] = {}


def _node(module: str) -> str | None:
    """optico.pool.store -> 'pool'; optico.spec -> 'spec'; anything outside optico -> None."""
    parts = module.split(".")
    return parts[1] if parts[0] == "optico" and len(parts) > 1 else None


def _imports(tree: ast.AST) -> list[str]:
    out: list[str] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            out.extend(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append(node.module)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return out


def import_graph() -> dict[str, dict[str, set[str]]]:
    """package -> imported package -> the files that import it. Parsed in a child process: Python 3.11
    before 3.11.8 shares ast.parse's recursion counter between threads (CPython gh-106905), and a thread
    an earlier test left running in this process (LangGraph's) may be parsing too: a SystemError."""
    done = subprocess.run([sys.executable, __file__], capture_output=True, text=True, check=True, timeout=120)
    return {pkg: {target: set(files) for target, files in targets.items()}
            for pkg, targets in json.loads(done.stdout).items()}


def _parsed_import_graph() -> dict[str, dict[str, set[str]]]:
    graph: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        source = _node(".".join(rel.parts) if len(rel.parts) > 2 else ".".join(rel.parts[:2]) + ".x")
        for module in _imports(ast.parse(path.read_text())):
            target = _node(module)
            if source and target and target != source:
                graph[source][target].add(str(path.relative_to(ROOT.parent)))
    return graph


def _cycles(graph: dict[str, dict[str, set[str]]]) -> list[frozenset[str]]:
    """Strongly connected components with more than one package (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[frozenset[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, {}):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(frozenset(component))

    for v in list(graph):
        if v not in index:
            connect(v)
    return out


def test_forbidden_imports():
    graph = import_graph()
    broken = [f"{pkg} imports {target} ({', '.join(sorted(graph[pkg][target]))})"
              for pkg, banned in FORBIDDEN.items() for target in sorted(banned & set(graph.get(pkg, {})))]
    assert not broken, "\n".join(broken)


def test_no_cycles_between_packages():
    found = set(_cycles(import_graph()))
    new = [sorted(c) for c in found if c not in KNOWN_CYCLES]
    assert not new, f"import cycles between packages: {new}"
    gone = [sorted(c) for c in KNOWN_CYCLES if c not in found]
    assert not gone, f"known cycle(s) {gone} are fixed: remove them from KNOWN_CYCLES"


def test_the_pool_does_not_load_the_launchers():
    """Importing the pool (as the service does) must not import any launcher or the Megatron driver."""
    code = ("import sys, optico.pool.store, optico.spec; "
            "print(sorted(m for m in sys.modules if m.startswith(('optico.launchers', 'optico.agents'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]", out


if __name__ == "__main__":  # import_graph's child process
    print(json.dumps({pkg: {target: sorted(files) for target, files in targets.items()}
                      for pkg, targets in _parsed_import_graph().items()}))
