"""Each deep-learning notebook's paper-mode YAML is the paper's configuration (reported.csv)."""

from pathlib import Path

import pandas as pd
import yaml

from localsgd.training.config import TrainConfig

REPO = Path(__file__).resolve().parents[1]
PARAMS = REPO / "notebooks" / "params"
REPORTED = pd.read_csv(REPO / "papers" / "lin2020_local_sgd" / "reported.csv")


def paper(nb_id: str) -> dict:
    return yaml.safe_load((PARAMS / nb_id / "paper.yaml").read_text())


def value(artifact: str, setting: str, metric: str) -> float:
    row = REPORTED[(REPORTED.artifact == artifact) & (REPORTED.setting == setting)
                   & (REPORTED.metric == metric)]
    assert len(row) == 1, (artifact, setting, metric)
    return float(row.value.iloc[0])


def test_training_recipe_defaults_are_section_4_2_1():
    cfg = TrainConfig()
    recipe = "CIFAR; ResNet-20"
    assert cfg.lr == value("Section 4.2.1", recipe, "initial learning rate")
    assert cfg.momentum == value("Section 4.2.1", recipe, "momentum")
    assert cfg.momentum_scheme == "local"
    assert cfg.weight_decay == value("Section 4.1", "all models", "weight decay")
    assert [100 * f for f in cfg.decay_fractions] == [
        value("Section 4.2.1", f"{recipe}; decay={i}", "learning rate decay point") for i in (1, 2)]
    assert cfg.model == "resnet20" and cfg.dataset == "cifar10" and cfg.width == 1.0
    assert cfg.base_batch == 128


def _full_scale(p: dict) -> None:
    assert p["width"] == 1.0 and p["n_train"] is None and p["n_test"] is None
    assert p["epochs"] == value("Section 4.2.1", "CIFAR; ResNet-20", "epochs")
    assert p.get("dataset", "cifar10") == "cifar10" and p.get("model", "resnet20") == "resnet20"


def test_fig06_paper_yaml():
    p = paper("fig06_cifar10_local_sgd")
    _full_scale(p)
    assert p["K"] == value("Figure 6", "setup", "K")
    assert p["B_loc"] == value("Figure 6", "setup", "B_loc")
    assert max(p["Hs"]) == value("Figure 6", "setup", "H max") and min(p["Hs"]) == 1
    assert p.get("gpus_per_node", 1) == 1  # 2x1 GPUs: the default of the notebook


def test_table01_paper_yaml():
    p = paper("table01_large_batch")
    _full_scale(p)
    t1 = REPORTED[(REPORTED.artifact == "Table 1") & (REPORTED.setting != "setup")]
    b_globs = sorted({int(s.split("B_glob=")[1]) for s in t1.setting})
    assert p["B_globs"] == b_globs
    assert p["K"] == value("Table 1", "setup", "K")
    assert p["B_loc"] == value("Table 1", "setup", "B_loc")
    assert p["n_seeds"] == value("Table 1", "setup", "runs averaged")
    assert p["warmup_epochs"] == value("Appendix C", "large-batch tricks", "learning rate warm-up")


def test_fig07_paper_yaml():
    p = paper("fig07_scaling")
    _full_scale(p)
    assert min(p["Ks"]) == value("Figure 7", "setup", "K min")
    assert max(p["Ks"]) == value("Figure 7", "setup", "K max")
    assert max(p["Hs"]) == value("Figure 7", "setup", "H max") and min(p["Hs"]) == 1
    assert p["B_loc"] == value("Figure 7", "setup", "B_loc")
    assert p["inter_gbps"] == value("Figure 7", "setup", "network bandwidth")
    assert p["target_acc"] == value("Figure 7", "setup", "target test top-1")
    assert p["n_seeds"] == value("Figure 7", "setup", "runs averaged")
    assert p["gpus_per_node"] == 2  # 8x2-GPU cluster


