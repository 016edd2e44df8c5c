"""The README's examples run: every ```python block of its Algorithms section (after the setup
block), and the ```py torchrun script under torchrun with 4 gloo workers."""

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

README = Path(__file__).resolve().parents[1] / "README.md"
TEXT = README.read_text()
ALGORITHMS = TEXT.split("\n## Algorithms\n", 1)[1].split("\n## ", 1)[0]
FENCE = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def blocks() -> list[tuple[str, str]]:
    """(section heading, code) of every python block of the Algorithms section, in order."""
    out = []
    for match in FENCE.finditer(ALGORITHMS):
        headings = re.findall(r"^### (.+)$", ALGORITHMS[: match.start()], re.MULTILINE)
        out.append((headings[-1] if headings else "setup", match.group(1)))
    return out


SETUP, *EXAMPLES = blocks()


def test_readme_has_one_example_per_algorithm():
    sections = [name for name, _ in EXAMPLES]
    for name in ("Local SGD", "Hierarchical local SGD", "Post-local SGD", "local-step warm-up",
                 "Momentum", "SlowMo over local SGD", "SGP", "SlowMo over SGP", "Large-batch"):
        assert any(name in s for s in sections), f"no example for {name!r} in {sections}"
    assert SETUP[0] == "setup"


@pytest.fixture(scope="module")
def _torch_warm():
    # torch's first optimizer in a process pays a one-off import (~2 s); keep it out of the timing
    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)


@pytest.mark.parametrize(("section", "code"), EXAMPLES, ids=[s for s, _ in EXAMPLES])
def test_example_runs(section, code, _torch_warm):
    namespace: dict = {"__name__": "readme_example"}
    exec(compile(SETUP[1], "README.md:setup", "exec"), namespace)  # noqa: S102 - the doc's code
    start = time.perf_counter()
    exec(compile(code, f"README.md:{section}", "exec"), namespace)  # noqa: S102 - the doc's code
    # the README promises < 2 s per example; a loose bound keeps that honest on a loaded machine
    assert time.perf_counter() - start < 10, f"example {section!r} is too slow for the README"




def test_torchrun_script_runs_and_ends_in_consensus(tmp_path):
    (script,) = re.findall(r"^```py\n(.*?)^```", TEXT, re.DOTALL | re.MULTILINE)
    body, destroy = script.rsplit("torch.distributed.destroy_process_group()", 1)
    check = (
        "flat = torch.cat([p.detach().flatten() for p in model.parameters()])\n"
        "ref = flat.clone()\n"
        "torch.distributed.broadcast(ref, 0)\n"
        "assert torch.equal(flat, ref), 'ranks differ after the final global average'\n"
        "assert opt.last_action.outer and opt.driver.outer.num_steps == 4\n"
    )
    path = tmp_path / "train_local_sgd.py"
    path.write_text(body + check + "torch.distributed.destroy_process_group()" + destroy)
    torchrun = Path(sys.executable).with_name("torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [str(torchrun), "--standalone", "--nproc-per-node", "4", str(path)]
    for _attempt in range(2):
        r = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=240,
                           env=env, cwd=tmp_path)
        # one retry only for a crash at process teardown after every rank finished (seen once
        # under a loaded 2-core CI: "terminate called without an active exception" on one rank)
        teardown_crash = ("terminate called without an active exception" in r.stderr
                          and "AssertionError" not in r.stderr
                          and r.stdout.count("step 40") == 4)
        if r.returncode == 0 or not teardown_crash:
            break
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert r.stdout.count("step 40") == 4


def test_deep_learning_example_runs(capsys):
    section = TEXT.split("\n## Deep learning", 1)[1].split("\n## ", 1)[0]
    (code,) = FENCE.findall(section)
    exec(compile(code, "README.md:deep learning", "exec"), {"__name__": "readme_example"})  # noqa: S102
    out = capsys.readouterr().out
    assert "test_acc" in out and "sync_l1" in out
