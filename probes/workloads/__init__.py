"""Reference workloads run as probes: the projection probe (:mod:`.projection`, the public face; its parts in
:mod:`.projection_config`, :mod:`.projection_math` and :mod:`.projection_io`), the DFlash context path computed
three ways from the same hidden states. Needs torch only; public names load on first use (PEP 562)."""

from __future__ import annotations

from probes.core.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "projection": [
            "ProbeRun",
            "ProjectionConfig",
            "ProjectionConfigError",
            "load_hidden_states",
            "make_hidden_states",
            "run_probe",
        ]
    },
)
