"""Every code block of README.md and docs/*.md runs, so the documentation cannot rot.

- ```python blocks are executed, each in a fresh namespace after its page's setup block (the one
  whose first line starts with ``# setup``); a page's expected output, where listed, is checked.
- ```py blocks are torchrun scripts: run under torchrun with the process count their first line
  names (``--nproc-per-node N``); the README's script also checks that the ranks end in consensus.
- ```bash blocks are run, command by command, by tests/test_doc_commands.py.
- Commands quoted inline in the prose (`` `localsgd reproduce --jobs 2` ``) are references, not
  instructions: every ``localsgd`` command and ``python -m localsgd...`` module they name must
  answer ``--help`` with exit code 0, and every ``--flag`` given to it must appear in that help.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import re
import runpy
import shlex
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>[\w-]*)[^\n]*\n(?P<body>.*?)^(?P=indent)```",
                   re.DOTALL | re.MULTILINE)
HEADING = re.compile(r"^#{1,6} (.+)$", re.MULTILINE)
ALGORITHMS = ("Local SGD", "Hierarchical local SGD", "Post-local SGD", "local-step warm-up",
              "Momentum", "SlowMo over local SGD", "SGP", "SlowMo over SGP", "Large-batch")
# per (page, section): text the example must print
EXPECTED_OUTPUT = {
    ("deep_learning.md", "Deep learning (CIFAR-10/100, ImageNet; §4, Appendices C, D, F)"):
        ("test_acc", "sync_l1"),
}
SLOW_PAGES = {"deep_learning.md"}  # whole training runs; the rest promise < 2 s per example


@dataclass(frozen=True)
class Block:
    page: str
    section: str
    lang: str
    code: str
    line: int

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def blocks(lang: str | None = None) -> list[Block]:
    out = []
    for page in PAGES:
        text = page.read_text()
        for m in FENCE.finditer(text):
            # headings outside code blocks: a shell or Python comment line is not a heading
            heads = HEADING.findall(FENCE.sub("", text[: m.start()]))
            indent = m.group("indent")
            code = "".join(line.removeprefix(indent)
                           for line in m.group("body").splitlines(keepends=True))
            block = Block(page.name, heads[-1] if heads else "", m.group("lang"), code,
                          text[: m.start()].count("\n") + 1)
            if lang is None or block.lang == lang:
                out.append(block)
    return out


def _is_setup(b: Block) -> bool:
    return b.code.lstrip().startswith("# setup")


PYTHON = blocks("python")
SETUPS = {b.page: b for b in PYTHON if _is_setup(b)}
EXAMPLES = [b for b in PYTHON if not _is_setup(b)]
SCRIPTS = blocks("py")


def test_every_block_has_a_known_language():
    unknown = [(b.id, b.lang) for b in blocks() if b.lang not in
               ("python", "py", "bash", "sh", "shell", "console", "text", "")]
    assert not unknown, f"code blocks the tests do not know how to check: {unknown}"
    assert len(SETUPS) == len({b.page for b in PYTHON if _is_setup(b)}), "one setup per page"


def test_one_example_per_algorithm():
    sections = [b.section for b in EXAMPLES if b.page == "algorithms.md"]
    for name in ALGORITHMS:
        assert any(name in s for s in sections), f"no example for {name!r} in {sections}"
    assert "algorithms.md" in SETUPS


@pytest.fixture(scope="module")
def _torch_warm():
    # torch's first optimizer in a process pays a one-off import (~2 s); keep it out of the timing
    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)


@pytest.mark.parametrize("block", EXAMPLES, ids=[b.id for b in EXAMPLES])
def test_example_runs(block, _torch_warm, capsys, slowdown):
    namespace: dict = {"__name__": "doc_example"}
    setup = SETUPS.get(block.page)
    if setup is not None:
        exec(compile(setup.code, f"{setup.page}:setup", "exec"), namespace)  # noqa: S102
    start = time.perf_counter()
    exec(compile(block.code, block.id, "exec"), namespace)  # noqa: S102 - the doc's own code
    took = time.perf_counter() - start
    # the docs promise < 2 s per algorithm example; a loose bound keeps that honest when loaded
    limit = (300 if block.page in SLOW_PAGES else 10) * slowdown
    assert took < limit, f"example {block.id} ({block.section}) took {took:.1f} s"
    out = capsys.readouterr().out
    for text in EXPECTED_OUTPUT.get((block.page, block.section), ()):
        assert text in out, f"{block.id} should print {text!r}; printed {out[-500:]!r}"


CONSENSUS_CHECK = (
    "flat = torch.cat([p.detach().flatten() for p in model.parameters()])\n"
    "ref = flat.clone()\n"
    "torch.distributed.broadcast(ref, 0)\n"
    "assert torch.equal(flat, ref), 'ranks differ after the final global average'\n"
    "assert opt.last_action.outer and opt.driver.outer.num_steps == 4\n"
)


@pytest.mark.parametrize("block", SCRIPTS, ids=[b.id for b in SCRIPTS])
def test_torchrun_script_runs(block, tmp_path):
    m = re.search(r"--nproc-per-node (\d+)", block.code.splitlines()[0])
    assert m, f"{block.id}: the first line must say how to launch it (--nproc-per-node N)"
    nproc = int(m.group(1))
    code = block.code
    if block.page == "README.md" and re.search(r"\bLocalSGDOptimizer\(", code):  # the
        # README's script: the ranks end in consensus
        body, destroy = code.rsplit("torch.distributed.destroy_process_group()", 1)
        code = body + CONSENSUS_CHECK + "torch.distributed.destroy_process_group()" + destroy
    path = tmp_path / "script.py"
    path.write_text(code)
    torchrun = Path(sys.executable).with_name("torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [str(torchrun), "--standalone", "--nproc-per-node", str(nproc), str(path)]
    r = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=240, env=env,
                       cwd=tmp_path)
    assert r.stdout.count("rank ") == nproc, r.stdout + r.stderr[-4000:]  # every rank finished
    assert "AssertionError" not in r.stderr, r.stderr[-4000:]  # ... and the consensus check held
    # gloo may abort one rank after destroy_process_group on a loaded 2-core machine ("terminate
    # called without an active exception", torch's teardown, seen twice in a row under load and
    # never alone): after every rank printed its last line that is torch's teardown, not the
    # script; any other failure fails the test
    teardown_crash = "terminate called without an active exception" in r.stderr
    assert r.returncode == 0 or teardown_crash, r.stdout[-2000:] + r.stderr[-4000:]


# ---- shell blocks: every localsgd command parses -------------------------------------------

ASSIGN = re.compile(r"^(\w+)=\"([^\"]*)\"\s*$")


def _commands(code: str) -> list[str]:
    """The block's command lines: continuations joined, comments and prompts dropped, simple
    ``NAME="..."`` variables expanded."""
    text = re.sub(r"\\\n", " ", code)
    env: dict[str, str] = {}
    out = []
    for line in text.splitlines():
        line = line.strip().removeprefix("$ ")
        if not line or line.startswith("#"):
            continue
        line = re.sub(r"\s#\s.*$", "", line)
        m = ASSIGN.match(line)
        if m:
            env[m.group(1)] = m.group(2)
            continue
        for name, value in env.items():
            line = line.replace("${" + name + "}", value).replace("$" + name, value)
        out.append(line)
    return out


def invocations(code: str) -> list[tuple[tuple[str, ...], list[str]]]:
    """(how to ask for help, flags given) for every localsgd command in a shell block."""
    found = []
    for line in _commands(code):
        try:
            tokens = shlex.split(line)
        except ValueError:
            tokens = line.split()
        tokens = [t.strip("[]") for t in tokens]
        i = 0
        while i < len(tokens):
            tok = tokens[i]
            help_cmd = None
            if tok == "localsgd" or tok.endswith("/localsgd"):
                rest = tokens[i + 1:i + 3]
                sub = rest[:1]
                if sub and sub[0] == "bench" and len(rest) > 1 and not rest[1].startswith("-"):
                    sub = rest[:2]
                if sub and not sub[0].startswith("-"):
                    help_cmd = ("localsgd", *sub)
                    i += 1 + len(sub)
                else:
                    i += 1
                    continue
            elif tok == "-m" and i + 1 < len(tokens) and tokens[i + 1].startswith("localsgd"):
                help_cmd = ("-m", tokens[i + 1])
                i += 2
            else:
                i += 1
                continue
            flags = []
            while i < len(tokens) and tokens[i] not in ("|", "&&", ";", "-m", "localsgd") \
                    and not tokens[i].endswith("/localsgd"):
                if tokens[i].startswith("--"):
                    flags.append(tokens[i].split("=", 1)[0])
                i += 1
            found.append((help_cmd, flags))
    return found


@functools.cache
def help_text(cmd: tuple[str, ...]) -> str:
    """``--help`` of a localsgd command, run in this process as ``python -m`` would run it
    (``localsgd X`` is ``python -m localsgd X``); it must exit with code 0."""
    module, args = (cmd[1], []) if cmd[0] == "-m" else ("localsgd", list(cmd[1:]))
    out = io.StringIO()
    argv = sys.argv
    sys.argv = [module, *args, "--help"]
    try:
        with contextlib.redirect_stdout(out), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # "found in sys.modules"
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as stop:
        code = stop.code or 0
    finally:
        sys.argv = argv
    assert code == 0, f"`{' '.join(cmd)} --help` exits {code}: {out.getvalue()[-1500:]}"
    return out.getvalue()


def inline_commands() -> list[Block]:
    """The prose's inline code spans that quote a localsgd command (fenced blocks left out)."""
    out = []
    for page in PAGES:
        text = page.read_text()
        prose = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
        for m in re.finditer(r"`([^`\n]+)`", prose):
            span = m.group(1)
            if re.match(r"(\S*/)?localsgd |(python3? )?-m localsgd|torchrun ", span):
                out.append(Block(page.name, "", "inline", span,
                                 prose[: m.start()].count("\n") + 1))
    return out


