"""Who averages with whom: `Topology`, nested groups of contiguous ranks with their averaging
periods (one `Level` each), and the integer check `check_int` that `localsgd.schedule` shares.

Pure Python (no torch, no torch.distributed), like the schedule built on it
(`localsgd.schedule`).

Paper: Lin, Stich, Patel, Jaggi, "Don't Use Large Mini-Batches, Use Local SGD" (ICLR 2020),
Sec. 3.2, Eq. (5), Algorithm 2 (K, K', H, H^b). Hierarchy rules: PyTorch hierarchical SGD blog.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

__all__ = ["Level", "Topology", "check_int"]


class Level(NamedTuple):
    """One level of the hierarchy: groups of `group_size` contiguous ranks average every
    `period` local steps. `name` maps the level to hardware ("node", "rack", "world")."""

    period: int
    group_size: int
    name: str | None = None


def check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")  # noqa: TRY004
    if value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value}")
    return value


class Topology:
    """Nested groups of contiguous ranks with their averaging periods.

    Levels are ordered from the smallest (most frequent) group to the whole world. Rules
    (validated, each violation is a ValueError naming the value and what would be valid):

    * periods are >= 1, strictly ascending, and each is a multiple of the previous one;
    * group sizes are >= 1, each divides the next one, and the last equals `world_size`.

    Two constructors match the two ways users describe hierarchies:
    `from_paper` (K, K', H, H^b of Algorithm 2) and `from_periods` (PyTorch's
    ``period_group_size_dict`` of ``HierarchicalModelAverager``).
    """

    def __init__(self, levels: Iterable[Level | tuple], world_size: int):
        self.world_size = check_int("world_size", world_size, 1)
        lv = [Level(*level) for level in levels]
        if not lv:
            raise ValueError("a topology needs at least one level; got an empty list of levels")
        for i, level in enumerate(lv):
            check_int(f"period of level {i}", level.period, 1)
            check_int(f"group size of level {i}", level.group_size, 1)
        for i, level in enumerate(lv):
            if self.world_size % level.group_size:
                divisors = [d for d in range(1, self.world_size + 1) if self.world_size % d == 0]
                raise ValueError(
                    f"group size {level.group_size} of level {i} does not divide world_size "
                    f"{self.world_size}; valid group sizes are {divisors}"
                )
        for i in range(1, len(lv)):
            prev, cur = lv[i - 1], lv[i]
            if cur.period <= prev.period:
                raise ValueError(
                    f"periods must be strictly ascending: level {i} has period {cur.period} "
                    f"after period {prev.period}; use a multiple of {prev.period} greater than it "
                    f"(e.g. {2 * prev.period})"
                )
            if cur.period % prev.period:
                raise ValueError(
                    f"period {cur.period} of level {i} is not a multiple of the previous period "
                    f"{prev.period}; valid periods are {prev.period}*k for k >= 2"
                )
            if cur.group_size % prev.group_size:
                raise ValueError(
                    f"group size {cur.group_size} of level {i} is not a multiple of the previous "
                    f"group size {prev.group_size}; groups must nest"
                )
        if lv[-1].group_size != self.world_size:
            raise ValueError(
                f"the last level must be the whole world: its group size is {lv[-1].group_size} "
                f"but world_size is {self.world_size}; add a level ({2 * lv[-1].period}, "
                f"{self.world_size}) or change the last group size to {self.world_size}"
            )
        names = [level.name for level in lv if level.name is not None]
        if len(set(names)) != len(names):
            raise ValueError(f"level names must be unique, got {names}")
        self.levels: tuple[Level, ...] = tuple(lv)

    # -- constructors ------------------------------------------------------------------------

    @classmethod
    def from_paper(
        cls,
        world_size: int,
        local_steps: int,
        block_size: int | None = None,
        block_steps: int = 1,
    ) -> Topology:
        """Algorithm 1/2 of the paper: K = `world_size` workers, blocks of K' = `block_size`
        workers average every H = `local_steps` steps and the world every H * H^b steps
        (H^b = `block_steps`), Eq. (5).

        Flat local SGD (Algorithm 1, Eq. (4)) with period H * H^b is returned when `block_size`
        is None or K, or when H^b = 1: then both levels are due at the same steps, only the
        highest one runs, so blocks never average on their own. The paper writes plain local
        SGD on a cluster of blocks this way ("H^b = 1" in Table 2 and Table 3's last column).
        """
        check_int("world_size (K)", world_size, 1)
        check_int("local_steps (H)", local_steps, 1)
        check_int("block_steps (H^b)", block_steps, 1)
        if block_size is not None:
            check_int("block_size (K')", block_size, 1)
            if block_size > world_size or world_size % block_size:
                divisors = [d for d in range(1, world_size + 1) if world_size % d == 0]
                raise ValueError(
                    f"block_size (K') {block_size} does not divide world_size (K) {world_size}; "
                    f"valid block sizes are {divisors} (or None for flat local SGD)"
                )
        if block_size is None or block_size == world_size or block_steps == 1:
            return cls([Level(local_steps * block_steps, world_size, "world")], world_size)
        return cls(
            [
                Level(local_steps, block_size, "block"),
                Level(local_steps * block_steps, world_size, "world"),
            ],
            world_size,
        )

    @classmethod
    def from_periods(
        cls,
        period_group_sizes: Mapping[int, int] | Iterable[tuple[int, int]],
        world_size: int | None = None,
        names: Iterable[str] | None = None,
    ) -> Topology:
        """PyTorch's ordered ``period -> group size`` map, e.g. ``{2: 8, 4: 32, 8: 128}``
        (any number of levels). `world_size` defaults to the last group size."""
        items = list(
            period_group_sizes.items() if isinstance(period_group_sizes, Mapping)
            else period_group_sizes
        )
        if not items:
            raise ValueError("period_group_sizes must not be empty; e.g. {2: 4, 8: 16}")
        if world_size is None:
            world_size = items[-1][1]
        name_list = list(names) if names is not None else [None] * len(items)
        if len(name_list) != len(items):
            raise ValueError(f"got {len(name_list)} names for {len(items)} levels")
        return cls(
            [Level(p, g, n) for (p, g), n in zip(items, name_list, strict=True)], world_size
        )

    # -- queries -----------------------------------------------------------------------------

    @property
    def num_levels(self) -> int:
        return len(self.levels)

    @property
    def top(self) -> int:
        """Index of the global (whole-world) level."""
        return len(self.levels) - 1

    def level_index(self, level: int | str) -> int:
        """Level index from an index (negative allowed) or a level name."""
        if isinstance(level, str):
            for i, lv in enumerate(self.levels):
                if lv.name == level:
                    return i
            raise ValueError(
                f"unknown level name {level!r}; valid names are "
                f"{[lv.name for lv in self.levels if lv.name is not None]}"
            )
        n = len(self.levels)
        if isinstance(level, bool) or not isinstance(level, int) or not -n <= level < n:
            raise ValueError(f"level must be an index in [{-n}, {n - 1}] or a name, got {level!r}")
        return level % n

    def groups(self, level: int | str) -> list[list[int]]:
        """Contiguous rank groups of a level, e.g. [[0, 1, 2, 3], [4, 5, 6, 7]]."""
        size = self.levels[self.level_index(level)].group_size
        return [list(range(s, s + size)) for s in range(0, self.world_size, size)]

    def group_of(self, rank: int, level: int | str) -> list[int]:
        """The ranks in `rank`'s group at `level`."""
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self.world_size:
            raise ValueError(f"rank must be in [0, {self.world_size - 1}], got {rank!r}")
        size = self.levels[self.level_index(level)].group_size
        start = rank - rank % size
        return list(range(start, start + size))

    @property
    def period_group_sizes(self) -> dict[int, int]:
        """PyTorch form ``{period: group_size}``."""
        return {lv.period: lv.group_size for lv in self.levels}

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Topology)
            and self.levels == other.levels
            and self.world_size == other.world_size
        )

    def __hash__(self) -> int:  # SyncSchedule is a frozen dataclass: its hash needs ours
        return hash((self.levels, self.world_size))

    def __repr__(self) -> str:
        body = ", ".join(
            f"{lv.name + ': ' if lv.name else ''}every {lv.period} in groups of {lv.group_size}"
            for lv in self.levels
        )
        return f"Topology(world_size={self.world_size}; {body})"
