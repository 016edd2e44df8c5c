"""Helpers for the notebooks: parameter checks that fail in one readable line.

A notebook declares each parameter once, in its papermill ``parameters`` cell, and the next cell
starts with::

    from localsgd.paper import notebook
    P = notebook.params(globals())

``params`` takes the parameters cell's values from the namespace (plain data bound to public
names, nothing imported yet), checks every one against ``RULES`` and returns them as a read-only
record: ``P.K`` in the code, ``P.as_dict()`` for the figure's provenance. A name without a rule
(a typo, or a papermill ``-p`` the notebook does not know) is an error naming the closest
parameters. ``check(...)`` checks named values directly::

    from localsgd.paper.notebook import check
    check(mode=mode, Hs=Hs, epsilon=epsilon)

A bad value raises ``ParameterError`` naming the parameter, the value and what is allowed, e.g.
``ParameterError: mode = 'fast' is not allowed; expected one of 'smoke', 'quick', 'paper',
'converged'``. In Jupyter (and in papermill's error report) that is the whole message: the
exception renders itself as one line instead of a traceback through the library. The rules live in ``RULES``, keyed by
parameter name, so every notebook that uses a name gets the same check; a notebook-specific
parameter passes its own rule with ``check(rules={"name": one_of(...)}, name=value)``.
"""

from __future__ import annotations

import ast
import difflib
import json
import math
import os
import re
import types
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from localsgd.paper import results

MODES = ("smoke", "quick", "paper", "converged", "long")  # reproduce.MODES (kept import-light)
# the CPU proxies: each keeps its runs and figures in figures/<mode>/ (converged: 20 epochs of all
# of CIFAR-10; long: the paper's 300 epochs and update counts on a subset, docs/pilot/)
PROXY_MODES = ("converged", "long")


class ParameterError(ValueError):
    """A bad value in a notebook's parameters cell; Jupyter shows it as one line."""

    def _render_traceback_(self) -> list[str]:
        # IPython calls this instead of formatting a traceback (the hook IPython documents for
        # exceptions that know how to show themselves); red like IPython's own exception names
        return [f"\x1b[0;31m{type(self).__name__}\x1b[0m: {self}"]


class Rule:
    """``ok(value)`` is True for an allowed value; ``expected`` says which values those are."""

    def __init__(self, ok: Callable[[Any], bool], expected: str | Callable[[], str]):
        self.ok, self._expected = ok, expected

    @property
    def expected(self) -> str:
        return self._expected() if callable(self._expected) else self._expected


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def one_of(*choices: Any, lazy: Callable[[], Iterable[Any]] | None = None) -> Rule:
    """One of ``choices`` (or of ``lazy()``, evaluated when checking: avoids heavy imports)."""
    def allowed() -> tuple[Any, ...]:
        return tuple(choices) + (tuple(lazy()) if lazy is not None else ())

    return Rule(lambda v: v in allowed(), lambda: "one of " + ", ".join(map(repr, allowed())))


def integer(minimum: int = 1) -> Rule:
    return Rule(lambda v: _is_int(v) and v >= minimum, f"an integer >= {minimum}")


def number(minimum: float = 0.0, *, inclusive: bool = False, maximum: float | None = None) -> Rule:
    low = f">= {minimum:g}" if inclusive else f"> {minimum:g}"
    high = f" and <= {maximum:g}" if maximum is not None else ""
    return Rule(lambda v: _is_number(v) and (v >= minimum if inclusive else v > minimum)
                and (maximum is None or v <= maximum), f"a number {low}{high}")


def optional(rule: Rule) -> Rule:
    return Rule(lambda v: v is None or rule.ok(v), f"None or {rule.expected}")


def list_of(rule: Rule, *, empty: str | None = None) -> Rule:
    """A list of values each passing ``rule``; non-empty unless ``empty`` says what [] means."""
    # the message is built lazily: a lazy one_of inside must not import torch at module import
    return Rule(lambda v: isinstance(v, (list, tuple)) and (len(v) > 0 or empty is not None)
                and all(rule.ok(x) for x in v),
                lambda: (f"a list ([]: {empty}), each {rule.expected}" if empty is not None
                         else f"a non-empty list, each {rule.expected}"))


