"""An emulated cluster on one Linux machine: network namespaces as nodes, throttled links.

Each node is a network namespace ``lsgd<pid>n<i>`` whose ``eth0`` (a veth pair, the root side
``lsgd<pid>v<i>``) joins a bridge ``lsgd<pid>br`` in the root namespace. A token-bucket filter
(``tc qdisc ... tbf``) on both ends of every veth caps the node's uplink and downlink at the asked
rate, as a NIC would; processes inside one node talk over its loopback, unshaped unless an
intra-node rate is asked (a tbf on that node's ``lo``). No delay or loss is emulated: ``netem``
is not in this machine's kernel, so a link here has its rate and the kernel's own latency
(tens of microseconds), and a claim that rests on a link's latency is not tested by it.

`EmulatedCluster` builds the nodes, `probe_rate` measures a link (an iperf-like TCP stream), and
`run_job` starts one torchrun agent per node (``--nnodes N --node-rank i``, node 0's address as
the rendezvous), stops every node when one fails, and always tears down what it built, by name:
on exit, on an error, on Ctrl-C or SIGTERM. A controller killed by SIGKILL cannot clean up; the
next cluster removes what a dead controller (its pid in the names) left behind (`sweep_stale`).
Creating namespaces needs root or CAP_NET_ADMIN (`require_net_admin`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

__all__ = [
    "PROCESS_MB",
    "ClusterError",
    "EmulatedCluster",
    "leftovers",
    "probe_rate",
    "require_net_admin",
    "run_job",
    "sweep_stale",
]

PREFIX = "lsgd"
_NAME = re.compile(rf"^{PREFIX}(\d+)(?:n\d+|v\d+|br)$")
# one torchrun worker of the project's runner on the CPU holds about this much memory (torch
# and gloo loaded, a quarter-width ResNet-20): the cap on processes a cluster may start
PROCESS_MB = 400
MIN_RATE_MBIT, MAX_RATE_MBIT = 0.1, 100_000.0


class ClusterError(RuntimeError):
    """A cluster that cannot be built or a job that failed: one line for the user."""


def _last_line(text: str, fallback: object) -> str:
    """A child's stderr as one line for a `ClusterError` (its last line: the error itself)."""
    lines = [line for line in (text or "").strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else str(fallback)


def _ip(*args: str, ns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    cmd = (["ip", "netns", "exec", ns] if ns else []) + list(args)
    r = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if check and r.returncode != 0:
        raise ClusterError(f"`{' '.join(cmd)}` failed: {_last_line(r.stderr, r.returncode)}")
    return r


def require_net_admin() -> None:
    """Raise `ClusterError` (one line) unless this process can create network namespaces: root
    or CAP_NET_ADMIN, with ``ip`` and ``tc`` on the PATH, and namespaces allowed here."""
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise ClusterError(f"the emulated cluster needs `{tool}` (iproute2) on the PATH")
    probe = f"{PREFIX}{os.getpid()}n99"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise ClusterError("the emulated cluster needs root or CAP_NET_ADMIN to create network "
                           f"namespaces (`ip netns add` said: "
                           f"{_last_line(r.stderr, r.returncode)})")
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, check=False)


def _namespaces() -> list[str]:
    try:  # no iproute2: nothing of ours can exist (teardown must not raise over the real error)
        r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    except OSError:
        return []
    return [line.split()[0] for line in r.stdout.splitlines() if line.strip()]


def _links() -> list[str]:
    try:
        r = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True,
                           check=False)
    except OSError:
        return []
    return [line.split(":")[1].strip().split("@")[0] for line in r.stdout.splitlines()
            if line.count(":") >= 2]


def leftovers(tag: int | None = None) -> list[str]:
    """Namespaces and links of emulated clusters still present (of controller ``tag`` only,
    when given): what a torn-down cluster must not leave."""
    names = [n for n in _namespaces() + _links() if _NAME.match(n)]
    return sorted(n for n in names if tag is None or int(_NAME.match(n).group(1)) == tag)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale() -> list[str]:
    """Remove every cluster namespace or link whose controller (the pid in its name) is dead;
    returns the names removed."""
    gone = []
    for name in leftovers():
        if not _alive(int(_NAME.match(name).group(1))):
            _delete(name)
            gone.append(name)
    return gone


