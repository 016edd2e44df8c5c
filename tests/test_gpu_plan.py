"""The GPU-hours plan: arithmetic, totals = sum of the rows, order, the paper-mode run counts
each notebook's grid gives (counted by hand from the notebooks' parameters), and that the plan
builds each grid with the function its notebook calls."""

import json
import math

import pytest

from localsgd.paper import gpu_plan as g
from localsgd.paper.results import repo_root

TABLE = {("GPU-X", "a"): g.Throughput("GPU-X", "a", 1000.0, "ESTIMATE", "test"),
         ("GPU-X", "b"): g.Throughput("GPU-X", "b", 250.0, "ESTIMATE", "test")}


def test_plan_rows_total_and_order():
    items = [g.PlanItem("nb1", 3, 1000, 256, "a"),
             g.PlanItem("nb1", 1, 500, 128, "b", eval_images=30_000),
             g.PlanItem("nb2", 1, 100, 64, "a", key="shared"),
             g.PlanItem("nb2", 1, 100, 64, "a", key="own"),
             g.PlanItem("nb3", 1, 100, 64, "a", key="shared"),
             g.PlanItem("free", 0, 0, 0, "", note="no training")]
    p = g.plan(items, gpu="GPU-X", table=TABLE)
    rows = {r["notebook"]: r for r in p.rows}
    assert rows["nb1"]["runs"] == 4 and rows["nb1"]["updates"] == 3500
    assert rows["nb1"]["images"] == 3 * 1000 * 256 + 500 * 128
    assert rows["nb1"]["gpu_hours"] == pytest.approx(
        (3 * 1000 * 256 / 1000 + (500 * 128 + 30_000 / 3) / 250) / 3600)
    for k in ("runs", "updates", "images", "eval_images", "gpu_hours"):
        assert p.total[k] == pytest.approx(sum(r[k] for r in p.rows))
    # the configuration shared by nb2 and nb3 counted once: one 64 x 100 run at 1000 images/s
    assert p.total["gpu_hours"] - p.total["gpu_hours_shared"] == pytest.approx(
        100 * 64 / 1000 / 3600)
    assert p.order[0] == "free" and p.order[-1] == "nb1"
    assert p.order.index("nb3") < p.order.index("nb2")  # ascending cost
    with pytest.raises(ValueError, match="runs=1"):
        g.PlanItem("x", 2, 1, 1, "a", key="k")
    assert "ESTIMATE" in p.format() and len(p.table()) == len(p.rows) + 1
    with pytest.raises(KeyError, match="no throughput"):
        g.plan([g.PlanItem("x", 1, 1, 1, "zzz")], gpu="GPU-X", table=TABLE)


def test_throughput_table_is_marked_and_sourced():
    assert {m for _, m in g.THROUGHPUT} == {"resnet20", "densenet40_12", "wrn28_10", "resnet50"}
    for t in g.THROUGHPUT.values():
        assert t.status == "ESTIMATE" and t.source and t.images_per_s > 0
    # ResNet-20 from Table 5: 300 epochs x 50,000 images / 2 GPUs in 1.55 h
    assert g.throughput("resnet20", "TITAN Xp").images_per_s == pytest.approx(
        7.5e6 / (1.55 * 3600))


PAPER_RUNS = {  # runs per notebook in paper mode, from the notebooks' grids
    "fig06_cifar10_local_sgd": 5 * 3,          # Hs x seeds
    "fig07_scaling": 4 * 5 * 3,                # Ks x Hs x seeds
    "fig08_imagenet": 2 * 1,                   # mini-batch + local SGD, 1 seed
    "fig09_hierarchical": 6 * 1,               # Hbs, n_seeds default 1
    "fig10_cifar100": 6 * 1,                   # Hs, n_seeds default 1
    "slowmo": 13 * 3,                          # H=1, local, 4 betas, 2 alphas, 5 SGP; x 3 seeds
    "table01_large_batch": (2 * 2 * 6 - 2) * 3,  # B_glob = B_loc is one config per tricks
    "table03_topologies": 3 * 5 * 3,           # topologies x (H, H^b) x seeds
    "table05_models": 2 * 3 * 2 * 3,           # datasets x models x Hs x seeds
    "table06_07_momentum": (12 + 6) * 1,       # Table 6 + Table 7 cells, 1 seed
    "comm_quality": 6 * 3,                     # variants (3 formats) x seeds
}