# The lazy choices below import their modules when a check runs, not when a notebook imports
# this module (they import torch).
def _model_names() -> tuple[str, ...]:
    from localsgd.models import MODEL_NAMES

    return MODEL_NAMES


def _dataset_names() -> tuple[str, ...]:
    from localsgd.data import IMAGE_DATASETS

    return IMAGE_DATASETS


def _ddp_model_names() -> tuple[str, ...]:
    from localsgd.paper.bench.ddp import MODELS, SOURCE_MODELS

    return (*MODELS, *SOURCE_MODELS)


FLAG = Rule(lambda v: isinstance(v, bool), "True or False")
SWITCH = Rule(lambda v: isinstance(v, bool) or v == "auto", "True, False or 'auto'")
DEVICE = Rule(lambda v: isinstance(v, str) and re.fullmatch(r"cpu|mps|cuda(:\d+)?", v) is not None,
              "'cpu', 'cuda', 'cuda:N' or 'mps'")
SHAPE = Rule(lambda v: isinstance(v, str) and re.fullmatch(r"[1-9]\d*[x×][1-9]\d*", v) is not None,
             "'SERVERSxGPUS', e.g. '8x2'")
POSITIVE_INTS = list_of(integer(1))
MOMENTUM_PAIR = Rule(lambda v: isinstance(v, (list, tuple)) and len(v) == 2
                     and all(_is_number(m) and 0 <= m < 1 for m in v),
                     "a pair [local, global] of momenta in [0, 1)")
MOMENTA = list_of(MOMENTUM_PAIR)

