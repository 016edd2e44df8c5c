"""`localsgd campaign` (localsgd.paper.campaign) at toy size on a CPU: it trains a claim's runs
in packs, keeps each run where `localsgd reproduce` reads it, skips kept runs the next time,
leaves a cut-off pack's checkpoint, prices the whole campaign in GPU stints, and the render
command draws the figure from the kept runs without training."""

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from localsgd.paper import campaign
from localsgd.paper.experiments import grid

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
# Table 5's smoke grid: two models (each its own pack) x H = 1, 8 (one pack each)
SMOKE = campaign.Entry("t5-smoke", "Table 5 at smoke size", "table05_models", mode="smoke",
                       sets={"datasets": ["cifar10"], "batched": "auto"})


@pytest.fixture()
def cifar():
    if not os.environ.get("LOCALSGD_DATA"):
        pytest.skip("CIFAR-10 not available locally (set LOCALSGD_DATA); CI provides it")


def test_runs_are_packed_kept_and_not_trained_twice(tmp_path, cifar):
    said = []
    done = campaign.run(5.0, notebooks=NOTEBOOKS, figures=tmp_path, entries=[SMOKE],
                        progress=False, say=said.append)
    cfgs = campaign.entry_configs(SMOKE, NOTEBOOKS)
    folder = campaign.runs_folder(tmp_path, "smoke")
    assert len(done["kept"]) == len(cfgs) == 4 and not done["cut"]
    assert all(grid.find_kept(c, folder) is not None for c in cfgs)
    assert sum("a pack of 2 runs" in line for line in said) == 2  # H = 1 and 8 share a pack
    import json

    meta = json.loads(Path(done["kept"][0]).with_suffix(".json").read_text())
    assert meta["pack"]["runs"] == 2 and meta["results_version"] >= 1
    assert not list((folder / "packs").glob("*.ckpt.pt"))  # finished packs leave none
    again = campaign.run(5.0, notebooks=NOTEBOOKS, figures=tmp_path, entries=[SMOKE],
                         progress=False, say=said.append)
    assert again["kept"] == [] and again["left"] == 0


