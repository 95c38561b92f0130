"""The layout's rules, checked on the source: the import contracts of pyproject.toml's ``[tool.importlinter]``
(the layers of docs/architecture.md, what probes may import), no import of another package's private names, no
import cycles among validator/ and probes/ modules (imports inside functions and imports only for type checking
included), and no two modules of the same name."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

from tests.paths import ROOT

PACKAGES = ("validator", "probes")


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def _imports(module: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of ours that ``module`` imports anywhere in its body."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                found.update(a.name for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    parts = package.split(".")
                    parts = parts[: len(parts) - (child.level - 1)]
                    base = ".".join(parts + ([base] if base else []))
                found.add(base)
                found.update(f"{base}.{a.name}" for a in child.names)
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    return {m for m in found if m in known and m != module}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def dfs(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph[n]):
            if state.get(m) == 1:
                return stack[stack.index(m) :] + [m]
            if m not in state and (found := dfs(m)):
                return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state and (found := dfs(n)):
            return found
    return None


def test_no_import_cycles() -> None:
    known = _modules()
    graph = {m: _imports(m, p, known) for m, p in known.items()}
    cycle = _cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_no_two_modules_share_a_name() -> None:
    names = Counter(p.stem for p in _modules().values() if p.stem not in ("__init__", "__main__"))
    assert [n for n, k in names.items() if k > 1] == []


def test_import_contracts() -> None:
    """``lint-imports`` on pyproject.toml's contracts; a broken one fails with import-linter's report."""
    lint = Path(sys.executable).with_name("lint-imports")
    assert lint.exists(), f"{lint}: install the test extra (pip install -e '.[test]'), which has import-linter"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    got = subprocess.run(
        [str(lint), "--config", str(ROOT / "pyproject.toml"), "--no-cache", "--no-logo"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert got.returncode == 0, got.stdout + got.stderr


def _private_at(dotted: str) -> int | None:
    """The index of the first private part of ``dotted`` (``_name``, not ``__dunder__``), or None."""
    return next(
        (i for i, part in enumerate(dotted.split(".")) if part.startswith("_") and not part.startswith("__")), None
    )


def _private_imports(module: str, path: Path, known: dict[str, Path]) -> list[str]:
    """The imports of ``module`` that name a private module or name of a package ``module`` is not inside."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    named: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            named += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - (node.level - 1)] + ([base] if base else []))
            named += [(node.lineno, f"{base}.{a.name}") for a in node.names if a.name != "*"]
    bad = []
    for line, dotted in named:
        if dotted.split(".")[0] not in PACKAGES or (i := _private_at(dotted)) is None:
            continue
        parts = dotted.split(".")
        owner = ".".join(parts[:i])  # the package holding the private part (a module's private name: its package)
        if owner in known and known[owner].name != "__init__.py":
            owner = owner.rpartition(".")[0]
        if module != owner and not module.startswith(owner + "."):
            bad.append(f"{path.relative_to(ROOT)}:{line}: {dotted} (private to {owner})")
    return bad


def test_no_imports_of_another_packages_private_names() -> None:
    known = _modules()
    bad = [b for m, p in sorted(known.items()) for b in _private_imports(m, p, known)]
    assert bad == [], "private names imported from outside their package:\n" + "\n".join(bad)
