"""A sweep on a two-node Ray cluster started by hand, as docs/sweeps.md ("On a Ray cluster") says.

Two ``ray start`` nodes on this machine (a head and a second node, one CPU each, each with its
own temporary folder and its own free ports), with token authentication on: Ray 2.60 refuses a
node or a driver that does not present the cluster's token (InvalidAuthToken), so the token
reaches both nodes and the driver as RAY_AUTH_MODE=token and RAY_AUTH_TOKEN in the environment
(nothing reads or writes ~/.ray). Then ``python -m sinklab sweep SPEC --executor ray
--ray-address 127.0.0.1:PORT`` must exit 0 with every cell of its store done.

Everything the cluster started is stopped by pid at the end, never with ``ray stop`` (that
stops every Ray instance on the machine), and the test fails if any of it survives.

Run it alone (about 25 s on two cores; marked slow):

    .venv/bin/python -m pytest tests/test_ray_cluster.py -q -p no:cacheprovider
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from helpers import ROOT

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(sys.platform == "win32", reason="multi-node Ray is POSIX only")]

REPO = ROOT

SPEC = """seeds = 2

[base]
train.max_steps = 30
eval.n_sequences = 32

[grid]
"model.attention" = ["softmax", "relu"]
"""
N_CELLS = 4

START_TIMEOUT_S = 60   # one `ray start` takes 3-5 s here; a node that cannot join retries ~20 s
NODES_DEADLINE_S = 30  # both nodes registered and alive
SWEEP_TIMEOUT_S = 120  # the sweep itself takes about 9 s
GRACE_S = 3            # gcs_server and raylet may ignore SIGTERM for longer: then SIGKILL

# Poll the cluster from a driver of its own until both nodes are alive, or give up.
WAIT_FOR_NODES = """
import sys, time, ray
ray.init(address=sys.argv[1], log_to_driver=False)
deadline = time.monotonic() + float(sys.argv[2])
while (alive := sum(n["Alive"] for n in ray.nodes())) < 2:
    if time.monotonic() > deadline:
        sys.exit(f"{alive} node(s) alive after {sys.argv[2]} s")
    time.sleep(0.5)
"""


def free_ports(n: int) -> list[int]:
    """n distinct ports that were free a moment ago (all held open until all are chosen)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("", 0))  # Ray's servers listen on every interface, not just loopback
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def node_args(temp_dir: Path, ports: list[int]) -> list[str]:
    """`ray start` options shared by both nodes: one CPU, a small object store, and every port
    a node opens pinned, so that two nodes (and any other Ray here) never collide."""
    return ["--temp-dir", str(temp_dir), "--num-cpus", "1",
            "--object-store-memory", str(100 * 2**20), "--disable-usage-stats",
            "--node-manager-port", str(ports[0]), "--object-manager-port", str(ports[1]),
            "--dashboard-agent-listen-port", str(ports[2]),
            "--dashboard-agent-grpc-port", str(ports[3]),
            "--runtime-env-agent-port", str(ports[4]), "--metrics-export-port", str(ports[5]),
            "--worker-port-list", ",".join(map(str, ports[6:]))]


def cluster_processes(root: str) -> list:
    """Every live process of this test's cluster: those with ``root`` on their command line
    (gcs_server, raylet, monitors) or a file open under it (agents and workers rename their
    command line to ``ray::...`` but keep their logs open), and all their children."""
    import psutil

    found = {}
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if proc.pid == os.getpid():
                continue
            if (root in " ".join(proc.info["cmdline"] or ())
                    or any(f.path.startswith(root) for f in proc.open_files())):
                found[proc.pid] = proc
                found.update((c.pid, c) for c in proc.children(recursive=True))
        except psutil.Error:  # gone meanwhile, or not ours to inspect
            pass
    return list(found.values())


def stop_cluster(root: str) -> list[str]:
    """SIGTERM, then SIGKILL after a grace period, every process of the cluster, by pid.
    Returns a description of the ones still alive (none, normally)."""
    import psutil

    for _ in range(3):  # a raylet may start a worker while it is being stopped: look again
        procs = cluster_processes(root)
        if not procs:
            break
        for proc in procs:
            try:
                proc.terminate()
            except psutil.Error:
                pass
        _, alive = psutil.wait_procs(procs, timeout=GRACE_S)
        for proc in alive:
            try:
                proc.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(alive, timeout=5)
    left = []
    for proc in cluster_processes(root):
        try:
            left.append(f"{proc.pid} {' '.join(proc.cmdline())[:120]}")
        except psutil.Error:
            pass
    return left


