"""Run a script in a fresh interpreter, which records what it imports: the test process has long imported torch.

The script ends by calling ``report(**fields)``; :func:`run_child` returns those fields plus ``torch``,
``alembic`` and ``sqlalchemy`` (whether each was imported) and ``where`` (the stack that first imported torch, for a failure
message). The child sees no ``VALIDATOR_*`` variable, so a store is the one its arguments name.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

PRELUDE = textwrap.dedent(
    """
    import json, sys, traceback

    _first_torch = []

    class _Watch:  # where torch was first imported from
        def find_spec(self, name, path=None, target=None):
            if name == "torch" and not _first_torch:
                _first_torch.append("".join(traceback.format_stack(limit=30)))
            return None

    sys.meta_path.insert(0, _Watch())

    def report(**fields):
        loaded = {m: m in sys.modules for m in ("torch", "alembic", "sqlalchemy")}
        print(json.dumps({**fields, **loaded, "where": _first_torch[:1]}))
    """
)


def run_child(script: str, *args: str, timeout: float = 120) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VALIDATOR_")}
    proc = subprocess.run(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(script), *args],
        cwd=ROOT,
        env={**env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def torch_stack(out: dict[str, Any]) -> str:
    """For an assertion message: where the child first imported torch."""
    return "imported torch:\n" + "".join(out["where"])
