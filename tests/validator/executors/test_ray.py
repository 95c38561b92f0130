"""Comparisons on a real Ray cluster (validator.executors): a head and two worker nodes on loopback
(tests/ray_cluster.py), reading tensors from a shared filesystem, a local blob store and the SeaweedFS S3
store scripts/services starts. The comparison document must be the one a single process writes, byte for
byte; a worker killed mid-task must not change it; no cluster, or a lost one, is exit 2 with a message."""

from __future__ import annotations

import bisect
import contextlib
import importlib.util
import json
import math
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from probes import BundleWriter, ShardSpec
from probes.core.acceptance import AcceptanceRecorder
from tests.factories import tensors, write_tp_bundle
from tests.ray_cluster import RayCluster
from tests.servers import VALIDATOR, free_port
from validator.errors import InputError
from validator.executors import RayExecutor, pair_memory, plan_batches, plan_ranges
from validator.judging.compare import PairToMeasure, compare_runs
from validator.runs.reassembly import LogicalTensor, group_logical
from validator.runs.sources import open_path
from validator.runs.tensorfile import ITEMSIZES
from validator.settings import ExecutorSpec, parse_executor

HAVE_RAY = importlib.util.find_spec("ray") is not None
S3 = os.environ.get("VALIDATOR_TEST_S3_ENDPOINT")
BUCKET = "validator-tests"
AWS_ENV = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"}
needs_ray = pytest.mark.skipif(not HAVE_RAY, reason="needs Ray: pip install 'validator[ray]' (scripts/setup installs it)")


# -- test data: TP-split, replicated and PP-partial tensors, a floor pair, acceptance records --------


