"""Hook points resolved on the real SGLang sources; missing points reported (and fatal when required)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

from probes.core.capture import ProbeWarning
from probes.core.config import ProbeConfigError
from probes.engines.sglang import (
    POINTS,
    PluginConfig,
    PluginStartupError,
    activate,
    check_points,
    current,
    resolve_static,
    sglang_version,
)
from probes.engines.sglang.launch import environment, site_dir
from tests.paths import ROOT

PR_BRANCH = {"ctx.partial", "ctx.write"}


def test_points_resolve_on_sglang_0523(sglang_0523: Path) -> None:
    statuses = {s.point.name: s for s in check_points(POINTS, sglang_0523)}
    assert sglang_version(sglang_0523) == "0.5.23"
    for name, s in statuses.items():
        assert s.active == (name not in PR_BRANCH), s.message()
    # every released target is found, with the parameters the wrappers read by name
    for s in statuses.values():
        for r in s.resolutions:
            assert r.found == (not r.target.pp_branch), (r.target.path, r.where)
    params = {
        r.target.path.rsplit(".", 2)[-2] + "." + r.target.qualname.rsplit(".", 1)[-1]: r.params
        for s in statuses.values()
        for r in s.resolutions
    }
    assert params["DFlashDraftModel.project_target_hidden"] == ("self", "target_hidden")
    assert params["DFlashWorkerV2._append_target_hidden_to_draft_kv_by_loc"][1:4] == (
        "target_hidden",
        "cache_loc",
        "positions",
    )
    assert "candidates" in params["DFlashWorkerV2._accept_block"]
    msg = statuses["ctx.partial"].message()
    assert "sglang 0.5.23" in msg and "project_target_hidden_partial" in msg and "PR #33863" in msg


def test_a_version_without_dflash_is_reported(sglang_059: Path) -> None:
    statuses = {s.point.name: s for s in check_points(POINTS, sglang_059)}
    assert not statuses["ctx.project"].active and not statuses["draft.kv"].active
    msg = statuses["ctx.project"].message()
    assert "sglang 0.5.9" in msg and "sglang.srt.models.dflash.DFlashDraftModel.project_target_hidden" in msg
    assert "module sglang.srt.models.dflash not found" in msg
    assert statuses["pp.send"].active and statuses["target.hidden"].active  # present since long before DFlash


def test_fake_matches_real_signatures(sglang_0523: Path, fake_sglang: Path) -> None:
    fake_root = fake_sglang / "sglang"
    for p in POINTS:
        for t in p.targets:
            real, fake = resolve_static(t, sglang_0523), resolve_static(t, fake_root)
            if real.found:
                assert fake.found and fake.params == real.params, (t.path, fake.params, real.params)
    # the PR #33863 methods are modelled on DFlashDraftModel (from the PR's description)
    partial = next(
        t for p in POINTS for t in p.targets if t.qualname == "DFlashDraftModel.project_target_hidden_partial"
    )
    assert resolve_static(partial, fake_root).params == ("self", "x_local", "feature_indices")


def env(tmp_path: Path, **kw: str) -> dict[str, str]:
    return {"VALIDATOR_PROBE_BUNDLE": str(tmp_path / "b"), **kw}


def test_required_point_missing_stops_startup(sglang_0523: Path, tmp_path: Path) -> None:
    with pytest.raises(PluginStartupError) as ei:
        activate(
            env(tmp_path, VALIDATOR_SGLANG_REQUIRED="ctx.partial"),
            search_path=[str(sglang_0523.parent)],
            register_atexit=False,
        )
    text = str(ei.value)
    assert "DFlashDraftModel.project_target_hidden_partial" in text and "sglang 0.5.23" in text
    assert current() is None and not (tmp_path / "b").exists()


def test_missing_points_warn_and_disabled_is_a_noop(sglang_059: Path, tmp_path: Path) -> None:
    before = list(sys.meta_path)
    assert activate({}, search_path=[str(sglang_059.parent)]) is None  # no bundle: nothing at all
    assert sys.meta_path == before
    from probes.engines.sglang import deactivate

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plugin = activate(env(tmp_path), search_path=[str(sglang_059.parent)], register_atexit=False)
    texts = [str(w.message) for w in caught if issubclass(w.category, ProbeWarning)]
    assert any("'ctx.project' is not available in sglang 0.5.9" in t for t in texts), texts
    try:
        assert plugin is not None and sys.meta_path[0] is not before[0]
        assert plugin.manifest()["points"]["ctx.project"]["active"] is False
    finally:
        deactivate()
    assert sys.meta_path == before


def test_plugin_config_from_env() -> None:
    cfg = PluginConfig.from_env(
        {
            "VALIDATOR_SGLANG_POINTS": "ctx.*,accept",
            "VALIDATOR_SGLANG_CAPTURE_LAYERS": "19,37",
            "VALIDATOR_SGLANG_REQUIRED": "selected",
            "VALIDATOR_SGLANG_ROLE": "prefill",
        }
    )
    assert cfg.selected() == ["batch", "ctx.project", "ctx.partial", "ctx.write", "accept"]
    assert cfg.capture_layers == (19, 37) and cfg.is_required("accept") and cfg.role == "prefill"
    assert "draft.kv_steps" not in PluginConfig().selected() and "draft.kv" in PluginConfig().selected()
    with pytest.raises(ProbeConfigError, match="VALIDATOR_SGLANG_POINTZ"):
        PluginConfig.from_env({"VALIDATOR_SGLANG_POINTZ": "x"})
    with pytest.raises(ProbeConfigError, match="matches no capture point"):
        PluginConfig.from_env({"VALIDATOR_SGLANG_POINTS": "ctx.project,draft.kvv"})


def _run_site(cmd: list[str], extra_env: dict[str, str], pythonpath: list[str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("VALIDATOR_", "PYTHONPATH"))}
    e = environment({**base, **extra_env, "PYTHONPATH": os.pathsep.join(pythonpath)})
    return subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_sitecustomize_fails_startup_for_a_required_missing_point(sglang_0523: Path, tmp_path: Path) -> None:
    r = _run_site(
        [sys.executable, "-c", "print('served')"],
        env(tmp_path, VALIDATOR_SGLANG_REQUIRED="ctx.write"),
        [str(sglang_0523.parent)],
    )
    assert r.returncode == 2, r.stderr
    assert "served" not in r.stdout
    assert "write_projected_context_kv" in r.stderr and "sglang 0.5.23" in r.stderr


def test_sitecustomize_without_variables_loads_nothing(tmp_path: Path) -> None:
    code = textwrap.dedent("""
        import sys
        print(any(m.startswith("probes") for m in sys.modules), sys.modules["sitecustomize"].__file__)
    """)
    r = _run_site([sys.executable, "-c", code], {}, [])
    assert r.returncode == 0, r.stderr
    loaded, origin = r.stdout.split()
    assert loaded == "False" and origin.startswith(site_dir())


def test_probes_sglang_imports_with_torch_only() -> None:
    code = textwrap.dedent("""
        import sys
        BLOCKED = {"sglang", "validator", "sqlalchemy", "fastapi", "pandas", "scipy", "httpx", "pyarrow"}

        class Blocker:
            def find_spec(self, name, path=None, target=None):
                if name.partition(".")[0] in BLOCKED:
                    raise ImportError(f"blocked import of {name}")
                return None

        sys.meta_path.insert(0, Blocker())
        import probes.engines.sglang, probes.engines.sglang.wrappers, probes.engines.sglang.launch, probes.engines.sglang.__main__
        print("ok")
    """)
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "error"},
    )
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]
