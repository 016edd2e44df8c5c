"""Every shell command of README.md and docs/*.md runs as written, on a CPU.

The commands are read from the Markdown itself: the lines of ```bash (sh, shell, console) blocks
and the ``$ ``-prompted lines of any block (where a block has prompts, only those lines are
commands; the rest is output). Continuation lines are joined, comments dropped, and a block's
``NAME=value`` lines run before the commands that follow them. A block that activates a virtual
environment runs as one script; the commands of a block that start one node each
(``--node-rank``) run side by side; a SLURM batch script runs as a job on two simulated nodes.

Each command must match exactly one entry of `RUNS`, which says what is appended to it (at most
a size override -- fewer images, epochs, repeats -- plus ``--device cpu`` where a recipe names a
GPU) and what is checked afterwards; the few commands that cannot run here are listed with the
reason. So a documentation edit that breaks a command fails here, and so does a new command
nobody runs (it matches no entry). Commands run in a temporary folder holding links to the
checkout's .venv, notebooks/, Makefile and pyproject.toml, with the venv's bin/ first on PATH,
so relative output paths (runs/..., build/..., figures/paper) land in the temporary folder.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>[\w-]*)[^\n]*\n(?P<body>.*?)^(?P=indent)```",
                   re.DOTALL | re.MULTILINE)
SHELL_LANGS = ("bash", "sh", "shell", "console")
ASSIGN = re.compile(r"""^[A-Za-z_]\w*=("[^"]*"|'[^']*'|\S+)$""")  # a line that only assigns
VENV_BIN = Path(sys.executable).parent


