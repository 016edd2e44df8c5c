"""Streamed image-folder data (ImageNet's code path, §4.2.2): the loop reads PNG/JPEG folders
through DataLoader workers; crops are seeded per image, so runs repeat and resume bitwise."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest
import torch

from localsgd import data
from localsgd.training.config import TrainConfig
from localsgd.training.loop import train

TIMED = ("compute_seconds", "data_seconds", "wall_seconds")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    ds = data.synthetic_image_dataset(128, 32, num_classes=4, image_size=16, seed=0)
    root = data.write_image_folders(ds, tmp_path_factory.mktemp("f") / "synthetic")
    from torchvision import datasets

    train_tf, val_tf = data.folder_transforms(16, 18)
    return data.ImageFolders(datasets.ImageFolder(root / "train", train_tf),
                             datasets.ImageFolder(root / "val", val_tf), ds.mean, ds.std), ds


CFG = TrainConfig(dataset="cifar10_folder", model="resnet20", width=0.25, image_size=16,
                  world_size=2, local_batch=8, local_steps=2, epochs=2.0, lr=0.05,
                  loader_workers=0, local_step_warmup_epochs=1, eval_batch=16)


def _same(a: pd.DataFrame, b: pd.DataFrame) -> None:
    cols = [c for c in a.columns if c not in TIMED and c != "loader_workers"]
    pd.testing.assert_frame_equal(a[cols].reset_index(drop=True), b[cols].reset_index(drop=True),
                                  check_exact=True)


def test_folders_written_once_and_exactly(folders, tmp_path):
    f, ds = folders
    assert f.classes == ds.classes and len(f.train) == 128 and len(f.val) == 32
    # lossless: the PNG of training image 0 decodes to the in-memory pixels
    from PIL import Image

    path, label = f.train.samples[0]
    i = int(path.rsplit("/", 1)[1].split(".")[0])
    import numpy as np

    pixels = torch.from_numpy(np.array(Image.open(path))).permute(2, 0, 1)
    assert torch.equal(pixels, ds.train_x[i]) and label == int(ds.train_y[i])
    root = data.write_image_folders(ds, tmp_path / "again")
    stamp = (root / "COMPLETE").stat().st_mtime_ns
    assert data.write_image_folders(ds, root) == root  # complete: reused, not rewritten
    assert (root / "COMPLETE").stat().st_mtime_ns == stamp
    sub = data.balanced_folder_subset(f, 40, 8)
    counts = torch.bincount(torch.tensor([f.train.targets[i] for i in sub.train.indices]))
    assert counts.tolist() == [10, 10, 10, 10] and len(sub.val) == 8 and sub.classes == f.classes


def test_streamed_training_repeats_with_any_number_of_loader_workers(folders):
    f, _ = folders
    a = train(CFG, dataset=f, progress=False)
    # 128 / 2 / 8 = 8 updates per epoch: epoch 1 warms up with H = 1, epoch 2 runs H = 2
    assert a.step.tolist() == [8, 16] and a.sync_l0.tolist() == [8, 12]
    assert a.test_images.iloc[0] == 32 and a.test_acc.between(0, 100).all()
    b = train(dataclasses.replace(CFG, loader_workers=2), dataset=f, progress=False)
    _same(a, b)
    c = train(dataclasses.replace(CFG, seed=1), dataset=f, progress=False)
    assert a.train_loss.iloc[-1] != c.train_loss.iloc[-1]


def test_streamed_training_resumes_mid_epoch_bitwise(folders, tmp_path):
    f, _ = folders
    ref = train(CFG, dataset=f, progress=False)
    ckpt = tmp_path / "run.pt"

    def interrupt(t):
        if t == 11:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(CFG, dataset=f, progress=False, checkpoint_path=ckpt, on_step=interrupt)
    _same(ref, train(CFG, dataset=f, progress=False, checkpoint_path=ckpt))


def test_augmentation_is_a_function_of_seed_epoch_and_image(folders):
    f, _ = folders
    items = data.SeededItems(f.train, seed=3, epoch=1)
    before = torch.get_rng_state()
    x1, _ = items[5]
    assert torch.equal(torch.get_rng_state(), before)  # the training RNG is left alone
    assert torch.equal(items[5][0], x1)
    assert not torch.equal(data.SeededItems(f.train, seed=3, epoch=2)[5][0], x1)


def test_standin_streams_real_cifar_through_the_imagenet_pipeline():
    try:
        f = data.standin_folders("cifar10", 20, 10, image_size=24)
    except FileNotFoundError:
        pytest.skip("CIFAR-10 not available locally (set LOCALSGD_DATA); CI provides it")
    assert len(f.classes) == 10 and len(f.train) == 20 and len(f.val) == 10
    x, y = f.train[0]
    # uint8 from the loader, normalized on the device with CIFAR-10's own statistics
    assert x.shape == (3, 24, 24) and x.dtype == torch.uint8 and 0 <= y < 10
    assert f.val[0][0].shape == (3, 24, 24) and f.mean == load_cifar_stats()[0]


def load_cifar_stats():
    ds = data.load_cifar("cifar10")
    return ds.mean, ds.std


# The paper's ImageNet configuration (Fig. 8, notebooks/params/fig08_imagenet/paper.yaml): 224 px,
# K = 30, B_loc = 128, 8 loader workers. Before, one loader batch was K·B_loc float32 images
# (3,840 x 602 KB = 2.3 GB) and 8 workers x prefetch 4 held 32 of them (74 GB of shared memory).
PAPER = TrainConfig(dataset="cifar10_folder", model="resnet50", image_size=224, world_size=30,
                    local_batch=128, loader_workers=8, eval_batch=1000)
IN_FLIGHT_BOUND = 512 * 2**20  # bytes of loader batches in flight, all workers together


def test_paper_loader_batches_fit_host_memory():
    """One real loader batch of Figure 8's paper configuration, on the CIFAR stand-in at 224 px
    (no ImageNet here; the loader cannot tell: same transforms, same sizes): its host bytes are
    measured, and the in-flight total (workers x prefetch x batch) is bounded."""
    from localsgd.training.batch_sources import StreamedBatches

    try:
        f = data.standin_folders("cifar10", 256, 64, image_size=224)
    except FileNotFoundError:
        pytest.skip("CIFAR-10 not available locally (set LOCALSGD_DATA); CI provides it")
    cfg = dataclasses.replace(PAPER, loader_workers=2)  # two cores here; the bound uses 8
    source = StreamedBatches(f, cfg, torch.device("cpu"))
    k, b = PAPER.world_size, PAPER.local_batch
    parts = torch.randint(0, 256, (k, b), generator=torch.Generator().manual_seed(0))
    # the replica engine's view (all 30 workers in one process): 30 loader batches of B_loc
    plan = [parts[w].tolist() for w in range(k)]
    loader = source.loader(data.SeededItems(f.train, 0, 0), plan)
    it = iter(loader)
    x, y = next(it)
    batch_bytes = x.untyped_storage().nbytes() + y.untyped_storage().nbytes()
    assert x.shape == (b, 3, 224, 224) and x.dtype == torch.uint8
    assert batch_bytes == b * 3 * 224 * 224 + b * 8  # 19.3 MB: one worker's uint8 images
    in_flight = PAPER.loader_workers * source.PREFETCH * batch_bytes
    assert loader.prefetch_factor == source.PREFETCH and in_flight <= IN_FLIGHT_BOUND, in_flight
    del it
    # the training loop's call: one normalized float32 batch per worker of this process
    out = source.batches(parts, 0, 0, [0, 1], [torch.Generator()] * 2, b)
    assert [tuple(o[0].shape) for o in out] == [(b, 3, 224, 224)] * 2
    assert out[0][0].dtype == torch.float32 and torch.equal(out[0][1], y)
    expected = data.normalize(x, f.mean, f.std)  # seeded per image: the same crops again
    assert torch.equal(out[0][0], expected)
    # evaluation: 1,000 images at 224 px would be 600 MB of float32 input; capped at 445
    assert source.eval_batch_size() == 445
    assert source.eval_batch_size() * 3 * 224 * 224 * 4 <= source.EVAL_BATCH_BYTES
    small = StreamedBatches(f, dataclasses.replace(cfg, image_size=32), torch.device("cpu"))
    assert small.eval_batch_size() == 1000  # no cap at CIFAR's size


def test_config_errors():
    with pytest.raises(ValueError, match="dataset='imagenet21k'"):
        TrainConfig(dataset="imagenet21k")
    with pytest.raises(ValueError, match="loader_workers=-1"):
        TrainConfig(loader_workers=-1)
    with pytest.raises(ValueError, match="image_size=0"):
        TrainConfig(image_size=0)
