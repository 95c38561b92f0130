"""Finding the plugin's targets in the installed SGLang, statically (source read with ``ast``) or at run time.

Static resolution never imports SGLang: the package folder is located with ``PathFinder.find_spec`` and
each target module's source is parsed. The plugin runs it at start-up, before SGLang is imported, so a
requested point whose function is missing is reported (with the SGLang version) before the server loads
a model, and fails start-up when the point is marked required. Run-time resolution looks the same names
up on imported modules (``getattr`` along the qualified name) right before wrapping them.
"""

from __future__ import annotations

import ast
import importlib.machinery
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from .points import Point, Target

__all__ = [
    "Resolution",
    "PointStatus",
    "check_points",
    "module_file",
    "resolve_runtime",
    "resolve_static",
    "sglang_root",
    "sglang_version",
]


@dataclass(frozen=True)
class Resolution:
    target: Target
    found: bool
    where: str  # "file:line" when found, else why not
    params: tuple[str, ...] = ()


@dataclass(frozen=True)
class PointStatus:
    point: Point
    resolutions: tuple[Resolution, ...]
    version: str

    @property
    def active(self) -> bool:
        return any(r.found for r in self.resolutions)

    def message(self) -> str:
        if self.active:
            found = ", ".join(r.target.path for r in self.resolutions if r.found)
            return f"capture point {self.point.name!r}: {found}"
        why = "; ".join(f"{r.target.path}: {r.where}" for r in self.resolutions)
        branch = any(r.target.pp_branch for r in self.resolutions)
        hint = " (these functions exist only on the branch of SGLang PR #33863)" if branch else ""
        return f"capture point {self.point.name!r} is not available in sglang {self.version}: {why}{hint}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "active": self.active,
            "targets": {r.target.path: (r.where if r.found else f"missing: {r.where}") for r in self.resolutions},
        }


def sglang_root(search_path: Sequence[str] | None = None) -> Path | None:
    """The installed ``sglang`` package folder (``search_path``: like ``sys.path``), without importing it."""
    spec = importlib.machinery.PathFinder.find_spec("sglang", list(search_path) if search_path else None)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def sglang_version(root: Path | None) -> str:
    """The version of the SGLang at ``root``, read from its files (``sglang/_version.py`` or dist-info)."""
    mod = sys.modules.get("sglang")
    if mod is not None and root is not None and Path(getattr(mod, "__file__", "") or "").parent == root:
        v = getattr(mod, "__version__", None)
        if isinstance(v, str):
            return v
    if root is None:
        return "not installed"
    vf = root / "_version.py"
    if vf.is_file():
        m = re.search(
            r"""^__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""", vf.read_text(errors="replace"), re.M
        )
        if m:
            return m.group(1)
    for info in sorted(root.parent.glob("sglang-*.dist-info")):
        meta = info / "METADATA"
        if meta.is_file():
            m = re.search(r"^Version:\s*(\S+)", meta.read_text(errors="replace"), re.M)
            if m:
                return m.group(1)
    return "unknown"


def module_file(root: Path, module: str) -> Path | None:
    parts = module.split(".")
    if parts[0] != "sglang":
        return None
    base = root.joinpath(*parts[1:])
    for cand in (base.with_suffix(".py"), base / "__init__.py"):
        if cand.is_file():
            return cand
    return None


@lru_cache(maxsize=64)
def _parse(path: str, mtime: float) -> ast.Module:
    return ast.parse(Path(path).read_text(encoding="utf-8", errors="replace"), filename=path)


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[str, ...]:
    a = fn.args
    names = [x.arg for x in (*a.posonlyargs, *a.args)]
    if a.vararg:
        names.append("*" + a.vararg.arg)
    names += [x.arg for x in a.kwonlyargs]
    if a.kwarg:
        names.append("**" + a.kwarg.arg)
    return tuple(names)


def resolve_static(target: Target, root: Path | None) -> Resolution:
    """Find ``target`` in the source of the SGLang at ``root`` (nothing is imported)."""
    if root is None:
        return Resolution(target, False, "sglang is not installed")
    path = module_file(root, target.module)
    if path is None:
        return Resolution(target, False, f"module {target.module} not found under {root}")
    try:
        tree = _parse(str(path), path.stat().st_mtime)
    except (OSError, SyntaxError) as exc:
        return Resolution(target, False, f"cannot read {path}: {exc}")
    body: list[ast.stmt] = tree.body
    node: ast.AST | None = None
    parts = target.qualname.split(".")
    for i, part in enumerate(parts):
        node = None
        for stmt in body:
            if isinstance(stmt, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and stmt.name == part:
                node = stmt
            elif isinstance(stmt, (ast.Assign, ast.AnnAssign)):
                names = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                if any(isinstance(n, ast.Name) and n.id == part for n in names):
                    node = stmt
        if node is None:
            owner = ".".join(parts[:i]) or target.module
            return Resolution(target, False, f"{part} not defined in {owner} ({path.name})")
        if i < len(parts) - 1:
            if not isinstance(node, ast.ClassDef):
                return Resolution(target, False, f"{'.'.join(parts[: i + 1])} is not a class ({path.name})")
            body = node.body
    assert node is not None
    params = _params(node) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else ()
    return Resolution(target, True, f"{path}:{getattr(node, 'lineno', 0)}", params)


def check_points(
    points: Iterable[Point], root: Path | None = None, *, search_path: Sequence[str] | None = None
) -> list[PointStatus]:
    """Static status of each point against the SGLang at ``root`` (default: the one on ``search_path``)."""
    root = root if root is not None else sglang_root(search_path)
    version = sglang_version(root)
    return [PointStatus(p, tuple(resolve_static(t, root) for t in p.targets), version) for p in points]


@dataclass
class RuntimeTarget:
    """An attribute to replace: ``owner.<attr>`` currently holds ``raw`` (a function, staticmethod, ...)."""

    owner: Any
    attr: str
    raw: Any
    extra: dict[str, Any] = field(default_factory=dict)


def resolve_runtime(module: Any, qualname: str) -> RuntimeTarget:
    """Look ``qualname`` up on an imported module. Raises ``LookupError`` naming what is missing."""
    owner = module
    parts = qualname.split(".")
    for part in parts[:-1]:
        owner = getattr(owner, part, None)
        if owner is None:
            raise LookupError(f"{module.__name__}.{qualname}: {part} not found")
    name = parts[-1]
    raw = owner.__dict__.get(name) if hasattr(owner, "__dict__") else None
    if raw is None:
        raw = getattr(owner, name, None)
    if raw is None:
        raise LookupError(f"{module.__name__}.{qualname}: {name} not found")
    return RuntimeTarget(owner, name, raw)