@dataclass(frozen=True)
class Doc:
    """One documented command (or script) and where it is written."""

    page: str
    line: int
    command: str  # one logical command line; a whole script for kind "script"/"job"
    prelude: str = ""  # the block's variable assignments before it
    kind: str = "command"  # "command", "script" (one shell script), "nodes" (side by side), "job"

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def _strip_comment(line: str) -> str:
    """``line`` without a trailing `` # comment`` (a ``#`` outside quotes after a space)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1] in " \t"):
            return line[:i].rstrip()
    return line.rstrip()


def _logical_lines(body: str) -> list[tuple[int, str]]:
    """(offset of the first line, text) with ``\\``-continuations joined."""
    out, buf, start = [], "", None
    for i, raw in enumerate(body.splitlines()):
        if start is None:
            start = i
        part = raw.strip() if buf else raw.rstrip()
        if part.endswith("\\"):
            buf += part[:-1].rstrip() + " "
            continue
        out.append((start, buf + part))
        buf, start = "", None
    return out


def doc_commands() -> list[Doc]:
    docs = []
    for page in PAGES:
        text = page.read_text()
        for m in FENCE.finditer(text):
            first = text[: m.start()].count("\n") + 2  # the line after the fence
            indent = m.group("indent")
            body = "".join(line.removeprefix(indent)
                           for line in m.group("body").splitlines(keepends=True))
            prompted = [ln for ln in body.splitlines() if ln.startswith("$ ")]
            if prompted:  # a transcript: the prompted lines are the commands
                for i, ln in enumerate(body.splitlines()):
                    if ln.startswith("$ "):
                        docs.append(Doc(page.name, first + i, _strip_comment(ln[2:])))
                continue
            if m.group("lang") not in SHELL_LANGS:
                continue
            if body.startswith("#!") and "#SBATCH" in body:
                docs.append(Doc(page.name, first, body, kind="job"))
                continue
            if re.search(r"(^|\s)(\.|source) \S*activate", body):
                docs.append(Doc(page.name, first, body, kind="script"))
                continue
            prelude, nodes = [], []
            for offset, line in _logical_lines(body):
                cmd = _strip_comment(line.strip())
                if not cmd:
                    continue
                if ASSIGN.match(cmd):
                    prelude.append(cmd)
                    continue
                if "--node-rank" in cmd:
                    nodes.append((offset, cmd))
                    continue
                docs.append(Doc(page.name, first + offset, cmd, "\n".join(prelude)))
            if nodes:
                docs.append(Doc(page.name, first + nodes[0][0], "\n".join(c for _, c in nodes),
                                "\n".join(prelude), kind="nodes"))
    return docs


# ---- what each command runs with, and what is checked -------------------------------------------

@dataclass
class Ctx:
    """What a check sees: the folder the command ran in and its output."""

    cwd: Path
    out: str
    code: int


def _files(*paths: str) -> Callable[[Ctx], None]:
    def check(ctx: Ctx) -> None:
        for p in paths:
            found = list(ctx.cwd.glob(p))
            assert found, f"{p} was not written in {ctx.cwd}: {ctx.out[-3000:]}"
    return check


def _prints(*texts: str) -> Callable[[Ctx], None]:
    def check(ctx: Ctx) -> None:
        for t in texts:
            assert t in ctx.out, f"expected {t!r} in the output: {ctx.out[-3000:]}"
    return check


def _all(*checks: Callable[[Ctx], None]) -> Callable[[Ctx], None]:
    def check(ctx: Ctx) -> None:
        for c in checks:
            c(ctx)
    return check


@dataclass
class Run:
    """How the commands matching ``pattern`` (a regex searched in the command) run here."""

    pattern: str
    append: str = ""  # appended to the command; {tmp} and {port} are filled in
    why: str = ""  # why that override
    check: Callable[[Ctx], None] | None = None
    skip: str | None = None  # the reason it cannot run here
    needs_cifar: bool = False
    timeout: int = 420
    env: dict = field(default_factory=dict)


RUN_SIZE = "--n-train 256 --n-test 32 --epochs 1 --no-progress"
CIFAR_CPU = ("--device cpu --width 0.25 --n-train 256 --n-test 64 --local-batch 8 --epochs 1 "
             "--no-progress")
DRY_ONLY = "--only fig08_imagenet dynamo_ddp appB_comm_cost"

RUNS = [
    # README: install and run
    Run(r"^make reproduce$", 'MODE=smoke ARGS="--only appB_comm_cost --out-dir figures"',
        "one smoke-size notebook into the temporary folder (the full quick run is make "
        "reproduce itself, ~20 min)", _files("figures/appB_comm_cost.*", "figures/REPORT.md")),
    Run(r"^make test$", skip="the test suite itself: this test is part of it"),
    Run(r'^make reproduce MODE=smoke ARGS="--only fig06_cifar10_local_sgd --set \'Hs=\[1, 2\]\' '
        r'--out-dir build/try"$',
        check=_all(_files("build/try/fig06_cifar10_local_sgd.*"), _prints("Hs=[1, 2]")),
        needs_cifar=True),
    Run(r"^make lab$", "PORT={port}", "a free port; the server must answer, then it is stopped"),
    Run(r"python3 -m venv \.venv", why="a fresh virtual environment in a copy of the checkout",
        skip="run by tests/test_base_install.py: the block as written, then the README's library "
        "examples in that venv, without the [paper] extra"),
    # README: paper mode on GPUs
    Run(r"^localsgd gpu-check$", "--toy --device cpu --only fig06_cifar10_local_sgd --out "
        "figures/gpu", "toy size on the CPU into the temporary folder, one notebook "
        "(tests/test_gpu_check.py checks what it writes)",
        _all(_prints("3/3 training loop", "done in"),
             _files("figures/gpu/sweep.csv", "figures/gpu/loop.csv")), needs_cifar=True),
    Run(r"^localsgd doctor$", check=_prints("0 failed")),
    Run(r"^localsgd reproduce --mode paper --dry-run 2$", DRY_ONLY,
        "three notebooks, two of them skipped in paper mode (tests/test_dry_run.py runs every "
        "paper notebook dry)", _prints("fig08_imagenet", "dynamo_ddp", "torchrun")),
    Run(r"^localsgd reproduce --mode paper --plan$", check=_prints("TOTAL")),
    Run(r"^localsgd campaign --plan$", check=_prints("15-minute stints", "TOTAL")),
    Run(r"^localsgd campaign --budget 10$",
        "--toy --only table03-8x2-lr --figures figures",
        "toy size on the CPU (--toy sets the device) into the temporary folder, one entry "
        "(tests/test_campaign.py trains, keeps, skips and renders)",
        _all(_prints("campaign: 1 runs kept"), _files("figures/paper/runs/train-*.csv")),
        needs_cifar=True),
    Run(r"^localsgd campaign --render$", check=_prints("entries have all their runs kept")),
    Run(r"^make reproduce MODE=paper$", f'ARGS="--dry-run 2 {DRY_ONLY}"',
        "paper mode needs GPUs: its CPU dry run, on three notebooks", _prints("dry run")),
    Run(r"cifar10_resnet20 --device cuda --nodes 1 --procs-per-node 8 --out runs/r20",
        CIFAR_CPU, "no GPU here: the same launch on CPU with a quarter-width model, 256 images",
        _files("runs/r20/summary.json"), needs_cifar=True),
    # docs/notebooks.md
    Run(r"--mode paper --only fig04_convex_time fig05_convex_speedup --jobs 2",
        "--set n_seeds=1 --set 'Hs=[16]' --set epsilon=0.05 --out-dir build/paper",
        "the full-scale grid takes 6 min: one seed, H = 16 only, a looser target (a --set needs "
        "--out-dir: figures/paper/ keeps the mode's own results)",
        _files("build/paper/fig04_convex_time.csv", "build/paper/fig05_convex_speedup.csv")),
    Run(r"^localsgd reproduce --list$", check=_prints("appB_comm_cost", "fig04_convex_time")),
    Run(r"^localsgd reproduce --mode smoke --only appB_comm_cost --out-dir build/smoke$",
        check=_files("build/smoke/appB_comm_cost.*")),
    Run(r"papermill notebooks/appB_comm_cost\.ipynb build/appB\.smoke\.ipynb",
        "-p out_dir {tmp}/interactive", "the notebook's figures into the temporary folder",
        _files("build/appB.smoke.ipynb", "interactive/appB_comm_cost.*")),
    # docs/runner.md
    Run(r"--config run --nodes 2 --procs-per-node 2 --local-steps 2 --block-steps 4 "
        r"\\?\s*--checkpoint-every 100 --out runs/hier$", RUN_SIZE, "256 images, one epoch",
        _files("runs/hier/summary.json")),
    Run(r"^localsgd train --engine ddp --config run --out runs/hier$", RUN_SIZE,
        "256 images, one epoch", _files("runs/hier/summary.json")),
    Run(r"^localsgd train --engine replicas --config run --out runs/hier1$", RUN_SIZE,
        "256 images, one epoch", _files("runs/hier1/summary.json")),
    Run(r"--node-rank 0", "--n-train 256 --n-test 32 --epochs 1 --no-progress",
        "two nodes on loopback, side by side, on a free port", _files("runs/two/summary.json")),
    Run(r"^sudo localsgd cluster --nodes 4 --procs-per-node 2 --rate-mbit 100",
        skip="root's command: tests/test_netcluster.py runs this job (4 nodes x 2 processes, "
             "100 Mbit/s, hierarchical H = 2, H^b = 2, at 512 images) as root and checks "
             "consensus, the probed rate and that nothing is left behind"),
    Run(r"^#!/bin/bash", why="a simulated 2-node job (see test_slurm_job_resumes)",
        skip="run by test_slurm_job_resumes_after_a_kill"),
    Run(r"\$TR \$cfg --local-steps 1 --post-local-warmup-epochs 8 --out sync$",
        "--n-train 320 --epochs 1 --no-progress", "5 updates instead of 200",
        _files("sync/timing.csv")),
    Run(r"\$TR \$cfg --local-steps 4 --out local$", "--n-train 320 --epochs 1 --no-progress",
        "5 updates", _files("local/timing.csv")),
    Run(r"\$TR \$cfg --nodes 2 --procs-per-node 4 --local-steps 2 --block-steps 4 --out hier$",
        "--n-train 320 --epochs 1 --no-progress", "5 updates", _files("hier/timing.csv")),
    Run(r"--block-gradient-allreduce true --out hier_grad$",
        "--n-train 640 --epochs 1 --no-progress", "10 updates (H * H^b = 8 must fit)",
        _files("hier_grad/timing.csv")),
    Run(r"--config comp\s+--compile ddp_optimizer --compare-eager --out comp$",
        "--compile-backend aot_eager --epochs 2", "dynamo's graphs and DDP splitting without "
        "inductor's code generation (minutes on 2 cores), 24 updates",
        _files("comp/compare.json")),
    Run(r"^localsgd report$", "--figures {tmp}/figures",
        "a copy of figures/ (the committed REPORT.md and README stay untouched)",
        _files("figures/REPORT.md")),
    Run(r"^localsgd bench averaging --world 4 --params 270000 --json$", "--repeats 3 --warmup 1",
        "3 timed rounds", _prints('"ours_ms"')),
    Run(r"^localsgd bench convex --json$",
        "--steps 20 --repeats 1 --ref-runs 1 --seeds 1 --step-sizes 2", "20 steps, one seed",
        _prints('"speedup"')),
    Run(r"^localsgd bench replicas --json$",
        "--steps 2 --rounds 1 --warmup 1 --width 0.25 --batch 8", "2 steps, one round",
        _prints('"replica_over_single"')),
    Run(r"^localsgd bench ddp --models ffn_s ffn_m --world 2 4 --json$",
        "--models ffn_s --world 2 --steps 2 --rounds 1 --warmup 1 --compile-backend aot_eager",
        "one model on 2 processes, 2 steps, one round, no inductor code generation",
        _prints('"summary"')),
    Run(r"^localsgd plan --workers 256 --gpus-per-node 4 --model-mb 45 --step-ms 55 "
        r"\s*--straggler-rate 0\.01 --straggler-s 1$", check=_prints("speed-up")),
    Run(r"^localsgd plan --workers 64 --gpus-per-node 4 --inter-gbps 1 --top 3$",
        check=_prints("averages in fp32", "local:8")),
    Run(r"^localsgd plan --workers 64 --gpus-per-node 4 --inter-gbps 1 --top 3 "
        r"--compress int8$", check=_prints("averages in int8", "local:8")),
    Run(r"^localsgd train --engine replicas --config run --out runs/one$", RUN_SIZE,
        "256 images, one epoch", _files("runs/one/summary.json")),
]


def _entry(doc: Doc) -> Run:
    matches = [r for r in RUNS if re.search(r.pattern, doc.command, re.MULTILINE)]
    assert len(matches) == 1, (
        f"{doc.id}: `{doc.command[:200]}` matches {len(matches)} entries of RUNS in "
        f"{Path(__file__).name}: add one saying how it runs on a CPU (or why it cannot)")
    return matches[0]


DOCS = doc_commands()


def test_every_command_has_exactly_one_entry():
    assert len(DOCS) >= 25, f"only {len(DOCS)} commands found: is the extraction broken?"
    for doc in DOCS:
        _entry(doc)
    unused = [r.pattern for r in RUNS if not any(
        re.search(r.pattern, d.command, re.MULTILINE) for d in DOCS)]
    assert not unused, f"entries of RUNS that match no documented command: {unused}"


def test_extraction():
    cmds = {(d.page, d.command) for d in DOCS}
    assert ("runner.md", "localsgd doctor") in cmds
    assert any(d.kind == "nodes" and d.command.count("torchrun") == 2 for d in DOCS)
    assert any(d.kind == "job" for d in DOCS) and any(d.kind == "script" for d in DOCS)
    straggler = [d for d in DOCS if d.command.startswith("$TR $cfg")]
    assert len(straggler) == 4 and all("TR=" in d.prelude for d in straggler)
    assert all("#" not in d.command for d in DOCS if d.kind == "command"
               and "SBATCH" not in d.command), "comments must be stripped"


# ---- running them -----------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _workdir(tmp: Path) -> Path:
    """A folder that looks like the checkout to the commands, writing only into itself."""
    tmp.mkdir(parents=True, exist_ok=True)
    for name in (".venv", "notebooks", "Makefile", "pyproject.toml"):
        target = ROOT / name
        if target.exists():
            (tmp / name).symlink_to(target)
    return tmp


def _env(extra: dict | None = None) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PATH": f"{VENV_BIN}:{os.environ['PATH']}",
           "PYTHONUNBUFFERED": "1"}
    env.pop("MAKEFLAGS", None)
    env.pop("MFLAGS", None)
    env.update(extra or {})
    return env


def _cifar_available() -> bool:
    from localsgd import data

    return data._find_cifar("cifar10")[0] is not None


def _kill_tree(pid: int) -> None:
    import psutil

    try:
        parent = psutil.Process(pid)
        procs = [*parent.children(recursive=True), parent]
    except psutil.NoSuchProcess:
        return
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            p.send_signal(signal.SIGKILL)


def _bash(script: str, cwd: Path, timeout: int, env: dict) -> Ctx:
    proc = subprocess.Popen(["bash", "-c", script], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_tree(proc.pid)
        out, _ = proc.communicate()
        pytest.fail(f"timed out after {timeout} s: {script}\n{out[-3000:]}")
    return Ctx(cwd, out, proc.returncode)


def _copy_checkout(dest: Path) -> Path:
    """The checkout's tracked files (as they are in the working tree) in ``dest``."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True,
                           text=True).stdout.split("\0")
    for f in filter(None, files):
        src = ROOT / f
        if src.is_file():
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / f)
    return dest


