"""The shipped configs: every one loads into a TrainConfig, names resolve, unknown names list
the shipped ones, and every config the documentation names is shipped."""

import re
import tomllib
from pathlib import Path

import pytest

from localsgd import configs
from localsgd.train import TrainConfig

ROOT = Path(__file__).resolve().parents[1]


def test_configs_are_shipped():
    assert {"run", "base", "comp"} <= set(configs.shipped())


@pytest.mark.parametrize("name", sorted(configs.shipped()))
def test_every_shipped_config_loads(name):
    cfg = TrainConfig.from_dict(configs.load(name))
    assert cfg.dataset and cfg.epochs > 0


def test_resolve_names_and_paths(tmp_path):
    assert configs.resolve("run") == configs.HERE / "run.yaml"
    own = tmp_path / "mine.yaml"
    own.write_text("model: resnet20\n")
    assert configs.resolve(own) == own and configs.resolve(str(own)) == own
    with pytest.raises(FileNotFoundError, match="shipped configs: .*base.*comp.*run"):
        configs.resolve("nope")
    with pytest.raises(FileNotFoundError, match="not found"):
        configs.resolve(tmp_path / "missing.yaml")


def test_package_data_ships_the_yaml_files():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "configs/*.yaml" in pyproject["tool"]["setuptools"]["package-data"]["localsgd"]


def test_every_config_the_docs_use_is_shipped():
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    used = set()
    for doc in docs:
        used |= set(re.findall(r"--config[ =]([\w.-]+)", doc.read_text()))
    used = {u.removesuffix(".yaml") for u in used if not u.startswith("$")}
    assert used, "the docs use no --config?"
    assert used <= set(configs.shipped()), f"not shipped: {used - set(configs.shipped())}"
