"""The emulated cluster (`localsgd.netcluster`): namespaces as nodes, tbf-shaped links, one
torchrun agent per node, nothing left behind however the job ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from localsgd import netcluster
from localsgd.netcluster import ClusterError, EmulatedCluster, leftovers, sweep_stale


def _can_make_namespaces() -> str | None:
    try:
        netcluster.require_net_admin()
    except ClusterError as err:
        return str(err)
    return None


WHY = _can_make_namespaces()
needs_netns = pytest.mark.skipif(WHY is not None, reason=f"no emulated cluster here: {WHY}")
CLI = [sys.executable, "-m", "localsgd.netcluster"]


@pytest.mark.parametrize("kwargs, needs", [
    ({"nodes": 2, "rate_mbit": 0}, "must lie in [0.1, 100000]"),
    ({"nodes": 2, "rate_mbit": "fast"}, "a link rate in Mbit/s"),
    ({"nodes": 2, "rate_mbit": -5}, "must lie in"),
    ({"nodes": 0, "rate_mbit": 100}, "nodes=0: an integer in [1, 64]"),
    ({"nodes": 2, "rate_mbit": 100, "intra_rate_mbit": 0.0}, "intra_rate_mbit"),
])
def test_bad_cluster_is_one_line(kwargs, needs):
    with pytest.raises(ClusterError) as err:
        EmulatedCluster(**kwargs)
    assert needs in str(err.value) and "\n" not in str(err.value)


def test_too_many_processes_refused_before_anything_is_built(monkeypatch):
    monkeypatch.setattr(netcluster, "max_processes", lambda: 6)
    with pytest.raises(ClusterError, match="8 workers, and this machine's free memory holds "
                                           "about 6"):
        netcluster.run_job(4, 2, 100, ["-m", "x"])


def test_cli_bad_input_exits_with_one_line():
    r = subprocess.run([*CLI, "--nodes", "2", "--procs-per-node", "2", "--rate-mbit", "0",
                        "--", "-m", "x"], capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 1
    assert r.stderr.strip().count("\n") == 0 and r.stderr.startswith("error: rate_mbit=")


def test_without_net_admin_says_so(monkeypatch):
    real = subprocess.run

    def refuse(cmd, *a, **k):
        if cmd[:3] == ["ip", "netns", "add"]:
            return subprocess.CompletedProcess(cmd, 1, "", "mount --make-shared: Permission "
                                                          "denied")
        return real(cmd, *a, **k)

    monkeypatch.setattr(netcluster.subprocess, "run", refuse)
    monkeypatch.setattr(netcluster.shutil, "which", lambda tool: f"/usr/sbin/{tool}")
    with pytest.raises(ClusterError, match="needs root or CAP_NET_ADMIN"):
        netcluster.require_net_admin()


def test_bad_probe_and_missing_iproute2_are_one_line(monkeypatch):
    with pytest.raises(ClusterError, match=r"probe_mb=0: the rate probe needs > 0 MB"):
        netcluster.run_job(2, 1, 100, ["-m", "x"], probe_mb=0)
    # no `ip` at all: the one line, and the teardown's look-ups find nothing instead of raising
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ClusterError, match="needs `ip` \\(iproute2\\) on the PATH"):
        netcluster.run_job(2, 1, 100, ["-m", "x"])
    assert leftovers() == []


@needs_netns
def test_a_cluster_failing_midway_through_up_leaves_nothing(monkeypatch):
    real, calls = netcluster._tbf, []

    def fail_on_node_1(dev, rate, ns=None, mtu=1500):
        calls.append(ns)
        if ns is not None and ns.endswith("n1"):
            raise ClusterError("planted: tc refused")
        return real(dev, rate, ns=ns, mtu=mtu)

    monkeypatch.setattr(netcluster, "_tbf", fail_on_node_1)
    cluster = EmulatedCluster(3, 50.0)
    with pytest.raises(ClusterError, match="planted"):
        cluster.up()
    assert leftovers(cluster.tag) == [] and calls


@needs_netns
@pytest.mark.skipif(netcluster.max_processes() < 8, reason="the machine's free memory holds "
                    "fewer than 8 runner processes now")
def test_hierarchical_job_on_four_nodes_over_100_mbit(tmp_path):
    """The issue's 'done when': hierarchical local SGD, 4 nodes x 2 processes, 100 Mbit/s
    links, every rank ends with the same model, the probe within 20 % of the asked rate."""
    out = tmp_path / "c4"
    r = subprocess.run([*CLI, "--nodes", "4", "--procs-per-node", "2", "--rate-mbit", "100",
                        "--probe-mb", "2", "--out", str(out), "--timeout", "400", "--",
                        "-m", "localsgd.training.runner", "--config", "run", "--n-train",
                        "512", "--epochs", "1", "--local-steps", "2", "--block-steps", "2",
                        "--save-final", "--no-progress"],
                       capture_output=True, text=True, timeout=500, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    rec = netcluster.json.loads((out / "cluster.json").read_text())
    assert rec["left_behind"] == [] and rec["exit_codes"] == [0] * 4
    for rate in rec["measured_rate_mbit"].values():
        assert 80 <= rate <= 120, rec["measured_rate_mbit"]
    finals = [torch.load(out / f"final_rank{r}.pt", weights_only=True) for r in range(8)]
    for other in finals[1:]:  # 512 / (8 x 16) = 4 updates: H^b x H = 4, a global average last
        for name, t in finals[0].items():
            if t.is_floating_point() and "running" not in name and "num_batches" not in name:
                assert torch.equal(t, other[name]), name


def _sleeper(tmp_path: Path) -> Path:
    script = tmp_path / "sleep.py"
    script.write_text("import time\nprint('up', flush=True)\ntime.sleep(120)\n")
    return script


def _wait_for_nodes(proc: subprocess.Popen, nodes: int, seconds: float = 60.0) -> None:
    """Until every node of ``proc``'s cluster runs its torchrun worker (a python child)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise AssertionError(f"the cluster exited early: {proc.stderr.read()[-2000:]}")
        names = [f"lsgd{proc.pid}n{i}" for i in range(nodes)]
        pids = [subprocess.run(["ip", "netns", "pids", n], capture_output=True,
                               text=True, check=False).stdout.split() for n in names]
        if all(len(p) >= 2 for p in pids):  # the agent and its worker
            return
        time.sleep(0.5)
    raise AssertionError("the cluster's nodes never started")