def _lab(doc: Doc, run: Run, cwd: Path) -> Ctx:
    port = _free_port()
    cmd = f"{doc.command} {run.append.format(port=port, tmp=cwd)}"
    proc = subprocess.Popen(["bash", "-c", cmd], cwd=cwd, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            assert proc.poll() is None, f"`{cmd}` exited early: {proc.stdout.read()[-3000:]}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api", timeout=2) as r:
                    body = r.read().decode()
                return Ctx(cwd, body, 0 if '"version"' in body else 1)
            except OSError:
                time.sleep(1)
        pytest.fail(f"`{cmd}`: no server on port {port} after 120 s")
    finally:
        _kill_tree(proc.pid)
        proc.communicate()


def _nodes(doc: Doc, run: Run, cwd: Path) -> Ctx:
    for attempt in range(3):  # another test may take the free port first: try another
        ctx = _nodes_once(doc, run, cwd)
        if ctx.code == 0 or "address already in use" not in ctx.out.lower() or attempt == 2:
            return ctx
    return ctx


def _nodes_once(doc: Doc, run: Run, cwd: Path) -> Ctx:
    port = str(_free_port())
    procs = []
    for cmd in doc.command.splitlines():
        cmd = re.sub(r"--master-port \d+", f"--master-port {port}", cmd)
        procs.append(subprocess.Popen(
            ["bash", "-c", f"{cmd} {run.append}"], cwd=cwd, env=_env(), stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, start_new_session=True))
    outs, codes = [], []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=run.timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                _kill_tree(q.pid)
            pytest.fail(f"{doc.id}: the nodes did not finish in {run.timeout} s")
        outs.append(out)
        codes.append(p.returncode)
    return Ctx(cwd, "\n".join(outs), max(codes))


