"""GPU-hours plan for the notebooks' paper mode: how many runs, updates and images each
notebook trains, what that costs on a named GPU, and in which order to spend it.

THE THROUGHPUTS BELOW ARE ESTIMATES, NOT MEASUREMENTS: each entry says where its number comes
from. ``localsgd gpu-check`` measures the training loop on the GPU at hand and writes
``figures/gpu/loop.csv``; `measured_throughputs` turns its rows into entries with ``status
"measured"``, which ``localsgd reproduce --plan --gpu NAME`` uses instead of any estimate.
(figures/gpu/loop.csv holds an H200's ResNet-20 rows, figures/gpu/h100/loop.csv an H100's:
``--gpu "NVIDIA H200"`` and ``--gpu "NVIDIA H100 80GB HBM3"`` use them.)

Cost model: one training image costs 1 / throughput seconds of one GPU, whichever engine runs it
(K GPUs under torchrun each doing B_loc per update, or one GPU simulating the K workers with
the replica engine at batch K * B_loc), so a run's GPU-seconds are
``(updates * images_per_update + eval_images / 3) / images_per_s`` (evaluation: a forward pass,
~1/3 of a training step). Communication, data loading beyond what the source's number includes,
start-up and idle GPUs are not counted: a lower bound on a real cluster's bill.

`plan` is the pure computation over `PlanItem`s; `notebook_items` / `paper_items` derive the
items of each notebook from its ``notebooks/params/<nb>/paper.yaml`` merged over the
notebook's parameters cell, building the `TrainConfig` grid through the function the notebook
itself calls (``configs(P, seeds)`` of its module in `localsgd.paper.experiments`, see `_GRIDS`),
so no grid is written twice. Identical configurations inside a notebook are counted once (the
notebooks' run cache trains them once); across notebooks they are counted in every notebook
(``shared_across_notebooks`` in `plan`'s total gives the de-duplicated figure).
"""

from __future__ import annotations

import math
import types
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["DEFAULT_GPU", "THROUGHPUT", "Plan", "PlanItem", "Throughput", "items_from_configs",
           "notebook_items", "notebook_params", "paper_configs", "paper_items", "plan",
           "readme_block", "throughput"]

TRAIN_IMAGES = {"cifar10": 50_000, "cifar100": 50_000, "imagenet": 1_281_167}
TEST_IMAGES = {"cifar10": 10_000, "cifar100": 10_000, "imagenet": 50_000}
EVAL_COST = 1 / 3  # one evaluated image relative to one trained image (forward only)


@dataclass(frozen=True)
class Throughput:
    """Training images per second per GPU for one model, with its provenance (the estimates:
    float32 with TF32 off; measured rows: what paper mode ran there, named in ``source``)."""

    gpu: str
    model: str
    images_per_s: float
    status: str  # "ESTIMATE" until measured, then "measured"
    source: str
    world_size: int | None = None  # measured at this K (replicas on one GPU); None: any K


def _paper_table5(model: str, hours_h8: float) -> float:
    """Images/s per GPU from Lin et al.'s Table 5 running time at H = 8 (2 GPUs, 300 epochs of
    the 50,000 CIFAR images): 300 * 50,000 / 2 images per GPU in ``hours_h8``."""
    return 300 * 50_000 / 2 / (hours_h8 * 3600)


_TITAN_XP, _V100, _A100 = "TITAN Xp", "V100-SXM2-16GB", "A100-SXM4-40GB"
# names as torch.cuda.get_device_name gives them (gpu-check's loop.csv rows carry that name)
_H100, _H200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"
# FP32 (non-tensor-core) peak TFLOPS from the vendors' spec sheets: TITAN Xp 12.1, V100-SXM2
# 15.7, A100 19.5, H100 SXM and H200 67 (TF32 off, as the fp32 policy sets); the other GPUs'
# rows scale by these ratios: a rough guess for the small CIFAR models, launch- and
# memory-bound at B_loc = 128 (the H200's scaled ResNet-20 estimate, 7.4 k images/s, is about
# half what gpu-check measured there in TF32 with the batched engine: figures/gpu/loop.csv).
_FP32_TFLOPS = {_TITAN_XP: 12.1, _V100: 15.7, _A100: 19.5, _H100: 67.0, _H200: 67.0}

