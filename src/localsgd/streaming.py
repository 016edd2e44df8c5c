"""Streaming fragment sync (Douillard et al. 2025, *Streaming DiLoCo with overlapping
communication*): `FragmentSync` runs a `localsgd.schedule.Streaming` plan through any
communicator, so the replica engines and the torchrun engine compute the same run.

Per fragment p (`fragment_bounds`: whole tensors in parameter order) it keeps the reference
``ref_p`` (the fragment's last global value, equal on every worker), an outer update of its own
(Eq. 2 of the source: each fragment's Nesterov / block-momentum state is its own) and at most one
average in flight:

* **launch** (after update t): each worker's change since the reference, ``ref_p - x_p`` (the
  outer gradient of DiLoCo), starts its average over all workers -- under torchrun an
  asynchronous all-reduce (or the compressed codes of `localsgd.compression`) that travels
  while the workers go on computing;
* **merge** (after update t + τ): the new global value is ``ref_p - mean`` (plain averaging) or
  the outer update's step from ``mean``; it becomes the reference, and each worker's fragment
  becomes ``α x_p + (1 - α) global`` (α = ``mixing``).

With P = 1, τ = 0 and α = 0 this is local SGD's average (Eq. 4 of Lin et al., written as the
reference minus the mean change) or DiLoCo with an outer update. Launched averages not merged
when training stops are dropped (the evaluated model is the workers' mean either way).

A communicator serves it with four methods: ``param_numels()`` (one worker's trainable tensors'
sizes), ``read_tensors(j0, j1)`` (tensors j0..j1-1 of every worker, gap-free: ``[n]`` for this
process's worker, ``[K, n]`` for in-process replicas), ``write_tensors(j0, j1, values)`` (a
common ``[n]`` or per-worker values) and ``start_mean(delta, key)`` (begin averaging ``delta``
over all workers; returns a function that waits and gives the common ``[n]`` mean; ``key`` names
the fragment for error feedback).
"""

from __future__ import annotations

import copy
import itertools
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

__all__ = ["FragmentSync", "fragment_bounds"]


def fragment_bounds(numels: Sequence[int], fragments: int) -> list[tuple[int, int]]:
    """Tensor index ranges ``[(j0, j1), ...]`` splitting tensors of sizes ``numels`` (in
    parameter order) into ``fragments`` contiguous, non-empty parts whose sizes are as close to
    equal as whole tensors allow: each cut falls at the tensor boundary nearest its share."""
    count = len(numels)
    if not 1 <= fragments <= count:
        raise ValueError(f"streaming fragments={fragments}: must be between 1 and the model's "
                         f"{count} trainable tensors (a fragment holds whole tensors)")
    before = [0]
    for n in numels:
        before.append(before[-1] + int(n))
    total, cuts = before[-1], [0]
    for b in range(1, fragments):
        target = b * total / fragments
        # leave at least one tensor for this fragment and for each one after it
        options = range(cuts[-1] + 1, count - (fragments - b) + 1)
        cuts.append(min(options, key=lambda j: abs(before[j] - target)))
    cuts.append(count)
    return list(itertools.pairwise(cuts))


def _ready(value: torch.Tensor) -> Callable[[], torch.Tensor]:
    """An average already here, as `start_mean`'s waiting function gives it."""
    return lambda: value


def _common(values: torch.Tensor) -> torch.Tensor:
    """One worker's copy of values every worker holds alike (row 0 of a replica stack)."""
    return (values[0] if values.dim() == 2 else values).detach().clone()


