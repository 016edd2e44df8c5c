"""TrainConfig.resolution: in-memory images area-downsampled once when a run starts (the long
CPU proxy's lever), the crop's pad scaled with them, bad values refused in one line."""

from __future__ import annotations

import pytest
import torch

from localsgd import data
from localsgd.training.batch_sources import MemoryBatches, downsampled
from localsgd.training.config import TrainConfig
from localsgd.training.loop import train
from localsgd.training.results_key import results_key


@pytest.fixture(scope="module")
def synth32():
    return data.synthetic_image_dataset(64, 32, num_classes=4, image_size=32, seed=0)


def test_downsampled_images_are_each_blocks_mean(synth32):
    small = downsampled(synth32, 16)
    assert small.train_x.shape == (64, 3, 16, 16) and small.test_x.shape == (32, 3, 16, 16)
    assert small.train_x.dtype == torch.uint8
    blocks = synth32.train_x.float().reshape(64, 3, 16, 2, 16, 2).mean(dim=(3, 5))
    assert torch.equal(small.train_x, blocks.round().to(torch.uint8))
    assert torch.equal(small.train_y, synth32.train_y) and small.mean == synth32.mean
    assert "area-downsampled to 16x16" in small.source
    with pytest.raises(ValueError, match="only downsampling"):
        downsampled(synth32, 64)


def test_a_run_at_resolution_16_trains_on_16_pixel_images(synth32):
    cfg = TrainConfig(dataset="synthetic", model="resnet20", width=0.25, world_size=2,
                      local_batch=16, epochs=1.0, lr=0.1, n_test=32, resolution=16)
    source = MemoryBatches(synth32, cfg, torch.device("cpu"))
    assert tuple(source.train_x.shape[1:]) == (3, 16, 16) and source.augment.pad == 2
    assert MemoryBatches(synth32, TrainConfig(dataset="synthetic"),
                         torch.device("cpu")).augment.pad == 4
    rec = train(cfg, dataset=synth32, progress=False)
    assert len(rec) == 1 and rec.test_acc.between(0, 100).all()
    assert rec.resolution.iloc[0] == 16  # the records say what ran


def test_resolution_is_keyed_only_when_set_and_bad_values_fail_in_one_line():
    assert "resolution" not in results_key(TrainConfig())  # every kept run keeps its key
    assert results_key(TrainConfig(resolution=16))["resolution"] == 16
    for bad in (4, 0, True, 16.0):
        with pytest.raises(ValueError, match="resolution=.*must be null or an integer >= 8"):
            TrainConfig(resolution=bad)
    with pytest.raises(ValueError, match="for in-memory data sets only"):
        TrainConfig(dataset="imagenet", resolution=16)
    with pytest.raises(ValueError, match="model 'mlp' takes 3x32x32 images"):
        TrainConfig(model="mlp", resolution=16)  # refused at construction, not at the forward
    assert TrainConfig(model="mlp", resolution=32).resolution == 32


def test_a_side_that_does_not_divide_32_pools_overlapping_windows(synth32):
    from localsgd.training.batch_sources import downsampled

    small = downsampled(synth32, 24)
    assert small.train_x.shape[-2:] == (24, 24) and small.train_x.dtype == synth32.train_x.dtype