def test_the_render_draws_from_the_kept_runs_without_training(tmp_path, cifar, fresh_cache):
    campaign.run(5.0, notebooks=NOTEBOOKS, figures=tmp_path, entries=[SMOKE], progress=False,
                 say=lambda _: None)
    env = {**os.environ, "LOCALSGD_RUNS": str(campaign.runs_folder(tmp_path, "smoke")),
           "LOCALSGD_CACHE": str(fresh_cache("empty-cache")), "MPLBACKEND": "Agg"}
    out = tmp_path / "render"
    proc = subprocess.run(
        [sys.executable, "-m", "localsgd", "reproduce", "--mode", "smoke", "--only",
         "table05_models", "--set", 'datasets=["cifar10"]', "--set", 'batched="auto"',
         "--out-dir", str(out),
         "--build-dir", str(tmp_path / "build"), "--no-report"],
        env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert (out / "table05_models.png").is_file()
    assert "training" not in proc.stdout.replace("training images", "")  # every run read back
    assert proc.stdout.count("read from the cache") == 4, proc.stdout[-3000:]


def test_a_pack_cut_off_by_the_budget_leaves_its_checkpoint(tmp_path, monkeypatch, cifar):
    from localsgd.training import packs as tr

    def out_of_time(cfgs, *, checkpoint_path, **_):
        checkpoint_path.write_bytes(b"a checkpoint")
        raise tr.OutOfTime(checkpoint_path, 3, 10)

    monkeypatch.setattr(tr, "train_runs", out_of_time)
    said = []
    done = campaign.run(5.0, notebooks=NOTEBOOKS, figures=tmp_path, entries=[SMOKE],
                        progress=False, say=said.append)
    assert len(done["cut"]) == 2 and done["kept"] == []
    assert all(Path(p).is_file() for p in done["cut"])
    assert any("cut off at update 3 of 10" in line for line in said)
    # the budget spent before a pack starts: it is left for the next one, not started
    done = campaign.run(0.0, notebooks=NOTEBOOKS, figures=tmp_path, entries=[SMOKE],
                        progress=False, say=said.append)
    assert done["left"] == 4 and done["cut"] == []


def test_the_plan_prices_every_entry_in_stints():
    rows = campaign.plan(NOTEBOOKS, ROOT / "figures", "NVIDIA H200")
    assert [r["claim"] for r in rows] == [e.claim for e in campaign.ENTRIES]
    by = {r["claim"]: r for r in rows}
    assert by["Table 1 at B_glob 2,048"]["runs"] == 12  # 2 methods x 2 trick settings x 3 seeds
    assert by["Table 3's lr: 8x2, H = 1, H^b = 16, lr 0.1"]["runs"] == 1
    for r in rows:
        assert r["kept"] <= r["runs"]
        stint = campaign.STINT_MIN - campaign.STARTUP_MIN
        if r["packs"]:  # the fewest stints that hold its minutes (shown to 0.1 min)
            assert r["stints"] >= 1
            assert (r["stints"] - 1) * stint < r["gpu_minutes"] + 0.05
            assert r["gpu_minutes"] - 0.05 <= r["stints"] * stint
        else:
            assert r["stints"] == 0 and r["gpu_minutes"] == 0
    text = campaign.format_plan(rows, "NVIDIA H200")
    assert "15-minute stints" in text and text.splitlines()[-1].startswith("TOTAL")


def test_packs_group_runs_that_may_share_one():
    cfgs = campaign.entry_configs(campaign.ENTRIES[2], NOTEBOOKS)  # Table 1 at 2,048
    packs = campaign.pack_configs(cfgs, max_replicas=32)
    # local SGD (B_loc 128) and mini-batch SGD (B_loc 2,048) cannot share: two packs of 6
    assert sorted(len(p) for p in packs) == [6, 6]
    assert {p[0].local_batch for p in packs} == {128, 2048}
    assert [len(p) for p in campaign.pack_configs(cfgs, max_replicas=4)] == [2, 2, 2, 2, 2, 2]


def test_render_commands_quote_their_values():
    cmds = campaign.render_commands(campaign.ENTRIES[:3])
    assert cmds[0] == ("localsgd reproduce --mode paper --only table03_topologies --set "
                       "'topologies=[\"8x2\"]' --set 'H_Hbs=[[1, 16]]' --set n_seeds=1 "
                       "--out-dir figures/paper/campaign/table03-8x2-lr --no-report")
    assert "--set tricks=true --set warmup_epochs=5.0" in cmds[1]
    ids = [e.id for e in campaign.ENTRIES]
    assert len(ids) == len(set(ids))


def test_unknown_entry_ids_fail_in_one_line(capsys):
    assert campaign.main(["--plan", "--only", "table99"]) == 2
    assert "no paper-mode campaign entry ['table99']" in capsys.readouterr().err
    frame = pd.DataFrame(campaign.plan(NOTEBOOKS, ROOT / "figures", "NVIDIA H200",
                                       entries=[campaign.ENTRIES[0]]))
    assert frame["runs"].tolist() == [1]


def test_an_entry_asking_for_the_sequential_engine_is_refused_in_one_line():
    # a pack runs the batched engine: keeping the run under batched: false would misname it
    entry = campaign.Entry("t5-seq", "Table 5, sequential", "table05_models", mode="smoke",
                           sets={"datasets": ["cifar10"], "batched": False})
    with pytest.raises(ValueError, match="set batched: auto in notebooks/params/table05_models/"
                                         "smoke.yaml"):
        campaign.entry_configs(entry, NOTEBOOKS)
    # every entry of the campaign asks for what its packs run, on the device reproduce asks for
    for e in campaign.ENTRIES:
        assert {c.device for c in campaign.entry_configs(e, NOTEBOOKS)} == {"cuda"}, e.id