def _delete(name: str) -> None:
    if name in _namespaces():
        # a namespace outlives its name while a process runs in it: stop those first
        pids = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True, check=False)
        for pid in pids.stdout.split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)
    else:
        subprocess.run(["ip", "link", "del", name], capture_output=True, check=False)


def _tbf(dev: str, rate_mbit: float, ns: str | None = None, mtu: int = 1500) -> None:
    # burst: at least one 250 Hz tick of bytes (tbf's floor), 64 KB, and one whole packet of the
    # device (tbf drops a packet larger than its bucket: lo's are 65,536 bytes); queue 100 ms
    burst = max(64 * 1024, int(rate_mbit * 1e6 / 8 / 250), mtu + 64)
    _ip("tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", f"{rate_mbit}mbit",
        "burst", str(burst), "latency", "100ms", ns=ns)


def check_rate(rate_mbit: float, what: str = "rate") -> float:
    """``rate_mbit`` as a float in [0.1, 100000] Mbit/s, or a `ClusterError` line."""
    try:
        rate = float(rate_mbit)
    except (TypeError, ValueError):
        raise ClusterError(f"{what}={rate_mbit!r}: a link rate in Mbit/s, e.g. 100") from None
    if not MIN_RATE_MBIT <= rate <= MAX_RATE_MBIT:
        raise ClusterError(f"{what}={rate_mbit!r} Mbit/s: must lie in [{MIN_RATE_MBIT:g}, "
                           f"{MAX_RATE_MBIT:g}] (tbf cannot shape 0, and above 100 Gbit/s the "
                           "veth, not the limit, sets the speed)")
    return rate


@dataclass
class EmulatedCluster:
    """``nodes`` namespaces on one bridge, each node's link capped at ``rate_mbit`` each way
    (and its loopback at ``intra_rate_mbit`` when given). A context manager: built on enter,
    torn down by name on exit, whatever ended the block."""

    nodes: int
    rate_mbit: float
    intra_rate_mbit: float | None = None
    tag: int = field(default_factory=os.getpid)
    built: list[str] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        if isinstance(self.nodes, bool) or not isinstance(self.nodes, int) or not (
                1 <= self.nodes <= 64):
            raise ClusterError(f"nodes={self.nodes!r}: an integer in [1, 64]")
        self.rate_mbit = check_rate(self.rate_mbit, "rate_mbit")
        if self.intra_rate_mbit is not None:
            self.intra_rate_mbit = check_rate(self.intra_rate_mbit, "intra_rate_mbit")

    def ns(self, i: int) -> str:
        return f"{PREFIX}{self.tag}n{i}"

    def address(self, i: int) -> str:
        """Node ``i``'s address (10.213.<tag mod 250>.<i + 1>)."""
        return f"10.213.{self.tag % 250}.{i + 1}"

    @property
    def bridge(self) -> str:
        return f"{PREFIX}{self.tag}br"

    def up(self) -> Self:
        require_net_admin()
        sweep_stale()
        try:
            _ip("ip", "link", "add", self.bridge, "type", "bridge")
            self.built.append(self.bridge)
            _ip("ip", "link", "set", self.bridge, "up")
            for i in range(self.nodes):
                ns, veth = self.ns(i), f"{PREFIX}{self.tag}v{i}"
                _ip("ip", "netns", "add", ns)
                self.built.append(ns)
                _ip("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns",
                    ns)
                self.built.append(veth)
                _ip("ip", "link", "set", veth, "master", self.bridge)
                _ip("ip", "link", "set", veth, "up")
                _ip("ip", "addr", "add", f"{self.address(i)}/24", "dev", "eth0", ns=ns)
                _ip("ip", "link", "set", "eth0", "up", ns=ns)
                _ip("ip", "link", "set", "lo", "up", ns=ns)
                _tbf(veth, self.rate_mbit)  # the node's downlink (bridge -> node)
                _tbf("eth0", self.rate_mbit, ns=ns)  # its uplink
                if self.intra_rate_mbit is not None:
                    _tbf("lo", self.intra_rate_mbit, ns=ns, mtu=65536)
        except BaseException:
            self.down()
            raise
        return self

    def down(self) -> list[str]:
        """Delete what this cluster built (namespaces take their veth ends along); returns any
        name of this cluster still present afterwards (none, unless the kernel refused)."""
        for name in reversed(self.built):
            _delete(name)
        self.built.clear()
        for name in leftovers(self.tag):
            _delete(name)
        return leftovers(self.tag)

    def popen(self, i: int, argv: Sequence[str], *, env: dict | None = None,
              **kwargs) -> subprocess.Popen:
        """Start ``argv`` inside node ``i`` (in a session of its own, so it can be stopped with
        its children)."""
        return subprocess.Popen(["ip", "netns", "exec", self.ns(i), *argv],
                                env={**os.environ, **(env or {})}, start_new_session=True,
                                **kwargs)

    def __enter__(self) -> Self:
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()


