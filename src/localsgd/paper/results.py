"""Tidy result records, provenance sidecars, atomic writes and a parameter-keyed cache.

Every figure a notebook draws is saved as ``<id>.png``/``.pdf``, the exact data plotted as
``<id>.csv``, and a JSON sidecar ``<id>.json`` saying how it was made (git commit, package
versions, device, parameters, seed, mode, scale, UTC time, wall seconds). When a notebook also
has numbers to put beside a source's own, it writes ``<id>.compare.csv`` keyed like
``papers/*/reported.csv`` (artifact, setting, metric); ``localsgd report`` joins the two.
"""

from __future__ import annotations

import datetime as _dt
import functools
import hashlib
import importlib.metadata
import json
import os
import platform
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from localsgd import paths
from localsgd.paper import dry_run
from localsgd.paths import atomic_path  # re-exported: results.atomic_path is public

COMPARE_COLUMNS = ("artifact", "setting", "metric", "value")
# model: a prediction of the timing model, not a run; converged: converged mode's small proxy
# trained for a fraction of the source's epochs with its protocol; long: long mode's proxy, the
# source's epochs and update counts on a subset at lower resolution (docs/pilot/)
# cluster: measured on the emulated cluster (localsgd.netcluster: namespaces, tbf-shaped links)
SCALES = ("full", "reduced", "model", "converged", "long", "cluster")
_VERSIONED = ("localsgd", "torch", "torchvision", "numpy", "scipy", "pandas", "matplotlib",
              "seaborn", "papermill")


# --------------------------------------------------------------------------- atomic writes
def write_text(path: str | os.PathLike, text: str) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(text)
    return Path(path)


# Figures' CSVs carry 10 significant digits: far beyond what any plotted number means, and short of
# the last bits that differ between CPUs' BLAS/LAPACK kernels (Table 2's least-squares fit moved in
# the 16th digit between two machines), so a deterministic notebook writes the same bytes anywhere.
FIGURE_FLOAT_FORMAT = "%.10g"


def write_csv(df: pd.DataFrame, path: str | os.PathLike, float_format: str | None = None) -> Path:
    with atomic_path(path) as tmp:
        df.to_csv(tmp, index=False, float_format=float_format)
    return Path(path)


def write_json(obj: Any, path: str | os.PathLike) -> Path:
    return write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=_jsonable) + "\n")


def _jsonable(x: Any) -> Any:
    if hasattr(x, "tolist"):  # numpy / torch scalars and arrays
        return x.tolist()
    if isinstance(x, (set, tuple)):
        return list(x)
    if isinstance(x, Path):
        return str(x)
    return repr(x)


# --------------------------------------------------------------------------- provenance
def repo_root() -> Path:
    """The checkout this package runs from (src layout: src/localsgd/paper/results.py)."""
    return Path(__file__).resolve().parents[3]


# Where a notebook run by hand (JupyterLab, papermill without out_dir) writes: git-ignored, so
# interactive runs never touch the committed figures/ (only `localsgd reproduce` injects that).
INTERACTIVE_DIR = "build/interactive"


REPORTED_COLUMNS = ["artifact", "setting", "metric", "value", "unit", "note"]


def load_reported(papers_dir: Path) -> pd.DataFrame:
    """All sources' reported numbers, with a ``source`` column (the folder name)."""
    csvs = sorted(papers_dir.glob("*/reported.csv"))
    if not csvs:
        raise ValueError(f"no <source>/reported.csv under {papers_dir}; pass the repository's "
                         "papers/ folder (--papers)")
    frames = []
    for csv in csvs:
        df = pd.read_csv(csv, dtype={"setting": str, "metric": str, "unit": str, "note": str})
        missing = [c for c in REPORTED_COLUMNS if c not in df.columns]
        if missing:
            raise ValueError(f"{csv}: missing columns {missing}; expected {REPORTED_COLUMNS}")
        df.insert(0, "source", csv.parent.name)
        frames.append(df)
    return pd.concat(frames, ignore_index=True)


