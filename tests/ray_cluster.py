"""A real Ray cluster on loopback for tests and benchmarks: a head (no CPUs: it only schedules) and worker
nodes, each a `ray start --block` process of this environment, so stopping one stops its node's processes.
Every port is chosen free, the session lives in its own temporary directory (short: Ray's sockets live
there), and nothing is shared with any other Ray on the machine."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path


def _ray_command() -> list[str]:
    """The `ray` CLI of this interpreter: its script beside the interpreter (a virtual environment), or
    Ray's CLI module run by the interpreter (Ray installed with `pip --prefix/--target` elsewhere)."""
    script = Path(sys.executable).parent / "ray"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "ray.scripts.scripts"]


RAY = _ray_command()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RayCluster:
    address: str  # HOST:PORT of the head's GCS, what `--executor ray=ADDRESS` takes
    temp_dir: Path
    log_dir: Path
    env: dict[str, str]
    head: subprocess.Popen[bytes] | None = None
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def add_worker(self, cpus: int = 1, timeout: float = 120) -> subprocess.Popen[bytes]:
        """Start a worker node and wait until it has joined the cluster."""
        cmd = [*RAY, "start", "--block", f"--address={self.address}", f"--num-cpus={cpus}", *_node_ports(),
               "--node-ip-address=127.0.0.1", "--disable-usage-stats", "--object-store-memory=100000000"]
        proc = _start_node(cmd, self.env, self.log_dir / f"worker{len(self.workers)}.log", timeout, self)
        self.workers.append(proc)
        return proc

    def log_tail(self, limit: int = 3000) -> str:
        text = ""
        for p in sorted(self.log_dir.glob("*.log")):
            text += f"--- {p.name}\n{p.read_text(errors='replace')[-limit:]}\n"
        return text

    def descendants(self, root: int) -> list[int]:
        """Process ids below ``root`` (read from /proc): the processes a node started."""
        children: dict[int, list[int]] = {}
        for d in Path("/proc").iterdir():
            if d.name.isdigit():
                try:
                    ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    continue
                children.setdefault(ppid, []).append(int(d.name))
        out, todo = [], [root]
        while todo:
            for c in children.get(todo.pop(), []):
                out.append(c)
                todo.append(c)
        return out

    def task_workers(self, prefix: str = "ray::validator.measure") -> list[int]:
        """Worker processes of our nodes running a task whose title (``ray::`` and the task's name) starts with ``prefix``."""
        found = []
        for node in self.workers:
            for pid in self.descendants(node.pid):
                try:
                    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                except OSError:
                    continue
                if cmdline.startswith(prefix):
                    found.append(pid)
        return found

    def stop_node(self, proc: subprocess.Popen[bytes]) -> None:
        """Stop one node: its `ray start --block` stops the node's processes on SIGTERM; what is left of
        its process group (it is its own session) is killed after a grace period."""
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)

    def crash(self) -> None:
        """Every process of every node SIGKILLed at once, the head included: a cluster lost, not stopped."""
        nodes = [*self.workers, *([self.head] if self.head is not None else [])]
        pids = [pid for p in nodes for pid in [p.pid, *self.descendants(p.pid)]]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for p in nodes:
            p.wait()

    def stop(self) -> None:
        nodes = [*self.workers, *([self.head] if self.head is not None else [])]
        for p in nodes:  # all at once: each takes seconds to wind down
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in nodes:
            self.stop_node(p)


STARTED = b"Ray runtime started."  # what `ray start` prints once its node has registered with the head


def _start_node(cmd: list[str], env: dict[str, str], log_path: Path, timeout: float, cluster: RayCluster) -> subprocess.Popen[bytes]:
    """Run one `ray start --block` (its own session: stopping it stops its node) and wait for its node to be
    up, read from its log (no `ray status`: a Python start per poll is seconds on a busy machine)."""
    offset = log_path.stat().st_size if log_path.exists() else 0
    with open(log_path, "ab") as log:  # the child keeps its own copy
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + timeout
    while True:
        with open(log_path, "rb") as f:
            f.seek(offset)
            if STARTED in f.read():
                return proc
        if proc.poll() is not None or time.monotonic() > deadline:
            cluster.stop_node(proc)
            raise RuntimeError(f"a Ray node did not start ({' '.join(cmd[: len(RAY) + 3])}...):\n{cluster.log_tail()}")
        time.sleep(0.1)


def _node_ports() -> list[str]:
    """Free ports for one node's servers (two nodes on one host must not share the fixed defaults)."""
    return [
        f"--node-manager-port={free_port()}",
        f"--object-manager-port={free_port()}",
        f"--dashboard-agent-listen-port={free_port()}",
        f"--dashboard-agent-grpc-port={free_port()}",
        f"--runtime-env-agent-port={free_port()}",
        f"--metrics-export-port={free_port()}",
    ]


@contextlib.contextmanager
def ray_cluster(log_dir: Path, *, workers: int = 2, cpus: int = 1, env: Mapping[str, str] | None = None) -> Iterator[RayCluster]:
    """A head and ``workers`` nodes of ``cpus`` CPUs each; stopped (all their processes) on the way out."""
    log_dir.mkdir(parents=True, exist_ok=True)
    temp = Path(tempfile.mkdtemp(prefix="vray", dir="/tmp"))
    # RAY_AUTH_MODE: a loopback cluster without token authentication, whether or not ~/.ray/auth_token exists
    # (Ray >= 2.5x enables it on a head when that file exists, and a worker node started alike would not join)
    full_env = {"RAY_AUTH_MODE": "disabled", **os.environ, **(env or {}), "RAY_USAGE_STATS_ENABLED": "0"}
    port = free_port()
    cluster = RayCluster(address=f"127.0.0.1:{port}", temp_dir=temp, log_dir=log_dir, env=full_env)
    cmd = [*RAY, "start", "--head", "--block", f"--port={port}", "--num-cpus=0", "--include-dashboard=false",
           *_node_ports(), "--node-ip-address=127.0.0.1",
           f"--temp-dir={temp}", "--disable-usage-stats", "--object-store-memory=100000000"]
    try:
        cluster.head = _start_node(cmd, full_env, log_dir / "head.log", 120, cluster)
        for _ in range(workers):  # one at a time: nodes registering together can miss the GCS's deadline on 2 cores
            cluster.add_worker(cpus)
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(temp, ignore_errors=True)
