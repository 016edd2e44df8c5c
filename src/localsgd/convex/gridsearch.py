"""Step-size grid search of Appendix E: c = 2^i, optimal when 2^-2 c, 2^-1 c, 2c, 4c do worse.

The grid extends itself: while the best exponent so far lacks an evaluated neighbour at distance
1 or 2, those neighbours are evaluated; when all four are evaluated and none is better, the best
is optimal. Both step-size families are searched in lock-step so that every round of new points
runs as one vectorized batch.

Ties: a neighbour with the *same* score counts as "not better" (the measured stopping step is
quantized by the evaluation resolution, so exact ties happen). The smallest score wins; among
equal scores the *smaller* c wins. That choice also ends the search on plateaus: for large c the
decreasing family min(32, c·n/(t+1)) is the constant step 32 over the whole run, so all larger c
tie and the grid must not chase them upwards.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

NEIGHBOURS = (-2, -1, 1, 2)


def best_exponent(scores: Mapping[int, float]) -> int:
    """Exponent with the lowest score (ties → smaller exponent). Scores may be inf."""
    return min(scores, key=lambda i: (scores[i], i))


def missing_neighbours(scores: Mapping[int, float]) -> list[int]:
    """Exponents still to evaluate before the current best can be called optimal ([] = done)."""
    if all(math.isinf(v) for v in scores.values()):
        # nothing reached the target: the optimum may lie on either side
        return [min(scores) - 2, min(scores) - 1, max(scores) + 1, max(scores) + 2]
    i = best_exponent(scores)
    return [i + j for j in NEIGHBOURS if i + j not in scores]


def is_optimal(scores: Mapping[int, float], i: int) -> bool:
    """Appendix E's rule: i is optimal if 2^(i±1), 2^(i±2) are all evaluated and do worse
    (ties allowed, see module docstring) and i itself reached the target."""
    if not math.isfinite(scores.get(i, math.inf)):
        return False
    return all(i + j in scores and scores[i + j] >= scores[i] for j in NEIGHBOURS)


def grid_search(
    evaluate: Callable[[list[tuple[str, int]]], Mapping[tuple[str, int], float]],
    initial: Mapping[str, Sequence[int]],
    *,
    bounds: tuple[int, int] = (-40, 20),
    max_rounds: int = 20,
) -> dict[str, dict]:
    """Search every family's exponent grid until Appendix E's optimality rule holds.

    ``evaluate(points)`` scores a list of (family, exponent) points (lower is better, inf = did
    not reach the target) in one batch. ``initial`` maps each family to its first exponents.
    Returns per family ``{"best": i, "score": s, "scores": {i: s}, "optimal": bool}``;
    ``optimal`` is False when ``bounds`` or ``max_rounds`` stopped the extension. A family none
    of whose points reached the target keeps extending on both sides even when another family
    did: its starting window may simply lie far from its optimum, which could still win.
    """
    scores: dict[str, dict[int, float]] = {fam: {} for fam in initial}
    todo = [(fam, int(i)) for fam, grid in initial.items() for i in grid]
    for _ in range(max_rounds):
        if not todo:
            break
        for key, value in evaluate(todo).items():
            scores[key[0]][key[1]] = float(value)
        todo = [(fam, i) for fam, sc in scores.items() for i in missing_neighbours(sc)
                if bounds[0] <= i <= bounds[1]]
    out = {}
    for fam, sc in scores.items():
        i = best_exponent(sc)
        out[fam] = {"best": i, "score": sc[i], "scores": dict(sorted(sc.items())),
                    "optimal": is_optimal(sc, i)}
    return out
