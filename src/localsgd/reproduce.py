"""The reproduction harness: run the parameterized notebooks with papermill.

Each notebook ``notebooks/<id>.ipynb`` has exactly one code cell tagged ``parameters``; its mode
files ``notebooks/params/<id>/<mode>.yaml`` may only set names that cell defines. Everything is
checked before the first notebook starts, because papermill itself only warns about unknown
parameters and a typo would silently run the default configuration.
"""

from __future__ import annotations

import ast
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nbformat
import pandas as pd
import yaml
from tqdm.auto import tqdm

from localsgd import profile as profile_mod
from localsgd.notebook import HEADLESS_ENV

MODES = ("smoke", "quick", "paper")
# Notebooks whose results are measured times (time axes from measured compute, timed launches,
# step-time benchmarks): under ``--jobs`` they still run one at a time with every core, since
# a notebook running beside them would slow them unevenly (two vCPUs are often one core's
# hyper-threads). The others report accuracies, step counts or modelled times.
TIMED = frozenset({"dynamo_ddp", "timing_validation", "slowmo", "fig06_cifar10_local_sgd",
                   "fig07_scaling", "fig08_imagenet", "fig09_hierarchical"})
# Injected by the harness into every notebook; YAML files must not set them.
RESERVED = ("mode", "out_dir")


class HarnessError(ValueError):
    """A problem with the notebooks, their parameter files or the command line."""


@dataclass
class NotebookSpec:
    """A notebook with the names its parameters cell defines."""

    id: str
    path: Path
    defined: dict[str, Any]

    def params_file(self, mode: str) -> Path:
        return self.path.parent / "params" / self.id / f"{mode}.yaml"


@dataclass
class RunResult:
    id: str
    mode: str
    status: str  # "ok" or "failed"
    seconds: float
    files: list[str] = field(default_factory=list)
    error: str = ""
    phases: dict[str, Any] | None = None  # `localsgd.profile.notebook_row` when profiled


def parameters_cell_names(nb_path: Path) -> dict[str, Any]:
    """Names assigned in the notebook's single ``parameters`` cell, with their literal values.

    Raises HarnessError when there is no such cell, more than one, or it is not plain Python.
    """
    nb = nbformat.read(nb_path, as_version=4)
    cells = [c for c in nb.cells
             if c.cell_type == "code" and "parameters" in c.get("metadata", {}).get("tags", [])]
    if not cells:
        raise HarnessError(f"{nb_path}: no code cell tagged 'parameters'; tag the cell that "
                           "defines the notebook's parameters (papermill needs it)")
    if len(cells) > 1:
        raise HarnessError(f"{nb_path}: {len(cells)} cells tagged 'parameters'; keep exactly one")
    try:
        tree = ast.parse(cells[0].source)
    except SyntaxError as exc:
        raise HarnessError(f"{nb_path}: the parameters cell is not valid Python: {exc}") from exc
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


def discover(notebooks_dir: Path) -> dict[str, Path]:
    """All notebook ids in ``notebooks_dir`` (sorted), mapped to their paths."""
    if not notebooks_dir.is_dir():
        raise HarnessError(f"notebook folder {notebooks_dir} does not exist; run from a source "
                           "checkout (pip install -e .) or pass --notebooks/--out-dir")
    return {p.stem: p for p in sorted(notebooks_dir.glob("*.ipynb"))}


def plan(notebooks_dir: Path, mode: str, only: list[str] | None = None) -> list[NotebookSpec]:
    """Validate the selection and every parameter file it uses; return what would run."""
    if mode not in MODES:
        raise HarnessError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
    available = discover(notebooks_dir)
    ids = list(only) if only else list(available)
    unknown = [i for i in ids if i not in available]
    if unknown:
        raise HarnessError(f"unknown notebook id(s) {', '.join(map(repr, unknown))}; "
                           f"known: {', '.join(available) or '(none)'}")
    specs, problems = [], []
    for nb_id in ids:
        try:
            spec = NotebookSpec(nb_id, available[nb_id], parameters_cell_names(available[nb_id]))
            for name in RESERVED:
                if name not in spec.defined:
                    problems.append(f"{spec.path}: the parameters cell must define {name!r}")
            load_params(spec, mode)
            specs.append(spec)
        except HarnessError as exc:
            problems.append(str(exc))
    if problems:
        raise HarnessError("\n".join(problems))
    return specs


