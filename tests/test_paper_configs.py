"""Each deep-learning notebook's paper-mode YAML is the paper's configuration (reported.csv)."""

from pathlib import Path

import pandas as pd
import yaml

from localsgd.train import TrainConfig

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
