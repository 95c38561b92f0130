"""probes/ must import, and capture, with torch and safetensors alone (no server or analysis stack)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# triton too: it is optional (the fused summary kernels); without it summary mode uses plain torch
BLOCKED = ("sqlalchemy", "fastapi", "pandas", "scipy", "validator", "alembic", "uvicorn", "httpx", "pyarrow", "triton")

SCRIPT = textwrap.dedent(
    """
    import sys, tempfile
    BLOCKED = set(sys.argv[1].split(","))

    class Blocker:
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in BLOCKED:
                raise ImportError(f"blocked import of {name} (probes must not need it)")
            return None

    sys.meta_path.insert(0, Blocker())
    import probes, probes.core.capture, probes.core.hooks, probes.core.summary, probes.core.cudagraph, probes.core.config, probes.core.transfer
    assert probes.core.summary.fused() is None  # Triton cannot be imported: the torch fallback
    import torch
    from probes.core.capture import ProbeSession
    from probes.core.config import ProbeConfig

    with tempfile.TemporaryDirectory() as d:
        s = ProbeSession(ProbeConfig(bundle=d, mode="summary"))
        s.capture("x", torch.ones(3), step=0)
        s.close()
        s = ProbeSession(ProbeConfig(bundle=d, part="p1"))
        s.capture("x", torch.ones(3), step=0)
        s.close()
    loaded = sorted(m for m in sys.modules if m.partition(".")[0] in BLOCKED)
    assert not loaded, loaded
    print("ok")
    """
)


def test_probes_import_and_capture_with_torch_only() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, ",".join(BLOCKED)],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "error"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "ok"


LAZY = textwrap.dedent(
    """
    import sys
    import probes, probes.core, probes.engines, probes.engines.sglang, probes.rl, probes.workloads
    from probes.core.bundle import MANIFEST, check_tensor_name
    from probes.core.shards import ShardSpec
    from probes.engines.sglang.coverage import read_reports
    assert "torch" not in sys.modules, "the torch-free probes modules imported torch"
    for pkg in (probes, probes.core, probes.engines, probes.engines.sglang, probes.rl, probes.workloads):
        for name in pkg.__all__:
            getattr(pkg, name)
        assert set(pkg.__all__) <= set(dir(pkg))
    from probes import BundleWriter, ProbeSession, attach  # noqa: F401
    assert probes.core.capture.ProbeSession is ProbeSession is probes.core.ProbeSession
    assert probes.engines.sglang.runtime.Plugin is probes.engines.sglang.Plugin
    assert probes.rl.weights.write_manifest is probes.rl.write_manifest
    print("ok")
    """
)


def test_package_names_load_on_first_use() -> None:
    """probes.core.bundle, probes.core.shards and probes.engines.sglang.coverage (what the validator's ingest reads) import no
    torch; every exported name of the packages still resolves."""
    proc = subprocess.run(
        [sys.executable, "-c", LAZY],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "error"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "ok"