_RECEIVER = textwrap.dedent("""
    import socket, sys, time
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(1)
    print("ready", flush=True)
    c, _ = s.accept(); n = 0; t0 = None
    while True:
        b = c.recv(1 << 16)
        if not b:
            break
        if t0 is None:
            t0 = time.perf_counter()
        n += len(b)
    print(n, time.perf_counter() - t0, flush=True)
""")


def probe_rate(cluster: EmulatedCluster, src: int, dst: int, megabytes: float = 4.0,
               port: int = 29400) -> float:
    """Measured Mbit/s of one TCP stream of ``megabytes`` from node ``src`` to node ``dst``
    (timed at the receiver from the first byte to the last: the bucket's first burst, 64 KB,
    makes a 4 MB probe read at most about 1.6 % fast)."""
    if not megabytes > 0:
        raise ClusterError(f"probe_mb={megabytes!r}: the rate probe needs > 0 MB")
    # the stream's own time at the asked rate, four times over, plus start-up
    limit = 60.0 + 4 * megabytes * 2**20 * 8 / (cluster.rate_mbit * 1e6)
    recv = cluster.popen(dst, [sys.executable, "-c", _RECEIVER, cluster.address(dst), str(port)],
                         stdout=subprocess.PIPE, text=True)
    try:
        if recv.stdout.readline().strip() != "ready":
            raise ClusterError(f"the rate probe's receiver on node {dst} did not start")
        send = textwrap.dedent(f"""
            import socket
            c = socket.create_connection(({cluster.address(dst)!r}, {port}), timeout=60)
            c.sendall(bytes({int(megabytes * 2**20)})); c.close()
        """)
        try:
            r = subprocess.run(["ip", "netns", "exec", cluster.ns(src), sys.executable, "-c",
                                send], capture_output=True, text=True, timeout=limit,
                               check=False)
            if r.returncode != 0:
                raise ClusterError(f"the rate probe from node {src} failed: "
                                   f"{_last_line(r.stderr, r.returncode)}")
            out, _ = recv.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            raise ClusterError(f"the rate probe from node {src} to {dst} ran past {limit:.0f} s "
                               f"({megabytes:g} MB at {cluster.rate_mbit:g} Mbit/s asked)") from None
        try:
            n, seconds = out.split()
            return float(n) * 8 / float(seconds) / 1e6
        except ValueError:
            raise ClusterError(f"the rate probe's receiver on node {dst} read nothing") from None
    finally:
        if recv.poll() is None:
            recv.kill()
            recv.wait()


