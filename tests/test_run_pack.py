"""Run packing (localsgd.training.packs, localsgd.engines.run_pack): R runs trained as one stack of
R·K replicas give each run, bitwise, the records it gets trained alone on the batched engine
(the same arithmetic: vmap, or channel-packed; float64 on a CPU), for every schedule kind of the
paper's grids (the batched engine equals the sequential one: tests/test_batched_paper_kinds.py);
a run that diverges leaves the others alone; a pack cut off resumes bitwise."""

import dataclasses
import math

import golden_records as golden
import pandas as pd
import pytest
import torch

from localsgd import data
from localsgd.training.config import TrainConfig
from localsgd.training.loop import RunLimit, train
from localsgd.training.packs import check_packable, train_runs

# the golden runs' configurations: every schedule kind, two packs (K = 2 and K = 4)
K2 = ["local_tricks", "post_local", "local_step_warmup", "global_momentum"]
K4 = ["hierarchical_hybrid", "block_gradient_allreduce", "slowmo", "sgp_slowmo"]
COLUMNS = [c for c in golden.RESULT_COLUMNS if c not in ("train_images", "test_images")]


def _configs(names: list[str], **over) -> list[TrainConfig]:
    # each run its own seed (a shared stream would show as equal runs); augmented, so each
    # run's augmentation streams are tested too (the data is a pack's shared field)
    return [dataclasses.replace(golden.config(n), seed=10 + i, batched=False, augment=True,
                                **over) for i, n in enumerate(names)]


def _dataset():
    return data.load_image_dataset("synthetic").subset(128, 32, seed=0)


@pytest.fixture(autouse=True)
def _one_thread():
    # bitwise equality needs one intra-op thread: a pack's tensors are larger than a run's
    # alone, and with more threads torch splits a reduction by its size (CI runs with one)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _alone(cfg: TrainConfig) -> pd.DataFrame:
    """``cfg`` trained alone (its ``batched``/``packed`` as given)."""
    return train(cfg, dataset=_dataset(), progress=False)


def _assert_same(packed: pd.DataFrame, alone: pd.DataFrame, what: str, tol: float = 0.0):
    for col in COLUMNS:
        if col not in alone:
            continue
        a, b = packed[col].to_numpy(dtype=float), alone[col].to_numpy(dtype=float)
        same = (abs(a - b) <= tol * (1 + abs(b))) | (pd.isna(a) & pd.isna(b))
        assert same.all(), f"{what}: {col} packed {a.tolist()} alone {b.tolist()}"


@pytest.mark.parametrize("names", [K2, K4], ids=["K=2", "K=4"])
@pytest.mark.parametrize("packed", [False, True], ids=["vmap", "channel-packed"])
def test_each_run_of_a_pack_equals_the_run_alone(names, packed):
    cfgs = _configs(names)
    out = train_runs([dataclasses.replace(c, packed=packed) for c in cfgs], dataset=_dataset(),
                     progress=False)
    assert len(out) == len(cfgs)
    for name, cfg, rec in zip(names, cfgs, out, strict=True):
        alone = _alone(dataclasses.replace(cfg, batched=True, packed=packed))
        assert len(rec) == len(alone) and rec["seed"].iloc[0] == cfg.seed
        assert bool(rec["batched"].iloc[0]) and bool(rec["packed"].iloc[0]) == packed
        _assert_same(rec, alone, name)
    # the runs differ from each other (their own seeds, schedules): equality is not trivial
    assert out[0]["test_loss"].iloc[-1] != out[1]["test_loss"].iloc[-1]


def test_a_run_that_averages_its_momentum_does_so_inside_a_pack():
    # runs of one pack may differ in the state-sync policy; each keeps its own
    plain, averaged = _configs(K2[:2])
    averaged = dataclasses.replace(averaged, average_momentum=True)
    out = train_runs([plain, averaged], dataset=_dataset(), progress=False)
    for cfg, rec in zip((plain, averaged), out, strict=True):
        _assert_same(rec, _alone(dataclasses.replace(cfg, batched=True)), f"{cfg.seed}")
    off = _alone(dataclasses.replace(averaged, batched=True, average_momentum=False))
    assert out[1]["test_loss"].iloc[-1] != off["test_loss"].iloc[-1]  # the policy acted


def test_a_run_with_compressed_averages_keeps_them_inside_a_pack():
    exact, coded = _configs(K4[:2])  # hierarchical: a reference per level
    coded = dataclasses.replace(coded, average_compression="int8")
    out = train_runs([exact, coded], dataset=_dataset(), progress=False)
    for cfg, rec in zip((exact, coded), out, strict=True):
        _assert_same(rec, _alone(dataclasses.replace(cfg, batched=True)), f"{cfg.seed}")
    off = _alone(dataclasses.replace(coded, batched=True, average_compression="fp32"))
    assert out[1]["test_loss"].iloc[-1] != off["test_loss"].iloc[-1]  # the codes acted


