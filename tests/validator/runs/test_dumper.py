"""SGLang dumper import: files written by SGLang's own dumper (0.5.9 and 0.5.10 naming), ingested and compared.

The dumps are made in subprocesses by the real ``sglang.srt.debug_utils.dumper`` (scripts/setup installs
sglang 0.5.9 into the venv without its dependencies, and 0.5.10 into .venv/sglang-versions/). Two ranks
are played by one process in turn (the dumper asks ``torch.distributed`` for its rank; the test answers),
which keeps the dumper's own file naming and metadata without the cost of a process group per rank.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from tests.paths import ROOT
from validator.app.cli import main
from validator.errors import InputError
from validator.runs.dumper import find_dump_dir, parse_dump_name, read_dumper_dir
from validator.runs.reassembly import group_logical
from validator.runs.sources import open_path

SIDE = ROOT / ".venv" / "sglang-versions"

# Each rank dumps: "hidden" (the same on both ranks), "attn_heads" (rank r holds heads 2r, 2r+1),
# "logits" twice per step without distinguishing tags, and an int (skipped on import).
SCRIPT = textwrap.dedent(
    """
    import os, sys
    import torch
    import torch.distributed as dist

    world = int(sys.argv[1])
    from sglang.srt.debug_utils.dumper import dumper

    old_api = hasattr(dumper, "on_forward_pass_start")
    key = "partial_name" if old_api else "exp_name"
    base = os.environ["SGLANG_DUMPER_PARTIAL_NAME" if old_api else "DUMPER_EXP_NAME"]
    # two experiments: as given, and one whose attn_heads moved by 0.5 (folder name + "b")
    for bump in (0.0, 0.5):
        for rank in range(world):
            dist.is_initialized = lambda: True
            dist.get_rank = lambda rank=rank: rank
            dist.get_world_size = lambda: world
            dumper.reset()
            dumper.__dict__.pop("_static_meta", None)
            dumper.configure(**{key: base + ("b" if bump else "")})
            g = torch.Generator().manual_seed(0)
            for step in range(2):
                if old_api:
                    dumper.on_forward_pass_start()
                hidden = torch.randn(4, 16, generator=g).to(torch.bfloat16)
                heads = torch.randn(4, 2 * world, 8, generator=g) + bump
                logits = torch.randn(4, 10, generator=g, dtype=torch.float64)
                dumper.dump("hidden", hidden, layer_id=3)
                dumper.dump("attn_heads", heads[:, 2 * rank : 2 * rank + 2].clone(), layer_id=3)
                dumper.dump("logits", logits)
                dumper.dump("logits", logits * 2)
                dumper.dump("num_tokens", 4)
                if not old_api:
                    dumper.step()
    """
)


def _sglang_version(path: Path | None) -> str | None:
    import importlib.metadata as md

    try:
        dists = md.distributions(path=[str(path)]) if path else [md.distribution("sglang")]
        return next((d.version for d in dists if d.metadata["Name"] == "sglang"), None)
    except md.PackageNotFoundError:
        return None


def _dump(tmp: Path, generation: str, world: int = 2) -> tuple[Path, list[subprocess.Popen[str]]]:
    """Start the real dumper for ``world`` ranks; returns DUMP_DIR (it will hold two experiment folders)."""
    out = tmp / f"dump-{generation}"
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    if generation == "0.5.9":
        if importlib.util.find_spec("sglang") is None or _sglang_version(None) != "0.5.9":
            pytest.skip("sglang 0.5.9 is not installed in the venv (scripts/setup installs it)")
        env.pop("PYTHONPATH", None)
        env.update(
            SGLANG_DUMPER_ENABLE="1",
            SGLANG_DUMPER_DIR=str(out),
            SGLANG_DUMPER_PARTIAL_NAME="1795938480.42",
            SGLANG_DUMPER_ENABLE_HTTP_SERVER="0",
            SGLANG_DUMPER_ENABLE_OUTPUT_CONSOLE="0",
        )
    else:
        side = SIDE / generation
        if _sglang_version(side) != generation:
            pytest.skip(f"sglang {generation} is not installed in {side} (scripts/setup installs it)")
        env["PYTHONPATH"] = str(side)
        env.update(
            DUMPER_ENABLE="1",
            DUMPER_DIR=str(out),
            DUMPER_EXP_NAME="dump_20261129_074000_123456",
            DUMPER_ENABLE_OUTPUT_CONSOLE="0",
        )
    with open(tmp / f"log-{generation}", "w") as log:  # the child keeps its own descriptor
        proc = subprocess.Popen(
            [sys.executable, "-c", SCRIPT, str(world)],
            env=env,
            cwd=tmp,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
        )
    return out, [proc]


@pytest.fixture(scope="module")
def dumps(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("dumps")
    started = {"0.5.9": _dump(tmp, "0.5.9"), "0.5.10": _dump(tmp, "0.5.10")}
    for gen, (_, procs) in started.items():  # the ranks of both generations run at once
        for p in procs:
            p.wait(timeout=120)
            assert p.returncode == 0, (tmp / f"log-{gen}").read_text()[-3000:]
    out = {k: o for k, (o, _) in started.items()}
    old = out["0.5.9"] / "sglang_dump_1795938480.42"
    return {**out, "0.5.9-folder": old, "bumped": old.with_name(old.name + "b")}


def test_both_naming_generations(dumps: dict[str, Path]) -> None:
    old = find_dump_dir(dumps["0.5.9-folder"])
    new = find_dump_dir(dumps["0.5.10"] / "dump_20261129_074000_123456")
    assert old.name == "sglang_dump_1795938480.42" and new.name == "dump_20261129_074000_123456"
    assert next(iter(parse_dump_name(sorted(os.listdir(old))[0]) or {})) == "forward_pass_id"
    assert next(iter(parse_dump_name(sorted(os.listdir(new))[0]) or {})) == "step"
    for d, steps in ((old, {1, 2}), (new, {0, 1})):
        view = read_dumper_dir(d, split={"attn_*": 1})
        assert view.source == "sglang-dumper"
        assert {r.coords.step for r in view.tensors} == steps
        logical = group_logical(view.tensors)
        kinds = {(lt.name, lt.coords.extra): lt.kind for lt in logical.values()}
        assert kinds[("hidden", ())] == "replicated" and kinds[("attn_heads", ())] == "split"
        assert kinds[("logits", (("call", "0"),))] == kinds[("logits", (("call", "1"),))] == "replicated"
        heads = next(lt for lt in logical.values() if lt.name == "attn_heads")
        assert heads.shape() == (4, 4, 8) and heads.coords.layer == 3
        assert sum("num_tokens" in s for s in view.manifest["sglang_dumper"]["skipped"]) == 4


def test_generations_compare_equal_and_a_change_fails(
    dumps: dict[str, Path], service: object, capsys: pytest.CaptureFixture[str]
) -> None:
    # step numbers differ between generations (forward_pass_id starts at 1, step at 0): compare one generation
    # with itself through the CLI (auto-detected folder), and against a dump whose attn_heads moved
    home = str(Path(dumps["0.5.9"]).parent / "home")
    assert main(["--home", home, "compare", str(dumps["0.5.9-folder"]), str(dumps["0.5.9-folder"])]) == 0
    capsys.readouterr()
    # no dims: attn_heads (really split over the ranks) is read as copies that differ, which is only assumed,
    # so the differing copies are a note and the pair passes
    assert main(["--home", home, "compare", str(dumps["0.5.9-folder"]), str(dumps["0.5.9-folder"]), "--json"]) == 0
    heads = [p for p in json.loads(capsys.readouterr().out)["pairs"] if p["name"] == "attn_heads"]
    assert heads and all(p["status"] == "pass" for p in heads)
    assert all(any(n.startswith("A: replicas disagree") and "rank=1" in n for n in p["notes"]) for p in heads)
    assert main(["--home", home, "compare", str(dumps["0.5.9-folder"]), str(dumps["bumped"]), "--json"]) == 1
    assert "attn_heads" in capsys.readouterr().out


def test_ingest_through_the_cli_and_the_service(
    dumps: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home = str(tmp_path / "home")
    new = dumps["0.5.10"] / "dump_20261129_074000_123456"
    with pytest.raises(InputError, match="holds 2 SGLang dump folders"):
        find_dump_dir(dumps["0.5.10"])
    rc = main(
        [
            "--home",
            home,
            "ingest",
            "--format",
            "sglang-dumper",
            str(new),
            "--name",
            "dumped",
            "--split",
            "attn_*=1",
            "--json",
        ]
    )
    assert rc == 0, capsys.readouterr().err
    capsys.readouterr()
    assert main(["--home", home, "show", "dumped", "--json"]) == 0
    import json

    shown = json.loads(capsys.readouterr().out)
    assert shown["source"] == "sglang-dumper" and shown["labels"]["dumper_naming"] == "step"
    assert {t["kind"] for t in shown["tensors"] if t["name"] == "attn_heads"} == {"split"}
    assert (
        main(
            [
                "--home",
                home,
                "ingest",
                "--format",
                "sglang-dumper",
                str(new.with_name(new.name + "b")),
                "--name",
                "dumped-b",
                "--split",
                "attn_*=1",
            ]
        )
        == 0
    )
    capsys.readouterr()
    assert main(["--home", home, "compare", "dumped", "dumped", "--json"]) == 0
    assert main(["--home", home, "compare", "dumped", "dumped-b", "--json"]) == 1
    capsys.readouterr()
    # the folder itself reads attn_heads as copies (no --split): the layouts disagree, and the report says so
    assert main(["--home", home, "compare", "dumped", str(new), "--json"]) == 1
    assert "shape mismatch" in capsys.readouterr().out


def test_a_stored_0_5_9_dump_compares_with_its_folder(
    dumps: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # no dims: attn_heads's differing copies are assumed, in the stored run as in the folder: a note, a pass
    home = str(tmp_path / "home")
    assert (
        main(["--home", home, "ingest", "--format", "sglang-dumper", str(dumps["0.5.9-folder"]), "--name", "old"]) == 0
    )
    capsys.readouterr()
    assert main(["--home", home, "compare", str(dumps["0.5.9-folder"]), "old", "--json"]) == 0
    pairs = json.loads(capsys.readouterr().out)["pairs"]
    assert pairs and all(p["status"] == "pass" for p in pairs)
    heads = [p for p in pairs if p["name"] == "attn_heads"]
    assert heads and all(any(n.startswith("B: replicas disagree") and "rank=1" in n for n in p["notes"]) for p in heads)


def test_open_path_recognises_the_folder_and_its_parent(dumps: dict[str, Path]) -> None:
    a = open_path(dumps["0.5.9-folder"])
    b = open_path(find_dump_dir(dumps["0.5.9-folder"]))
    assert a.source == b.source == "sglang-dumper" and len(a.tensors) == len(b.tensors) == 16
    t = next(r for r in a.tensors if r.name == "hidden")
    assert t.load().dtype == torch.bfloat16 and t.nbytes == 4 * 16 * 2


class _Evil:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


def test_a_malicious_pickle_is_refused(tmp_path: Path) -> None:
    d = tmp_path / "sglang_dump_1"
    d.mkdir()
    marker = tmp_path / "pwned"
    torch.save({"value": torch.ones(2), "meta": {}}, d / "forward_pass_id=1___rank=0___dump_index=1___name=ok.pt")
    with open(d / "forward_pass_id=1___rank=0___dump_index=2___name=evil.pt", "wb") as f:
        pickle.dump({"value": _Evil(str(marker)), "meta": {}}, f)  # a legacy-format .pt whose unpickling runs a command
    torch.save(
        {"value": _Evil(str(marker)), "meta": {}}, d / "forward_pass_id=1___rank=0___dump_index=3___name=evil2.pt"
    )
    for bad in ("evil", "evil2"):
        ok = [p for p in d.iterdir() if "name=ok" in p.name or f"name={bad}." in p.name]
        dd = tmp_path / bad / "sglang_dump_1"
        dd.mkdir(parents=True)
        for p in ok:
            (dd / p.name).write_bytes(p.read_bytes())
        with pytest.raises(InputError, match=r"refused: not loadable with torch.load\(weights_only=True\)") as ei:
            read_dumper_dir(dd)
        assert f"name={bad}.pt" in str(ei.value)
    assert not marker.exists()


def test_size_cap_and_mixed_generations(tmp_path: Path) -> None:
    d = tmp_path / "x"
    d.mkdir()
    torch.save({"value": torch.ones(64), "meta": {}}, d / "step=0___rank=0___dump_index=1___name=big.pt")
    with pytest.raises(InputError, match="over the size cap of 100 bytes"):
        read_dumper_dir(d, max_file_bytes=100)
    torch.save({"value": torch.ones(1), "meta": {}}, d / "forward_pass_id=1___rank=0___dump_index=2___name=y.pt")
    with pytest.raises(InputError, match="mixes file-naming generations"):
        read_dumper_dir(d)
    assert parse_dump_name("step=0___rank=0___dump_index=1___name=a___layer_id=2.pt") == {
        "step": "0",
        "rank": "0",
        "dump_index": "1",
        "name": "a",
        "layer_id": "2",
    }
    assert parse_dump_name("notes.pt") is None and parse_dump_name("name=a___rank=0___step=1.pt") is None