def load_params(spec: NotebookSpec, mode: str) -> dict[str, Any]:
    """The mode's YAML parameters, checked against the notebook's parameters cell."""
    path = spec.params_file(mode)
    if not path.exists():
        raise HarnessError(f"{spec.id}: missing parameter file {path} for mode {mode!r}")
    try:
        params = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise HarnessError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(params, dict):
        raise HarnessError(f"{path}: expected a mapping of parameter names to values")
    reserved = [k for k in params if k in RESERVED]
    if reserved:
        raise HarnessError(f"{path}: sets {reserved}, which the harness injects itself; remove")
    unknown = sorted(k for k in params if k not in spec.defined)
    if unknown:
        raise HarnessError(f"{path}: unknown parameter(s) {', '.join(unknown)} — the parameters "
                           f"cell of {spec.path.name} defines only: {', '.join(spec.defined)}")
    return params


def _snapshot(folder: Path) -> dict[Path, float]:
    return {p: p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()} \
        if folder.exists() else {}


def cell_timeout() -> float | None:
    """Seconds one notebook cell may run (``LOCALSGD_CELL_TIMEOUT``; unset: no limit). The tests
    set it so that a kernel that stops answering fails a test instead of hanging the suite."""
    value = os.environ.get("LOCALSGD_CELL_TIMEOUT", "")
    try:
        return float(value) if value else None
    except ValueError:
        raise HarnessError(f"LOCALSGD_CELL_TIMEOUT={value!r} is not a number of seconds") from None


def run_notebook(spec: NotebookSpec, mode: str, *, out_dir: Path, build_dir: Path,
                 cwd: Path, kernel: str = "python3",
                 overrides: dict[str, Any] | None = None, profiled: bool = False) -> RunResult:
    """Execute one notebook with papermill; a failure is recorded, never raised. ``overrides``
    set parameters the notebook defines (others are ignored), e.g. a dry run's device;
    ``profiled`` collects where its time went (`localsgd.profile`) into ``RunResult.phases``."""
    import papermill as pm  # deferred: a slow import, needed only to execute a notebook

    extra = {k: v for k, v in (overrides or {}).items() if k in spec.defined}
    params = {**load_params(spec, mode), **extra, "mode": mode, "out_dir": str(out_dir)}
    executed = build_dir / f"{spec.id}.{mode}.ipynb"
    build_dir.mkdir(parents=True, exist_ok=True)
    before = _snapshot(out_dir)
    events = build_dir / f"{spec.id}.{mode}.profile.jsonl"
    if profiled:  # the kernel and its torchrun workers inherit the variable
        events.unlink(missing_ok=True)
        os.environ[profile_mod.ENV] = str(events)
    headless = os.environ.get(HEADLESS_ENV)
    os.environ[HEADLESS_ENV] = "1"  # the kernel inherits it: `notebook.headless()`
    t0 = time.perf_counter()
    status, error = "ok", ""
    try:
        pm.execute_notebook(str(spec.path), str(executed), parameters=params, kernel_name=kernel,
                            cwd=str(cwd), progress_bar=False, log_output=False,
                            execution_timeout=cell_timeout())
    except pm.PapermillExecutionError as exc:
        status = "failed"
        # papermill's cell_index counts the injected-parameters cell; report the executed copy's
        first = (exc.source or "").strip().splitlines()[:1]
        error = (f"cell In [{exc.exec_count}] (index {exc.cell_index} of {executed}, "
                 f"starting {first[0][:60]!r}) raised {exc.ename}: {exc.evalue}" if first else
                 f"cell index {exc.cell_index} of {executed} raised {exc.ename}: {exc.evalue}")
    except Exception as exc:  # noqa: BLE001 - a dead kernel or bad JSON must not stop the rest
        status, error = "failed", f"{type(exc).__name__}: {exc}"
    finally:
        if profiled:
            os.environ.pop(profile_mod.ENV, None)
        if headless is None:
            os.environ.pop(HEADLESS_ENV, None)
        else:
            os.environ[HEADLESS_ENV] = headless
    seconds = time.perf_counter() - t0
    after = _snapshot(out_dir)
    # a notebook writes <id>.<ext> files; the name check keeps out a concurrent notebook's
    files = sorted(str(p.relative_to(out_dir)) for p, m in after.items()
                   if before.get(p) != m and p.name.startswith(f"{spec.id}."))
    phases = (profile_mod.notebook_row(spec.id, seconds, executed,
                                       profile_mod.read_events(events)) if profiled else None)
    return RunResult(spec.id, mode, status, seconds, files, error, phases)