def _write_run(root: Path, name: str, *, tp: int, pp: int, dtype: torch.dtype, noise: float, seed: int) -> Path:
    full = tensors(seed=0, tokens=512, hidden=640)  # ctx: 327,680 elements (above compare.SMALL_PAIR)
    path = write_tp_bundle(root, name, full, tp=tp, dtype=dtype, noise=noise, seed=seed)
    g = torch.Generator().manual_seed(seed + 100)
    proj = torch.randn(64, 96, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    weights = torch.rand(pp, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    weights /= weights.sum()
    for s in range(pp):
        if pp > 2 and s == 2:
            continue  # a stage that contributed nothing
        piece = proj * weights[s] + noise * torch.randn(proj.shape, generator=g, dtype=torch.float64)
        with BundleWriter(path, run_name=name, part=f"pp{s}") as w:
            w.add("proj", piece.to(torch.float32), step=0, pp_stage=s, shard=ShardSpec.partial(s, pp))
    rng = torch.Generator().manual_seed(seed + 200)
    with AcceptanceRecorder(path, part="acceptance") as rec:
        for r in range(24):
            for step in range(6):
                acc = int(torch.randint(0, 4, (1,), generator=rng))
                rec.record(f"req{r}", proposed=[1, 2, 3], accepted=acc, step=step)
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("ray-runs")
    return {
        "a": _write_run(root, "a", tp=4, pp=4, dtype=torch.float32, noise=0.0, seed=1),
        "b": _write_run(root, "b", tp=2, pp=2, dtype=torch.bfloat16, noise=0.002, seed=2),
        "fa": _write_run(root, "fa", tp=4, pp=4, dtype=torch.float32, noise=0.0, seed=3),
        "fb": _write_run(root, "fb", tp=8, pp=4, dtype=torch.bfloat16, noise=0.001, seed=4),
    }


def _cli(args: list[str], env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([VALIDATOR, *args], env={**os.environ, **AWS_ENV, **env}, capture_output=True, text=True, timeout=timeout)


def _compare_args(runs: dict[str, Path] | dict[str, str]) -> list[str]:
    return ["compare", str(runs["a"]), str(runs["b"]), "--floor", str(runs["fa"]), str(runs["fb"]), "--json"]


# -- without a cluster ---------------------------------------------------------------------------


def test_executor_syntax() -> None:
    assert parse_executor(None) == ExecutorSpec() and parse_executor("local") == ExecutorSpec()
    assert parse_executor("ray") == ExecutorSpec("ray", None)
    assert parse_executor("ray=10.0.0.1:6379") == ExecutorSpec("ray", "10.0.0.1:6379")
    for bad in ("dask", "ray=", "Ray"):
        with pytest.raises(InputError, match="use local, ray or ray=ADDRESS"):
            parse_executor(bad)


def test_plan_and_memory_bound(runs: dict[str, Path]) -> None:
    ga, gb = group_logical(open_path(runs["a"]).tensors), group_logical(open_path(runs["b"]).tensors)
    pairs = [PairToMeasure(ga[k], gb[k], rounding_floor=True) for k in sorted(ga.keys() & gb.keys(), key=repr)]
    assert [len(b) for b in plan_batches(pairs)] == [3]
    assert plan_batches(pairs, batch_bytes=1) == [[0], [1], [2]]  # a pair larger than a batch is a task of its own
    for p in pairs:  # the reservation covers both assembled tensors at least
        numel = int(torch.Size(p.a.shape()).numel())
        assert pair_memory(p.a, p.b, p.rounding_floor) >= numel * (4 + 2)


def test_unreadable_refs_are_refused_before_connecting(tmp_path: Path) -> None:
    """A tensor a worker cannot read (no file, not in a blob store) is an input error naming it, and no
    cluster is contacted (there is none at this address)."""
    a = write_tp_bundle(tmp_path, "a", tensors(), tp=1)
    view = open_path(a)
    from dataclasses import replace

    view.tensors = [replace(t, location=None) for t in view.tensors]
    ex = RayExecutor(f"127.0.0.1:{free_port()}")
    with pytest.raises(InputError, match="cannot be read by Ray workers"):
        compare_runs(view, open_path(a), executor=ex)


def test_no_cluster_is_exit_2(runs: dict[str, Path]) -> None:
    got = _cli([*_compare_args(runs), "--executor", f"ray=127.0.0.1:{free_port()}"], {})
    assert got.returncode == 2, got.stderr
    assert "no Ray cluster answers at 127.0.0.1:" in got.stderr and "Traceback" not in got.stderr
    assert got.stdout == ""
    got = _cli([*_compare_args(runs), "--executor", "spark"], {})
    assert got.returncode == 2 and "use local, ray or ray=ADDRESS" in got.stderr


@pytest.fixture
def http_port() -> Iterator[int]:
    """A port that speaks TCP (an HTTP server) but not Ray."""
    import http.server
    import threading

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield int(srv.server_address[1])
    finally:
        srv.shutdown()
        srv.server_close()


@needs_ray
def test_a_port_that_is_not_ray_is_exit_2_at_once(runs: dict[str, Path], http_port: int) -> None:
    """An HTTP server at the address: exit 2 within seconds, naming the address, without Ray's own warnings."""
    t = time.monotonic()
    got = _cli([*_compare_args(runs), "--executor", f"ray=127.0.0.1:{http_port}"], {}, timeout=60)
    took = time.monotonic() - t
    assert got.returncode == 2, got.stderr
    assert f"127.0.0.1:{http_port} accepts connections but is not a Ray cluster's head" in got.stderr, got.stderr
    assert "Traceback" not in got.stderr and "rpc_client" not in got.stderr and "Failed to connect" not in got.stderr
    assert got.stdout == ""
    assert took < 15, took  # the probe is bounded by CONNECT_TIMEOUT_S (3 s); the rest is the CLI's start


@pytest.fixture
def stalling_port() -> Iterator[int]:
    """A port that answers as a gRPC server does (a SETTINGS frame) and then says nothing more, holding every
    connection open: what ray.init would wait on for minutes."""
    import socket
    import threading

    srv = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            held.append(conn)
            with contextlib.suppress(OSError):
                conn.sendall(bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]))  # an empty SETTINGS frame, then silence

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield int(srv.getsockname()[1])
    finally:
        stop.set()
        t.join()
        for conn in held:
            conn.close()
        srv.close()


@needs_ray
def test_a_port_that_accepts_and_stalls_is_exit_2_in_seconds(runs: dict[str, Path], stalling_port: int) -> None:
    """A server that speaks gRPC's first words and then stalls: the join is bounded (JOIN_TIMEOUT_S, 5 s), exit 2
    naming the address, without Ray's own warnings."""
    from validator.executors.ray_cluster import JOIN_TIMEOUT_S

    t = time.monotonic()
    got = _cli([*_compare_args(runs), "--executor", f"ray=127.0.0.1:{stalling_port}"], {}, timeout=120)
    took = time.monotonic() - t
    assert got.returncode == 2, got.stderr
    assert f"at 127.0.0.1:{stalling_port} did not let a driver join within {JOIN_TIMEOUT_S:g} s" in got.stderr, got.stderr
    assert "Traceback" not in got.stderr and "rpc_client" not in got.stderr, got.stderr
    assert got.stdout == ""
    assert took < JOIN_TIMEOUT_S + 10, took  # the probe's bound, plus the CLI's start


def test_an_absurd_address_is_a_usage_error() -> None:
    for bad in ("a" * 5000 + ":6379", "ray://" + "b" * 300 + ":1", "host:0", "host:65536", "host:port", "bad host:1", ":6379"):
        with pytest.raises(InputError, match="Ray address"):
            parse_executor(f"ray={bad}")
    got = _cli(["compare", "x", "y", "--executor", f"ray={'a' * 5000}:6379"], {}, timeout=60)
    assert got.returncode == 2 and "Ray address 'aaaa" in got.stderr and len(got.stderr) < 1000, got.stderr


@needs_ray
def test_service_comparison_on_a_port_that_is_not_ray_ends_in_error(
    runs: dict[str, Path], http_port: int, tmp_path: Path
) -> None:
    """The server's executor at an HTTP port: a background comparison ends ``error`` with the reason within
    seconds, and the next one is not held up behind it."""
    from validator.service import Service
    from validator.settings import Settings

    svc = Service(Settings(home=tmp_path / "home", compare_executor=f"ray=127.0.0.1:{http_port}"))
    try:
        for name in ("a", "b", "fa"):
            svc.ingest(runs[name], name=name)
        first = svc.cached_comparison("a", "b", background=True)
        second = svc.cached_comparison("a", "fa", background=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            first, second = svc.get_comparison(first["id"]), svc.get_comparison(second["id"])
            if first["status"] == second["status"] == "error":
                break
            time.sleep(0.1)
        for got in (first, second):
            assert got["status"] == "error", got
            assert "RayUnavailable" in got["error"] and "is not a Ray cluster's head" in got["error"], got["error"]
    finally:
        svc.close()


def test_without_ray_installed_is_exit_2(runs: dict[str, Path]) -> None:
    """Ray missing (as in the default install): --executor ray says what to install; exit 2."""
    script = "import sys\nsys.modules['ray'] = None\nfrom validator.app.cli import main\nsys.exit(main(sys.argv[1:]))\n"
    got = subprocess.run([sys.executable, "-c", script, *_compare_args(runs), "--executor", "ray"], capture_output=True,
                         text=True, timeout=120)
    assert got.returncode == 2, got.stderr
    assert "needs Ray, which is not installed here: pip install 'validator[ray]'" in got.stderr and got.stdout == ""


# -- on a cluster ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayCluster]:
    if not HAVE_RAY:
        pytest.skip("needs Ray: pip install 'validator[ray]' (scripts/setup installs it)")
    from tests.ray_cluster import ray_cluster
    from validator.executors import disconnect

    with ray_cluster(tmp_path_factory.mktemp("ray-logs"), workers=2, cpus=1, env=AWS_ENV) as c:
        try:
            yield c
        finally:  # the tests' own driver leaves before the cluster stops, or Ray ends this process later
            disconnect()


@pytest.fixture(scope="module")
def local_doc(runs: dict[str, Path]) -> str:
    got = _cli(_compare_args(runs), {})
    assert got.returncode in (0, 1, 3), got.stderr
    doc = json.loads(got.stdout)
    assert doc["floor"] and "acceptance" in doc and len(doc["pairs"]) == 3
    kinds = {p["name"]: p["floor_kind"] for p in doc["pairs"]}
    assert kinds == {"ctx": "measured", "k": "measured", "proj": "measured"}, kinds
    return got.stdout


@needs_ray
def test_shared_files_bitwise_equal(cluster: RayCluster, runs: dict[str, Path], local_doc: str) -> None:
    """Bundles on a filesystem the workers share: the same document, byte for byte."""
    address = cluster.address
    got = _cli([*_compare_args(runs), "--executor", f"ray={address}"], {})
    assert got.returncode in (0, 1, 3), got.stderr
    assert got.stdout == local_doc


def _s3_url() -> str:
    import boto3
    from botocore.exceptions import ClientError

    client = boto3.client("s3", endpoint_url=S3, region_name="us-east-1", aws_access_key_id="test", aws_secret_access_key="test")
    try:
        client.create_bucket(Bucket=BUCKET)
    except ClientError as exc:
        if exc.response["Error"]["Code"] not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
            raise
    return f"s3://{BUCKET}/ray-{uuid.uuid4().hex[:10]}?endpoint={S3}"


@needs_ray
@pytest.mark.parametrize("store", ["file", pytest.param("s3", marks=pytest.mark.skipif(not S3, reason="needs the SeaweedFS S3 server that scripts/services starts"))])
def test_stored_runs_bitwise_equal(
    cluster: RayCluster, runs: dict[str, Path], store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stored runs: the workers read the blobs from the store themselves (a directory they share, or S3);
    the document equals the one this process computes on the same stored runs, byte for byte."""
    from validator.service import Service
    from validator.settings import Settings

    env = {"VALIDATOR_HOME": str(tmp_path / "home")}
    if store == "s3":
        env["VALIDATOR_BLOB_URL"] = _s3_url()
    for k, v in AWS_ENV.items():
        monkeypatch.setenv(k, v)
    svc = Service(Settings(home=tmp_path / "home", blob_url=env.get("VALIDATOR_BLOB_URL")))
    try:
        for name, path in runs.items():
            svc.ingest(path, name=f"r{name}")
        c = svc.compare("ra", "rb", floor=("rfa", "rfb"), allow_paths=False)  # in this process
    finally:
        svc.close()
    from validator.judging.exit_codes import VERDICT_EXIT
    from validator.judging.report import comparison_doc, dumps

    local = dumps(comparison_doc(c), indent=True) + "\n"  # as `validator compare --json` prints it
    names = {k: f"r{k}" for k in runs}
    got = _cli([*_compare_args(names), "--executor", f"ray={cluster.address}"], env)
    assert got.returncode == VERDICT_EXIT[c.verdict], got.stderr
    assert got.stdout == local


def _kill_a_task_worker(cluster: Any, driver: subprocess.Popen[str]) -> list[int]:
    """SIGKILL the first worker process seen running a task while ``driver`` runs (within 2 minutes)."""
    killed: list[int] = []
    deadline = time.monotonic() + 120
    while not killed and driver.poll() is None and time.monotonic() < deadline:
        for pid in cluster.task_workers():
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
            break
        time.sleep(0.02)
    return killed


def _compare_killing_a_worker(
    cluster: RayCluster, a: Path, b: Path, name: str, *, range_bytes: int = 0, timeout: float
) -> tuple[list[int], int, str, str, str]:
    """Compare pair ``name`` of runs ``a`` and ``b`` on the cluster, in a driver process, with fresh workers
    (``range_bytes``: that range size, and range tasks required), while SIGKILLing the worker of one of its
    tasks. Returns the killed pids, the driver's exit code, stdout (the document), stderr, and the document a
    local comparison of the same pair gives."""
    script = (
        "import sys, json\n"
        "from validator.judging.compare import compare_runs\n"
        "from validator.judging.report import comparison_doc\n"
        "from validator.runs.sources import open_path\n"
        "from validator.executors import RayExecutor\n"
        "a, b, address, name, bound = sys.argv[1:]\n"
        "va, vb = open_path(a), open_path(b)\n"
        "va.tensors = [t for t in va.tensors if t.name == name]\n"  # one pair
        "vb.tensors = [t for t in vb.tensors if t.name == name]\n"
        "ex = RayExecutor(address, fresh_workers=True, **({'range_bytes': int(bound)} if int(bound) else {}))\n"
        "c = compare_runs(va, vb, executor=ex)\n"
        "assert not int(bound) or ex.range_tasks > 1, ex.range_tasks\n"
        "print(json.dumps(comparison_doc(c), indent=1))\n"
    )
    args = [sys.executable, "-c", script, str(a), str(b), cluster.address, name, str(range_bytes)]
    driver = subprocess.Popen(args, env={**os.environ, **AWS_ENV}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    killed = _kill_a_task_worker(cluster, driver)
    out, err = driver.communicate(timeout=timeout)
    from validator.judging.report import comparison_doc

    va, vb = open_path(a), open_path(b)
    va.tensors = [t for t in va.tensors if t.name == name]
    vb.tensors = [t for t in vb.tensors if t.name == name]
    return killed, driver.returncode, out, err, json.dumps(comparison_doc(compare_runs(va, vb)), indent=1)


@needs_ray
def test_killed_worker_is_retried(cluster: RayCluster, runs: dict[str, Path]) -> None:
    """SIGKILL the worker process running a measuring task: Ray runs the task again and the document is
    unchanged. The task gets a fresh worker process here, so there is a task to kill while it starts.
    The comparison is of one pair (the TP-split `k`), so it is one task."""
    killed, code, out, err, expected = _compare_killing_a_worker(cluster, runs["a"], runs["b"], "k", timeout=240)
    assert killed, "no measuring task was seen running"
    assert code == 0, err
    assert "will be retried" in err  # Ray's note, on stderr (stdout holds only the document)
    assert out.strip() == expected


@needs_ray
def test_a_file_workers_cannot_read_is_exit_2(cluster: RayCluster, tmp_path: Path) -> None:
    """A bundle the workers do not find where the driver found it: an error naming the file, exit 2."""
    a = write_tp_bundle(tmp_path, "a", tensors(), tp=2)
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from validator.errors import InputError\n"
        "from validator.judging.compare import compare_runs\n"
        "from validator.runs.sources import open_path\n"
        "from validator.executors import RayExecutor\n"
        "a, address = sys.argv[1:]\n"
        "va, vb = open_path(a), open_path(a)\n"
        "Path(a).rename(a + '.moved')\n"  # headers read, bytes not yet: the workers will not find them
        "try:\n"
        "    compare_runs(va, vb, executor=RayExecutor(address))\n"
        "except InputError as exc:\n"
        "    print(exc)\n"
        "    sys.exit(2)\n"
    )
    got = subprocess.run([sys.executable, "-c", script, str(a), cluster.address], capture_output=True, text=True, timeout=180)
    assert got.returncode == 2, got.stderr[-3000:]
    assert "a Ray worker cannot read" in got.stdout and str(a) in got.stdout and "same path" in got.stdout


@needs_ray
def test_a_pair_larger_than_every_node_is_refused(cluster: RayCluster, tmp_path: Path) -> None:
    """A pair whose tensors need more memory than any node's memory resource, and that cannot be measured in
    ranges (integers), is refused before any task runs, naming the tensor (the file is sparse: as large as
    this machine's memory, and nothing is read)."""
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    numel = ram // 4
    header = json.dumps({"huge": {"dtype": "I32", "shape": [numel], "data_offsets": [0, numel * 4]}}).encode()
    header += b" " * (-len(header) % 8)
    path = tmp_path / "huge.safetensors"
    with open(path, "wb") as f:
        f.write(len(header).to_bytes(8, "little") + header)
        f.truncate(8 + len(header) + numel * 4)
    got = _cli(["compare", str(path), str(path), "--executor", f"ray={cluster.address}"], {})
    assert got.returncode == 2, got.stderr
    assert "tensor 'huge' needs about" in got.stderr and "more than any Ray node offers" in got.stderr, got.stderr


@needs_ray
def test_service_background_comparison_on_ray(cluster: RayCluster, runs: dict[str, Path], tmp_path: Path) -> None:
    """VALIDATOR_COMPARE_EXECUTOR: a background comparison is measured on the cluster; its stored result is
    the one computed in the service's own process."""
    from validator.service import Service
    from validator.settings import Settings

    address = cluster.address
    svc = Service(Settings(home=tmp_path / "home", compare_executor=f"ray={address}"))
    try:
        for name in ("a", "b"):
            svc.ingest(runs[name], name=name)
        got = svc.cached_comparison("a", "b", background=True)
        deadline = time.monotonic() + 180
        while got["status"] in ("queued", "running") and time.monotonic() < deadline:
            time.sleep(0.2)
            got = svc.get_comparison(got["id"])
        assert got["status"] == "done", got["error"]
        from validator.judging.report import comparison_json

        expected = json.loads(comparison_json(svc.compare("a", "b", allow_paths=False)))  # in this process
        assert got["result"] == expected
    finally:
        svc.close()


def test_the_setting_imports_neither_ray_nor_torch(tmp_path: Path) -> None:
    """A service with the Ray setting starts, lists and shows without importing Ray (or torch): only a
    comparison does."""
    script = (
        "import sys\n"
        "from validator.service import Service\n"
        "from validator.settings import Settings\n"
        "from pathlib import Path\n"
        "svc = Service(Settings(home=Path(sys.argv[1]), compare_executor='ray=10.0.0.1:6379'))\n"
        "svc.list_runs()\n"
        "svc.close()\n"
        "assert 'ray' not in sys.modules and 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith(('ray', 'torch')))\n"
    )
    got = subprocess.run([sys.executable, "-c", script, str(tmp_path / "home")], capture_output=True, text=True, timeout=120)
    assert got.returncode == 0, got.stderr


def test_bad_executor_setting_fails_at_start(tmp_path: Path) -> None:
    from validator.service import Service
    from validator.settings import Settings

    with pytest.raises(InputError, match="use local, ray or ray=ADDRESS"):
        Service(Settings(home=tmp_path / "home", compare_executor="ray="))


# -- huge pairs in ranges: pairs above the executor's bound, measured by range tasks -------------------

RANGE_BOUND = 64 << 10  # bytes of both tensors per range task in these tests


def _nonfinite(t: torch.Tensor, at: list[int], values: list[float]) -> torch.Tensor:
    t = t.clone()
    flat = t.view(-1)
    for i, v in zip(at, values):
        flat[i] = v
    return t


def _write_huge(root: Path, name: str, side: str) -> Path:
    """Pairs the tests' bound splits (with NaN/Inf, TP-split on dim 1 and dim 0 in other layouts than the
    other side, a replicated tensor whose copies disagree, a PP-partial sum, mixed and equal dtypes, a wide
    ULP spread) and a small pair, measured in a batch."""
    g = torch.Generator().manual_seed(50)
    h, w = torch.randn(64, 20480, generator=g), torch.randn(64, 4096, generator=g)
    r, p = torch.randn(128, 1024, generator=g), torch.randn(128, 1024, generator=g, dtype=torch.float64)
    m, small = torch.randn(192, 700, generator=g), torch.randn(16, 64, generator=g)
    noise = torch.Generator().manual_seed(51 if side == "a" else 52)

    def jitter(t: torch.Tensor, scale: float = 0.01) -> torch.Tensor:
        return t * (1 + scale * torch.randn(t.shape, generator=noise, dtype=t.dtype))

    inf, nan = math.inf, math.nan
    path = root / name
    if side == "a":
        h = _nonfinite(h, [5, 70_000, 900_001, 1_300_000], [nan, inf, -inf, nan])
        m = _nonfinite(m, [3, 50_000, 100_000], [inf, nan, -inf])
        for rank in range(2):
            with BundleWriter(path, run_name=name, part=f"tp{rank}") as wr:
                wr.add("h", h[:, rank * 10240 : (rank + 1) * 10240].to(torch.bfloat16), step=0, tp_rank=rank, tp_size=2,
                       shard=ShardSpec.split(1, rank, 2))
                wr.add("w", w[rank * 32 : (rank + 1) * 32].clone(), step=0, tp_rank=rank, tp_size=2, shard=ShardSpec.split(0, rank, 2))
                copy = r if rank == 0 else _nonfinite(r, [7, 60_000, 99_999], [r.view(-1)[7].item() + 0.5, nan, 3.0])
                wr.add("r", copy.to(torch.bfloat16), step=0, tp_rank=rank, tp_size=2, shard=ShardSpec.replicated(rank, 2))
        for stage, weight in enumerate((0.3, 0.7)):
            with BundleWriter(path, run_name=name, part=f"pp{stage}") as wr:
                wr.add("p", (p * weight).to(torch.float32), step=0, pp_stage=stage, shard=ShardSpec.partial(stage, 2))
        with BundleWriter(path, run_name=name, part="full") as wr:
            wr.add("m", m, step=0)
            wr.add("s", small, step=0)
        return path
    h = _nonfinite(jitter(h), [5, 70_000, 900_001, 1_300_001], [nan, inf, inf, 1.0])
    m = _nonfinite(jitter(m), [3, 50_000, 100_001], [inf, 2.0, -inf])
    spread = jitter(w, 0.05)
    flat = spread.view(-1)
    flat[:5000] = -flat[:5000]
    flat[5000:10000] *= 37
    for rank in range(4):
        with BundleWriter(path, run_name=name, part=f"tp{rank}") as wr:
            wr.add("h", h[:, rank * 5120 : (rank + 1) * 5120].to(torch.bfloat16), step=0, tp_rank=rank, tp_size=4,
                   shard=ShardSpec.split(1, rank, 4))
    with BundleWriter(path, run_name=name, part="full") as wr:
        wr.add("w", spread, step=0)
        wr.add("r", jitter(r).to(torch.bfloat16), step=0)
        wr.add("p", jitter(p).to(torch.bfloat16), step=0)
        wr.add("m", m.to(torch.bfloat16), step=0)
        wr.add("s", jitter(small), step=0)
    return path


@pytest.fixture(scope="module")
def huge(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("ray-huge")
    return {"a": _write_huge(root, "a", "a"), "b": _write_huge(root, "b", "b")}


def _fresh(t: LogicalTensor) -> LogicalTensor:
    """A copy whose notes a materialize() may extend without touching ``t``."""
    return LogicalTensor(t.name, t.coords, t.shards, list(t.notes))


def _copies(t: LogicalTensor) -> int:
    """Copies of each element a range task reads: every replica, every stage, the replicas of a split piece."""
    return len(t.shards) if t.kind != "split" else len(t.shards) // len(t.split_pieces())


def _record_file_reads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int, int]]:
    """(file, offset, length) of every positioned read validator.store.blob_read makes from now on."""
    import validator.store.blob_read as blob_read

    reads: list[tuple[str, int, int]] = []
    real = os.preadv

    def preadv(fd: int, buffers: list[memoryview], offset: int) -> int:
        got = real(fd, buffers, offset)
        reads.append((os.readlink(f"/proc/self/fd/{fd}"), offset, got))
        return got

    monkeypatch.setattr(blob_read, "os", SimpleNamespace(preadv=preadv))
    return reads


def test_range_tasks_merge_to_the_whole_pair(huge: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a cluster: each range task's body run here on each range of each pair (ranges of whole row
    blocks and, where a block exceeds the bound, of rows inside it), merged as the driver merges them, gives
    the bits ``compare.measure_pair`` gives for the whole pair: metrics, block sums, NaN counts, the rounding
    floor, the largest ULP distance, the replica notes. Each task reads only its range's bytes
    of each stored piece (a piece split on dim 1: the whole rows around the range)."""
    from tests.validator.numerics.test_batched import bits
    from validator.executors.assembly import portable
    from validator.executors.planning import outer_row, rounding_dtype, splittable
    from validator.executors.tasks import measure_range, merge_measured
    from validator.judging.compare import measure_pair

    ga, gb = group_logical(open_path(huge["a"]).tensors), group_logical(open_path(huge["b"]).tensors)
    reads = _record_file_reads(monkeypatch)
    for key in sorted(ga.keys() & gb.keys(), key=repr):
        la, lb = ga[key], gb[key]
        assert splittable(la, lb)
        pa, pb = portable(la, None), portable(lb, None)
        per = int(torch.empty(0, dtype=getattr(torch, la.dtype)).element_size()) + int(torch.empty(0, dtype=getattr(torch, lb.dtype)).element_size())
        spans = plan_ranges(la.shape(), per, 16 << 10)
        for rounding in (False, True):
            want = measure_pair(_fresh(la), _fresh(lb), rounding)
            results = []
            for lo, hi in spans:
                reads.clear()
                (got,) = measure_range(pa, pb, rounding_dtype(la, lb, rounding), lo, hi, None)
                results.append(got)
                read = sum(n for _, _, n in reads)
                most = sum((hi - lo + 2 * outer_row(t)) * ITEMSIZES[t.dtype] * _copies(t) for t in (la, lb))
                assert (hi - lo) * per <= read <= most, (key, lo, hi, read, most)
            assert bits(merge_measured(PairToMeasure(pa, pb, rounding), results)) == bits(want), (key, rounding)
        assert len(spans) > 1 or key[0] == "s"
    (ra,), (rb,) = ([v for k, v in g.items() if k[0] == "r"] for g in (ga, gb))
    notes = measure_pair(_fresh(ra), _fresh(rb), False).notes
    assert any("replicas disagree" in n for n in notes), notes


@needs_ray
@pytest.mark.parametrize("floor", [False, True])
def test_huge_pairs_in_ranges_bitwise_equal(cluster: RayCluster, huge: dict[str, Path], floor: bool) -> None:
    """Pairs above the bound measured by range tasks on the cluster and merged by the driver: the document
    equals the one a single process writes, byte for byte (with and without a floor pair, itself split;
    with it, measured and rounding floors)."""
    from validator.judging.report import comparison_doc

    def views() -> tuple[Any, Any, Any]:
        va, vb = open_path(huge["a"]), open_path(huge["b"])
        return va, vb, ((open_path(huge["a"]), open_path(huge["b"])) if floor else None)

    va, vb, fl = views()
    local = json.dumps(comparison_doc(compare_runs(va, vb, floor=fl)), indent=1)
    ex = RayExecutor(cluster.address, range_bytes=RANGE_BOUND)
    va, vb, fl = views()
    got = json.dumps(comparison_doc(compare_runs(va, vb, floor=fl, executor=ex)), indent=1)
    assert got == local
    doc = json.loads(local)
    assert len(doc["pairs"]) == 6 and ex.range_tasks > 6 * (2 if floor else 1)
    assert any("replicas disagree" in n for p in doc["pairs"] for n in p["notes"])
    if floor:  # the floor pair's tensors with NaN are not used: those pairs measure the rounding floor, in ranges
        assert {p["floor_kind"] for p in doc["pairs"]} >= {"measured", "rounding"}, [p["floor_kind"] for p in doc["pairs"]]


@needs_ray
@pytest.mark.parametrize("store", ["file", pytest.param("s3", marks=pytest.mark.skipif(not S3, reason="needs the SeaweedFS S3 server that scripts/services starts"))])
def test_stored_huge_pairs_in_ranges_bitwise_equal(
    cluster: RayCluster, huge: dict[str, Path], store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stored runs, split by the setting (VALIDATOR_RAY_RANGE_BYTES): range tasks read their ranges of the
    blobs from the store (positioned reads of a shared directory's files, or S3 range GETs); the document
    equals the one this process computes, byte for byte."""
    import validator.executors.planning as planning
    from validator.judging.report import comparison_doc
    from validator.service import Service
    from validator.settings import Settings

    for k, v in AWS_ENV.items():
        monkeypatch.setenv(k, v)
    svc = Service(Settings(home=tmp_path / "home", blob_url=_s3_url() if store == "s3" else None))
    ranges: list[int] = []
    real = planning.range_memory

    def counted(*args: Any) -> int:
        ranges.append(1)
        return real(*args)

    monkeypatch.setattr(planning, "range_memory", counted)
    try:
        for name, path in huge.items():
            svc.ingest(path, name=f"h{name}")
        local = json.dumps(comparison_doc(svc.compare("ha", "hb", allow_paths=False)), indent=1)
        monkeypatch.setenv("VALIDATOR_RAY_RANGE_BYTES", str(RANGE_BOUND))
        got = json.dumps(comparison_doc(svc.compare("ha", "hb", allow_paths=False, executor=f"ray={cluster.address}")), indent=1)
    finally:
        svc.close()
    assert got == local
    assert len(ranges) > 6


@needs_ray
def test_killed_range_task_is_retried(cluster: RayCluster, huge: dict[str, Path]) -> None:
    """SIGKILL the worker process running a range task: Ray runs that range again and the document is unchanged."""
    killed, code, out, err, expected = _compare_killing_a_worker(
        cluster, huge["a"], huge["b"], "h", range_bytes=4 * RANGE_BOUND, timeout=300)
    assert killed, "no range task was seen running"
    assert code == 0, err[-3000:]
    assert "will be retried" in err
    assert out.strip() == expected


def test_range_bytes_setting() -> None:
    from validator.settings import RANGE_BYTES, ExecutorSettings

    assert ExecutorSettings.from_env({}).range_bytes == RANGE_BYTES
    assert ExecutorSettings.from_env({"VALIDATOR_RAY_RANGE_BYTES": "0"}).range_bytes is None
    assert ExecutorSettings.from_env({"VALIDATOR_RAY_RANGE_BYTES": "4096"}).range_bytes == 4096
    for bad in ("-1", "1G", "x"):
        with pytest.raises(InputError, match="use a number of bytes"):
            ExecutorSettings.from_env({"VALIDATOR_RAY_RANGE_BYTES": bad})
    assert ExecutorSettings.from_env({"RAY_ADDRESS": " 10.0.0.1:6379 "}).ray_address == "10.0.0.1:6379"


@needs_ray
def test_lost_cluster_is_exit_2(cluster: RayCluster, runs: dict[str, Path]) -> None:
    """Every process of the cluster is killed while a comparison runs on it: exit 2 with a message, no
    traceback, no output. (The last test of the module: it ends the module's cluster.)"""
    c = cluster
    script = (
        "import sys\n"
        "from validator.app.cli import main\n"
        "from validator.executors import ray_scheduler\n"
        "ray_scheduler.LOST_AFTER_S = 5.0\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    driver = subprocess.Popen(
        [sys.executable, "-c", script, *_compare_args(runs), "--executor", f"ray={c.address}"],
        env={**os.environ, **AWS_ENV}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    deadline = time.monotonic() + 120
    while not c.task_workers() and driver.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    c.crash()
    out, err = driver.communicate(timeout=240)
    assert driver.returncode == 2, (driver.returncode, err[-3000:])
    assert "Ray cluster" in err and "nothing was stored" in err and "Traceback" not in err, err[-3000:]
    assert out == ""


@pytest.mark.skipif(not S3, reason="needs the SeaweedFS S3 server that scripts/services starts")
def test_worker_reads_from_s3_in_ranges(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a worker does with a stored blob: S3 GETs (ranged, side by side, when the object is larger than
    a range) into memory, the digest checked; a missing or wrong object is an error naming the blob."""
    from validator.store.blob_read import open_blob_tensor
    from validator.store.blobs_s3 import S3BlobStore

    for k, v in AWS_ENV.items():
        monkeypatch.setenv(k, v)
    url = _s3_url()
    store = S3BlobStore.from_url(url, cache_dir=tmp_path / "cache")
    t = torch.randn(1000, 777, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    data = t.view(torch.uint8).numpy().tobytes()
    sha, size, _ = store.put([data])
    for range_bytes in (None, 100_000, size - 1, size):
        got = open_blob_tensor(url, sha, "bfloat16", (1000, 777), size, range_bytes=range_bytes)
        assert torch.equal(got, t)
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("??/*"))  # no copy on disk
    missing = "0" * 64
    with pytest.raises(InputError, match=f"blob {missing} is missing from object storage"):
        open_blob_tensor(url, missing, "bfloat16", (1000, 777), size)
    wrong = "f" * 64  # an object under a digest its bytes do not have
    store.client.put_object(Bucket=store.bucket, Key=store.key(wrong), Body=data)
    for range_bytes in (None, 100_000):
        with pytest.raises(InputError, match="does not match its digest"):
            open_blob_tensor(url, wrong, "bfloat16", (1000, 777), size, range_bytes=range_bytes)
    with pytest.raises(InputError, match="longer than its record"):
        open_blob_tensor(url, wrong, "bfloat16", (999, 777), size - 777 * 2)
    with pytest.raises(InputError, match="bytes, its record says"):
        open_blob_tensor(url, wrong, "bfloat16", (999, 777), size - 777 * 2, range_bytes=100_000)


# -- ranges of huge tensors (planning and range reads; the executor does not split pairs yet) ------------


@pytest.mark.parametrize("shape", [(4096, 1024), (1000, 3, 7), (100,), (63, 5), (1, 1), (0, 4), (64, 20480), (3, 100_000)])
@pytest.mark.parametrize("bound", [1, 64, 4096, 1 << 16, 1 << 20, 1 << 40])
def test_plan_ranges_cut_where_ranges_merge(shape: tuple[int, ...], bound: int) -> None:
    """Ranges cover the tensor in order, every cut is one where ranges merge exactly (a row-block edge, or
    inside a block larger than the bound the first element of a row of partials), and each range holds
    at most ``bound`` bytes of both tensors unless no cut lies inside it."""
    from validator.numerics.backends.cpu import row_plan
    from validator.numerics.floors import block_edges
    from validator.numerics.ranges import is_cut

    edges = block_edges(shape)
    cuts = {int(c) for c in row_plan(edges, edges[-1])[0]}
    per = 2 + 4  # bf16 against float32
    got = plan_ranges(shape, per, bound)
    assert got[0][0] == 0 and got[-1][1] == edges[-1]
    assert all(x[1] == y[0] for x, y in zip(got, got[1:])) and all(lo < hi for lo, hi in got if edges[-1])
    assert all(is_cut(shape, c) for r in got for c in r)
    for lo, hi in got:
        assert (hi - lo) * per <= bound or not any(lo < c < hi for c in cuts), (lo, hi)
        if (hi - lo) * per > bound and any(lo < e < hi for e in edges):
            raise AssertionError(f"{lo}..{hi} holds a block edge and more than the bound")
    if edges[-1] * per <= bound:
        assert got == [(0, edges[-1])]
    for c in {c for r in got for c in r} - set(edges):  # inside a block only where the block exceeds the bound
        j = bisect.bisect_right(edges, c) - 1
        assert (edges[j + 1] - edges[j]) * per > bound, (c, edges[j], edges[j + 1])


def _record_reads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """(offset, length) of every positioned read validator.store.blob_read makes from now on."""
    import validator.store.blob_read as blob_read

    reads: list[tuple[int, int]] = []
    real = os.preadv

    def preadv(fd: int, buffers: list[memoryview], offset: int) -> int:
        got = real(fd, buffers, offset)
        reads.append((offset, got))
        return got

    monkeypatch.setattr(blob_read, "os", SimpleNamespace(preadv=preadv))
    return reads


def test_file_range_reads_only_its_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A range of a tensor in a bundle file: the same elements as the whole tensor's, and no byte outside
    the range is read (what bounds a range task's memory)."""
    from validator.store.blob_read import open_file_range

    t = torch.randn(300, 77, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    with BundleWriter(tmp_path / "r", run_name="r", part="p0") as w:
        w.add("x", t, step=0)
    (ref,) = open_path(tmp_path / "r").tensors
    assert ref.location is not None
    path, offset = ref.location
    reads = _record_reads(monkeypatch)
    flat = t.reshape(-1)
    for lo, hi in [(0, flat.numel()), (0, 1), (1234, 5678), (flat.numel() - 3, flat.numel()), (50, 50)]:
        reads.clear()
        got = open_file_range(str(path), offset, "bfloat16", lo, hi)
        assert torch.equal(got, flat[lo:hi])
        assert all(offset + 2 * lo <= o and o + n <= offset + 2 * hi for o, n in reads), reads
        assert sum(n for _, n in reads) == 2 * (hi - lo)
    with pytest.raises(OSError, match="file ended"):
        open_file_range(str(path), offset, "bfloat16", flat.numel(), flat.numel() + 10**6)


def test_local_store_range_reads_only_its_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A range of a blob of the local store (file://): its elements, read alone; a blob of another length
    than its record, or a missing one, is an error naming it."""
    from validator.store.blob_read import open_blob_range
    from validator.store.blobs import LocalBlobStore

    store = LocalBlobStore(tmp_path / "blobs")
    t = torch.randn(1000, 33, generator=torch.Generator().manual_seed(4))
    sha, size, _ = store.put([t.view(torch.uint8).numpy().tobytes()])
    url = f"file://{tmp_path / 'blobs'}"
    reads = _record_reads(monkeypatch)
    got = open_blob_range(url, sha, "float32", size, 4000, 9000)
    assert torch.equal(got, t.reshape(-1)[4000:9000])
    assert reads and all(4 * 4000 <= o and o + n <= 4 * 9000 for o, n in reads)
    with pytest.raises(InputError, match="its record says"):
        open_blob_range(url, sha, "float32", size + 4, 0, 10)
    with pytest.raises(InputError, match="outside blob"):
        open_blob_range(url, sha, "float32", size, 0, size // 4 + 1)
    with pytest.raises(InputError, match="missing"):
        open_blob_range(url, "0" * 64, "float32", size, 0, 10)


@pytest.mark.skipif(not S3, reason="needs the SeaweedFS S3 server that scripts/services starts")
def test_s3_range_reads_only_its_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A range of an S3 blob: range GETs inside the range only (side by side when larger than one range),
    the elements equal; an object whose length is not its record's is refused."""
    from validator.store.blob_read import _s3_store, open_blob_range
    from validator.store.blobs_s3 import S3BlobStore

    for k, v in AWS_ENV.items():
        monkeypatch.setenv(k, v)
    url = _s3_url()
    store = S3BlobStore.from_url(url, cache_dir=tmp_path / "cache")
    t = torch.randn(1000, 777, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    sha, size, _ = store.put([t.view(torch.uint8).numpy().tobytes()])
    client = _s3_store(url).client
    ranges: list[str] = []
    real = client.get_object

    def get_object(**kw: object) -> object:
        ranges.append(str(kw.get("Range")))
        return real(**kw)

    monkeypatch.setattr(client, "get_object", get_object)
    flat = t.reshape(-1)
    for lo, hi, step in [(0, flat.numel(), None), (1000, 300_000, 100_000), (777, 778, None)]:
        ranges.clear()
        got = open_blob_range(url, sha, "bfloat16", size, lo, hi, range_bytes=step)
        assert torch.equal(got, flat[lo:hi])
        spans = [tuple(int(x) for x in r.removeprefix("bytes=").split("-")) for r in ranges]
        assert spans and all(2 * lo <= a and b < 2 * hi for a, b in spans), ranges
        assert sum(b - a + 1 for a, b in spans) == 2 * (hi - lo)
    with pytest.raises(InputError, match="its record says"):
        open_blob_range(url, sha, "bfloat16", size + 2, 0, 10)
    with pytest.raises(InputError, match="missing from object storage"):
        open_blob_range(url, "0" * 64, "bfloat16", size, 0, 10)