def test_a_streaming_run_keeps_its_fragments_inside_a_pack():
    # streaming fragment sync (2 fragments, merged an update after launch, global momentum per
    # fragment) beside a run that averages whole models
    plain, streamed = _configs(["local_tricks", "global_momentum"])
    streamed = dataclasses.replace(streamed, fragments=2, overlap_steps=1, fragment_mixing=0.5,
                                   average_buffers=False)
    out = train_runs([plain, streamed], dataset=_dataset(), progress=False)
    for cfg, rec in zip((plain, streamed), out, strict=True):
        _assert_same(rec, _alone(dataclasses.replace(cfg, batched=True)), f"{cfg.seed}")
    off = _alone(dataclasses.replace(streamed, batched=True, fragments=0))
    assert out[1]["test_loss"].iloc[-1] != off["test_loss"].iloc[-1]  # the fragments acted


def test_a_diverging_run_leaves_the_others_unchanged():
    cfgs = _configs(K2[:3])
    wild = dataclasses.replace(cfgs[1], lr=1e8)  # diverges to NaN within an update or two
    with_wild = train_runs([cfgs[0], wild, cfgs[2]], dataset=_dataset(), progress=False)
    without = train_runs([cfgs[0], cfgs[2]], dataset=_dataset(), progress=False)
    assert with_wild[1]["train_loss"].isna().any() or not math.isfinite(
        with_wild[1]["test_loss"].iloc[-1])
    _assert_same(with_wild[0], without[0], "run 0")
    _assert_same(with_wild[2], without[1], "run 2")


def test_a_pack_cut_off_resumes_bitwise(tmp_path):
    cfgs = _configs(K4[:2])
    whole = train_runs(cfgs, dataset=_dataset(), progress=False)
    ckpt = tmp_path / "pack.pt"
    per_epoch = 128 // (4 * 4)
    first = train_runs(cfgs, dataset=_dataset(), progress=False, checkpoint_path=ckpt,
                       checkpoint_every=1, limit=RunLimit(updates=per_epoch))
    assert ckpt.is_file() and len(first[0]) < len(whole[0])
    rest = train_runs(cfgs, dataset=_dataset(), progress=False, checkpoint_path=ckpt)
    for a, b in zip(rest, whole, strict=True):
        _assert_same(a, b, "resumed")
    # another pack's checkpoint is refused in one line
    with pytest.raises(ValueError, match="holds another pack of runs"):
        train_runs(list(reversed(cfgs)), dataset=_dataset(), progress=False,
                   checkpoint_path=ckpt)


@pytest.mark.parametrize("content", ["garbled", [1, 2], {"format": -1, "pack": []},
                                     {"pack": "not a list"}])
def test_a_checkpoint_that_is_not_a_pack_is_refused_in_one_line(tmp_path, content):
    ckpt = tmp_path / "pack.pt"
    if content == "garbled":
        ckpt.write_bytes(b"not a torch file")
    else:
        torch.save(content, ckpt)
    with pytest.raises(ValueError, match="corrupt or not a pack checkpoint|is not a pack "
                                         "checkpoint") as err:
        train_runs(_configs(K4[:1]), dataset=_dataset(), progress=False, checkpoint_path=ckpt)
    assert "\n" not in str(err.value)


def test_runs_that_cannot_share_a_pack_say_why():
    a = golden.config("local_tricks")
    with pytest.raises(ValueError, match=r"run 1 cannot share a pack with run 0: local_batch = 8"):
        check_packable([a, dataclasses.replace(a, local_batch=8)])
    with pytest.raises(ValueError, match="world_size"):
        check_packable([a, dataclasses.replace(golden.config("hierarchical_hybrid"),
                                               augment=True)])
    with pytest.raises(ValueError, match="at least one"):
        check_packable([])
    check_packable([a, dataclasses.replace(a, seed=5, lr=0.3, local_steps=8, momentum=0.5)])


def test_a_pack_past_its_deadline_stops_at_an_epochs_end_and_resumes(tmp_path):
    import time

    from localsgd.training.packs import OutOfTime

    cfgs = _configs(K2[:2])
    whole = train_runs(cfgs, dataset=_dataset(), progress=False)
    ckpt = tmp_path / "pack.pt"
    with pytest.raises(OutOfTime) as stop:
        train_runs(cfgs, dataset=_dataset(), progress=False, checkpoint_path=ckpt,
                   deadline=time.monotonic() - 1)
    assert stop.value.update == 128 // (2 * 4) and stop.value.path == ckpt  # one epoch
    rest = train_runs(cfgs, dataset=_dataset(), progress=False, checkpoint_path=ckpt)
    for a, b in zip(rest, whole, strict=True):
        _assert_same(a, b, "resumed after the deadline")
    with pytest.raises(ValueError, match="deadline needs checkpoint_path"):
        train_runs(cfgs, dataset=_dataset(), progress=False, deadline=0.0)
