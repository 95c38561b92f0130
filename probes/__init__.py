"""Production-safe capture probes for validator. Importable with torch and safetensors alone.

Capture inside a serving process with :class:`ProbeSession` (or :func:`session_from_env`), write run
bundles with :class:`BundleWriter`, and record speculative-decoding verify steps with
:class:`AcceptanceRecorder`. See docs/probes.md and docs/bundle-format.md.

The package is grouped by concern:

- :mod:`probes.core`: the capture session, its configuration, module hooks, summaries, CUDA-graph slots,
  device-to-host transfer, the run-bundle writer, shard coordinates and the acceptance recorder;
- :mod:`probes.engines`: the serving engines' integrations (:mod:`probes.engines.sglang`, the SGLang plugin;
  :mod:`probes.engines.transformers`, Hugging Face models);
- :mod:`probes.rl`: RL records (:mod:`probes.rl.logprobs`) and weight-sync manifests (:mod:`probes.rl.weights`);
- :mod:`probes.workloads`: the projection probe, a reference implementation of the DFlash context path.

The names below load on first use (PEP 562), so that importing a torch-free module such as
:mod:`probes.core.shards` or :mod:`probes.core.bundle` (as the validator's ingest does) does not import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from probes.core.lazy import lazy_exports

if TYPE_CHECKING:
    from probes.core.acceptance import AcceptanceRecorder, AcceptanceRecordError
    from probes.core.bundle import BUNDLE_FORMAT, BUNDLE_VERSION, BundleError, BundleWriter
    from probes.core.capture import (
        DISABLED,
        ProbeError,
        ProbeSession,
        ProbeWarning,
        get_session,
        session_from_env,
        set_session,
    )
    from probes.core.config import ProbeConfig, ProbeConfigError
    from probes.core.cudagraph import GraphCaptureError
    from probes.core.hooks import HookHandles, attach
    from probes.core.shards import Coords, ShardSpec, ShardSpecError
    from probes.core.summary import SUMMARY_FIELDS, summarize

__all__ = [
    "AcceptanceRecordError",
    "AcceptanceRecorder",
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

__getattr__, __dir__, _ = lazy_exports(
    __name__,
    {
        "core.acceptance": ["AcceptanceRecorder", "AcceptanceRecordError"],
        "core.bundle": ["BUNDLE_FORMAT", "BUNDLE_VERSION", "BundleError", "BundleWriter"],
        "core.capture": [
            "DISABLED",
            "ProbeError",
            "ProbeSession",
            "ProbeWarning",
            "get_session",
            "session_from_env",
            "set_session",
        ],
        "core.config": ["ProbeConfig", "ProbeConfigError"],
        "core.cudagraph": ["GraphCaptureError"],
        "core.hooks": ["HookHandles", "attach"],
        "core.shards": ["Coords", "ShardSpec", "ShardSpecError"],
        "core.summary": ["SUMMARY_FIELDS", "summarize"],
    },
    submodules=("core", "engines", "rl", "workloads"),
)
