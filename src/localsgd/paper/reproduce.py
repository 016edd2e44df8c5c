"""The reproduction harness: run the parameterized notebooks with papermill.

Each notebook ``notebooks/<id>.ipynb`` has exactly one code cell tagged ``parameters``; its mode
files ``notebooks/params/<id>/<mode>.yaml`` may only set names that cell defines. Everything is
checked before the first notebook starts, because papermill itself only warns about unknown
parameters and a typo would silently run the default configuration.
"""

from __future__ import annotations

import difflib
import functools
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import yaml
from tqdm.auto import tqdm

from localsgd.paper import profile as profile_mod
from localsgd.paper import run_progress
from localsgd.paper.bench.allocator import allocator_env
from localsgd.paper.notebook import HEADLESS_ENV, ParameterError, cell_defaults

MODES = ("smoke", "quick", "paper", "converged", "long")
# modes only some notebooks have (a params file): run without --only, they select those
PARTIAL_MODES = ("converged", "long")
# Notebooks whose results are measured times (time axes from measured compute, timed launches,
# step-time benchmarks): under ``--jobs`` they still run one at a time with every core, since
# a notebook running beside them would slow them unevenly (two vCPUs are often one core's
# hyper-threads). The others report accuracies, step counts or modelled times.
TIMED = frozenset({"dynamo_ddp", "timing_validation", "slowmo", "comm_quality",
                   "fig06_cifar10_local_sgd",
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
    status: str  # "ok", "failed" or "skipped"
    seconds: float
    files: list[str] = field(default_factory=list)
    error: str = ""  # a failure: what raised; a skip: why, and what to run instead
    phases: dict[str, Any] | None = None  # `localsgd.paper.profile.notebook_row` when profiled


@dataclass(frozen=True)
class ClusterOnly:
    """A notebook whose paper mode needs several nodes or a torchrun launch: ``reproduce --mode
    paper`` (dry runs included) does not execute it but reports it as skipped with the commands
    to run instead. ``commands`` and ``applies`` take the notebook's parameters (parameters cell,
    mode YAML, ``--set``) and call the code the notebook itself calls, so they cannot drift from
    it; ``commands`` writes any file they need (e.g. configs) into the folder it is given (the
    harness's build folder). ``applies`` False (e.g. Figure 8 with ``runs_dir`` set: it plots
    the torchrun outputs) runs the notebook after all."""

    reason: str
    commands: Callable[[dict[str, Any], Path], list[str]]
    applies: Callable[[dict[str, Any]], bool] = lambda params: True

    def note(self, params: dict[str, Any], folder: Path) -> str:
        """What the summary says: the reason, then the commands, one per line."""
        cmds = self.commands(params, folder)
        these = "this command" if len(cmds) == 1 else "these commands"
        return f"{self.reason} — run {these} instead:" + "".join(f"\n  {c}" for c in cmds)


def _fig08_torchrun(params: dict[str, Any], folder: Path) -> list[str]:
    """Figure 8's torchrun commands, from the notebook's own `lin2020.fig08_runs` (which also
    writes the configs they name, into ``folder``), then the command that plots their outputs."""
    from localsgd.paper import notebook
    from localsgd.paper.experiments import lin2020

    P = notebook.params(dict(params))
    *_, commands = lin2020.fig08_runs(P, seeds=notebook.Session(P).seeds,
                                      cfg_dir=folder / "fig08_imagenet_configs")
    plot = (f"localsgd reproduce --mode {P.mode} --only fig08_imagenet --set runs_dir=RUNS"
            "   # then plot them (RUNS: the folder holding their --out folders)")
    return [*commands, plot]


def _fig08_needs_torchrun(params: dict[str, Any]) -> bool:
    from localsgd.paper import notebook
    from localsgd.paper.experiments import lin2020

    return lin2020.fig08_torchrun_only(notebook.params(dict(params)))


# Notebooks that paper mode reports as skipped, with what to run instead (`ClusterOnly`).
# `localsgd.paper.dry_run.SKIP` adds the notebooks that only a dry run skips.
CLUSTER_ONLY = {
    "fig08_imagenet": ClusterOnly(
        "paper mode trains ResNet-50 on ImageNet through torchrun, one process per GPU on "
        "15 nodes x 2 GPUs (start each torchrun command on every node, with MASTER set to the "
        "first node's address; the configs they name are written to the build folder)",
        _fig08_torchrun, _fig08_needs_torchrun),
    "dynamo_ddp": ClusterOnly(
        "paper mode is six torchbench models on 8 and 64 A100s (8 per node, NCCL over EFA), "
        "which this package does not launch (localsgd.paper.bench.ddp runs gloo CPU processes); the "
        "same benchmark at reduced scale",
        lambda params, folder: ["localsgd reproduce --mode quick --only dynamo_ddp"]),
}


def parameters_cell_names(nb_path: Path) -> dict[str, Any]:
    """Names assigned in the notebook's single ``parameters`` cell, with their literal values
    (`localsgd.paper.notebook.cell_defaults`); a bad cell is a HarnessError."""
    try:
        return cell_defaults(nb_path)
    except ParameterError as exc:
        raise HarnessError(str(exc)) from exc


def discover(notebooks_dir: Path) -> dict[str, Path]:
    """All notebook ids in ``notebooks_dir`` (sorted), mapped to their paths."""
    if not notebooks_dir.is_dir():
        raise HarnessError(f"notebook folder {notebooks_dir} does not exist; run from a source "
                           "checkout (pip install -e .) or pass --notebooks/--out-dir")
    return {p.stem: p for p in sorted(notebooks_dir.glob("*.ipynb"))}


def plan(notebooks_dir: Path, mode: str, only: list[str] | None = None,
         sets: dict[str, Any] | None = None) -> list[NotebookSpec]:
    """Validate the selection, every parameter file it uses and ``sets`` (`parse_sets`); return
    what would run."""
    if mode not in MODES:
        raise HarnessError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
    available = discover(notebooks_dir)
    ids = list(only) if only else [
        i for i, path in available.items() if mode not in PARTIAL_MODES
        or (path.parent / "params" / i / f"{mode}.yaml").exists()]
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
    check_sets(specs, sets)
    return specs


def parse_sets(items: list[str] | None) -> dict[str, Any]:
    """``--set NAME=VALUE`` items as {NAME: VALUE parsed as YAML, like a parameter file's}; a
    later item wins."""
    sets: dict[str, Any] = {}
    for item in items or []:
        key, eq, text = item.partition("=")
        key = key.strip()
        if not eq or not key.isidentifier():
            raise HarnessError(f"--set {item!r}: expected NAME=VALUE with a YAML value, e.g. "
                               "--set n_seeds=1 or --set 'Hs=[1, 2]'")
        try:
            sets[key] = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            problem = " ".join(str(exc).split())
            raise HarnessError(f"--set {item!r}: the value is not valid YAML ({problem})") from None
    return sets


def check_sets(specs: list[NotebookSpec], sets: dict[str, Any] | None) -> None:
    """Raise a one-line HarnessError unless every ``--set`` name is a parameter that every
    notebook of ``specs`` defines in its parameters cell (like `load_params`'s check of the
    YAML files), and none is reserved (`RESERVED`: ``--mode``, ``--out-dir`` set those)."""
    if not sets or not specs:
        return
    reserved = [k for k in sets if k in RESERVED]
    if reserved:
        raise HarnessError(f"--set {', '.join(reserved)}: set by the harness itself (use --mode "
                           "and --out-dir), not by --set")
    common = [k for k in specs[0].defined
              if k not in RESERVED and all(k in s.defined for s in specs)]
    bad = [k for k in sets if k not in common]
    if not bad:
        return
    hints = "".join(f" (did you mean {', '.join(close)}?)" for k in bad
                    if (close := difflib.get_close_matches(k, common, n=2)))
    if len(specs) == 1:
        raise HarnessError(f"--set {', '.join(bad)}: not a parameter of {specs[0].id}{hints}; its "
                           f"parameters cell defines: {', '.join(common)}")
    lacking = "; ".join(f"{k} is not defined by {', '.join(s.id for s in specs if k not in s.defined)}"
                        for k in bad)
    raise HarnessError(f"--set {', '.join(bad)}: --set applies to every selected notebook and "
                       f"each must define the name: {lacking}{hints}; the names all "
                       f"{len(specs)} define: {', '.join(common) or '(none)'}")


def format_sets(sets: dict[str, Any] | None) -> str:
    """``--set`` values as ``NAME=VALUE, ...`` for what is printed."""
    return ", ".join(f"{k}={v!r}" for k, v in (sets or {}).items())


def load_params(spec: NotebookSpec, mode: str,
                sets: dict[str, Any] | None = None) -> dict[str, Any]:
    """The mode's YAML parameters, checked against the notebook's parameters cell, updated with
    ``sets`` (``--set``, checked the same way by `check_sets`)."""
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
    check_sets([spec], sets)
    return {**params, **(sets or {})}


def skipped(spec: NotebookSpec, mode: str, sets: dict[str, Any] | None = None, *,
            build_dir: Path) -> str | None:
    """Why ``spec`` is not executed in ``mode`` and what to run instead (`CLUSTER_ONLY`, paper
    mode only; files the commands need go to ``build_dir``), or None when it runs. Parameters
    that the notebook's own check rejects (`localsgd.paper.notebook.params`) run it, so that it
    reports them as any notebook does."""
    entry = CLUSTER_ONLY.get(spec.id)
    if mode != "paper" or entry is None:
        return None
    params = {**spec.defined, **load_params(spec, mode, sets), "mode": mode}
    try:
        return entry.note(params, build_dir) if entry.applies(params) else None
    except ParameterError:
        return None


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
                 cwd: Path, kernel: str = "python3", sets: dict[str, Any] | None = None,
                 overrides: dict[str, Any] | None = None, profiled: bool = False,
                 progress: bool = True) -> RunResult:
    """Execute one notebook with papermill; a failure is recorded, never raised. ``sets`` are
    the command line's parameters (``--set``; every name must be defined, `check_sets`);
    ``overrides`` set parameters the notebook defines (others are ignored), e.g. a dry run's
    device, after ``sets``; ``profiled`` collects where its time went (`localsgd.paper.profile`)
    into ``RunResult.phases``; ``progress`` prints a line per training run as it starts and ends
    (`localsgd.paper.run_progress`)."""
    import papermill as pm  # deferred: a slow import, needed only to execute a notebook

    extra = {k: v for k, v in (overrides or {}).items() if k in spec.defined}
    params = {**load_params(spec, mode, sets), **extra, "mode": mode, "out_dir": str(out_dir)}
    executed = build_dir / f"{spec.id}.{mode}.ipynb"
    build_dir.mkdir(parents=True, exist_ok=True)
    before = _snapshot(out_dir)
    events = build_dir / f"{spec.id}.{mode}.profile.jsonl"
    if profiled:  # the kernel inherits it (torchrun launches pass it on: runner --phases)
        events.unlink(missing_ok=True)
        os.environ[profile_mod.ENV] = str(events)
    headless = os.environ.get(HEADLESS_ENV)
    os.environ[HEADLESS_ENV] = "1"  # the kernel inherits it: `notebook.headless()`
    runs_file = build_dir / f"{spec.id}.{mode}.runs.jsonl"
    runs_file.unlink(missing_ok=True)
    os.environ[run_progress.ENV] = str(runs_file)
    follower = run_progress.Follower(runs_file, spec.id, tqdm.write if progress else _quiet)
    t0 = time.perf_counter()
    status, error = "ok", ""
    try:
        with follower:
            pm.execute_notebook(str(spec.path), str(executed), parameters=params, kernel_name=kernel,
                                cwd=str(cwd), progress_bar=False, log_output=False,
                                execution_timeout=cell_timeout(),
                                kernel_manager_class=_kernel_manager_class())
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
        os.environ.pop(run_progress.ENV, None)
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


def _quiet(line: str) -> None:
    """`run_progress.Follower`'s sink when progress is off."""


@functools.cache
def _kernel_manager_class() -> type:
    """The kernel manager papermill starts each notebook's kernel with: jupyter_client's own,
    with two changes so that a run prints only the harness's lines.

    * CurveZMQ transport encryption when pyzmq has it and the kernelspec declares support
      (ipykernel's does): a kernel on plain TCP logs "Kernel is running over TCP without
      encryption ..." to the terminal at every start (ipykernel's kernelapp).
    * No SIGINT before the shutdown request: jupyter_client interrupts the kernel first (for a
      busy one), and an idle kernel hit by it mid-message logs "KeyboardInterrupt caught in
      kernel". The notebook has finished when the harness shuts its kernel down; one that
      does not answer the shutdown request is still killed after jupyter_client's wait.
    """
    import zmq
    from jupyter_client.manager import AsyncKernelManager
    from traitlets import default

    class HarnessKernelManager(AsyncKernelManager):
        @default("transport_encryption")
        def _transport_encryption_default(self) -> str:
            return "auto" if zmq.has("curve") else "disabled"

        async def _async_interrupt_kernel(self) -> None:
            if not self.shutting_down:
                await super()._async_interrupt_kernel()

    return HarnessKernelManager


def run(specs: list[NotebookSpec], mode: str, *, out_dir: Path, build_dir: Path, cwd: Path,
        kernel: str = "python3", progress: bool = True, sets: dict[str, Any] | None = None,
        overrides: dict[str, Any] | None = None, profiled: bool = False, jobs: int = 1,
        expected: dict[str, float] | None = None,
        skip: dict[str, str] | None = None) -> list[RunResult]:
    """Run every planned notebook, with a progress bar; failures do not stop the rest.

    A notebook that `skipped` names (paper mode's `CLUSTER_ONLY`) or ``skip`` maps to a reason
    is not executed: its result has status "skipped" and the reason (with the commands to run
    instead) as ``error``.

    ``jobs`` = 1 runs them in order. ``jobs`` > 1 runs the `TIMED` ones first, one at a time
    with every core, then the others ``jobs`` at a time, longest first by ``expected`` seconds
    (the committed ones), each kernel with ``cpu_count // jobs`` threads (`job_threads`). The
    thread count does not change a CPU training run of K >= 2 replicas (`localsgd.training.loop`
    runs every op single-threaded and spreads the replicas over host threads); other float32 work
    may differ at round-off level between thread counts, and the same command always gives a
    notebook the same count. Results come back in ``specs`` order.
    """
    allocator_env()  # kept freed memory, for the kernels this starts
    kwargs = {"mode": mode, "out_dir": out_dir, "build_dir": build_dir, "cwd": cwd,
              "kernel": kernel, "sets": sets, "overrides": overrides, "profiled": profiled,
              "progress": progress}
    done: dict[str, RunResult] = {}
    for spec in specs:
        why = (skip or {}).get(spec.id) or skipped(spec, mode, sets, build_dir=build_dir)
        if why:
            done[spec.id] = RunResult(spec.id, mode, "skipped", 0.0, error=why)
    bar = tqdm(total=len(specs) - len(done), desc=f"notebooks ({mode})", unit="nb",
               disable=not progress)
    serial = [s for s in specs if s.id not in done and (jobs <= 1 or s.id in TIMED)]
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
    """The final table: id, mode, status, seconds, files written; then why each skipped
    notebook was skipped (and what to run instead) and what each failed one raised."""
    rows = [{"id": r.id, "mode": r.mode, "status": r.status, "seconds": round(r.seconds, 1),
             "files written": len(r.files)} for r in results]
    table = pd.DataFrame(rows, columns=["id", "mode", "status", "seconds", "files written"])
    text = table.to_string(index=False)
    for r in results:
        if r.status == "skipped":
            text += f"\nskipped {r.id}: {r.error}"
    for r in results:
        if r.status == "failed":
            text += f"\nFAILED {r.id}: {r.error}"
    return text