# a command documented twice (e.g. `localsgd doctor`) runs once
RUNNABLE = list({(d.prelude, d.command): d for d in reversed(DOCS) if d.kind != "job"}.values())
RUNNABLE.reverse()


@pytest.mark.parametrize("doc", RUNNABLE, ids=[f"{d.id}:{d.command[:60]}" for d in RUNNABLE])
def test_documented_command_runs(doc, tmp_path):
    run = _entry(doc)
    if run.skip:
        pytest.skip(run.skip)
    if run.needs_cifar and not _cifar_available():
        pytest.skip("CIFAR-10 not found (set LOCALSGD_DATA; CI has it)")
    cwd = _workdir(tmp_path)
    if doc.command.startswith("localsgd report"):
        shutil.copytree(ROOT / "figures", tmp_path / "figures")
    if doc.command.startswith("make lab"):
        ctx = _lab(doc, run, cwd)
    elif doc.kind == "nodes":
        ctx = _nodes(doc, run, cwd)
    else:
        tail = run.append.format(tmp=tmp_path, port=_free_port())
        script = "set -eo pipefail\n" + (doc.prelude + "\n" if doc.prelude else "") + \
            f"{doc.command} {tail}"
        ctx = _bash(script, cwd, run.timeout, _env(run.env))
    assert ctx.code == 0, f"{doc.id}: `{doc.command}` exited {ctx.code}:\n{ctx.out[-4000:]}"
    if run.check:
        run.check(ctx)


