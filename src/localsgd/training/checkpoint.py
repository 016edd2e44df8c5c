"""Checkpoints of a training run: atomic writes, validated loads, per-rank files for torchrun.

A checkpoint is a dict ``{"format": CHECKPOINT_FORMAT, "config": cfg.to_dict(), "engine":
engine.state_dict(), "records": ..., "totals": ...}`` written by `localsgd.training.loop.train`; it
is loaded with ``weights_only=True`` and refused (a ``ValueError`` naming the difference) when it
belongs to another configuration.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from localsgd.engines import Engine
from localsgd.paths import atomic_path

__all__ = ["CHECKPOINT_FORMAT", "RankCheckpoints", "load_checkpoint", "read_state",
           "save_checkpoint"]

CHECKPOINT_FORMAT = 2  # 2: the replica stack's rows hold alignment gaps (engines.replicas.FLAT_ALIGN)



def read_state(path: str | Path, what: str) -> Any:
    """``torch.load`` of a checkpoint file (tensors and plain data only), a garbled or foreign
    file raising one ValueError line that names ``what`` the file should have been."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except OSError:  # missing, unreadable, a folder: not a question of the file's contents
        raise
    except Exception as err:  # noqa: BLE001 - torch raises many types for garbled files
        first = (str(err).strip().splitlines() or [""])[0]  # torch's messages run to pages
        raise ValueError(f"checkpoint {path} is corrupt or not {what} ({type(err).__name__}: "
                         f"{first}); delete it to start afresh or point checkpoint_path "
                         "elsewhere") from None

def save_checkpoint(path: str | Path, state: dict) -> Path:
    """Write a checkpoint atomically: a reader never sees a half-written file."""
    with atomic_path(path) as tmp:
        torch.save(state, tmp)
    return Path(path)


def load_checkpoint(path: str | Path, cfg: Any) -> dict:
    """Load and validate a checkpoint of ``cfg``'s run (``weights_only=True``); ``cfg`` is the
    run's `localsgd.training.config.TrainConfig` (not imported here: the loop imports this
    module)."""
    path = Path(path)
    state = read_state(path, "a localsgd checkpoint")
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"checkpoint {path} is not a localsgd training checkpoint "
                         f"(format {CHECKPOINT_FORMAT}); delete it or use another path")
    saved = state.get("config", {})
    defaults = {f.name: f.default for f in dataclasses.fields(cfg)}
    # a field added after the checkpoint was written counts as its default value
    saved = {k: saved.get(k, defaults[k]) for k in cfg.to_dict()}
    diff = {k: (saved.get(k), v) for k, v in cfg.to_dict().items()
            if _jsonish(saved.get(k)) != _jsonish(v)}
    if diff:
        described = ", ".join(f"{k}: saved {a!r} vs now {b!r}" for k, (a, b) in diff.items())
        raise ValueError(f"checkpoint {path} belongs to another configuration ({described}); "
                         "resume with the saved configuration or use another checkpoint_path")
    return state


def _jsonish(v: Any) -> Any:
    return list(v) if isinstance(v, tuple) else v