@needs_netns
def test_node_killed_mid_run_stops_the_others_and_leaves_nothing(tmp_path):
    proc = subprocess.Popen([*CLI, "--nodes", "2", "--procs-per-node", "1", "--rate-mbit", "50",
                             "--probe-mb", "1", "--out", str(tmp_path), "--",
                             str(_sleeper(tmp_path))], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_nodes(proc, 2)
        pids = subprocess.run(["ip", "netns", "pids", f"lsgd{proc.pid}n1"], capture_output=True,
                              text=True, check=False).stdout.split()
        for pid in pids:  # node 1 dies whole, as a machine would
            os.kill(int(pid), signal.SIGKILL)
        _, err = proc.communicate(timeout=60)
    finally:
        _end(proc)
    assert proc.returncode == 1
    assert "error: node 1 exited with signal 9 (SIGKILL); stopped the other nodes" in err
    assert leftovers(proc.pid) == []
    rec = netcluster.json.loads((tmp_path / "cluster.json").read_text())
    assert rec["failed_node"] == 1 and rec["left_behind"] == []


@needs_netns
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_controller_stopped_tears_down(tmp_path, sig):
    proc = subprocess.Popen([*CLI, "--nodes", "2", "--procs-per-node", "1", "--rate-mbit", "50",
                             "--probe-mb", "1", "--", str(_sleeper(tmp_path))],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_nodes(proc, 2)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        _end(proc)
    assert proc.returncode == 1 and "interrupted: stopped every node" in err
    assert leftovers(proc.pid) == []


def _end(proc: subprocess.Popen) -> None:
    """Stop the controller the way that lets it tear down (SIGTERM), SIGKILL only after."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


@needs_netns
def test_controller_sigkilled_is_swept_by_the_next(tmp_path):
    """SIGKILL leaves the namespaces (nothing can run on the way out); the next cluster, or
    ``localsgd cluster --cleanup``, removes every one whose controller is dead."""
    proc = subprocess.Popen([*CLI, "--nodes", "2", "--procs-per-node", "1", "--rate-mbit", "50",
                             "--probe-mb", "1", "--", str(_sleeper(tmp_path))],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_nodes(proc, 2)
    except BaseException:
        _end(proc)
        raise
    inside = [int(p) for i in range(2) for p in subprocess.run(
        ["ip", "netns", "pids", f"lsgd{proc.pid}n{i}"], capture_output=True,
        text=True, check=False).stdout.split()]
    proc.kill()
    proc.wait()
    sweep_stale()  # (a cluster of a test beside this one may have swept it first: also fine)
    assert leftovers(proc.pid) == []
    time.sleep(0.5)
    alive = [p for p in inside if _running(p)]
    assert alive == [], "the dead controller's workers must be stopped with its nodes"