# One rule per parameter name used by the notebooks. Names mean the same in every notebook.
RULES: dict[str, Rule] = {
    "mode": one_of(*MODES),
    "out_dir": Rule(lambda v: isinstance(v, str) and v != "", "a folder path (relative to the "
                    "repository root, or absolute)"),
    "seed": integer(0),
    "n_seeds": integer(1),
    "K": integer(1),
    "Ks": POSITIVE_INTS,
    "B_loc": integer(1),
    "B_locs": POSITIVE_INTS,
    "B_globs": POSITIVE_INTS,
    "Hs": POSITIVE_INTS,
    "H": integer(1),
    "Hbs": POSITIVE_INTS,
    "H_Hbs": list_of(Rule(lambda v: isinstance(v, (list, tuple)) and len(v) == 2
                          and all(_is_int(x) and x >= 1 for x in v),
                          "a pair [H, H^b] of integers >= 1")),
    "block_size": integer(1),
    "local_steps": POSITIVE_INTS,
    "block_steps": POSITIVE_INTS,
    "max_steps": integer(1),
    "epsilon": number(0.0),
    "rel_resolution": number(0.0, maximum=1.0),
    "comm_cost": number(0.0, inclusive=True),
    "fstar_source": one_of("paper", "computed"),
    "dataset": one_of(lazy=_dataset_names),
    "datasets": list_of(one_of(lazy=_dataset_names)),
    "download": FLAG,
    "model": one_of(lazy=_model_names),
    "models": list_of(one_of(lazy=_model_names)),
    "width": number(0.0),
    "widths": list_of(number(0.0)),
    "n_train": optional(integer(1)),
    "n_test": optional(integer(1)),
    "resolution": optional(integer(8)),
    "batch_scale": number(0.0, maximum=1.0),
    "packed": SWITCH,
    "epochs": number(0.0),
    "records_per_epoch": integer(1),
    "warmup_epochs": number(0.0, inclusive=True),
    "tricks": FLAG,
    "base_batch": integer(1),
    "table6_momenta": MOMENTA,
    "table7_momenta": list_of(MOMENTUM_PAIR, empty="Table 7 not run"),
    "target_acc": optional(number(0.0, maximum=100.0)),
    "compute_ms_per_update": optional(number(0.0)),
    "delays_s": list_of(number(0.0, inclusive=True)),
    "overcome_slowdown": number(0.0),
    "gpus_per_node": integer(1),
    "inter_gbps": number(0.0),
    "intra_gbps": number(0.0),
    "latency_s": number(0.0, inclusive=True),
    "n_samples": integer(1),
    "batch": integer(1),
    "c_intra": number(0.0),
    "c_inter": number(0.0),
    "topologies": list_of(SHAPE),
    "device": DEVICE,
    "batched": SWITCH,
    "refresh": FLAG,
    # dynamo_ddp: eager vs compiled DDP (localsgd.paper.bench.ddp)
    "ddp_models": list_of(one_of(lazy=_ddp_model_names)),
    "batches": POSITIVE_INTS,
    "world_sizes": list_of(integer(2)),
    "steps_per_window": integer(1),
    "rounds": integer(1),
    "warmup_steps": integer(1),
    "bucket_cap_mb": number(1.0, inclusive=True),
    "compile_backend": one_of("inductor", "aot_eager"),
    "process_group": one_of("gloo", "nccl"),
    # blog_hsgd_stragglers: the timing model's inputs (localsgd.timing.simulate)
    "worker_counts": POSITIVE_INTS,
    "straggler_rates": list_of(number(0.0, inclusive=True, maximum=1.0)),
    "steps": integer(1),
    "straggler_s": number(0.0, inclusive=True),
    "compute_cv": number(0.0, inclusive=True),
    "step_ms": number(0.0),
    "model_mb": number(0.0, inclusive=True),
    "intra_host_grad_allreduce": FLAG,
    "grad_overlap": number(0.0, inclusive=True, maximum=1.0),
    "backward_fraction": number(0.0, inclusive=True, maximum=1.0),
    "queued_fraction": number(0.0, inclusive=True, maximum=1.0),
    "queue_steps": integer(0),
    "sync_queue_steps": optional(integer(0)),
    "persistent_rank": integer(0),
    "high_rate": number(0.0, inclusive=True, maximum=1.0),
    "small_stalls_s": list_of(number(0.0)),
    # streamed image folders (fig08_imagenet)
    "image_size": integer(8),
    "loader_workers": integer(0),
    "local_step_warmup_epochs": integer(0),
    "decay_fractions": list_of(number(0.0, maximum=1.0)),
    "nodes": integer(1),
    "runs_dir": optional(Rule(lambda v: isinstance(v, str) and v != "", "a folder path")),
    # table02_time_vs_H: the fit and the straggler scenarios of the barrier model
    "fit_max_h": integer(2),
    "jitter_cv": number(0.0, inclusive=True),
    "stall_rate": number(0.0, inclusive=True, maximum=1.0),
    "stall_s": number(0.0, inclusive=True),
    "slow_factor": number(1.0, inclusive=True),
    "slow_rate": number(0.0, inclusive=True, maximum=1.0),
    "slow_len": number(1.0, inclusive=True),
    # slowmo: the grid and the break-even check
    "lr": number(0.0),
    "localsgd_frequency": integer(1),
    "slowmo_frequency": integer(1),
    "slowmo_momenta": list_of(number(0.0, inclusive=True, maximum=0.99)),
    "sgp_momenta": list_of(number(0.0, inclusive=True, maximum=0.99), empty="SGP not run"),
    "slow_lrs": Rule(lambda v: isinstance(v, (list, tuple))
                     and all(_is_number(x) and x > 0 for x in v), "a list of numbers > 0"),
    "slow_lr_momentum": number(0.0, inclusive=True, maximum=0.99),
    "breakeven": FLAG,
    "breakeven_procs": integer(2),
    "breakeven_repeats": integer(1),
    "breakeven_specs": list_of(Rule(
        lambda v: isinstance(v, dict) and v.get("model") in ("resnet20", "mlp", "embedding")
        and _is_number(v.get("width")) and v["width"] > 0 and _is_int(v.get("batch"))
        and v["batch"] >= 1,
        "a dict {model: 'resnet20', 'mlp' or 'embedding', width: > 0, batch: >= 1}")),
    # comm_quality: DiLoCo's outer step, streaming fragments, formats, links
    "outer_lr": number(0.0),
    "outer_momentum": number(0.0, inclusive=True, maximum=0.99),
    "fragments": integer(1),
    "overlap": integer(0),
    "formats": list_of(one_of("bf16", "fp16", "fp8", "int8", "int4"), empty="no codes"),
    "link_gbps": list_of(number(0.0)),
    "target_drop": number(0.0, inclusive=True),
    # timing_validation (the runner's emulated compute and stragglers) and explore_stragglers
    "compute_ms": number(0.0),
    "straggler_rate": number(0.0, inclusive=True, maximum=1.0),
    "repeats": integer(1),
    "tolerance": number(0.0, maximum=1.0),
    "queue_test": FLAG,
    "workers": integer(1),
    "Hb": integer(1),
    # fig01_allreduce: the emulated cluster's measurements (`localsgd bench cluster`)
    "measured": Rule(lambda v: isinstance(v, str) and v.endswith(".csv"),
                     "a .csv path (relative to the repository root, or absolute)"),
}