class RankCheckpoints:
    """Per-rank checkpoints of a multi-process run (one worker per process, e.g. torchrun).

    Rank r writes ``<stem>.rank{r}.step{t}<suffix>`` atomically; then the ranks agree (one
    ``all_gather_object``) that all of them hold step t, each records that in its own marker
    ``<stem>.rank{r}.step{t}.complete`` and deletes its files older than the previous step. So at
    any moment -- also after a SIGKILL of every worker -- the newest step that every rank holds
    is complete, and the one before it is still on disk. The markers tell a run stopped while
    writing its *first* checkpoint (some ranks hold files, no rank a marker: it starts afresh)
    from checkpoints missing on some ranks -- another world size, or node-local disks after the
    ranks moved to other machines -- which is an error and deletes nothing.
    """

    KEEP = 2  # the newest complete step and its predecessor (a fallback if the newest is bad)

    def __init__(self, base: str | Path, engine: Engine):
        self.base, self.engine = Path(base), engine
        self.rank = engine.local_ranks[0]

    def path(self, t: int) -> Path:
        return self.base.with_name(f"{self.base.stem}.rank{self.rank}.step{t:09d}"
                                   f"{self.base.suffix}")

    def steps(self) -> list[int]:
        prefix = f"{self.base.stem}.rank{self.rank}.step"
        found = []
        for f in self.base.parent.glob(f"{prefix}*{self.base.suffix}"):
            digits = f.name[len(prefix):len(f.name) - len(self.base.suffix)]
            if digits.isdigit():
                found.append(int(digits))
        return sorted(found)

    def marker(self, t: int) -> Path:
        return self.base.with_name(f"{self.base.stem}.rank{self.rank}.step{t:09d}.complete")

    def marked(self) -> list[int]:
        """The steps this rank recorded as held by every rank."""
        prefix, found = f"{self.base.stem}.rank{self.rank}.step", []
        for f in self.base.parent.glob(f"{prefix}*.complete"):
            digits = f.name[len(prefix):-len(".complete")]
            if digits.isdigit():
                found.append(int(digits))
        return sorted(found)

    def save(self, state: dict, t: int) -> None:
        save_checkpoint(self.path(t), state)
        at = self.engine.all_gather_object(t)  # every rank has written step t past this point
        if len(set(at)) != 1:
            raise RuntimeError(f"ranks checkpointed different steps {at}; the schedule diverged")
        with atomic_path(self.marker(t)) as tmp:
            tmp.write_text(f"every one of the {len(at)} ranks holds step {t}\n")
        for old in self.marked()[:-self.KEEP]:
            self.marker(old).unlink(missing_ok=True)
        for old in self.steps()[:-self.KEEP]:
            self.path(old).unlink(missing_ok=True)

    def load_latest(self, cfg: Any) -> dict | None:
        """The newest step every rank holds (collective); None if no rank has one, or if the
        run stopped while writing its first checkpoint (no rank holds a marker: the partial files,
        which no resume could use, are deleted).
        A corrupt or mismatched file on any rank fails on every rank, naming the rank and the
        problem."""
        gathered = self.engine.all_gather_object((self.steps(), self.marked()))
        everyone = [steps for steps, _ in gathered]
        ever_complete = any(marked for _, marked in gathered)
        common = sorted(set(everyone[0]).intersection(*map(set, everyone[1:])))
        if not common:
            holders = [r for r, steps in enumerate(everyone) if steps]
            if holders and not ever_complete:
                if self.rank == 0:
                    print(f"checkpoints {self.base.stem}.rank*.step* exist for ranks {holders} "
                          f"only: the run stopped while writing its first checkpoint; starting "
                          "from update 0", flush=True)
                for t in self.steps():
                    self.path(t).unlink(missing_ok=True)
                return None
            if holders:
                raise ValueError(
                    f"checkpoints {self.base.stem}.rank*.step* exist for ranks {holders} but not "
                    f"for ranks {[r for r, st in enumerate(everyone) if not st]} of this "
                    f"{len(everyone)}-worker run (saved with another world size, or on another "
                    "machine's disk?); resume with the saved launch or use another folder")
            return None
        t = common[-1]
        state, error = None, None
        try:
            state = load_checkpoint(self.path(t), cfg)
        except ValueError as err:
            error = str(err)
        errors = [(r, e) for r, e in enumerate(self.engine.all_gather_object(error)) if e]
        if errors:
            prev = [s for s in common if s < t]
            hint = (f"; step {prev[-1]} is the previous complete checkpoint: delete the "
                    f"step-{t} files ({self.base.stem}.rank*.step{t:09d}{self.base.suffix}) to "
                    "resume from it" if prev else "")
            raise ValueError(f"cannot resume from step {t}: " + "; ".join(
                f"rank {r}: {e}" for r, e in errors) + hint)
        return state