def test_fig09_and_table03_paper_yaml():
    p = paper("fig09_hierarchical")
    _full_scale(p)
    assert p["K"] == value("Figure 9", "setup", "nodes") * value("Figure 9", "setup", "GPUs per node")
    assert p["block_size"] == value("Figure 9", "setup", "GPUs per node")
    assert min(p["Hbs"]) == value("Figure 9", "setup", "Hb min")
    assert max(p["Hbs"]) == value("Figure 9", "setup", "Hb max")
    assert p["H"] == value("Figure 9", "panel=a", "H")
    assert sorted(p["delays_s"]) == [0.0, value("Figure 9", "panel=b", "added delay per global sync"),
                                     value("Figure 9", "panel=c", "added delay per global sync")]
    t3 = paper("table03_topologies")
    _full_scale(t3)
    cells = REPORTED[(REPORTED.artifact == "Table 3") & (REPORTED.metric == "test top-1")]
    assert sorted(t3["topologies"]) == sorted({s.split("; ")[0] for s in cells.setting})
    pairs = {tuple(int(x.split("=")[1]) for x in s.split("; ")[1:]) for s in cells.setting}
    assert sorted(map(tuple, t3["H_Hbs"])) == sorted(pairs)
    assert all(h * hb == 16 for h, hb in t3["H_Hbs"]) and t3["K"] == 16


def test_table05_and_fig10_paper_yaml():
    p = paper("table05_models")
    assert p["widths"] == [1.0, 1.0, 1.0] and p["n_train"] is None and p["n_test"] is None
    assert p["models"] == ["resnet20", "densenet40_12", "wrn28_10"]
    assert p["epochs"] == value("Section 4.2.1", "CIFAR; ResNet-20", "epochs")
    t5 = REPORTED[(REPORTED.artifact == "Table 5") & (REPORTED.metric == "test top-1")]
    assert sorted(p["Hs"]) == sorted({int(s.rsplit("H=", 1)[1]) for s in t5.setting})
    assert {f"K={p['K']}" in s for s in t5.setting} == {True}
    assert p["warmup_epochs"] == value("Appendix C", "large-batch tricks", "learning rate warm-up")
    f10 = paper("fig10_cifar100")
    _full_scale({**f10, "dataset": "cifar10"})
    assert f10.get("dataset", "cifar100") == "cifar100"
    assert f10["K"] == value("Figure 10", "setup", "K")
    assert f10["B_loc"] == value("Figure 10", "setup", "B_loc")
    assert max(f10["Hs"]) == value("Figure 10", "setup", "H max") and min(f10["Hs"]) == 1


def test_table06_07_paper_yaml():
    p = paper("table06_07_momentum")
    _full_scale(p)
    assert p["K"] == 10  # 5x2-GPU cluster
    assert p["B_loc"] == value("Table 6", "setup", "B_loc")
    assert p["base_batch"] == value("Table 6", "setup", "base batch size")
    for name, H, grid in (("Table 6", 1, p["table6_momenta"]), ("Table 7", 8, p["table7_momenta"])):
        cells = REPORTED[(REPORTED.artifact == name) & (REPORTED.setting != "setup")]
        want = sorted(tuple(float(x.split("=")[1]) for x in s.split("; ")[:2]) for s in cells.setting)
        assert sorted(map(tuple, grid)) == want
        assert all(s.endswith(f"H={H}") for s in cells.setting)


def test_fig08_paper_yaml():
    p = paper("fig08_imagenet")
    s = "ImageNet; ResNet-50"
    assert p["dataset"] == "imagenet" and p["model"] == "resnet50" and p["width"] == 1.0
    assert p["n_train"] is None and p["n_test"] is None and p["image_size"] == 224
    assert p["nodes"] == value("Figure 8", "setup", "nodes")
    assert p["gpus_per_node"] == value("Figure 8", "setup", "GPUs per node")
    assert p["H"] == value("Figure 8", "setup", "H")
    assert p["B_loc"] == value("Section 4.2.2", s, "B_loc")
    assert p["epochs"] == value("Section 4.2.2", s, "epochs")
    assert p["lr"] == value("Section 4.2.2", s, "base learning rate")
    assert p["base_batch"] == value("Section 4.2.2", s, "base batch size")
    assert p["warmup_epochs"] == value("Section 4.2.2", s, "learning rate warm-up")
    decays = [value("Section 4.2.2", f"{s}; decay={i}", "learning rate decay epoch") for i in (1, 2, 3)]
    assert [round(f * p["epochs"], 3) for f in p["decay_fractions"]] == decays
    # footnote 4: H = 1, 2, 4 in epochs 1-3, then the target 8 -- the schedule's exponential warm-up
    warm = [value("Section 4.2.2", f"ImageNet; local-step warm-up; epoch={e}", "H") for e in (1, 2, 3)]
    assert warm == [2 ** e for e in range(p["local_step_warmup_epochs"])] and 2 * warm[-1] == p["H"]
