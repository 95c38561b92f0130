"""Capture module inputs/outputs of a plain ``torch.nn`` model by module-name pattern.

>>> handles = attach(model, session, patterns=["layers.*.mlp"], what="output")
>>> model(x)            # captures "layers.0.mlp.output" (layer=0), "layers.1.mlp.output" (layer=1), ...
>>> handles.remove()

Patterns are dotted globs over ``model.named_modules()`` names (``*`` = one component, ``**`` = any
depth; see :mod:`probes.core.config`). A pattern that matches no module raises, so a typo cannot silently
capture nothing. Names stored: ``<module>.output`` / ``<module>.input`` for a single tensor,
``<module>.output[i]`` for the i-th tensor of a tuple or list (non-tensor items are skipped). The first
all-digit component of the module name becomes the ``layer`` coordinate unless ``layer`` is given.
Hooks only read; they return ``None`` and never replace a module's inputs or outputs.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Literal, Self

import torch
from torch import nn

from .config import glob_match

__all__ = ["HookHandles", "attach", "layer_of"]

What = Literal["output", "input", "both"]
_LAYER_RE = re.compile(r"(?:^|\.)([0-9]+)(?:\.|$)")


class HookHandles:
    """The hook handles ``attach`` registered; ``remove()`` detaches them all (also as a context manager)."""

    def __init__(self) -> None:
        self.handles: list[Any] = []

    def append(self, handle: Any) -> None:
        self.handles.append(handle)

    def __len__(self) -> int:
        return len(self.handles)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.handles)

    def remove(self) -> None:
        while self.handles:
            self.handles.pop().remove()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.remove()


def layer_of(module_name: str) -> int | None:
    """The first all-digit component of a dotted module name (``model.layers.12.mlp`` -> 12)."""
    m = _LAYER_RE.search(module_name)
    return int(m.group(1)) if m else None


def _tensors(value: Any) -> list[tuple[str, torch.Tensor]]:
    """(suffix, tensor) pairs: ``""`` for a lone tensor, ``"[i]"`` for sequence items."""
    if isinstance(value, torch.Tensor):
        return [("", value)]
    if isinstance(value, (tuple, list)):
        items = [(i, v) for i, v in enumerate(value) if isinstance(v, torch.Tensor)]
        if len(value) == 1 and items:
            return [("", items[0][1])]
        return [(f"[{i}]", v) for i, v in items]
    return []


def attach(
    model: nn.Module,
    session: Any,
    patterns: Sequence[str] | str,
    *,
    what: What = "output",
    prefix: str = "",
    coords: dict[str, Any] | None = None,
    layer_from_name: bool = True,
) -> HookHandles:
    """Register forward hooks on the modules of ``model`` whose names match ``patterns``.

    ``session``: a :class:`probes.core.capture.ProbeSession` (or anything with ``enabled`` and ``capture``);
    the hooks look at ``session.enabled`` on each call, so a disabled session costs one attribute check.
    ``prefix`` is prepended to the stored names; ``coords`` are added to every capture.
    """
    if what not in ("output", "input", "both"):
        raise ValueError(f"what must be 'output', 'input' or 'both', got {what!r}")
    pats = [patterns] if isinstance(patterns, str) else list(patterns)
    if not pats:
        raise ValueError("attach() needs at least one module-name pattern")
    modules = [(n, m) for n, m in model.named_modules() if n]
    handles = HookHandles()
    unmatched = []
    for pat in pats:
        hits = [(n, m) for n, m in modules if glob_match(pat, n)]
        if not hits:
            unmatched.append(pat)
    if unmatched:
        sample = ", ".join(n for n, _ in modules[:8])
        raise ValueError(f"pattern(s) {unmatched} match no module of {type(model).__name__} (modules: {sample}, ...)")
    for name, module in modules:
        if not any(glob_match(p, name) for p in pats):
            continue
        extra = dict(coords or {})
        if layer_from_name and "layer" not in extra:
            layer = layer_of(name)
            if layer is not None:
                extra["layer"] = layer
        handles.append(module.register_forward_hook(_make_hook(session, prefix + name, what, extra)))
    return handles


def _make_hook(session: Any, base: str, what: str, coords: dict[str, Any]) -> Any:
    def hook(_module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        if not session.enabled:
            return
        parts: Iterable[tuple[str, Any]] = ()
        if what in ("input", "both"):
            parts = [("input", args)]
        if what in ("output", "both"):
            parts = [*parts, ("output", output)]
        for kind, value in parts:
            for suffix, tensor in _tensors(value):
                session.capture(f"{base}.{kind}{suffix}", tensor, **coords)

    return hook
