"""What a training run's results are keyed by: the `TrainConfig` fields that can change its
numbers -- its whole recipe and the execution choices that change numbers (device, dtype,
precision, layout, engine; `localsgd.training.config.EXECUTION`) -- plus `RESULTS_VERSION`.

A kept run (the reproduction's results cache and its committed ``figures/*/runs/``) is found
by `results_key` and trusted only when `same_run` says its stored parameters describe the run
asked for. The library's code is *not* in the key: editing a docstring, renaming a private
helper or adding a config field with a default keeps every kept run. What guards the numbers
instead is ``tests/test_golden_records.py``: tiny runs of every schedule kind and engine, their
records committed under ``tests/golden/``; a change to the arithmetic of results fails it
until `RESULTS_VERSION` is bumped (which retires every run kept under the old version) and the
golden records are written again (``python tests/golden_records.py``). The golden runs are
CPU runs in float32: they guard the arithmetic every engine shares, not what only a GPU does
(TF32 or bf16 numerics, channels-last layout, ``torch.compile``, packs on CUDA); a change there
is checked by ``localsgd gpu-check`` on a lent GPU, and its runs keep their device, precision
and layout in the key.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Mapping
from typing import Any

from localsgd.training.config import SPARSE_DENSITY_FORMATS, TrainConfig

__all__ = ["NOT_IN_KEY", "RESULTS_VERSION", "UNUSED_WHEN", "results_key", "same_run"]

# Bump by hand when a change makes any run compute other numbers (the golden-records test says
# when); runs kept under another version are then trained again, never served.
RESULTS_VERSION = 1

# TrainConfig fields that do not change a run's records, each with why: execution fields only
# (a recipe field always changes what the run is). Every other field is in the key
# (tests/test_results_key.py walks the fields).
NOT_IN_KEY = {
    "eval_batch": "the test set's size per forward pass in evaluation: eval-mode outputs are "
                  "per image and the sums are taken over the same images in order",
    "loader_workers": "processes decoding streamed images: the crops are seeded per image "
                      "(`localsgd.data.SeededItems`), so the batches are the same",
    "check_consistency": "a check of the workers' parameters at the start and after world-wide "
                         "averages: it raises or leaves the run as it was",
    "host_threads": "threads the sequential engine spreads its replicas over: the same bits on "
                    "one core or several (tests/test_replicas.py)",
}

# Fields that cannot change a run's numbers while another field leaves them unused
# (`localsgd.training.loop.build_engine` reads them only then): (when unused, why).
UNUSED_WHEN = {
    "slowmo_momentum": (lambda c: c.slowmo_frequency is None, "no SlowMo outer step"),
    "slowmo_lr": (lambda c: c.slowmo_frequency is None, "no SlowMo outer step"),
    "global_momentum": (lambda c: c.momentum_scheme in ("local", "none"),
                        "no global (outer) momentum step"),
    "global_lr": (lambda c: c.momentum_scheme in ("local", "none"), "no global (outer) step"),
    "global_nesterov": (lambda c: c.momentum_scheme in ("local", "none"),
                        "no global (outer) step"),
    "compression_feedback": (lambda c: c.average_compression == "fp32",
                             "exact averages: no codes whose error to feed back"),
    "compression_density": (lambda c: c.average_compression not in SPARSE_DENSITY_FORMATS,
                            "no top-k or random-k codes to size"),
    "churn_away_rounds": (lambda c: not c.churn_rate, "nobody leaves"),
    "churn_rejoin": (lambda c: not c.churn_rate, "nobody leaves"),
    "quorum_grace_steps": (lambda c: not c.quorum, "every average waits for everyone"),
    "quorum_stall_rate": (lambda c: not c.quorum, "every average waits for everyone"),
    "quorum_stall_steps": (lambda c: not c.quorum, "every average waits for everyone"),
    "adam_betas": (lambda c: c.optimizer != "adamw", "SGD inside: no Adam moments"),
    "overlap_steps": (lambda c: not c.fragments, "no streaming fragments to overlap"),
    "fragment_mixing": (lambda c: not c.fragments, "no streaming fragments to merge"),
}


def results_key(cfg: TrainConfig) -> dict[str, Any]:
    """The run's key: every field that can change its records (not `NOT_IN_KEY`, not unused
    by this run, `UNUSED_WHEN`) and is not at its default (a field added later with a default
    therefore leaves older keys as they were), plus ``results_version``. The values are JSON's,
    one spelling per value (`_normal`)."""
    key: dict[str, Any] = {"results_version": RESULTS_VERSION}
    for field in dataclasses.fields(TrainConfig):
        value = getattr(cfg, field.name)
        unused = field.name in UNUSED_WHEN and UNUSED_WHEN[field.name][0](cfg)
        if field.name in NOT_IN_KEY or unused or value == _default(field):
            continue
        key[field.name] = _normal(value, field.name)
    return key


@functools.cache
def _float_fields() -> frozenset[str]:
    """The fields annotated float (or float | None): 20 and 20.0 are one value there."""
    hints = typing.get_type_hints(TrainConfig)
    return frozenset(name for name, hint in hints.items()
                     if hint is float or float in typing.get_args(hint))


def _normal(value: Any, name: str) -> Any:
    """``value`` as JSON writes it, one spelling per value: a tuple is a list, an int in a
    float field a float (``epochs=20`` and ``epochs=20.0`` are the same run, one file)."""
    if isinstance(value, tuple | list):
        return [_normal(v, name) for v in value]
    if name in _float_fields() and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def same_run(stored: Mapping[str, Any], cfg: TrainConfig) -> bool:
    """Whether the parameters ``stored`` with a kept run (``TrainConfig.to_dict()``, or a part
    of it: a field missing there was at its default) describe the run ``cfg`` asks for. A field
    ``cfg`` no longer has, or a value it would refuse, is another run."""
    try:
        kept = TrainConfig.from_dict(dict(stored))
    except (ValueError, TypeError):
        return False
    return results_key(kept) == results_key(cfg)


def _default(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    return field.default_factory()  # type: ignore[misc]