class FragmentSync:
    """The fragments' references, outer updates and averages in flight (module docstring) for
    one `localsgd.schedule.Streaming` plan over ``comm``; ``outer`` (an `localsgd.outer.OuterUpdate`, copied per
    fragment) or None for plain averaging. `localsgd.schedule.SyncDriver` calls `launch` and
    `merge` as the schedule's actions say and `reset` when the post-local warm-up ends."""

    def __init__(self, spec: Any, comm: Any, outer: Any = None):
        self.spec, self.comm, self._template = spec, comm, outer
        self.bounds = fragment_bounds(comm.param_numels(), spec.fragments)
        self.pending: dict[int, tuple[Callable[[], torch.Tensor], float | None]] = {}
        self.outers: list[Any] | None = None
        self.last_wait_s = 0.0  # host seconds the last merge waited for its average
        self.reset()

    @torch.no_grad()
    def reset(self) -> None:
        """References (and outer anchors) from the workers' current, common model."""
        self.refs = [_common(self.comm.read_tensors(*b)) for b in self.bounds]
        if self._template is not None:
            if self.outers is None:
                self.outers = [copy.deepcopy(self._template) for _ in self.bounds]
            for outer, ref in zip(self.outers, self.refs, strict=True):
                outer.reset(ref)

    @torch.no_grad()
    def launch(self, p: int, lr: float | None) -> None:
        """Start averaging fragment ``p``'s change since its reference (``lr``: the inner
        learning rate of the update, the outer step's scale at the merge)."""
        if p in self.pending:
            raise RuntimeError(f"fragment {p} launched again before its merge")
        local = self.comm.read_tensors(*self.bounds[p])
        self.pending[p] = (self.comm.start_mean(self.refs[p] - local, ("fragment", p)), lr)

    @torch.no_grad()
    def merge(self, p: int) -> None:
        """Wait for fragment ``p``'s average; step its global value; mix it into the workers."""
        if p not in self.pending:
            raise RuntimeError(f"fragment {p} merged without a launched average")
        wait, lr = self.pending.pop(p)
        start = time.perf_counter()
        mean = wait().to(self.refs[p].dtype)
        self.last_wait_s = time.perf_counter() - start
        if self.outers is not None:
            if lr is None:
                raise ValueError("an outer step needs the inner lr: call after_step(lr)")
            new = self.outers[p].step_delta(mean, lr).clone()
        else:
            new = self.refs[p] - mean
        self.refs[p] = new
        value = new
        if self.spec.mixing:
            local = self.comm.read_tensors(*self.bounds[p])
            value = torch.lerp(new.expand_as(local), local, self.spec.mixing)
        self.comm.write_tensors(*self.bounds[p], value)

    def finish(self) -> None:
        """Wait for the averages still in flight, without merging them (training stops: the
        run ends as it is); call before tearing down a process group."""
        for wait, _ in self.pending.values():
            wait()
        self.pending.clear()

    def state_dict(self) -> dict:
        """References, outer states and the averages in flight (waited for: a checkpoint lies
        between updates, so a resumed run merges what the uninterrupted one would)."""
        pending = {}
        for p, (wait, lr) in list(self.pending.items()):
            mean = wait()
            self.pending[p] = (_ready(mean), lr)
            pending[p] = {"mean": mean.clone(), "lr": lr}
        return {"bounds": list(self.bounds), "refs": [r.clone() for r in self.refs],
                "outers": None if self.outers is None else [o.state_dict() for o in self.outers],
                "pending": pending}

    def load_state_dict(self, state: dict) -> None:
        if [tuple(b) for b in state["bounds"]] != self.bounds:
            raise ValueError(f"the state's fragments {state['bounds']} are not this run's "
                             f"{self.bounds}; resume with the model and fragments it was "
                             "written with")
        self.refs = [r.to(ref.device).clone() for r, ref in zip(state["refs"], self.refs,
                                                                 strict=True)]
        if (self.outers is None) != (state["outers"] is None):
            raise ValueError("the state's outer updates do not match this run's; resume with "
                             "the configuration it was written with")
        if self.outers is not None:
            for outer, saved in zip(self.outers, state["outers"], strict=True):
                outer.load_state_dict(saved)
        self.pending = {int(p): (_ready(v["mean"].to(self.refs[0].device)), v["lr"])
                        for p, v in state["pending"].items()}