SHELL_CALLS = [(b, cmd, flags) for b in inline_commands() for cmd, flags in invocations(b.code)]


def test_the_prose_quotes_localsgd_commands():
    named = {cmd for _, cmd, _ in SHELL_CALLS}
    assert ("localsgd", "reproduce") in {c[:2] for c in named}
    assert any(c[0] == "-m" for c in named), "no `python -m localsgd.training.runner` quoted?"


def test_invocation_parser():
    code = ('TR="torchrun --nproc-per-node 8 -m localsgd.training.runner"\n'
            "$TR --config base --out x  # a comment --not-a-flag\n"
            "localsgd bench averaging --world 4 \\\n    --json\n"
            "localsgd reproduce [--mode smoke|quick|paper] [--only ID ...]\n")
    assert invocations(code) == [
        (("-m", "localsgd.training.runner"), ["--config", "--out"]),
        (("localsgd", "bench", "averaging"), ["--world", "--json"]),
        (("localsgd", "reproduce"), ["--mode", "--only"])]


@pytest.mark.parametrize(("block", "cmd", "flags"), SHELL_CALLS,
                         ids=[f"{b.id}:{' '.join(c)}" for b, c, _ in SHELL_CALLS])
def test_shell_command_parses(block, cmd, flags):
    text = help_text(cmd)
    unknown = [f for f in flags if f not in text]
    assert not unknown, f"{block.id}: `{' '.join(cmd)}` has no option(s) {unknown}"


