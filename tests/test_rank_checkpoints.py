"""Per-rank checkpoints (`localsgd.training.checkpoint.RankCheckpoints`) across a kill at any
moment.

The ranks run as threads of this process; their ``all_gather_object`` is a barrier over a shared
list, so the collective logic runs without a process group. What a SIGKILL can leave on disk is
written by hand: the states below are exactly those a kill between two file operations leaves.
"""

from __future__ import annotations

import re
import threading

import pytest

from localsgd.training.checkpoint import CHECKPOINT_FORMAT, RankCheckpoints, save_checkpoint
from localsgd.training.config import TrainConfig

WORLD = 4
CFG = TrainConfig.from_dict({"world_size": WORLD})


class _Gather:
    """``all_gather_object`` for WORLD threads: each contributes, all wait, all read the list."""

    def __init__(self):
        self.values: list = [None] * WORLD
        self.barrier = threading.Barrier(WORLD)

    def __call__(self, rank: int, value):
        self.values[rank] = value
        self.barrier.wait()
        out = list(self.values)
        self.barrier.wait()  # nobody overwrites before everyone has read
        return out


class _RankEngine:
    def __init__(self, rank: int, gather: _Gather):
        self.local_ranks, self.world_size, self._gather = [rank], WORLD, gather

    def all_gather_object(self, value):
        return self._gather(self.local_ranks[0], value)


def _on_every_rank(fn):
    """fn(rank, RankCheckpoints) on WORLD threads at once; their results (or first error)."""
    gather, results, errors = _Gather(), [None] * WORLD, []

    def work(rank):
        try:
            results[rank] = fn(rank, RankCheckpoints(BASE[0], _RankEngine(rank, gather)))
        except Exception as err:  # noqa: BLE001 - re-raised below
            errors.append(err)
            gather.barrier.abort()

    threads = [threading.Thread(target=work, args=(r,)) for r in range(WORLD)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    if errors:
        raise next((e for e in errors if not isinstance(e, threading.BrokenBarrierError)),
                   errors[0])
    return results


BASE: list = [None]


@pytest.fixture(autouse=True)
def _base(tmp_path):
    BASE[0] = tmp_path / "checkpoints" / "run.pt"


def _state(rank: int, t: int) -> dict:
    return {"format": CHECKPOINT_FORMAT, "config": CFG.to_dict(),
            "engine": {"rank": rank, "t": t}, "records": [], "totals": {}}


def test_saves_keep_two_complete_steps_and_resume_from_the_newest():
    for t in (3, 6, 9):
        _on_every_rank(lambda r, ck, t=t: ck.save(_state(r, t), t))
    folder = BASE[0].parent
    assert sorted(f.name for f in folder.glob("run.rank0.step*.complete")) == [
        "run.rank0.step000000006.complete", "run.rank0.step000000009.complete"]
    assert len(list(folder.glob("run.rank*.step*.complete"))) == 2 * WORLD
    assert len(list(folder.glob("run.rank*.step*.pt"))) == 2 * WORLD
    states = _on_every_rank(lambda r, ck: ck.load_latest(CFG))
    assert [s["engine"] for s in states] == [{"rank": r, "t": 9} for r in range(WORLD)]


def test_a_kill_during_the_first_checkpoint_starts_afresh(capsys):
    # ranks 1 and 3 had written step 3 when every process was killed: no complete checkpoint
    for r in (1, 3):
        save_checkpoint(RankCheckpoints(BASE[0], _RankEngine(r, None)).path(3), _state(r, 3))
    assert _on_every_rank(lambda r, ck: ck.load_latest(CFG)) == [None] * WORLD
    out = capsys.readouterr().out
    assert out.count("stopped while writing its first checkpoint") == 1, out
    assert not list(BASE[0].parent.glob("run.rank*.step*.pt"))  # the partial files are gone


def test_a_kill_between_the_agreement_and_the_marker_resumes_the_previous_step():
    for t in (3, 6):
        _on_every_rank(lambda r, ck, t=t: ck.save(_state(r, t), t))
    # every rank wrote step 9 and the ranks agreed; killed before any marker; rank 2 had pruned
    for r in range(WORLD):
        save_checkpoint(RankCheckpoints(BASE[0], _RankEngine(r, None)).path(9), _state(r, 9))
    RankCheckpoints(BASE[0], _RankEngine(2, None)).path(3).unlink()
    states = _on_every_rank(lambda r, ck: ck.load_latest(CFG))
    assert [s["engine"]["t"] for s in states] == [9] * WORLD  # every rank holds 9: complete


@pytest.mark.parametrize(("held", "missing"), [
    ((0, 1), "[2, 3]"),  # saved by a 2-worker run, resumed with 4
    ((1, 3), "[0, 2]"),  # node-local disks: ranks 0 and 2 now run on a machine without them
])
def test_missing_ranks_after_a_complete_checkpoint_are_an_error(held, missing):
    for r in held:
        ck = RankCheckpoints(BASE[0], _RankEngine(r, None))
        save_checkpoint(ck.path(3), _state(r, 3))
        ck.marker(3).write_text("complete\n")
    with pytest.raises(ValueError, match=re.escape(
            f"exist for ranks {list(held)} but not for ranks {missing}")):
        _on_every_rank(lambda r, ck: ck.load_latest(CFG))
    assert len(list(BASE[0].parent.glob("run.rank*.step*.pt"))) == 2  # nothing deleted


def test_a_corrupt_newest_step_is_refused_on_every_rank_naming_the_fallback():
    for t in (3, 6):
        _on_every_rank(lambda r, ck, t=t: ck.save(_state(r, t), t))
    bad = RankCheckpoints(BASE[0], _RankEngine(1, None)).path(6)
    bad.write_bytes(bad.read_bytes()[:100])
    with pytest.raises(ValueError, match=r"cannot resume from step 6: rank 1: .*corrupt.*"
                       r"step 3 is the previous complete checkpoint"):
        _on_every_rank(lambda r, ck: ck.load_latest(CFG))
