"""A reference speculative-decoding harness in torch (CPU or GPU) and an HTTP server around it.

:mod:`validator.workloads.harness.model` needs torch only; :mod:`validator.workloads.harness.generate_server` adds FastAPI and uvicorn
and is imported on its own (``python -m validator.workloads.harness.generate_server``).
"""

from validator.workloads.harness.model import (
    BOS,
    EOS,
    MODES,
    Harness,
    HarnessConfig,
    SpecCounters,
    prompt_hash,
    spec_counters,
    write_acceptance_part,
)

__all__ = [
    "BOS",
    "EOS",
    "MODES",
    "Harness",
    "HarnessConfig",
    "SpecCounters",
    "prompt_hash",
    "spec_counters",
    "write_acceptance_part",
]