HEADLESS_ENV = "LOCALSGD_HEADLESS"  # set by `localsgd reproduce` for the kernels it starts
RUNS_ENV = "LOCALSGD_RUNS"  # `localsgd.paper.experiments.grid.RUNS_ENV`: kept runs (converged)


def headless() -> bool:
    """True in a kernel that `localsgd reproduce` (papermill) executes: no frontend can move a
    slider there, so an explorer draws its chart once instead of building ipywidgets. (Their
    comm traffic twice left papermill waiting for a widget cell the kernel had finished, in CI
    under load.)"""
    return os.environ.get(HEADLESS_ENV) == "1"


def check(rules: Mapping[str, Rule] | None = None, **values: Any) -> None:
    """Check parameter values against ``RULES`` (plus ``rules``); raise one ``ParameterError``.

    Every bad value is named in the message, one per line. A name without a rule is a
    programming error (``TypeError``), so a typo in the call cannot silently skip a check.
    """
    table = {**RULES, **(rules or {})}
    unknown = [n for n in values if n not in table]
    if unknown:
        raise TypeError(f"check(): no rule for {', '.join(unknown)}; pass rules={{name: Rule}} "
                        "or add it to localsgd.paper.notebook.RULES")
    bad = [f"{name} = {value!r} is not allowed; expected {table[name].expected}"
           for name, value in values.items() if not table[name].ok(value)]
    if bad:
        raise ParameterError("; ".join(bad))


# What a parameters cell binds: papermill injects only literals (str, numbers, bools, None, lists
# and dicts of them). IPython's own history lists ``In``/``Out`` are data too, so named here.
_PARAMETER_TYPES = (str, int, float, bool, type(None), list, tuple, dict)
_IPYTHON_NAMES = frozenset({"In", "Out"})
_SEEN = "__localsgd_parameters__"  # where params() remembers the names for a second run


class Params(types.SimpleNamespace):
    """A notebook's checked parameters: attributes by name, ``as_dict()`` for provenance."""

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"notebook parameters are read-only (set {name} in the parameters "
                             "cell or pass it to papermill with -p)")

    def as_dict(self, **extra: Any) -> dict[str, Any]:
        """The parameters (plus ``extra`` derived values) as a plain dict, for provenance."""
        return {**vars(self), **extra}


