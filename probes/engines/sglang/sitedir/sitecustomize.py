"""Loads the validator SGLang probes in every Python process that has this folder on ``PYTHONPATH``.

``python -m probes.engines.sglang.launch -- <sglang args>`` puts this folder first on ``PYTHONPATH``, so the server
process and every process it spawns (scheduler ranks, P and D workers) run this at start-up. It does
nothing unless a ``VALIDATOR_PROBE_*`` variable is set, and then hands over to any other
``sitecustomize`` found further along ``sys.path``.
"""

import importlib.machinery
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))

if any(k.startswith("VALIDATOR_PROBE_") for k in os.environ):
    try:
        from probes.engines.sglang.install import activate_from_site
    except ImportError as _exc:
        sys.stderr.write(f"validator SGLang probes not loaded: {_exc} (is the validator package installed?)\n")
    else:
        activate_from_site()

_rest = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
_spec = importlib.machinery.PathFinder.find_spec("sitecustomize", _rest)
if _spec is not None and _spec.loader is not None and _spec.origin != __file__:
    _mod = importlib.util.module_from_spec(_spec)
    sys.modules["_validator_chained_sitecustomize"] = _mod
    _spec.loader.exec_module(_mod)