def test_paper_plan_from_the_notebooks():
    items = g.paper_items(repo_root() / "notebooks")
    p = g.plan(items)
    rows = {r["notebook"]: r for r in p.rows}
    for nb, runs in PAPER_RUNS.items():
        assert rows[nb]["runs"] == runs, nb
    for nb in g.NO_GPU:
        assert rows[nb]["gpu_hours"] == 0
    # every CIFAR run at 300 epochs trains ~300 x 50,000 images whatever K and B_loc
    fig06 = rows["fig06_cifar10_local_sgd"]
    assert fig06["updates"] == 15 * math.floor(300 * 50_000 / (2 * 128))
    assert fig06["images"] == 15 * math.floor(300 * 50_000 / 256) * 256
    assert rows["fig08_imagenet"]["images"] == 2 * math.floor(90 * 1_281_167 / 3840) * 3840
    assert p.total["gpu_hours"] == pytest.approx(sum(r["gpu_hours"] for r in p.rows))
    assert p.total["gpu_hours_shared"] <= p.total["gpu_hours"]
    assert p.order[-1] in ("fig08_imagenet", "table05_models")


def test_the_plan_builds_each_grid_with_the_function_its_notebook_calls():
    # one grid per notebook (issue 29): gpu_plan once kept a copy of each, which lacked the
    # parameters grid.base_config reads (device, batched, loader_workers, records_per_epoch)
    calls = {"fig08_imagenet": "lin2020.fig08_runs(P, seeds=nb.seeds"}  # fig08.configs + torchrun
    for nb_id, grid in g._GRIDS.items():
        cells = json.loads((repo_root() / "notebooks" / f"{nb_id}.ipynb").read_text())["cells"]
        code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
        assert calls.get(nb_id, f"{grid.module}.configs(P, nb.seeds") in code, nb_id
        assert "dataclasses.replace(" not in code, f"{nb_id} builds a grid of its own"


def test_the_committed_h200_loop_prices_resnet20_and_every_other_model_has_an_estimate():
    # `--gpu "NVIDIA H200"` failed with a KeyError for resnet50 once loop.csv existed: a GPU
    # with a measurement needs estimates for the models it did not measure
    loop = repo_root() / "figures" / "gpu" / "loop.csv"
    measured = g.measured_throughputs(loop)
    assert ("NVIDIA H200", "resnet20") in measured
    table = {**g.THROUGHPUT, **measured}
    plan = g.plan(g.paper_items(repo_root() / "notebooks", None, "paper"), "NVIDIA H200", table)
    used = {(t.model, t.world_size): t.status for t in plan.throughputs}
    resnet20 = {k: v for k, v in used.items() if k[0] == "resnet20"}
    assert resnet20 and set(resnet20.values()) == {"measured"}
    assert all(k[1] is not None for k in resnet20)  # every K of the grids was measured there
    others = {k: v for k, v in used.items() if k[0] != "resnet20"}
    assert others and set(others.values()) == {"ESTIMATE"}
    assert f"{len(resnet20)} measured" in plan.format() and plan.total["gpu_hours"] > 0


def test_a_run_is_priced_with_its_own_k_where_that_k_was_measured():
    table = {**TABLE, ("GPU-X", "a", 16): g.Throughput("GPU-X", "a", 4000.0, "measured",
                                                        "test", world_size=16)}
    items = [g.PlanItem("nb", 1, 1000, 3600, "a", world_size=16),
             g.PlanItem("nb2", 1, 1000, 3600, "a", world_size=2)]
    plan = g.plan(items, gpu="GPU-X", table=table)
    hours = {r["notebook"]: r["gpu_hours"] for r in plan.rows}
    assert hours["nb"] == pytest.approx(1000 * 3600 / 4000 / 3600)  # K = 16's own rate
    assert hours["nb2"] == pytest.approx(1000 * 3600 / 1000 / 3600)  # no K = 2 row: the model's
    assert "a (K = 16): 4,000 images/s [measured]" in plan.format()


def test_the_plan_reads_every_gpu_folder_of_figures_gpu():
    # figures/gpu/loop.csv is an H200's; figures/gpu/h100/loop.csv an H100's (packed engine)
    measured = g.measured_folder(repo_root() / "figures" / "gpu")
    assert {("NVIDIA H200", "resnet20"), ("NVIDIA H100 80GB HBM3", "resnet20")} <= set(measured)
    h100 = measured[("NVIDIA H100 80GB HBM3", "resnet20", 16)]
    assert h100.status == "measured" and h100.source.startswith("h100/loop.csv")
