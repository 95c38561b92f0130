"""The serving engines' integrations: :mod:`.sglang`, the plugin loaded into SGLang servers without editing
SGLang (docs/sglang.md), and :mod:`.transformers`, hooks and acceptance records for Hugging Face models.
Neither engine is imported here; each submodule loads on first use (PEP 562)."""

from __future__ import annotations

from probes.core.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {}, submodules=("sglang", "transformers"))
