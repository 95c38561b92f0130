"""What every capture needs: the capture session (:mod:`.capture`) and its configuration (:mod:`.config`),
module hooks (:mod:`.hooks`), per-tensor summaries (:mod:`.summary`, :mod:`.fused_summary`), static slots
inside CUDA graphs (:mod:`.cudagraph`), the asynchronous device-to-host copies (:mod:`.transfer`), the run
bundle and its writer (:mod:`.bundle`), shard coordinates (:mod:`.shards`), the acceptance recorder
(:mod:`.acceptance`), the hidden JSONL file recorders write through (:mod:`.hidden_jsonl`), the validated header
of a safetensors file (:mod:`.safetensors_header`) and the lazy public names of every package (:mod:`.lazy`).

:mod:`.shards`, :mod:`.bundle`, :mod:`.config`, :mod:`.acceptance`, :mod:`.hidden_jsonl`, :mod:`.safetensors_header`
and :mod:`.lazy` import no torch (the validator reads them); the rest need torch only. Public names load on first
use (PEP 562).
"""

from __future__ import annotations

from probes.core.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "acceptance": ["ACCEPTANCE_FILE", "AcceptanceRecordError", "AcceptanceRecorder"],
        "bundle": ["BUNDLE_FORMAT", "BUNDLE_VERSION", "BundleError", "BundleWriter"],
        "capture": [
            "DISABLED",
            "ProbeError",
            "ProbeSession",
            "ProbeWarning",
            "get_session",
            "session_from_env",
            "set_session",
        ],
        "config": ["ProbeConfig", "ProbeConfigError"],
        "cudagraph": ["GraphCaptureError"],
        "hooks": ["HookHandles", "attach"],
        "shards": ["Coords", "ShardSpec", "ShardSpecError"],
        "summary": ["SUMMARY_FIELDS", "summarize"],
    },
)
