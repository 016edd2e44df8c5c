"""The shipped configs: every one loads into a TrainConfig, names resolve, unknown names list
the shipped ones, and every config the documentation names is shipped."""

import re
import tomllib
from pathlib import Path

import pytest

from localsgd import configs
from localsgd.training.config import TrainConfig

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


# ---- what each shipped config holds, and the errors a user can cause -------------------------

def _documented(name: str) -> dict:
    """The field summary docs/runner.md prints under its commands (``# NAME (shipped: ...):
    field value, ...``), parsed back into values."""
    text = (ROOT / "docs" / "runner.md").read_text()
    m = re.search(rf"^# {name} \(shipped: [^)]*\): (.*(?:\n#   .*)*)", text, re.MULTILINE)
    assert m, f"docs/runner.md has no summary of the {name!r} config"
    import yaml

    pairs = [p.strip().split(" ", 1) for p in re.sub(r"\n#\s+", " ", m.group(1)).split(",")]
    return {k: yaml.safe_load(v) for k, v in pairs}


# what each config is for, as the README, docs/runner.md and the configs' own comments say
EXPECTED = {
    # Lin et al. (2020) §4.2.1: ResNet-20 on CIFAR-10, B_loc 128, 300 epochs, lr 0.1, m 0.9, 1e-4
    "cifar10_resnet20": {"dataset": "cifar10", "model": "resnet20", "width": 1.0,
                         "local_batch": 128, "epochs": 300.0, "lr": 0.1, "momentum": 0.9,
                         "weight_decay": 1e-4},
    # "a small run any CPU can do in about a minute": quarter-width ResNet-20, synthetic images
    "run": {"dataset": "synthetic", "model": "resnet20", "width": 0.25, "n_train": 1024,
            "n_test": 128, "augment": False, "local_batch": 16, "epochs": 2.0,
            "eval_batch": 128},
    "base": _documented("base"),
    "comp": _documented("comp"),
}


def test_every_shipped_config_is_described():
    assert set(EXPECTED) == set(configs.shipped())


@pytest.mark.parametrize("name", sorted(configs.shipped()))
def test_shipped_config_fields_equal_its_yaml(name):
    """The loaded TrainConfig holds exactly the YAML's values, and the YAML holds what the docs
    promise (an emptied or edited file fails here, not silently on a cluster)."""
    raw = configs.load(name)
    assert raw == pytest.approx(EXPECTED[name]), f"{name}.yaml differs from what the docs say"
    cfg = TrainConfig.from_dict(raw)
    for key, value in raw.items():
        assert getattr(cfg, key) == value, f"{name}: {key} loaded as {getattr(cfg, key)!r}"


def _run_args(*argv: str):
    import argparse

    from localsgd.training.runner_args import add_run_arguments

    p = argparse.ArgumentParser()
    add_run_arguments(p)
    return p.parse_args(list(argv))


@pytest.mark.parametrize(("argv", "world", "message"), [
    (("--config", "nope"), 2, "no shipped config named 'nope'; shipped configs: base"),
    (("--config", "missing/run.yaml"), 2, "config file 'missing/run.yaml' not found"),
    (("--config", "run", "--world-size", "4", "--block-size", "3"), 4, "block"),
    (("--config", "run", "--world-size", "4"), 3,
     "torchrun started 3 processes but the run needs world_size=4"),
    (("--config", "run", "--nodes", "2", "--procs-per-node", "2"), 3,
     "torchrun started 3 processes but the run needs world_size=4"),
])
def test_bad_launches_are_one_line(argv, world, message):
    from localsgd.training.runner_args import resolve_config

    with pytest.raises((ValueError, FileNotFoundError)) as err:
        resolve_config(_run_args(*argv), world)
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(("yaml_text", "message"), [
    ("lr: fast\n", "lr: 'fast' (str) is not a number"),
    ("local_batch: 12.5\n", "local_batch: 12.5 (float) is not an integer"),
    ("augment: 'no'\n", "augment: 'no' (str) is not true or false"),
    ("n_train: many\n", "n_train: 'many' (str) is not an integer or null"),
    ("weight_decy: 0.1\n",
     "unknown TrainConfig field(s) ['weight_decy'] ('weight_decy': did you mean 'weight_decay'?)"),
    ("- lr\n", "expected a mapping of TrainConfig fields"),
    ("lr: [0.1\n", "not valid YAML (line 2"),
])
def test_bad_config_files_are_one_line(tmp_path, yaml_text, message):
    from localsgd.training.runner_args import resolve_config

    path = tmp_path / "mine.yaml"
    path.write_text(yaml_text)
    with pytest.raises(ValueError) as err:
        resolve_config(_run_args("--config", str(path)), None)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_yaml_11_exponents_are_numbers(tmp_path):
    # PyYAML reads 1e-4 (no dot) as a string; a float field takes it as the number it means
    path = tmp_path / "wd.yaml"
    path.write_text("weight_decay: 1e-4\nepochs: 3\n")
    from localsgd.training.runner_args import resolve_config

    cfg = resolve_config(_run_args("--config", str(path)), None)
    assert cfg.weight_decay == 1e-4 and cfg.epochs == 3.0 and isinstance(cfg.epochs, float)


def test_torchrun_reports_a_bad_config_once(tmp_path):
    """Every rank validates, rank 0 alone prints one line, the launch exits non-zero and no
    Python traceback of ours is printed (torchrun adds its own failure report after it)."""
    import os
    import subprocess
    import sys

    torchrun = Path(sys.executable).with_name("torchrun")
    r = subprocess.run([str(torchrun), "--standalone", "--nproc-per-node", "2", "-m",
                        "localsgd.training.runner", "--config", "cifar10_resnt20", "--out",
                        str(tmp_path / "out")], capture_output=True, text=True, timeout=180,
                       env={**os.environ, "OMP_NUM_THREADS": "1"}, cwd=tmp_path, check=False)
    out = r.stdout + r.stderr
    assert r.returncode != 0
    assert out.count("error: no shipped config named 'cifar10_resnt20'") == 1, out[-3000:]
    assert "localsgd/" not in out.split("error:", 1)[0], out[-3000:]  # no worker traceback
    assert "localsgd/training/runner.py" not in out and "localsgd/configs" not in out, out[-3000:]