_BASE = [
    Throughput(_TITAN_XP, "resnet20", _paper_table5("resnet20", 1.55), "ESTIMATE",
               "Lin et al. 2020 Table 5: ResNet-20 CIFAR-10, 2x1 TITAN Xp, H=8, 1.55 h for 300 "
               "epochs (includes their data pipeline, evaluation and syncs)"),
    Throughput(_TITAN_XP, "densenet40_12", _paper_table5("densenet40_12", 3.77), "ESTIMATE",
               "Lin et al. 2020 Table 5: DenseNet-40-12 CIFAR-10, H=8, 3.77 h"),
    Throughput(_TITAN_XP, "wrn28_10", _paper_table5("wrn28_10", 12.30), "ESTIMATE",
               "Lin et al. 2020 Table 5: WideResNet-28-10 CIFAR-10, H=8, 12.30 h"),
    Throughput(_V100, "resnet50", 128 / 0.34237, "ESTIMATE",
               "torchvision ResNet-50, FP32 NCHW, batch 128, 342.37 ms per iteration on a "
               "V100-SXM2 (github.com/sandeepkumar-skb/pytorch_experiments, "
               "torchvision_exp/README.md); 224 px ImageNet crops"),
]


def _scaled(t: Throughput, gpu: str) -> Throughput:
    ratio = _FP32_TFLOPS[gpu] / _FP32_TFLOPS[t.gpu]
    return Throughput(gpu, t.model, t.images_per_s * ratio, "ESTIMATE",
                      f"{t.gpu} estimate x {ratio:.2f} (FP32 peak {_FP32_TFLOPS[gpu]:g} / "
                      f"{_FP32_TFLOPS[t.gpu]:g} TFLOPS); base: {t.source}")


THROUGHPUT: dict[tuple[str, str], Throughput] = {(t.gpu, t.model): t for t in _BASE}
for _t in _BASE:
    for _gpu in _FP32_TFLOPS:
        THROUGHPUT.setdefault((_gpu, _t.model), _scaled(_t, _gpu))
DEFAULT_GPU = _A100


def measured_throughputs(loop_csv: str | Path) -> dict[tuple[str, str], Throughput]:
    """Measured entries from ``localsgd gpu-check``'s ``loop.csv`` (`localsgd.paper.gpu_check`):
    per (GPU, model), the median training images/s of its rows that ran ("ok"), in the
    arithmetic paper mode uses there (``precision: auto``; the source names it), and per
    (GPU, model, K) the median of the rows with that K: K replicas on one GPU run at very
    different rates (the batched engine fills the GPU better as K grows), so `plan` prices a
    run with its own K's rate where one was measured. Nothing when the file does not exist."""
    import csv

    path = Path(loop_csv)
    if not path.exists():
        return {}
    by_key: dict[tuple, list[tuple[float, str]]] = {}
    with open(path, newline="") as fh:
        for r in csv.DictReader(fh):
            if r.get("status") == "ok" and r.get("images_per_s"):
                row = (float(r["images_per_s"]), f"{r['notebook']} ({r.get('precision')})")
                by_key.setdefault((r["gpu"], r["model"]), []).append(row)
                if r.get("world_size"):
                    by_key.setdefault((r["gpu"], r["model"], int(r["world_size"])),
                                      []).append(row)
    out = {}
    for key, rows in by_key.items():
        rates = sorted(v for v, _ in rows)
        mid = len(rates) // 2
        median = rates[mid] if len(rates) % 2 else (rates[mid - 1] + rates[mid]) / 2
        k = key[2] if len(key) == 3 else None
        out[key] = Throughput(
            key[0], key[1], median, "measured",
            f"{path.parent.name}/{path.name} (localsgd gpu-check): median of the first "
            "configurations"
            f"{'' if k is None else f' with K = {k}'} of {len(rows)} notebook(s) "
            f"({', '.join(sorted(nb for _, nb in rows))}), training images / "
            "(data + compute + engine) seconds of the loop", world_size=k)
    return out


def measured_folder(folder: str | Path) -> dict[tuple, Throughput]:
    """`measured_throughputs` of ``folder/loop.csv`` and of each ``folder/<gpu>/loop.csv``
    (figures/gpu/ holds one GPU's files at the top, an H200's, and others in subfolders)."""
    folder = Path(folder)
    out: dict[tuple, Throughput] = {}
    for path in [folder / "loop.csv", *sorted(folder.glob("*/loop.csv"))]:
        out.update(measured_throughputs(path))
    return out


def throughput(model: str, gpu: str = DEFAULT_GPU) -> Throughput:
    """The table's entry for ``model`` on ``gpu`` (KeyError naming what exists)."""
    try:
        return THROUGHPUT[(gpu, model)]
    except KeyError:
        raise KeyError(f"no throughput for {model!r} on {gpu!r}; known: "
                       f"{sorted(THROUGHPUT)}") from None


