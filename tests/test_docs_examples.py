"""Every ```python block of docs/algorithms.md runs (after the setup block), so the examples
cannot rot."""

import re
import time
from pathlib import Path

import pytest
import torch

DOC = Path(__file__).resolve().parents[1] / "docs" / "algorithms.md"
FENCE = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def blocks() -> list[tuple[str, str]]:
    """(section heading, code) of every python block, in document order."""
    text = DOC.read_text()
    out = []
    for match in FENCE.finditer(text):
        headings = re.findall(r"^## (.+)$", text[: match.start()], re.MULTILINE)
        out.append((headings[-1] if headings else "setup", match.group(1)))
    return out


SETUP, *EXAMPLES = blocks()


def test_doc_has_one_example_per_algorithm():
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
    namespace: dict = {"__name__": "docs_example"}
    exec(compile(SETUP[1], f"{DOC.name}:setup", "exec"), namespace)  # noqa: S102 - the doc's code
    start = time.perf_counter()
    exec(compile(code, f"{DOC.name}:{section}", "exec"), namespace)  # noqa: S102 - the doc's code
    # the doc promises < 2 s per example; a loose bound keeps that honest on a loaded machine
    assert time.perf_counter() - start < 10, f"example {section!r} is too slow for the docs"
