"""Loading the plugin into SGLang processes without editing SGLang's source.

:func:`activate` (called from ``sitecustomize`` in every Python process started with the plugin's site
folder on ``PYTHONPATH``; ``python -m probes.engines.sglang.launch`` sets that up) does nothing unless
``VALIDATOR_PROBE_BUNDLE`` is set. When it is, it

1. checks every capture point against the installed SGLang's source (nothing is imported), warns about
   each selected point whose functions are missing, naming them and the SGLang version, and raises
   :class:`PluginStartupError` when such a point is required (``VALIDATOR_SGLANG_REQUIRED``);
2. puts an import hook on ``sys.meta_path`` that, right after a target module has been executed, replaces
   each target function by its wrapper (modules already imported are patched at once);
3. closes the bundle part at interpreter exit (and after ``VALIDATOR_SGLANG_MAX_FORWARDS`` forwards).
"""

from __future__ import annotations

import atexit
import importlib.abc
import importlib.machinery
import os
import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any

from probes.core.capture import ProbeWarning
from probes.core.config import ProbeConfig, ProbeConfigError

from .points import POINTS, Target
from .resolve import check_points, resolve_runtime, sglang_root, sglang_version
from .runtime import Plugin, PluginConfig, _sglang_coords
from .wrappers import FACTORIES

__all__ = ["PluginStartupError", "activate", "current", "deactivate"]


class PluginStartupError(RuntimeError):
    """A required capture point is missing from the installed SGLang."""


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: Any, hook: _Hook) -> None:
        self.inner = inner
        self.hook = hook

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        create = getattr(self.inner, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        self.hook.patch(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_code, is_package, ... for tools
        return getattr(self.inner, name)


class _Hook(importlib.abc.MetaPathFinder):
    """Patches target modules right after they are imported."""

    def __init__(self, plugin: Plugin, targets: Mapping[str, list[tuple[str, Target]]]) -> None:
        self.plugin = plugin
        self.targets = targets
        self.restore: list[tuple[Any, str, Any]] = []

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> Any:
        if fullname not in self.targets:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader, self)
                return spec
        return None

    def patch(self, module: ModuleType) -> None:
        plugin = self.plugin
        for point, target in self.targets.get(module.__name__, []):
            status = plugin.wrapped.setdefault(point, {})
            try:
                rt = resolve_runtime(module, target.qualname)
            except LookupError as exc:
                status[target.path] = f"missing at run time: {exc}"
                msg = f"capture point {point!r}: {exc} (sglang {plugin.version})"
                if plugin.cfg.is_required(point) and not any(v == "wrapped" for v in status.values()):
                    raise PluginStartupError(msg) from None
                warnings.warn(msg, ProbeWarning, stacklevel=2)
                continue
            raw = rt.raw
            func = raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw
            if getattr(func, "__validator_probe__", None) or not callable(func):
                status[target.path] = "wrapped" if callable(func) else "not a function"
                continue
            new: Any = FACTORIES[_POINTS[point].wrapper](plugin, point, func)
            if isinstance(raw, staticmethod):
                new = staticmethod(new)
            elif isinstance(raw, classmethod):
                new = classmethod(new)
            setattr(rt.owner, rt.attr, new)
            self.restore.append((rt.owner, rt.attr, raw))
            status[target.path] = "wrapped"


_POINTS = {p.name: p for p in POINTS}
_STATE: dict[str, Any] = {"plugin": None, "hook": None}


def current() -> Plugin | None:
    """The plugin active in this process, if any."""
    plugin: Plugin | None = _STATE["plugin"]
    return plugin


def activate(
    environ: Mapping[str, str] | None = None,
    *,
    search_path: Sequence[str] | None = None,
    coords_fn: Callable[[], dict[str, int]] | None = None,
    register_atexit: bool = True,
) -> Plugin | None:
    """Set the plugin up in this process (see the module docstring). Returns None when not enabled."""
    if _STATE["plugin"] is not None:
        return current()
    probe_cfg = ProbeConfig.from_env("VALIDATOR_PROBE_", environ)
    cfg = PluginConfig.from_env(environ)
    if not probe_cfg.active:
        return None
    root = sglang_root(search_path)
    version = sglang_version(root)
    statuses = {s.point.name: s for s in check_points(POINTS, root)}
    selected = cfg.selected()
    missing = [statuses[n] for n in selected if not statuses[n].active]
    fatal = [s for s in missing if cfg.is_required(s.point.name)]
    if fatal:
        raise PluginStartupError(
            "validator SGLang probes cannot start: "
            + "; ".join(s.message() for s in fatal)
            + " (required by VALIDATOR_SGLANG_REQUIRED)"
        )
    for s in missing:
        warnings.warn(s.message() + "; it will record nothing", ProbeWarning, stacklevel=2)
    plugin = Plugin(probe_cfg, cfg, statuses, version, coords_fn=coords_fn or _sglang_coords)
    targets: dict[str, list[tuple[str, Target]]] = {}
    for name in selected:
        for r in statuses[name].resolutions:
            if r.found:
                targets.setdefault(r.target.module, []).append((name, r.target))
            else:
                plugin.wrapped.setdefault(name, {})[r.target.path] = f"missing: {r.where}"
    hook = _Hook(plugin, targets)
    sys.meta_path.insert(0, hook)
    _STATE.update(plugin=plugin, hook=hook)
    for mod_name in targets:
        mod = sys.modules.get(mod_name)
        if mod is not None:
            hook.patch(mod)
    if register_atexit:
        atexit.register(plugin.close)
    plugin.watch_close_file()
    return plugin


def deactivate() -> None:
    """Close the part, remove the import hook and restore the original functions (for tests)."""
    plugin, hook = _STATE["plugin"], _STATE["hook"]
    if plugin is not None:
        plugin.close()
        atexit.unregister(plugin.close)
    if hook is not None:
        if hook in sys.meta_path:
            sys.meta_path.remove(hook)
        for owner, attr, raw in reversed(hook.restore):
            setattr(owner, attr, raw)
    _STATE.update(plugin=None, hook=None)


def activate_from_site() -> None:
    """Entry point for ``sitecustomize``: a start-up failure (a missing required point, a bad variable) ends
    the process with its message and exit code 2, instead of Python's "Error in sitecustomize" and going on."""
    try:
        activate()
    except (PluginStartupError, ProbeConfigError) as exc:
        sys.stderr.write(f"{exc}\n")
        sys.stderr.flush()
        os._exit(2)  # SystemExit during site start-up is a fatal interpreter error; nothing is running yet
