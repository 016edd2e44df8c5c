"""``localsgd campaign``: the paper's CIFAR experiments at the paper's own scale, a few minutes
of a lent GPU at a time.

`ENTRIES` is the priority list, each a claim's runs as a notebook builds them in a mode
(``sets``: the notebook parameters that cut its grid to the claim, the same ``--set`` values
`render_commands` hands to ``localsgd reproduce`` afterwards). `run` takes the runs not kept
yet, in that order, groups them into packs (`localsgd.training.packs`: runs that differ only in
seed, schedule, lr, momentum or outer step share one stack of R·K replicas, at most
``max_replicas``), and trains packs while the budget lasts: a pack cut off by the budget leaves
its checkpoint in ``<runs>/packs/`` for the next GPU to resume
(`localsgd.training.packs.OutOfTime`), a finished pack keeps each run (`grid.keep_run`) in
``figures/paper/runs/``, where ``localsgd reproduce --mode paper`` reads them. Each run is kept
under the configuration that reproduce asks for (paper mode's ``device: "cuda"``, ``batched: auto``,
which a pack's batched engine is on a GPU), so nothing is trained twice. The converged proxy is not
an entry: its configurations say ``device: "cpu"`` (the device is part of a run's results key, and a
GPU's arithmetic is not the CPU's), so GPU runs of them would be other runs. Nothing here imports
papermill: the GPU image has none; the figures are drawn on a CPU afterwards.

`plan` prices every entry from measured throughputs (``figures/gpu/**/loop.csv``, by K) in
15-minute stints of one GPU, start-up included: what a full reproduction costs on one GPU.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import shlex
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localsgd.paper import gpu_plan, results

__all__ = ["CAMPAIGN_DIR", "ENTRIES", "STINT_MIN", "Entry", "Pack", "entry_configs",
           "format_plan", "pack_configs", "plan", "render_commands", "run", "runs_folder", "toy"]

STINT_MIN = 15.0  # one lent GPU's session, start-up included
STARTUP_MIN = 3.0  # machine start, imports, data to the device, cuDNN's first shapes


@dataclass(frozen=True)
class Entry:
    """One claim's runs: ``notebook``'s grid in ``mode`` with ``sets`` applied; ``id`` names
    it (``--only``, its render's folder)."""

    id: str
    claim: str
    notebook: str
    mode: str = "paper"
    sets: dict[str, Any] = field(default_factory=dict)


ENTRIES: tuple[Entry, ...] = (
    # Table 3's gap first (one paper-scale run ended at 85.73 % against 90.02 %): the 8x2 cell
    # with §4.1's lr 0.1 and with App. C's linear scaling and warm-up, one seed each
    Entry("table03-8x2-lr", "Table 3's lr: 8x2, H = 1, H^b = 16, lr 0.1", "table03_topologies",
          sets={"topologies": ["8x2"], "H_Hbs": [[1, 16]], "n_seeds": 1}),
    Entry("table03-8x2-scaled-lr", "Table 3's lr: 8x2, H = 1, H^b = 16, lr scaled with "
          "warm-up", "table03_topologies",
          sets={"topologies": ["8x2"], "H_Hbs": [[1, 16]], "n_seeds": 1, "tricks": True,
                "warmup_epochs": 5.0}),
    Entry("table01-2048", "Table 1 at B_glob 2,048", "table01_large_batch",
          sets={"B_globs": [2048]}),
    Entry("table05-resnet20", "Table 5, ResNet-20", "table05_models",
          sets={"models": ["resnet20"], "widths": [1.0], "datasets": ["cifar10"]}),
    Entry("fig06", "Figure 6", "fig06_cifar10_local_sgd"),
    Entry("table03", "Table 3", "table03_topologies"),
    Entry("table06-07", "Tables 6 and 7", "table06_07_momentum"),
    Entry("fig07", "Figure 7", "fig07_scaling"),
    Entry("table01-4096", "Table 1 at B_glob 4,096", "table01_large_batch",
          sets={"B_globs": [4096]}),
)


# The long proxy's runs (long mode, docs/pilot/long_proxy.md) on this project's 2-core CPU: the
# same packs, checkpoints and kept runs, trained where no GPU is lent (``--mode long``)
LONG_ENTRIES: tuple[Entry, ...] = (
    Entry("long-table01", "Table 1 at B_glob 2,048 (long proxy)", "table01_large_batch",
          mode="long"),
)
ENTRIES_BY_MODE = {"paper": ENTRIES, "long": LONG_ENTRIES}
# training images/s of a pack on the 2-core CPU (docs/pilot/pack_speed_2026-12-07.json: 4,200
# for 6 runs x K = 2 at B_loc 16, 7,500 for 3 runs at B_loc 256, 16x16, width 0.25; the lower)
CPU_RATE = 4200.0


def runs_folder(figures: Path, mode: str) -> Path:
    """Where ``mode``'s kept runs live (``localsgd reproduce`` reads them there: paper mode's
    in figures/paper/runs/, converged mode's in figures/converged/runs/; another mode's, a
    test's, in figures/<mode>/runs/)."""
    return Path(figures) / mode / "runs"


def entry_configs(entry: Entry, notebooks: Path) -> list:
    """The entry's `TrainConfig`s as its notebook builds them (and reproduce asks for them).
    A configuration that asks for the sequential engine (``batched: false``) is refused in
    one line: a pack runs the batched one, and the run would be kept under a setting it did
    not run with."""
    cfgs = gpu_plan.paper_configs(notebooks, [entry.notebook], entry.mode,
                                  sets=entry.sets)[entry.notebook]
    if any(c.batched is False for c in cfgs):
        raise ValueError(f"campaign entry {entry.id}: {entry.notebook}'s {entry.mode} "
                         "configurations ask for batched: false, and a pack runs the batched "
                         f"engine: set batched: auto in notebooks/params/{entry.notebook}/"
                         f"{entry.mode}.yaml")
    return cfgs


def pack_configs(cfgs: Sequence, max_replicas: int) -> list[list]:
    """``cfgs`` in packs: those that may share one (`localsgd.training.packs.PER_RUN`) in order,
    at most ``max_replicas`` replicas (R·K) a pack, at least one run."""
    from localsgd.training.packs import PER_RUN  # deferred: torch

    groups: dict[tuple, list] = {}
    for cfg in cfgs:
        key = tuple((k, str(v)) for k, v in cfg.to_dict().items() if k not in PER_RUN)
        groups.setdefault(key, []).append(cfg)
    packs = []
    for members in groups.values():
        per = max(1, max_replicas // members[0].world_size)
        packs += [members[i:i + per] for i in range(0, len(members), per)]
    return packs


@dataclass
class Pack:
    """A pack of runs with its cost: training and evaluated images, and minutes at ``rate``."""

    entry: Entry
    cfgs: list
    images: int
    minutes: float
    rate: float

    @property
    def name(self) -> str:
        """The pack's checkpoint name: a hash of its runs' results keys."""
        from localsgd.training.results_key import results_key

        blob = repr([sorted(results_key(c).items()) for c in self.cfgs]).encode()
        return f"pack-{hashlib.sha256(blob).hexdigest()[:16]}"


def _rate(cfg: Any, replicas: int, gpu: str, table: dict) -> float:
    """Training images/s of ``replicas`` packed replicas of ``cfg.model`` on ``gpu``: the rate
    measured at the largest K not above ``replicas`` (a pack fills the GPU at least as well),
    else the model's rate; a CPU configuration's: `CPU_RATE`."""
    if cfg.device == "cpu":
        return CPU_RATE
    measured = sorted((key[2], t.images_per_s) for key, t in table.items()
                      if len(key) == 3 and key[:2] == (gpu, cfg.model) and key[2] <= replicas)
    if measured:
        return measured[-1][1]
    return (table.get((gpu, cfg.model)) or gpu_plan.throughput(cfg.model, gpu)).images_per_s


def priced(entry: Entry, packs: list[list], gpu: str, table: dict) -> list[Pack]:
    out = []
    for cfgs in packs:
        (item,) = gpu_plan.items_from_configs(entry.notebook, cfgs[:1])
        images = item.updates * item.images_per_update + gpu_plan.EVAL_COST * item.eval_images
        rate = _rate(cfgs[0], len(cfgs) * cfgs[0].world_size, gpu, table)
        out.append(Pack(entry, cfgs, int(images * len(cfgs)), images * len(cfgs) / rate / 60,
                        rate))
    return out


def plan(notebooks: Path, figures: Path, gpu: str, max_replicas: int = 32,
         entries: Sequence[Entry] = ENTRIES) -> list[dict[str, Any]]:
    """Per entry: its runs, the runs kept already, its packs, GPU minutes at the measured (or
    estimated) rate, and the 15-minute stints of one GPU it takes (`STINT_MIN`, each losing
    `STARTUP_MIN` to start-up)."""
    from localsgd.paper.experiments import grid  # deferred: torch

    table = {**gpu_plan.THROUGHPUT, **gpu_plan.measured_folder(Path(figures) / "gpu")}
    rows = []
    for entry in entries:
        cfgs = entry_configs(entry, notebooks)
        folder = runs_folder(figures, entry.mode)
        with warnings.catch_warnings():  # which code trained a kept run: provenance, not here
            warnings.filterwarnings("ignore", message="runs in .* were computed by")
            todo = [c for c in cfgs if grid.find_kept(c, folder) is None]
        packs = priced(entry, pack_configs(todo, max_replicas), gpu, table)
        minutes = sum(p.minutes for p in packs)
        rows.append({"claim": entry.claim, "notebook": entry.notebook, "mode": entry.mode,
                     "runs": len(cfgs), "kept": len(cfgs) - len(todo), "packs": len(packs),
                     "gpu_minutes": round(minutes, 1),
                     "stints": math.ceil(minutes / (STINT_MIN - STARTUP_MIN)) if packs else 0})
    return rows


def format_plan(rows: list[dict[str, Any]], gpu: str) -> str:
    lines = [(f"campaign on one {gpu}, in {STINT_MIN:g}-minute stints ({STARTUP_MIN:g} of each "
              "to start-up):"),
             (f"{'claim':62s} {'mode':9s} {'runs':>4s} {'kept':>4s} {'packs':>5s} "
              f"{'GPU min':>8s} {'stints':>6s}")]
    for r in rows:
        lines.append(f"{r['claim'][:62]:62s} {r['mode']:9s} {r['runs']:4d} {r['kept']:4d} "
                     f"{r['packs']:5d} {r['gpu_minutes']:8.1f} {r['stints']:6d}")
    total = sum(r["gpu_minutes"] for r in rows)
    lines.append(f"{'TOTAL':62s} {'':9s} {sum(r['runs'] for r in rows):4d} "
                 f"{sum(r['kept'] for r in rows):4d} {sum(r['packs'] for r in rows):5d} "
                 f"{total:8.1f} {sum(r['stints'] for r in rows):6d}")
    return "\n".join(lines)


def toy(cfg: Any) -> Any:
    """``cfg`` at toy size on the CPU (a test of the campaign, not a result)."""
    return dataclasses.replace(cfg, dataset="synthetic", width=0.25, n_train=64, n_test=32,
                               local_batch=4, epochs=2.0, device="cpu", records_per_epoch=1,
                               eval_batch=32)


def run(budget_min: float, *, notebooks: Path, figures: Path,
        entries: Sequence[Entry] = ENTRIES, max_replicas: int = 32, gpu: str | None = None,
        shrink: Callable[[Any], Any] | None = None, progress: bool = True,
        say: Callable[[str], None] = print) -> dict[str, Any]:
    """Train the next packs of `ENTRIES` not kept yet, for ``budget_min`` minutes from now
    (start-up already spent); returns what was kept, resumed and left. A pack is started while
    time remains and stopped at an epoch's end once it is spent (its checkpoint stays in
    ``<runs>/packs/``); ``shrink`` turns each configuration into a smaller one (``--toy``)."""
    from localsgd.paper.experiments import grid  # deferred: torch
    from localsgd.training.packs import OutOfTime, train_runs

    deadline = time.monotonic() + budget_min * 60
    gpu = gpu or gpu_plan.DEFAULT_GPU
    table = {**gpu_plan.THROUGHPUT, **gpu_plan.measured_folder(Path(figures) / "gpu")}
    done: dict[str, Any] = {"kept": [], "cut": [], "left": 0}
    for entry in entries:
        cfgs = entry_configs(entry, notebooks)
        folder = runs_folder(figures, entry.mode)
        todo = [c for c in cfgs if grid.find_kept(shrink(c) if shrink else c, folder) is None]
        for pack in priced(entry, pack_configs(todo, max_replicas), gpu, table):
            if time.monotonic() >= deadline:
                done["left"] += len(pack.cfgs)
                continue
            cfgs_run = [shrink(c) for c in pack.cfgs] if shrink else pack.cfgs
            ckpt = folder / "packs" / f"{pack.name}.ckpt.pt"
            ckpt.parent.mkdir(parents=True, exist_ok=True)
            say(f"{entry.claim}: a pack of {len(cfgs_run)} runs (K = {cfgs_run[0].world_size}"
                f"), about {pack.minutes:.1f} GPU minutes at {pack.rate:,.0f} images/s"
                + (" (resuming)" if ckpt.is_file() else ""))
            t0 = time.perf_counter()
            try:
                frames = train_runs(cfgs_run, checkpoint_path=ckpt, checkpoint_every=1,
                                    progress=progress, deadline=deadline)
            except OutOfTime as stop:
                say(f"  cut off at update {stop.update} of {stop.total}: {ckpt} resumes it")
                done["cut"].append(str(ckpt))
                continue
            seconds = time.perf_counter() - t0
            for i, (cfg, rec) in enumerate(zip(cfgs_run, frames, strict=True)):
                path = grid.keep_run(cfg, rec, folder, pack={
                    "runs": len(cfgs_run), "index": i, "seconds": round(seconds, 1),
                    "device": results.device_info().get("gpus") or "cpu"})
                done["kept"].append(str(path))
            ckpt.unlink(missing_ok=True)
            say(f"  kept {len(frames)} runs in {folder} ({seconds:.0f} s; final test top-1 "
                + ", ".join(f"{rec['test_acc'].iloc[-1]:.2f}" for rec in frames) + " %)")
    return done


CAMPAIGN_DIR = "campaign"  # figures/paper/campaign/<entry>/: a paper-scale render per entry


def render_commands(entries: Sequence[Entry] = ENTRIES) -> list[str]:
    """The ``localsgd reproduce`` command that draws each entry's figure from its kept runs:
    a paper-mode entry into ``figures/paper/campaign/<entry>/`` (its ``sets`` cut the
    notebook's grid; the report reads every render there), a converged one into
    ``figures/converged/``. Then ``localsgd report``."""
    out = []
    for e in entries:
        sets = " ".join(f"--set {shlex.quote(f'{k}={json.dumps(v)}')}" for k, v in e.sets.items())
        where = (f" --out-dir figures/paper/{CAMPAIGN_DIR}/{e.id}" if e.mode == "paper"
                 else "")
        out.append(f"localsgd reproduce --mode {e.mode} --only {e.notebook} {sets}".rstrip()
                   + where + " --no-report")
    return list(dict.fromkeys(out))


def main(argv: Sequence[str] | None = None) -> int:
    """``localsgd campaign``: train the next packs within ``--budget`` minutes (on a lent GPU),
    or ``--plan`` the whole campaign, or ``--render`` the figures whose runs
    are all kept (prints the commands; run them on a machine with the notebooks' packages)."""
    import argparse
    import sys

    from localsgd.paper.results import repo_root

    root = repo_root()
    p = argparse.ArgumentParser(prog="localsgd campaign", description=main.__doc__)
    p.add_argument("--budget", type=float, default=10.0, metavar="MIN",
                   help="minutes to train from now (start-up spent already; default 10)")
    p.add_argument("--plan", action="store_true", help="price every entry and exit")
    p.add_argument("--render", action="store_true",
                   help="print the reproduce command of every entry whose runs are all kept")
    p.add_argument("--gpu", default=None, help="the GPU whose measured rates price packs "
                   "(default: this machine's, else the plan's default)")
    p.add_argument("--max-replicas", type=int, default=32,
                   help="replicas (runs x K) in one pack (default 32)")
    p.add_argument("--mode", choices=sorted(ENTRIES_BY_MODE), default="paper",
                   help="paper: the paper's scale on a lent GPU (the default); long: the long "
                   "proxy on this CPU")
    p.add_argument("--only", nargs="+", metavar="ID",
                   help="these entries (ids: " + ", ".join(
                       e.id for es in ENTRIES_BY_MODE.values() for e in es)
                   + "; default: all of --mode's, in order)")
    p.add_argument("--toy", action="store_true",
                   help="toy-size runs on the CPU into --figures (a test of the campaign; "
                   "each run on its configuration's device otherwise: paper mode's cuda)")
    p.add_argument("--figures", type=Path, default=root / "figures",
                   help="the figures folder whose runs/ hold the kept runs (default figures/)")
    p.add_argument("--notebooks", type=Path, default=root / "notebooks", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    pool = ENTRIES_BY_MODE[args.mode]
    unknown = sorted(set(args.only or []) - {e.id for e in pool})
    if unknown:
        print(f"error: no {args.mode}-mode campaign entry {unknown}; the ids: "
              + ", ".join(e.id for e in pool), file=sys.stderr)
        return 2
    entries = [e for e in pool if not args.only or e.id in args.only]
    gpu = args.gpu
    if gpu is None:
        import torch

        gpu = (torch.cuda.get_device_name() if torch.cuda.is_available()
               else gpu_plan.DEFAULT_GPU)
    if args.plan:
        print(format_plan(plan(args.notebooks, args.figures, gpu, args.max_replicas, entries),
                          gpu))
        return 0
    if args.render:
        rows = plan(args.notebooks, args.figures, gpu, args.max_replicas, entries)
        complete = [e for e, r in zip(entries, rows, strict=True) if r["kept"] == r["runs"]]
        for cmd in render_commands(complete):
            print(cmd)
        print(f"{len(complete)} of {len(entries)} entries have all their runs kept")
        return 0
    done = run(args.budget, notebooks=args.notebooks, figures=args.figures, entries=entries,
               max_replicas=args.max_replicas, gpu=gpu, shrink=toy if args.toy else None)
    print(f"campaign: {len(done['kept'])} runs kept, {len(done['cut'])} packs cut off (their "
          f"checkpoints resume next time), {done['left']} runs left for the next budget")
    return 0