# ---- every `localsgd.x.y` the pages name exists -------------------------------------------

NAMES = sorted({(page.name, m.group(1)) for page in PAGES
                for m in re.finditer(r"`(localsgd(?:\.\w+)+)", page.read_text())})


@pytest.mark.parametrize(("page", "name"), NAMES, ids=[f"{p}:{n}" for p, n in NAMES])
def test_named_api_exists(page, name):
    import importlib

    parts = name.split(".")
    for i in range(len(parts), 0, -1):  # the longest importable module, then attributes
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        for attr in parts[i:]:
            assert hasattr(obj, attr), f"{page} names `{name}`: {obj!r} has no {attr!r}"
            obj = getattr(obj, attr)
        return
    pytest.fail(f"{page} names `{name}`, which does not import")


def test_relative_links_resolve():
    """Every relative link and image of README.md and docs/ points at a file in the repo."""
    broken = []
    for page in PAGES:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if re.match(r"[a-z]+://|#|mailto:", target):
                continue
            path = (page.parent / target.split("#", 1)[0]).resolve()
            if not path.exists():
                broken.append(f"{page.name}: {target}")
    assert not broken, f"links to missing files: {broken}"


def test_readme_gpu_plan_is_current():
    # docs/gpu.md shows `localsgd reproduce --mode paper --plan`: regenerate it with
    # gpu_plan.readme_block when a paper configuration changes
    from localsgd.paper import gpu_plan

    text = (ROOT / "docs" / "gpu.md").read_text()
    block = gpu_plan.readme_block(ROOT / "notebooks")
    assert block in text, ("docs/gpu.md's paper-mode plan is stale: replace the text between "
                           f"{gpu_plan.README_BEGIN} and {gpu_plan.README_END} by "
                           "localsgd.paper.gpu_plan.readme_block('notebooks')")
