"""Run Triton kernels on the CPU: a call in a subprocess that sets ``TRITON_INTERPRET=1`` before Triton is
imported (the interpreter is chosen at import), its printed JSON lines returned."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from tests.paths import ROOT


def interpreted(call: str) -> list[dict[str, Any]]:
    """The JSON lines printed by ``call``, a Python statement run under Triton's interpreter (CPU)."""
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT))
    run = subprocess.run([sys.executable, "-c", call], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return [json.loads(line) for line in run.stdout.splitlines()]
