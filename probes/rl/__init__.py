"""RL records: the logprob recorder (:mod:`.logprobs`, the rollout engine's and the trainer's logprob per
sampled token) and weight-sync manifests (:mod:`.weights`). See docs/rl.md. Public names load on first use
(PEP 562); :mod:`.weights` imports torch only to hash a state dict."""

from __future__ import annotations

from probes.core.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "logprobs": ["LOGPROB_FILE", "LogprobRecordError", "LogprobRecorder"],
        "weights": [
            "MANIFEST_FORMAT",
            "ManifestWriteError",
            "manifest_from_safetensors",
            "manifest_from_state_dict",
            "write_manifest",
        ],
    },
)