# ---- the SLURM recipe: a job killed mid-run and resubmitted resumes --------------------------

FAKE_SRUN = """#!/bin/bash
# srun on a simulated allocation: the command once per node, side by side
pids=()
for ((i = 0; i < SLURM_NNODES; i++)); do
  SLURM_NODEID=$i SLURM_PROCID=$i SLURM_LOCALID=0 "$@" &
  pids+=($!)
done
code=0
for p in "${pids[@]}"; do wait "$p" || code=$?; done
exit $code
"""
FAKE_SCONTROL = """#!/bin/bash
# scontrol show hostnames LIST: every simulated node is this machine
echo localhost
"""
# the job's torchrun line with CPU and size overrides: 2 nodes x 2 processes, 24 updates
SLURM_APPEND = ("--device cpu --width 0.25 --n-train 256 --n-test 64 --local-batch 8 --epochs 3 "
                "--checkpoint-every 2 --compute-ms 150 --no-progress")


def test_slurm_job_resumes_after_a_kill(tmp_path):
    """The runner.md batch script as a job on two simulated nodes (fake srun/scontrol, SLURM_*
    set, 2 processes per node): killed after its first checkpoints, resubmitted under a new job
    id, it resumes from its last checkpoint and finishes. ``--compute-ms`` (an emulated 150 ms
    per update) keeps the job running long enough to be killed between checkpoints."""
    if not _cifar_available():
        pytest.skip("CIFAR-10 not found (set LOCALSGD_DATA; CI has it)")
    (job,) = [d for d in DOCS if d.kind == "job"]
    lines = _logical_lines(job.command)
    script = "\n".join(f"{ln} {SLURM_APPEND}" if "localsgd.training.runner" in ln else ln
                       for _, ln in lines)
    fake = tmp_path / "fakebin"
    fake.mkdir()
    for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
        (fake / name).write_text(text)
        (fake / name).chmod(0o755)
    cwd = _workdir(tmp_path / "job")
    (cwd / "runs").mkdir()
    (cwd / "job.sh").write_text(script)
    base = {"PATH": f"{fake}:{VENV_BIN}:{os.environ['PATH']}", "SLURM_NNODES": "2",
            "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_GPUS_ON_NODE": "2",
            "MASTER_PORT": str(_free_port())}
    ckpts = cwd / "runs" / "r20-4x8" / "checkpoints"

    first = subprocess.Popen(["bash", "job.sh"], cwd=cwd, env=_env({**base, "SLURM_JOB_ID": "101"}),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True)
    deadline = time.time() + 300
    # a complete checkpoint (a rank's marker: every rank holds the step); a kill during the first
    # one starts afresh, tested in test_rank_checkpoints
    while not list(ckpts.glob("run.rank*.step*.complete")):
        if first.poll() is not None:
            pytest.fail(f"the job ended before its first checkpoint: {first.stdout.read()[-4000:]}")
        assert time.time() < deadline, "no checkpoint after 300 s"
        time.sleep(0.1)
    _kill_tree(first.pid)  # preemption: every process of the job at once
    first.communicate()
    assert not (cwd / "runs" / "r20-4x8" / "summary.json").exists(), "killed too late"

    second = _bash("bash job.sh", cwd, 300, _env({**base, "SLURM_JOB_ID": "102",
                                                  "MASTER_PORT": str(_free_port())}))
    assert second.code == 0, second.out[-4000:]
    m = re.search(r"resumed from update (\d+) of 24", second.out)
    assert m and int(m.group(1)) >= 2, second.out[-4000:]
    assert (cwd / "runs" / "r20-4x8" / "summary.json").exists()
