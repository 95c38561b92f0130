"""Tests that need CUDA skip on a machine without it, so the CPU suite never runs their bodies. mypy reads them
here: a name they use that does not exist (a function renamed elsewhere, say) fails on the CPU, not at the next
GPU run."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.paths import ROOT

# what mypy says of a name that is not there; other findings (types, re-export style) are not this test's
MISSING = re.compile(r'(has no attribute|Name "[^"]+" is not defined|Module "[^"]+" has no attribute)')


def test_gpu_only_tests_name_what_exists() -> None:
    files = sorted(
        str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py") if "cuda.is_available()" in p.read_text()
    )
    assert "tests/validator/numerics/test_backends.py" in files
    got = subprocess.run(
        [sys.executable, "-m", "mypy", "--follow-imports=silent", "--no-error-summary", *files],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert "error" in got.stdout or got.returncode == 0, got.stderr  # mypy ran
    missing = [line for line in got.stdout.splitlines() if MISSING.search(line)]
    assert not missing, "\n".join(missing)