# --------------------------------------------------------------------------- plan


@dataclass(frozen=True)
class PlanItem:
    """``runs`` identical-cost runs of one notebook: each ``updates`` updates of
    ``images_per_update`` images (K * B_loc), plus ``eval_images`` evaluated images."""

    notebook: str
    runs: int
    updates: int
    images_per_update: int
    model: str
    eval_images: int = 0
    note: str = ""
    key: Any = None  # identity of ONE configuration (runs must be 1): de-duplication across
    # notebooks (`plan`'s ``gpu_hours_shared``)
    world_size: int | None = None  # K: a throughput measured at this K is used first

    def __post_init__(self):
        if min(self.runs, self.updates, self.images_per_update, self.eval_images) < 0:
            raise ValueError(f"{self}: counts must be >= 0")
        if self.key is not None and self.runs != 1:
            raise ValueError(f"{self.notebook}: an item with a key is one configuration "
                             f"(runs=1), got runs={self.runs}")


@dataclass
class Plan:
    gpu: str
    rows: list[dict[str, Any]]
    total: dict[str, Any]
    order: list[str]
    throughputs: list[Throughput]

    def table(self):
        """The rows and the total as a pandas DataFrame."""
        import pandas as pd

        return pd.DataFrame(self.rows + [self.total])

    def format(self) -> str:
        measured = sum(t.status == "measured" for t in self.throughputs)
        what = ("ESTIMATED throughputs (not measured)" if not measured else
                "MEASURED throughputs" if measured == len(self.throughputs) else
                f"throughputs: {measured} measured, {len(self.throughputs) - measured} ESTIMATED")
        lines = [f"GPU-hours on {self.gpu} -- {what}:"]
        lines.append(f"{'notebook':28s} {'runs':>5s} {'updates':>12s} {'images':>15s} "
                     f"{'GPU-hours':>10s}")
        for r in self.rows + [self.total]:
            lines.append(f"{r['notebook']:28s} {r['runs']:5d} {r['updates']:12,d} "
                         f"{r['images']:15,d} {r['gpu_hours']:10.1f}")
        lines.append("order (cheapest informative first): " + ", ".join(self.order))
        for t in self.throughputs:
            k = "" if t.world_size is None else f" (K = {t.world_size})"
            lines.append(f"  {t.model}{k}: {t.images_per_s:,.0f} images/s [{t.status}] "
                         f"{t.source}")
        return "\n".join(lines)


def plan(items: Iterable[PlanItem], gpu: str = DEFAULT_GPU,
         table: dict[tuple[str, str], Throughput] | None = None) -> Plan:
    """Per-notebook rows (runs, updates, images, eval_images, gpu_hours, models), a total (the
    sum of the rows, plus ``gpu_hours_shared``: configurations with the same ``key`` in several
    notebooks counted once) and a recommended order: notebooks that train nothing first
    (free), then ascending GPU-hours -- the cheapest informative runs surface problems before
    the expensive ones are started; ties by name."""
    table = THROUGHPUT if table is None else table
    items = list(items)
    rows: dict[str, dict[str, Any]] = {}
    used: dict[str, Throughput] = {}
    seen: dict[Any, float] = {}
    for it in items:
        row = rows.setdefault(it.notebook, {"notebook": it.notebook, "runs": 0, "updates": 0,
                                            "images": 0, "eval_images": 0, "gpu_hours": 0.0,
                                            "models": "", "note": ""})
        row["runs"] += it.runs
        row["updates"] += it.runs * it.updates
        row["images"] += it.runs * it.updates * it.images_per_update
        row["eval_images"] += it.runs * it.eval_images
        if it.note and it.note not in row["note"]:
            row["note"] = "; ".join(filter(None, [row["note"], it.note]))
        if it.runs and it.updates:
            tp = table.get((gpu, it.model, it.world_size)) or table.get((gpu, it.model))
            if tp is None:
                raise KeyError(f"no throughput for {it.model!r} on {gpu!r}")
            used[(it.model, tp.world_size or 0)] = tp
            hours = it.runs * (it.updates * it.images_per_update
                               + EVAL_COST * it.eval_images) / tp.images_per_s / 3600
            row["gpu_hours"] += hours
            if it.model not in row["models"].split(","):
                row["models"] = ",".join(filter(None, [row["models"], it.model]))
            if it.key is not None:
                seen[it.key] = hours / it.runs
    out = list(rows.values())
    total = {"notebook": "TOTAL", "note": "sum of the rows",
             "models": ",".join(sorted({m for m, _ in used}))}
    for k in ("runs", "updates", "images", "eval_images", "gpu_hours"):
        total[k] = sum(r[k] for r in out)
    keyed_hours = sum(it.runs * seen[it.key] for it in items if it.key is not None)
    total["gpu_hours_shared"] = total["gpu_hours"] - keyed_hours + sum(seen.values())
    order = [r["notebook"] for r in sorted(out, key=lambda r: (r["gpu_hours"] > 0,
                                                               r["gpu_hours"], r["notebook"]))]
    return Plan(gpu, out, total, order, [used[m] for m in sorted(used)])