def _stop(procs: Sequence[subprocess.Popen], grace: float = 10.0) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    end = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(timeout=max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()


def max_processes() -> int:
    """How many runner processes this machine's free memory holds (`PROCESS_MB` each)."""
    try:
        with open("/proc/meminfo") as f:
            avail_kb = next(int(line.split()[1]) for line in f if line.startswith("MemAvailable"))
    except (OSError, StopIteration):
        return 64
    return max(1, avail_kb // 1024 // PROCESS_MB)


def run_job(nodes: int, procs_per_node: int, rate_mbit: float, command: Sequence[str], *,
            intra_rate_mbit: float | None = None, out: Path | None = None, port: int = 29500,
            probe_mb: float = 4.0, timeout: float | None = None,
            say=lambda line: print(line, file=sys.stderr, flush=True)) -> dict:
    """Run ``command`` (a ``-m module ...`` or script argv for torchrun, e.g. ``["-m",
    "localsgd.training.runner", "--config", "run"]``) as a ``nodes`` × ``procs_per_node`` job on
    an emulated cluster: one torchrun agent per node, rendezvous on node 0. The link is probed
    both ways between nodes 0 and 1 first; ``out/cluster.json`` records the asked and measured
    rates, the nodes and the outcome. Returns that record; raises `ClusterError` when a node
    fails (the others stopped) or on bad input. Everything built is removed on the way out."""
    cluster = EmulatedCluster(nodes, rate_mbit, intra_rate_mbit)  # checks nodes and rates
    if isinstance(procs_per_node, bool) or not isinstance(procs_per_node, int) or \
            procs_per_node < 1:
        raise ClusterError(f"procs_per_node={procs_per_node!r}: a positive integer")
    if not (isinstance(probe_mb, (int, float)) and probe_mb > 0):
        raise ClusterError(f"probe_mb={probe_mb!r}: the rate probe needs > 0 MB")
    cap = max_processes()
    if nodes * procs_per_node > cap:
        raise ClusterError(f"{nodes} nodes x {procs_per_node} processes = "
                           f"{nodes * procs_per_node} workers, and this machine's free memory "
                           f"holds about {cap} ({PROCESS_MB} MB each): ask for fewer")
    record: dict = {"nodes": nodes, "procs_per_node": procs_per_node,
                    "asked_rate_mbit": cluster.rate_mbit,
                    "intra_rate_mbit": cluster.intra_rate_mbit, "command": list(command),
                    "delay": "none emulated (no netem here)"}
    torchrun = [sys.executable, "-m", "torch.distributed.run"]
    main_thread = threading.current_thread() is threading.main_thread()
    # SIGTERM (a job scheduler's stop) tears down as Ctrl-C does; signals reach the main thread
    previous = signal.signal(signal.SIGTERM, _raise_interrupt) if main_thread else None
    procs: list[subprocess.Popen] = []
    try:
        with cluster:
            if nodes > 1:
                record["measured_rate_mbit"] = {
                    "0->1": round(probe_rate(cluster, 0, 1, probe_mb), 2),
                    "1->0": round(probe_rate(cluster, 1, 0, probe_mb), 2)}
                say(f"emulated cluster: {nodes} nodes x {procs_per_node} processes, link "
                    f"{cluster.rate_mbit:g} Mbit/s asked, measured "
                    + ", ".join(f"{k} {v:g}" for k, v in record["measured_rate_mbit"].items()))
            # gloo on the node's link; c10d's reverse look-up of 10.213.x.y warns on every
            # connection (no DNS here), so its C++ log is kept to errors unless asked otherwise
            env = {"GLOO_SOCKET_IFNAME": "eth0", "OMP_NUM_THREADS": "1",
                   "TORCH_CPP_LOG_LEVEL": os.environ.get("TORCH_CPP_LOG_LEVEL", "ERROR")}
            t0 = time.perf_counter()
            for i in range(nodes):
                procs.append(cluster.popen(i, [
                    *torchrun, "--nnodes", str(nodes), "--node-rank", str(i),
                    "--nproc-per-node", str(procs_per_node), "--master-addr",
                    cluster.address(0), "--master-port", str(port), *command], env=env))
            failed = _watch(procs, timeout)
            record["seconds"] = round(time.perf_counter() - t0, 2)
            record["exit_codes"] = [p.returncode for p in procs]
            if failed is not None:
                i, code = failed
                record["failed_node"] = i
                raise ClusterError(f"node {i} exited with {_describe(code)}; stopped the other "
                                   "nodes and removed the cluster")
    except KeyboardInterrupt:
        record["interrupted"] = True
        raise ClusterError("interrupted: stopped every node and removed the cluster") from None
    finally:
        # a second Ctrl-C or SIGTERM must not cut the teardown short: both wait until it is done
        held = ({sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT,
                                                                     signal.SIGTERM)}
                if main_thread else {})
        try:
            _stop(procs)
            left = cluster.down()
        finally:
            for sig, handler in held.items():
                # SIGTERM's handler before this job, not the one it installed
                restore = previous if sig == signal.SIGTERM else handler
                signal.signal(sig, restore if restore is not None else signal.SIG_DFL)
        record["left_behind"] = left
        if out is not None:
            Path(out).mkdir(parents=True, exist_ok=True)
            (Path(out) / "cluster.json").write_text(json.dumps(record, indent=1) + "\n")
    return record


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def _describe(code: int) -> str:
    return f"signal {-code} ({signal.Signals(-code).name})" if code < 0 else f"code {code}"


def _watch(procs: Sequence[subprocess.Popen], timeout: float | None) -> tuple[int, int] | None:
    """Wait for every node; the first that fails (index, exit code) stops the wait."""
    end = None if timeout is None else time.monotonic() + timeout
    while True:
        codes = [p.poll() for p in procs]
        for i, code in enumerate(codes):
            if code not in (None, 0):
                return i, code
        if all(code == 0 for code in codes):
            return None
        if end is not None and time.monotonic() > end:
            raise ClusterError(f"the job ran past its {timeout:g} s: stopped every node")
        time.sleep(0.2)


def main(argv: Sequence[str] | None = None) -> int:
    """``localsgd cluster``: run a torchrun job on an emulated cluster (one line on failure)."""
    import argparse

    p = argparse.ArgumentParser(
        prog="localsgd cluster",
        description="Run the torchrun runner (or any torchrun target) as a multi-node job on "
                    "an emulated cluster: network namespaces as nodes, tc-tbf-shaped links. "
                    "Needs root or CAP_NET_ADMIN. Everything is removed on the way out.",
        epilog="example: localsgd cluster --nodes 4 --procs-per-node 2 --rate-mbit 100 "
               "--out runs/c4 -- -m localsgd.training.runner --config run --local-steps 2 "
               "--block-steps 4")
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--procs-per-node", type=int, required=True)
    p.add_argument("--rate-mbit", required=True, help="each node's link, Mbit/s each way")
    p.add_argument("--intra-rate-mbit", default=None,
                   help="a cap on traffic inside a node (its loopback), Mbit/s")
    p.add_argument("--out", type=Path, default=None,
                   help="folder for cluster.json (the asked and measured rates)")
    p.add_argument("--probe-mb", type=float, default=4.0)
    p.add_argument("--port", type=int, default=29500)
    p.add_argument("--timeout", type=float, default=None, help="seconds before every node stops")
    p.add_argument("--cleanup", action="store_true",
                   help="only remove what dead controllers left behind, and exit")
    p.add_argument("command", nargs=argparse.REMAINDER,
                   help="after --: torchrun's target, e.g. -m localsgd.training.runner ...")
    args = p.parse_args(argv)
    try:
        if args.cleanup:
            require_net_admin()
            print("\n".join(sweep_stale()) or "nothing left behind")
            return 0
        command = args.command[1:] if args.command[:1] == ["--"] else args.command
        if not command:
            raise ClusterError("no command: give torchrun's target after --, e.g. -- -m "
                               "localsgd.training.runner --config run")
        if "localsgd.training.runner" in command and "--nodes" not in command:
            command = [*command, "--nodes", str(args.nodes),
                       "--procs-per-node", str(args.procs_per_node)]
        if args.out is not None and "localsgd.training.runner" in command and \
                "--out" not in command:
            command = [*command, "--out", str(args.out)]
        record = run_job(args.nodes, args.procs_per_node, args.rate_mbit, command,
                         intra_rate_mbit=args.intra_rate_mbit, out=args.out,
                         probe_mb=args.probe_mb, port=args.port, timeout=args.timeout)
    except ClusterError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(f"done in {record['seconds']:g} s on {args.nodes} nodes; nothing left behind"
          if not record["left_behind"] else f"left behind: {record['left_behind']}")
    return 0 if not record["left_behind"] else 1


if __name__ == "__main__":
    sys.exit(main())
