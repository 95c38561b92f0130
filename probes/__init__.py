"""Production-safe capture probes for validator. Importable with torch and safetensors alone.

Capture inside a serving process with :class:`ProbeSession` (or :func:`session_from_env`), write run
bundles with :class:`BundleWriter`, and record speculative-decoding verify steps with
:class:`AcceptanceRecorder`. See docs/probes.md and docs/bundle-format.md.
"""

from .acceptance import AcceptanceRecorder, AcceptanceRecordError
from .bundle import BUNDLE_FORMAT, BUNDLE_VERSION, BundleError, BundleWriter
from .capture import DISABLED, ProbeError, ProbeSession, ProbeWarning, get_session, session_from_env, set_session
from .config import ProbeConfig, ProbeConfigError
from .cudagraph import GraphCaptureError
from .hooks import HookHandles, attach
from .shards import Coords, ShardSpec, ShardSpecError
from .summary import SUMMARY_FIELDS, summarize

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