def resolve_out_dir(out_dir: str | os.PathLike | None) -> Path:
    """A notebook's ``out_dir`` as an absolute path: ``None`` is ``INTERACTIVE_DIR`` and a
    relative path is taken from the repository root, so a notebook writes to the same place
    whatever its working directory."""
    path = Path(INTERACTIVE_DIR if out_dir is None else out_dir).expanduser()
    return path if path.is_absolute() else repo_root() / path


def git_state(root: Path | None = None) -> dict[str, Any]:
    """Commit hash and dirty flag of the checkout; ``None`` values outside a git checkout."""
    root = root or repo_root()
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                                text=True, check=True, timeout=10).stdout.strip()
        # the outputs a run writes (figures/, build/) do not make the code differ from the commit
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--",
                                 ".", ":(exclude)figures", ":(exclude)build"],
                                cwd=root, capture_output=True, text=True, check=True,
                                timeout=10).stdout
        return {"commit": commit, "dirty": bool(status.strip())}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


def package_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in _VERSIONED:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def cpu_model() -> str:
    """The CPU's model name and whether it has AVX-512 (float32 results on a CPU can differ in
    the last digits between the two), from /proc/cpuinfo where there is one."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or "unknown"
    name = next((line.split(":", 1)[1].strip() for line in text.splitlines()
                 if line.startswith("model name")), platform.processor() or "unknown")
    return f"{name} ({'AVX-512' if 'avx512f' in text else 'no AVX-512'})"


def device_info() -> dict[str, Any]:
    info: dict[str, Any] = {"platform": platform.platform(), "machine": platform.machine(),
                            "cpu": cpu_model(), "cpu_count": os.cpu_count()}
    try:
        import torch  # deferred: provenance of any run, also ones that never import torch

        from localsgd.numerics import numerics_state

        info["torch_threads"] = torch.get_num_threads()
        info["numerics"] = numerics_state()  # TF32 / deterministic flags of the runs in here
        info["cuda"] = torch.cuda.is_available()
        if info["cuda"]:
            info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except ImportError:
        info["cuda"] = None
    return info


def provenance(*, params: dict[str, Any], mode: str, scale: str, seed: int | None = None,
               wall_seconds: float | None = None, **extra: Any) -> dict[str, Any]:
    """The sidecar record: everything needed to say how a result was made. ``git`` is the checkout
    when the record is written, which may be later than the cached training runs it reads; each
    of those names its own code in its ``.json`` (`localsgd.paper.experiments.grid.run_provenance`)
    and is keyed by its meaning (`localsgd.training.results_key`)."""
    if scale not in SCALES:
        raise ValueError(f"scale={scale!r} is not one of {SCALES}")
    return {
        "git": git_state(),
        "library_hash": library_code_hash(),
        "versions": package_versions(),
        "device": device_info(),
        "params": params,
        "seed": seed,
        "mode": mode,
        "scale": scale,
        "utc_time": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "wall_seconds": wall_seconds,
        **({"dry_run_updates": dry_run.updates()} if dry_run.updates() else {}),
        **extra,
    }


# --------------------------------------------------------------------------- records
def write_records(df: pd.DataFrame, path: str | os.PathLike, **prov: Any) -> list[Path]:
    """Write tidy records as CSV plus a JSON provenance sidecar (``path`` with ``.json``)."""
    path = Path(path)
    return [write_csv(df, path, FIGURE_FLOAT_FORMAT),
            write_json(provenance(**prov), path.with_suffix(".json"))]


PRINT_WIDTH = 7.5  # inches: a journal page's text width, the widest a saved figure may be
SAVE_PAD = 0.05  # inches of margin a saved figure keeps around its drawing


def fit_print_width(fig: Any, width: float = PRINT_WIDTH) -> None:
    """Make ``fig`` at most ``width`` inches wide as saved (a tight bounding box): titles and
    figure texts wrap at the figure's edge, and a figure still wider (a legend beside its
    axes) is narrowed, its text sizes kept."""
    for text in [*fig.texts, *(ax.title for ax in fig.axes)]:
        text.set_wrap(True)
    if getattr(fig, "_suptitle", None) is not None:
        fig._suptitle.set_wrap(True)
    room = width - 2 * SAVE_PAD - 0.15  # the drawing inside the saved margins, and spare
    for _ in range(4):  # each pass re-lays the figure out; text does not shrink with it
        drawn = fig.get_tightbbox().width  # its own renderer: any backend (inline too)
        if drawn <= room:
            return
        w, h = fig.get_size_inches()
        fig.set_size_inches(max(1.0, w - (drawn - room) - 0.05), h)


def save_figure(fig_id: str, fig: Any, data: pd.DataFrame, *, out_dir: str | os.PathLike | None,
                params: dict[str, Any], mode: str, scale: str, seed: int | None = None,
                wall_seconds: float | None = None,
                compare: pd.DataFrame | None = None) -> list[Path]:
    """Save a notebook's figure with the data it plots, its provenance and its comparison rows.

    Writes ``<out_dir>/<fig_id>.{png,pdf,csv,json}`` and, when ``compare`` is given,
    ``<fig_id>.compare.csv`` with columns ``artifact, setting, metric, value`` (+ ``unit``,
    ``note``, and per row ``scale``/``rel_tol`` when they differ from the figure's) keyed exactly
    like ``papers/*/reported.csv``. A relative ``out_dir`` is taken from the repository root
    (``resolve_out_dir``).
    """
    out = resolve_out_dir(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    if fig is not None:
        fit_print_width(fig)
        for ext in ("png", "pdf"):
            target = out / f"{fig_id}.{ext}"
            with atomic_path(target) as tmp:
                # metadata without dates keeps committed PDFs/PNGs stable between identical runs
                meta = {"CreationDate": None} if ext == "pdf" else {"Software": None}
                fig.savefig(tmp, format=ext, dpi=150, bbox_inches="tight",
                            pad_inches=SAVE_PAD, metadata=meta)
            written.append(target)
    written += write_records(data, out / f"{fig_id}.csv", params=params, mode=mode, scale=scale,
                             seed=seed, wall_seconds=wall_seconds, figure=fig_id)
    if compare is not None:
        missing = [c for c in COMPARE_COLUMNS if c not in compare.columns]
        if missing:
            raise ValueError(f"compare rows for {fig_id} lack columns {missing}; "
                             f"need {list(COMPARE_COLUMNS)} (+ optional unit, note)")
        cmp = compare.copy()
        for col in ("unit", "note"):
            if col not in cmp.columns:
                cmp[col] = ""
        # a row may carry its own scale (an exact quantity inside a reduced-scale figure) and
        # rel_tol / abs_tol (how close to the source counts as reproduced; `report.agrees`)
        cmp["scale"] = cmp["scale"].fillna(scale) if "scale" in cmp.columns else scale
        bad = sorted(set(cmp["scale"]) - set(SCALES))
        if bad:
            raise ValueError(f"compare rows for {fig_id} have scale {bad}; use one of {SCALES}")
        cmp["mode"], cmp["figure"] = mode, fig_id
        written.append(write_csv(cmp, out / f"{fig_id}.compare.csv", FIGURE_FLOAT_FORMAT))
    return written


# --------------------------------------------------------------------------- cache
@functools.cache
def code_hash(package: Path | None = None, *, skip: tuple[str, ...] = ()) -> str:
    """Hash of every ``.py`` file (names and contents) of ``package``, by default the installed
    ``localsgd`` package (both wings: the library's loop and the reproduction's code), less the
    sub-packages named in ``skip``."""
    package = Path(__file__).resolve().parents[1] if package is None else Path(package)
    h = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package)
        if rel.parts[0] in skip:
            continue
        h.update(str(rel).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


@functools.cache
def library_code_hash(package: Path | None = None) -> str:
    """Hash of the library wing's definitions (the package less ``localsgd.paper``): what a
    `localsgd.training.loop.train` run's records depend on. Every figure and kept training run
    records it (provenance; training runs are keyed by `localsgd.training.results_key` instead,
    which a code edit leaves alone), and the convex grids' key starts from it
    (`experiment_code_hash`).

    It hashes the sorted set of top-level definitions and statements of every module as
    `ast.dump` gives them, without docstrings, imports and ``__all__``: a change to any
    definition's code changes it; moving definitions between modules, editing comments or
    docstrings, or re-exporting names does not (`_definitions`)."""
    package = Path(__file__).resolve().parents[1] if package is None else Path(package)
    dumps = sorted(d for path in package.rglob("*.py")
                   if path.relative_to(package).parts[0] != "paper"
                   for d in _definitions(path))
    h = hashlib.sha256()
    for d in dumps:
        h.update(d.encode() + b"\0")
    return h.hexdigest()[:16]


def experiment_code_hash(*modules: Any, package: Path | None = None) -> str:
    """The key of a result that a reproduction module computes on top of the library (the convex
    grids of `localsgd.paper.experiments.convex`): `library_code_hash` plus the definitions of
    ``modules`` (module objects or paths), as `_definitions` reads them. A change to a plot, a
    notebook, the harness or another module's claim keeps the cached grid; a change to the
    library or to the modules' own code recomputes it."""
    h = hashlib.sha256(library_code_hash(package).encode())
    for module in modules:
        path = Path(getattr(module, "__file__", module))
        for d in sorted(_definitions(path)):
            h.update(d.encode() + b"\0")
    return h.hexdigest()[:16]


def _definitions(path: Path) -> list[str]:
    """`ast.dump` of each top-level statement of the module at ``path`` that is not an import,
    the module docstring or ``__all__``, with every docstring inside removed."""
    import ast

    out = []
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.Import, ast.ImportFrom)) or _is_docstring(node):
            continue
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and any(
                isinstance(t, ast.Name) and t.id == "__all__"
                for t in (node.targets if isinstance(node, ast.Assign) else [node.target])):
            continue
        for inner in ast.walk(node):
            if isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                body = [n for n in inner.body[:1] if not _is_docstring(n)] + inner.body[1:]
                inner.body = body or [ast.Pass()]
        out.append(ast.dump(node))
    return out


def _is_docstring(node: object) -> bool:
    import ast

    return (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str))


def params_hash(params: dict[str, Any]) -> str:
    """A stable short hash of an experiment's parameters (key order does not matter)."""
    blob = json.dumps(params, sort_keys=True, default=_jsonable).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def keyed_entry(name: str, key: dict[str, Any],
                cache_dir: str | os.PathLike | None = None) -> Path:
    """``<cache_dir>/<name>-<hash of key>.csv`` (default folder: the results cache)."""
    folder = Path(cache_dir) if cache_dir is not None else paths.cache_dir() / "results"
    return folder / f"{name}-{params_hash(key)}.csv"


def cache_entry(name: str, params: dict[str, Any], *, code: str | None = None,
                cache_dir: str | os.PathLike | None = None) -> Path:
    """The cache file `cached` reads and writes for ``name`` and ``params`` under the code
    hash ``code`` (default: the whole package's, `code_hash`)."""
    code = code_hash() if code is None else code
    return keyed_entry(name, {**params, "__code__": code}, cache_dir)


def cached(name: str, params: dict[str, Any], compute: Callable[[], pd.DataFrame], *,
           refresh: bool = False, code: str | None = None,
           cache_dir: str | os.PathLike | None = None, entry: Path | None = None,
           meta: dict[str, Any] | None = None) -> pd.DataFrame:
    """Return ``compute()``'s DataFrame, reusing a stored copy for identical ``params``.

    The entry is ``entry`` or else `cache_entry`: ``<cache_dir>/<name>-<hash of params and of
    the code>.csv`` with a ``.json`` of the parameters (and ``meta``) beside it. The code hash
    ``code`` defaults to the whole package's (any change to it may change results; training runs
    pass their own ``entry``, keyed by meaning: `localsgd.training.results_key`). Both files are
    written atomically, so an interrupted run never leaves a corrupt entry. A corrupt entry found
    anyway (e.g. edited by hand) is recomputed, not trusted.
    """
    if dry_run.updates() is not None:  # a dry run's numbers are not results: never cached
        return compute()
    entry = cache_entry(name, params, code=code, cache_dir=cache_dir) if entry is None else entry
    if entry.exists() and not refresh:
        try:
            return pd.read_csv(entry)
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError):
            pass  # fall through and recompute
    df = compute()
    if not isinstance(df, pd.DataFrame):
        raise TypeError(f"cached({name!r}): compute() returned {type(df).__name__}, "
                        "expected a pandas DataFrame")
    write_json({"name": name, "params": params, **(meta or {})}, entry.with_suffix(".json"))
    write_csv(df, entry)
    return df