def run(specs: list[NotebookSpec], mode: str, *, out_dir: Path, build_dir: Path, cwd: Path,
        kernel: str = "python3", progress: bool = True,
        overrides: dict[str, Any] | None = None, profiled: bool = False, jobs: int = 1,
        expected: dict[str, float] | None = None) -> list[RunResult]:
    """Run every planned notebook, with a progress bar; failures do not stop the rest.

    ``jobs`` = 1 runs them in order. ``jobs`` > 1 runs the `TIMED` ones first, one at a time
    with every core, then the others ``jobs`` at a time, longest first by ``expected`` seconds
    (the committed ones), each kernel with ``cpu_count // jobs`` threads (`job_threads`). The
    thread count does not change a CPU training run of K >= 2 replicas (`localsgd.train` runs
    every op single-threaded and spreads the replicas over host threads); other float32 work may
    differ at round-off level between thread counts, and the same command always gives a
    notebook the same count. Results come back in ``specs`` order.
    """
    kwargs = {"mode": mode, "out_dir": out_dir, "build_dir": build_dir, "cwd": cwd,
              "kernel": kernel, "overrides": overrides, "profiled": profiled}
    bar = tqdm(total=len(specs), desc=f"notebooks ({mode})", unit="nb", disable=not progress)
    done: dict[str, RunResult] = {}
    serial = specs if jobs <= 1 else [s for s in specs if s.id in TIMED]
    for spec in serial:
        bar.set_postfix_str(spec.id)
        done[spec.id] = run_notebook(spec, **kwargs)
        bar.update()
    pooled = sorted((s for s in specs if s.id not in done),
                    key=lambda s: -(expected or {}).get(s.id, 0.0))
    if pooled:
        import concurrent.futures as cf
        import multiprocessing

        threads = job_threads(jobs)
        with cf.ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as ex:
            futures = {ex.submit(_run_with_threads, threads, spec, kwargs): spec
                       for spec in pooled}
            for future in cf.as_completed(futures):
                spec = futures[future]
                try:
                    done[spec.id] = future.result()
                except Exception as exc:  # noqa: BLE001 - a dead worker must not stop the rest
                    done[spec.id] = RunResult(spec.id, mode, "failed", 0.0,
                                              error=f"{type(exc).__name__}: {exc}")
                bar.set_postfix_str(spec.id)
                bar.update()
    bar.close()
    return [done[s.id] for s in specs]


def job_threads(jobs: int) -> int:
    """Torch threads per notebook kernel when ``jobs`` notebooks share this machine's CPUs."""
    return max(1, (os.cpu_count() or 1) // max(1, jobs))


def _run_with_threads(threads: int, spec: NotebookSpec, kwargs: dict[str, Any]) -> RunResult:
    """`run_notebook` in a pool worker whose kernels (and their children) use ``threads``."""
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(threads)
    return run_notebook(spec, **kwargs)


def summary_table(results: list[RunResult]) -> str:
    """The final table: id, mode, status, seconds, files written."""
    rows = [{"id": r.id, "mode": r.mode, "status": r.status, "seconds": round(r.seconds, 1),
             "files written": len(r.files)} for r in results]
    table = pd.DataFrame(rows, columns=["id", "mode", "status", "seconds", "files written"])
    text = table.to_string(index=False)
    for r in results:
        if r.status != "ok":
            text += f"\nFAILED {r.id}: {r.error}"
    return text