def cell_defaults(nb_path: Path | str) -> dict[str, Any]:
    """Names assigned in the notebook's single ``parameters`` cell, with their literal values
    (None for a value that is not a flat literal). A missing, doubled or unparsable cell is a
    ParameterError naming the file."""
    try:  # an .ipynb is JSON: reading one cell needs no nbformat (gpu-check runs without it)
        nb = json.loads(Path(nb_path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ParameterError(f"{nb_path}: not a readable notebook: {exc}") from exc
    cells = [c for c in nb.get("cells", []) if c.get("cell_type") == "code"
             and "parameters" in c.get("metadata", {}).get("tags", [])]
    if not cells:
        raise ParameterError(f"{nb_path}: no code cell tagged 'parameters'; tag the cell that "
                             "defines the notebook's parameters (papermill needs it)")
    if len(cells) > 1:
        raise ParameterError(f"{nb_path}: {len(cells)} cells tagged 'parameters'; keep "
                             "exactly one")
    try:
        source = cells[0].get("source", "")
        tree = ast.parse(source if isinstance(source, str) else "".join(source))
    except SyntaxError as exc:
        raise ParameterError(f"{nb_path}: the parameters cell is not valid Python: {exc}") \
            from exc
    names: dict[str, Any] = {}
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else (
            [node.target] if isinstance(node, ast.AnnAssign) and node.value is not None else [])
        for target in targets:
            if isinstance(target, ast.Name):
                try:
                    names[target.id] = ast.literal_eval(node.value)
                except ValueError:
                    names[target.id] = None  # not a flat literal; still a defined name
    return names


def notebooks_dir() -> Path:
    """The checkout's ``notebooks/`` (src layout: src/localsgd/paper/notebook.py)."""
    return Path(__file__).resolve().parents[3] / "notebooks"


BASE_MODE = "quick"  # the mode the committed parameters cells hold


def mode_values(found: Mapping[str, Any], notebook: str,
                folder: Path | None = None) -> dict[str, Any]:
    """The parameters a notebook runs with when its cell says ``mode``: the mode's file
    (``notebooks/params/<notebook>/<mode>.yaml``) over the cell's values, and every value the
    user changed on top (the user's edits win). ``found``: the cell's values as run.

    What the user changed is judged against the `BASE_MODE` file (which lists every name any
    mode's file sets, with the committed cell's value) over the cell as saved, never against
    the cell alone: a notebook saved with ``mode = "converged"`` still takes the converged file,
    and edits saved before the switch still win. A mode without a file is a ParameterError
    naming the modes that have one (the base mode's values are the cell's own)."""
    import yaml  # deferred: only a notebook run interactively reads a mode's file

    folder = notebooks_dir() if folder is None else Path(folder)
    mode = found.get("mode")
    if mode is None:
        return dict(found)
    params_dir = folder / "params" / notebook
    path = params_dir / f"{mode}.yaml"
    if not path.is_file():
        if mode == BASE_MODE:
            return dict(found)
        have = sorted(p.stem for p in params_dir.glob("*.yaml"))
        raise ParameterError(f"mode = {mode!r}: {notebook} has no {path.name} (modes with a "
                             f"file: {', '.join(have) or 'none'})")
    base_file = params_dir / f"{BASE_MODE}.yaml"
    base = {**cell_defaults(folder / f"{notebook}.ipynb"),
            **((yaml.safe_load(base_file.read_text()) or {}) if base_file.is_file() else {})}
    file = yaml.safe_load(path.read_text()) or {}
    changed = {k: v for k, v in found.items()
               if k != "mode" and (k not in base or v != base[k])}
    return {**found, **file, **changed}


# the kept runs' folder `params` set for a converged-mode run by hand (unset again by a run in
# another mode, so a later quick run in the same kernel never writes to the committed folder)
_runs_set: str | None = None


def _point_at_kept_runs(mode: Any) -> None:
    """Converged mode reads (and adds to) the committed kept runs, as `localsgd reproduce`
    does; any other mode undoes what an earlier converged run in this kernel set."""
    global _runs_set
    if mode in PROXY_MODES:
        if RUNS_ENV not in os.environ:
            _runs_set = str(notebooks_dir().parent / "figures" / mode / "runs")
            os.environ[RUNS_ENV] = _runs_set
    elif _runs_set is not None:
        if os.environ.get(RUNS_ENV) == _runs_set:
            os.environ.pop(RUNS_ENV)
        _runs_set = None


def params(namespace: Mapping[str, Any], rules: Mapping[str, Rule] | None = None, *,
           notebook: str | None = None) -> Params:
    """The parameters cell's values found in ``namespace`` (a notebook's ``globals()``), checked.

    Call it first thing after the parameters cell, before other imports: every public name bound
    to plain data is taken as a parameter, so constants imported earlier would be taken too (and
    rejected unless they have a rule). Raises ``ParameterError`` for an unknown name (with the
    closest known ones) or a bad value (with what is allowed).

    ``notebook`` (the notebook's id): a run by hand (JupyterLab) that sets ``mode`` in the cell
    to another mode takes that mode's file, the values the user changed in the cell winning
    (`mode_values`); the names in ``namespace`` are updated to match. `localsgd reproduce`
    injects the mode's file itself (``HEADLESS_ENV``), so there the cell's values stand.
    """
    table = {**RULES, **(rules or {})}
    seen = namespace.get(_SEEN)
    if seen is not None:
        # run again in the same kernel (Run All twice): the namespace now also holds the
        # notebook's own results; the parameters are the names the first call found
        found = {name: namespace[name] for name in seen if name in namespace}
    else:
        found = {name: value for name, value in namespace.items()
                 if not name.startswith("_") and name not in _IPYTHON_NAMES
                 and isinstance(value, _PARAMETER_TYPES)}
        if notebook is not None and not headless():
            if "mode" in found:
                check(rules, mode=found["mode"])  # a bad mode says so before any file is read
            found = mode_values(found, notebook)
            if isinstance(namespace, dict):
                namespace.update(found)  # later cells that read a bare name see the mode's
            _point_at_kept_runs(found.get("mode"))
    unknown = [name for name in found if name not in table]
    if unknown:
        hints = []
        for name in unknown:
            close = difflib.get_close_matches(name, list(found) + list(table), n=3)
            close = [c for c in close if c != name]
            hints.append(f"{name!r}" + (f" (did you mean {', '.join(map(repr, close))}?)"
                                        if close else ""))
        raise ParameterError(f"unknown parameter {', '.join(hints)}: not a parameter of the "
                             "notebooks (localsgd.paper.notebook.RULES); check its spelling")
    check(rules, **found)
    if isinstance(namespace, dict):
        namespace[_SEEN] = tuple(found)
    record = Params()
    for name, value in found.items():
        object.__setattr__(record, name, value)
    return record


class Session:
    """What every notebook does around its own work: the clock, the scale, the seeds, and the save.

    ``nb = notebook.Session(P)`` right after ``P = notebook.params(globals())``; ``nb.seeds`` are
    ``seed, seed + 1, ... seed + n_seeds - 1`` (``[seed]`` without ``n_seeds``), ``nb.scale`` is
    "full" in paper mode, "converged" in converged mode (a small proxy trained for a fraction
    of the paper's epochs with its protocol) and "reduced" otherwise (``scale=`` overrides it, e.g. "model" for a
    timing-model prediction); ``nb.save(...)`` writes the figure, the data it plots, the compare
    rows and the provenance (every parameter plus ``extra``) with the notebook's wall time.
    """

    def __init__(self, P: Params, *, scale: str | None = None):
        import time

        self.P, self._clock = P, time.perf_counter
        self.t0 = self._clock()
        print_style()  # every figure is drawn for print: 7.5 inches wide, no text under 7 pt
        self.scale = scale or {"paper": "full", **{m: m for m in PROXY_MODES}}.get(P.mode, "reduced")
        n = getattr(P, "n_seeds", 1)
        self.seeds = list(range(P.seed, P.seed + n)) if hasattr(P, "seed") else []

    def save(self, fig_id: str, fig: Any, data: Any, compare: Any = None, **extra: Any) -> list:
        """`localsgd.paper.results.save_figure` with this notebook's parameters, mode, scale and time;
        ``compare`` may be a list of `claims.claim_row` dicts or a DataFrame."""
        import pandas as pd

        from localsgd.paper import profile, results

        if isinstance(compare, list):
            compare = pd.DataFrame(compare) if compare else None
        t0 = self._clock()
        written = results.save_figure(
            fig_id, fig, data, out_dir=self.P.out_dir,
            params=self.P.as_dict(seeds=self.seeds, **extra), mode=self.P.mode,
            scale=self.scale, seed=getattr(self.P, "seed", None),
            wall_seconds=t0 - self.t0, compare=compare)
        profile.record("save", figure=fig_id, seconds=self._clock() - t0)
        return written


def source_value(artifact: str, setting: str, metric: str) -> float:
    """One number the source reports (``papers/*/reported.csv``), for drawing it beside ours;
    a row that is missing raises, so a figure never shows a source value nobody recorded."""
    from localsgd.paper.results import load_reported, repo_root

    rep = load_reported(repo_root() / "papers")
    row = rep[(rep["artifact"] == artifact) & (rep["setting"] == setting)
              & (rep["metric"] == metric)]
    if len(row) != 1:
        raise KeyError(f"papers/*/reported.csv: {len(row)} rows for {artifact!r}, "
                       f"{setting!r}, {metric!r} (expected one)")
    return float(row["value"].iloc[0])


PRINT_STYLE = {  # points at print size: nothing below 7
    "font.size": 8, "axes.titlesize": 8, "axes.labelsize": 8, "xtick.labelsize": 7,
    "ytick.labelsize": 7, "legend.fontsize": 7, "legend.title_fontsize": 7,
    "figure.titlesize": 9, "lines.linewidth": 1.2, "lines.markersize": 4}


def print_style() -> None:
    """Matplotlib's sizes for a figure printed `results.PRINT_WIDTH` inches wide."""
    import matplotlib as mpl  # deferred: only notebooks that draw need it

    mpl.rcParams.update(PRINT_STYLE)


def panels(n: int, *, ncols: int | None = None, height: float = 2.4,
           width: float = results.PRINT_WIDTH - 0.25, **kw: Any) -> tuple[Any, list]:
    """A figure of ``n`` panels at print width (less the saved margins), in rows of ``ncols``
    (default 2; 1 for one panel): ``(fig, [ax, ...])``, the unused cells of the last row
    removed. ``height``: one row's inches; ``kw`` go to `matplotlib.pyplot.subplots` (e.g.
    ``sharey=True``)."""
    import matplotlib.pyplot as plt  # deferred: only notebooks that draw need it

    print_style()
    ncols = ncols or min(n, 2)
    nrows = -(-n // ncols)
    fig, grid = plt.subplots(nrows, ncols, figsize=(width, height * nrows), squeeze=False,
                             layout="constrained", **kw)
    axes = list(grid.flatten())
    for ax in axes[n:]:
        ax.remove()
    return fig, axes[:n]


def paired_differences(ax: Any, groups: Iterable[tuple[str, Iterable[float], float | None]], *,
                       ylabel: str, band: float | None = None, title: str = "") -> None:
    """A claim about a difference, drawn as the claim judges it: per group (label, its per-seed
    paired differences, the source's difference or None) the seeds (grey), their mean and the
    one-sided 95 % t bounds on each side (the interval `claims.verdict` reads), the source's
    value as a hollow black diamond; zero, and the claim's tolerance ``band`` (±) when it has
    one."""
    from localsgd.paper.confidence import bounds  # deferred: numpy, scipy

    labels = []
    for i, (label, values, source) in enumerate(groups):
        vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
        labels.append(label)
        if vals:
            ax.scatter([i] * len(vals), vals, color="0.6", s=8, zorder=2)
            mean = sum(vals) / len(vals)
            lo, hi = bounds(vals)
            if math.isfinite(lo):
                ax.errorbar(i, mean, yerr=[[mean - lo], [hi - mean]], fmt="o", color="C0",
                            capsize=3, zorder=3, label="mean, 95 % bounds" if i == 0 else None)
            else:
                ax.plot(i, mean, "o", color="C0", zorder=3,
                        label="mean (1 seed)" if i == 0 else None)
        if source is not None and math.isfinite(float(source)):
            # hollow, so that ours shows where the two nearly agree
            ax.plot(i, float(source), "D", color="black", mfc="none", ms=5, zorder=4,
                    label="source (300 epochs)" if i == 0 else None)
    ax.axhline(0.0, color="black", lw=0.8)
    if band:
        ax.axhspan(-band, band, color="C2", alpha=0.12, label=f"±{band:g} (the claim's band)")
    ax.set_xticks(range(len(labels)), labels)
    ax.set_xlim(-0.6, len(labels) - 0.4)
    ax.set(ylabel=ylabel, title=title)
    ax.legend(loc="best")


def source_note(fig: Any, lines: Iterable[str]) -> None:
    """Print the source's values beside ours under a figure, left-aligned below its axes and
    wrapped to the figure's width (the saved file's tight bounding box takes the text in)."""
    import textwrap

    width = int(fig.get_size_inches()[0] * 72 / (7 * 0.6))  # characters of 7 pt in a line
    text = "\n".join(textwrap.fill(line, width) for line in lines)
    fig.text(0.01, -0.01, text, ha="left", va="top", fontsize=7, color="0.2",
             transform=fig.transFigure)


def ratio_text(value: Any) -> str:
    """A ratio for a source note: "1.64x", or "not measurable" for a missing or NaN value."""
    return f"{value:.2f}x" if isinstance(value, (int, float)) and math.isfinite(value) \
        else "not measurable"