# --------------------------------------------------------------------------- notebooks


def items_from_configs(notebook: str, configs: Sequence, note: str = "") -> list[PlanItem]:
    """One `PlanItem` per distinct `TrainConfig` (duplicates are trained once by the cache):
    updates as `localsgd.training.loop` computes them (floor(epochs * N / (K * B_loc))), one
    evaluation of the test set per epoch."""
    out = []
    for cfg in dict.fromkeys(configs):  # ordered, de-duplicated
        n = cfg.n_train or TRAIN_IMAGES[cfg.dataset]
        n_test = cfg.n_test or TEST_IMAGES[cfg.dataset]
        updates = max(math.floor(cfg.epochs * n / (cfg.world_size * cfg.local_batch)), 1)
        out.append(PlanItem(notebook, 1, updates, cfg.world_size * cfg.local_batch, cfg.model,
                            eval_images=math.ceil(cfg.epochs) * n_test, note=note, key=cfg,
                            world_size=cfg.world_size))
    return out


def _seeds(p: dict) -> list[int]:
    return list(range(p.get("seed", 0), p.get("seed", 0) + p.get("n_seeds", 1)))


@dataclass(frozen=True)
class _Grid:
    """A notebook's grid: ``configs(P, seeds)`` of ``module`` (``lin2020.<artifact>``,
    ``slowmo`` or ``comm_quality`` in `localsgd.paper.experiments`), the function the notebook itself calls, given
    the notebook's parameters as a dict; the configs alone where it also returns labels."""

    module: str

    def __call__(self, p: dict[str, Any]) -> list:
        # deferred: the plan imports no torch until a grid is built
        from localsgd.paper.experiments import comm_quality, lin2020, slowmo

        source = {"slowmo": slowmo, "comm_quality": comm_quality}.get(self.module) or getattr(
            lin2020, self.module.removeprefix("lin2020."))
        built = source.configs(types.SimpleNamespace(**p), _seeds(p))
        return built[0] if isinstance(built, tuple) else built  # (configs, labels)


# The TrainConfig grid of each training notebook: the function the notebook itself calls, so the
# plan prices exactly the runs the notebook trains (Table 5 with every data set taken as present;
# Figure 8 without writing its torchrun configs). tests/test_gpu_plan.py checks the paper-mode run
# counts against counts made by hand.
_GRIDS = {nb: _Grid(module) for nb, module in {
    "fig06_cifar10_local_sgd": "lin2020.fig06", "fig07_scaling": "lin2020.fig07",
    "fig08_imagenet": "lin2020.fig08", "fig09_hierarchical": "lin2020.fig09",
    "fig10_cifar100": "lin2020.fig10", "table01_large_batch": "lin2020.table01",
    "table03_topologies": "lin2020.table03", "table05_models": "lin2020.table05",
    "table06_07_momentum": "lin2020.table06_07", "slowmo": "slowmo",
    "comm_quality": "comm_quality"}.items()}

# Notebooks that train no network in paper mode, and why they cost no GPU-hours here.
NO_GPU = {
    "appB_comm_cost": "communication-cost formulas (no training)",
    "blog_hsgd_stragglers": "timing-model prediction on the CPU",
    "blog_stragglers_cluster": "measured on the emulated cluster (CPU processes, namespaces)",
    "explore_stragglers": "timing-model prediction on the CPU",
    "fig01_allreduce": "measured on the emulated cluster (CPU processes, namespaces)",
    "fig04_convex_time": "convex problem on the CPU",
    "slowmo_cluster": "measured on the emulated cluster (CPU processes, namespaces)",
    "sec43_hierarchy_cluster": "measured on the emulated cluster (CPU processes, namespaces)",
    "fig05_convex_speedup": "convex problem on the CPU",
    "table02_time_vs_H": "fit to the paper's Table 2",
    "table04_models": "parameter / flop counts on the meta device",
    "timing_validation": "gloo CPU processes with emulated compute",
    "timing_cluster": "measured on the emulated cluster (CPU processes, namespaces)",
    "dynamo_ddp": "needs 8x8 A100 + torchbench: not planned here (the notebook stops in paper "
                  "mode and prints what to run)",
}