def run(args: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(args, env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


def test_sweep_on_a_two_node_cluster_with_token_auth():
    pytest.importorskip("ray")
    pytest.importorskip("psutil")  # a dependency of ray
    # A short root under /tmp: Ray's Unix sockets live in <temp-dir>/session_<date>_<pid>/
    # sockets/, and AF_UNIX paths are limited to 107 bytes (pytest's tmp_path is too long).
    root = tempfile.mkdtemp(prefix="r-", dir="/tmp" if os.path.isdir("/tmp") else None)
    token = secrets.token_hex(16)
    # The same auth settings for both nodes and the driver. RAY_AUTH_MODE must be explicit:
    # with a token but no mode, the head turns auth on while the second node and a driver
    # given an address do not, and they are refused. Other RAY_* variables (RAY_ADDRESS...)
    # are dropped; src/ goes on PYTHONPATH because the workers, started by the raylets with
    # this environment, import sinklab.
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token, RAY_USAGE_STATS_ENABLED="0",
               PYTHONPATH=os.pathsep.join(
                   filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")])))
    ray_start = [sys.executable, "-m", "ray.scripts.scripts", "start"]
    ports = free_ports(2 * 16 + 1)
    head_port, head_ports, node_ports = ports[0], ports[1:17], ports[17:]
    address = f"127.0.0.1:{head_port}"
    try:
        # --include-dashboard=false: no HTTP dashboard (and no port 8265 to collide on).
        head = run([*ray_start, "--head", "--port", str(head_port), "--include-dashboard=false",
                    *node_args(Path(root, "h"), head_ports)], env, START_TIMEOUT_S)
        assert head.returncode == 0, head.stderr[-3000:]
        node = run([*ray_start, "--address", address, *node_args(Path(root, "w"), node_ports)],
                   env, START_TIMEOUT_S)
        assert node.returncode == 0, node.stderr[-3000:]
        # `ray start` can return before the second node is seen alive: wait for it.
        wait = run([sys.executable, "-c", WAIT_FOR_NODES, address, str(NODES_DEADLINE_S)],
                   env, NODES_DEADLINE_S + 30)
        assert wait.returncode == 0, wait.stderr[-3000:]

        spec = Path(root, "spec.toml")
        spec.write_text(SPEC)
        out = Path(root, "out")
        sweep = run([sys.executable, "-m", "sinklab", "sweep", str(spec), "--out", str(out),
                     "--executor", "ray", "--ray-address", address, "--workers", "2"],
                    env, SWEEP_TIMEOUT_S)
        assert sweep.returncode == 0, sweep.stderr[-3000:]
        conn = sqlite3.connect(out / "sweep.db")
        try:
            statuses = conn.execute("SELECT name, status FROM cells").fetchall()
        finally:
            conn.close()
        assert len(statuses) == N_CELLS and {s for _, s in statuses} == {"done"}, statuses

        # A driver with the wrong token is refused in one sentence that says what to set,
        # before it writes anything. (Ray retries a refused connection 20 times, 20 s;
        # RAY_NUM_REDIS_GET_RETRIES=2 makes it give up after about 3 s.)
        wrong = {**env, "RAY_AUTH_TOKEN": secrets.token_hex(16), "RAY_NUM_REDIS_GET_RETRIES": "2"}
        refused_out = Path(root, "refused")
        refused = run([sys.executable, "-m", "sinklab", "sweep", str(spec), "--out",
                       str(refused_out), "--executor", "ray", "--ray-address", address],
                      wrong, SWEEP_TIMEOUT_S)
        last = refused.stderr.strip().splitlines()[-1]
        assert refused.returncode == 2, refused.stderr[-3000:]
        assert last.startswith(f"sinklab: error: Ray refused the connection at {address}: the "
                               "cluster uses token authentication"), last
        assert "RAY_AUTH_MODE=token and RAY_AUTH_TOKEN" in last
        assert not refused_out.exists()

        # An address where nothing answers is refused at once (Ray would retry for minutes).
        nothing = f"127.0.0.1:{free_ports(1)[0]}"
        empty = run([sys.executable, "-m", "sinklab", "sweep", str(spec), "--out",
                     str(Path(root, "empty")), "--executor", "ray", "--ray-address", nothing],
                    env, 60)
        assert empty.returncode == 2 and empty.stderr.count("\n") == 1, empty.stderr
        assert f"--ray-address {nothing}: nothing answers there" in empty.stderr
        assert not Path(root, "empty").exists()
    finally:
        survivors = stop_cluster(root)
        shutil.rmtree(root, ignore_errors=True)
    assert not survivors, f"processes of the test cluster survived: {survivors}"
