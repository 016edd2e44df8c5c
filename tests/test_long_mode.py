"""Long mode (the long proxy, docs/pilot/long_proxy.md): batches scaled with the subset, the
labels kept the paper's, its campaign entries on the CPU, and its rows read as their own scale."""

from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from localsgd.paper import campaign, ledger, notebook
from localsgd.paper.experiments import grid
from localsgd.paper.experiments.lin2020 import table01
from localsgd.training.config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]


def test_batch_scale_keeps_h_and_the_papers_b_glob_labels():
    base = TrainConfig(local_batch=16, n_train=6250)
    cfgs, labels = table01.table01_configs(base, [2048], [0], warmup_epochs=5.0,
                                           batch_scale=0.125)
    local = [c for c, lab in zip(cfgs, labels) if lab["method"] == "local SGD"]
    mini = [c for c, lab in zip(cfgs, labels) if lab["method"] == "mini-batch SGD"]
    assert {(c.local_batch, c.local_steps) for c in local} == {(16, 16)}
    assert {(c.local_batch, c.local_steps) for c in mini} == {(256, 1)}
    assert {lab["B_glob"] for lab in labels} == {2048}
    # the tricks' lr factor is the paper's: K * B_loc / base_batch with both scaled
    tricked = [c for c in mini if c.scale_lr]
    assert tricked[0].local_batch / tricked[0].base_batch == 2048 / 128


def test_a_batch_scale_that_leaves_no_whole_batch_is_one_line():
    with pytest.raises(ValueError, match="whole batch"):
        grid.scaled_batch(128, 0.3)
    with pytest.raises(ValueError, match="whole batch"):
        table01.table01_configs(TrainConfig(local_batch=16), [100], [0], warmup_epochs=0.0,
                                batch_scale=0.125)
    assert grid.base_config(SimpleNamespace(B_loc=128)).local_batch == 128  # no batch_scale: as given


def test_base_config_scales_b_loc_and_passes_resolution_and_packing():
    P = SimpleNamespace(B_loc=128, batch_scale=0.125, resolution=16, packed=True,
                        batched=True, n_train=6250)
    cfg = grid.base_config(P)
    assert (cfg.local_batch, cfg.resolution, cfg.packed) == (16, 16, True)


def test_long_entries_build_the_modes_cpu_configurations():
    (entry,) = [e for e in campaign.LONG_ENTRIES if e.id == "long-table01"]
    cfgs = campaign.entry_configs(entry, ROOT / "notebooks")
    assert len(cfgs) == 12 and {c.device for c in cfgs} == {"cpu"}
    assert {c.resolution for c in cfgs} == {16} and {c.packed for c in cfgs} == {True}
    # two packs: B_loc 16 and mini-batch SGD's 256 cannot share one
    assert sorted(len(p) for p in campaign.pack_configs(cfgs, 32)) == [6, 6]
    assert campaign._rate(cfgs[0], 12, "H100", {}) == campaign.CPU_RATE


def test_an_entry_of_another_mode_is_refused_in_one_line(capsys):
    assert campaign.main(["--mode", "long", "--only", "table01-2048", "--plan"]) == 2
    assert "no long-mode campaign entry" in capsys.readouterr().err


def test_long_mode_is_a_proxy_mode_with_its_own_folder():
    assert "long" in notebook.MODES and "long" in notebook.PROXY_MODES
    assert "resolution" in grid.WORK_KEYS  # runs at other sides never pool their compute


def test_rows_under_figures_long_are_the_long_proxys(tmp_path):
    for name in ("long", "converged"):
        folder = tmp_path / name
        folder.mkdir()
        # a digest of 12 decimal digits stays text (it once read back as a number)
        pd.DataFrame([{"artifact": "Table 1", "setting": "s", "metric": "m", "value": 1.0,
                       "claim": "c", "verdict": "held: x", "mode": name, "scale": name,
                       "runs": "012345678901"}]).to_csv(folder / "t.compare.csv", index=False)
    rows = ledger.verdict_rows(tmp_path)
    assert sorted(rows["scale"]) == [ledger.CONVERGED, ledger.LONG]
    assert set(rows["runs"]) == {"012345678901"}