def notebook_items(notebook: str, params: dict[str, Any]) -> list[PlanItem]:
    """The `PlanItem`s of one notebook given its full parameters (the parameters cell's
    defaults updated with the mode's YAML)."""
    if notebook in NO_GPU:
        return [PlanItem(notebook, 0, 0, 0, "", note=NO_GPU[notebook])]
    if notebook not in _GRIDS:
        raise KeyError(f"no GPU-plan derivation for notebook {notebook!r}; add it to "
                       "localsgd.paper.gpu_plan._GRIDS or NO_GPU")
    return items_from_configs(notebook, _GRIDS[notebook](params))


def notebook_params(notebooks_dir: str | Path, only: Sequence[str] | None = None,
                    mode: str = "paper", sets: dict[str, Any] | None = None
                    ) -> dict[str, dict[str, Any]]:
    """Each notebook's (or ``only``'s) parameters: its ``params/<nb>/<mode>.yaml`` merged over
    the notebook's parameters cell (`localsgd.paper.reproduce`'s reading of both), then ``sets``
    (``reproduce --set``)."""
    from localsgd.paper import reproduce

    notebooks_dir = Path(notebooks_dir)
    found = reproduce.discover(notebooks_dir)
    out = {}
    for nb_id in (only or sorted(found)):
        params = dict(reproduce.parameters_cell_names(found[nb_id]))
        yaml_path = notebooks_dir / "params" / nb_id / f"{mode}.yaml"
        if yaml_path.exists():
            import yaml

            params.update(yaml.safe_load(yaml_path.read_text()) or {})
        out[nb_id] = {**params, **(sets or {})}
    return out


def paper_items(notebooks_dir: str | Path, only: Sequence[str] | None = None,
                mode: str = "paper", sets: dict[str, Any] | None = None) -> list[PlanItem]:
    """`notebook_items` for every notebook (or ``only``) with its parameters
    (`notebook_params`)."""
    return [item for nb_id, params in notebook_params(notebooks_dir, only, mode, sets).items()
            for item in notebook_items(nb_id, params)]


def paper_configs(notebooks_dir: str | Path, only: Sequence[str] | None = None,
                  mode: str = "paper", sets: dict[str, Any] | None = None) -> dict[str, list]:
    """The `TrainConfig` grid of every notebook that trains (or of ``only``'s), in the order
    the notebook builds it, with ``sets`` over the mode's parameters (``reproduce --set``);
    `localsgd.paper.gpu_check` runs the first of each, `localsgd.paper.campaign` all."""
    return {nb_id: list(dict.fromkeys(_GRIDS[nb_id](params)))
            for nb_id, params in notebook_params(notebooks_dir, only, mode, sets).items()
            if nb_id in _GRIDS}


README_BEGIN, README_END = "<!-- plan:begin -->", "<!-- plan:end -->"


def readme_block(notebooks_dir: str | Path, gpu: str = DEFAULT_GPU) -> str:
    """What docs/gpu.md shows between its plan markers: the command and the plan
    of every notebook's paper mode (tests/test_readme.py checks it is current)."""
    full = plan(paper_items(notebooks_dir), gpu).format().splitlines()
    # the notebooks that train (the others cost nothing), the total; the throughput sources and
    # the recommended order are in the command's own output
    rows = [line for line in full[2:] if not line.startswith(("order", "  "))
            and line.split()[1:3] != ["0", "0"]]
    text = "\n".join(full[:2] + rows)
    return (f"{README_BEGIN}\n```text\n$ localsgd reproduce --mode paper --plan   # (rows that "
            f"train)\n{text}\n```\n{README_END}")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m localsgd.paper.gpu_plan [--gpu NAME] [--mode paper] [--only NB ...]``: print the
    plan (phase 2 wires this to ``localsgd reproduce --mode paper --plan``)."""
    import argparse

    from localsgd.paper.results import repo_root

    p = argparse.ArgumentParser(prog="python -m localsgd.paper.gpu_plan", description=main.__doc__)
    p.add_argument("--gpu", default=DEFAULT_GPU,
                   choices=sorted({gpu for gpu, _ in THROUGHPUT}))
    p.add_argument("--mode", default="paper")
    p.add_argument("--only", nargs="+", metavar="NB")
    p.add_argument("--notebooks", type=Path, default=repo_root() / "notebooks")
    args = p.parse_args(argv)
    print(plan(paper_items(args.notebooks, args.only, args.mode), args.gpu).format())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
