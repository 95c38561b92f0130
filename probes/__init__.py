"""Production-safe capture probes for validator. Importable with torch and safetensors alone.

Capture inside a serving process with :class:`ProbeSession` (or :func:`session_from_env`), write run
bundles with :class:`BundleWriter`, and record speculative-decoding verify steps with
:class:`AcceptanceRecorder`. See docs/probes.md and docs/bundle-format.md.

The names below load on first use (PEP 562), so that importing a torch-free module such as
:mod:`probes.shards` or :mod:`probes.bundle` (as the validator's ingest does) does not import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._lazy import lazy_attributes

if TYPE_CHECKING:
    from .acceptance import AcceptanceRecorder, AcceptanceRecordError
    from .bundle import BUNDLE_FORMAT, BUNDLE_VERSION, BundleError, BundleWriter
    from .capture import DISABLED, ProbeError, ProbeSession, ProbeWarning, get_session, session_from_env, set_session
    from .config import ProbeConfig, ProbeConfigError
    from .cudagraph import GraphCaptureError
    from .hooks import HookHandles, attach
    from .shards import Coords, ShardSpec, ShardSpecError
    from .summary import SUMMARY_FIELDS, summarize

# public name -> submodule defining it
_EXPORTS = {
    "AcceptanceRecorder": "acceptance",
    "AcceptanceRecordError": "acceptance",
    "BUNDLE_FORMAT": "bundle",
    "BUNDLE_VERSION": "bundle",
    "BundleError": "bundle",
    "BundleWriter": "bundle",
    "DISABLED": "capture",
    "ProbeError": "capture",
    "ProbeSession": "capture",
    "ProbeWarning": "capture",
    "get_session": "capture",
    "session_from_env": "capture",
    "set_session": "capture",
    "ProbeConfig": "config",
    "ProbeConfigError": "config",
    "GraphCaptureError": "cudagraph",
    "HookHandles": "hooks",
    "attach": "hooks",
    "Coords": "shards",
    "ShardSpec": "shards",
    "ShardSpecError": "shards",
    "SUMMARY_FIELDS": "summary",
    "summarize": "summary",
}
# submodules that importing the package used to load eagerly: still reachable as attributes
_SUBMODULES = frozenset(
    ("acceptance", "bundle", "capture", "config", "cudagraph", "hooks", "shards", "summary", "transfer")
)

__all__ = [
    "AcceptanceRecorder",
    "AcceptanceRecordError",
    "BUNDLE_FORMAT",
    "BUNDLE_VERSION",
    "BundleError",
    "BundleWriter",
    "Coords",
    "DISABLED",
    "GraphCaptureError",
    "HookHandles",
    "ProbeConfig",
    "ProbeConfigError",
    "ProbeError",
    "ProbeSession",
    "ProbeWarning",
    "SUMMARY_FIELDS",
    "ShardSpec",
    "ShardSpecError",
    "attach",
    "get_session",
    "session_from_env",
    "set_session",
    "summarize",
]


__getattr__, __dir__ = lazy_attributes(__name__, globals(), _EXPORTS, _SUBMODULES, __all__)
