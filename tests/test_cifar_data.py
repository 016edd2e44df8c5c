"""Image data (§4.1): CIFAR loading and caching, ImageNet folders, the §4.2.1 partition, and
batched augmentation. Real CIFAR-10 is used only when ``$LOCALSGD_DATA`` provides it."""

from __future__ import annotations

import dataclasses
import io
import os
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from localsgd import data, paths
from localsgd.paper import results


def _shared_cifar10() -> Path | None:
    """The CIFAR-10 copy ``$LOCALSGD_DATA`` provides (read before tests isolate the environment)."""
    if not os.environ.get("LOCALSGD_DATA"):
        return None
    folder = data.data_dirs()[0]
    return next((p for p in data._cifar_candidates("cifar10", folder) if p.exists()), None)


SHARED_CIFAR10 = _shared_cifar10()


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """Empty cache, empty LOCALSGD_DATA: nothing can be found unless the test puts it there."""
    monkeypatch.setenv("LOCALSGD_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("LOCALSGD_DATA", str(tmp_path / "data"))
    (tmp_path / "data").mkdir()
    return tmp_path


def _jpeg(value: tuple[int, int, int], size: int = 32) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (size, size), value).save(buf, format="JPEG", quality=95)
    return buf.getvalue()


def _colour(c: int) -> tuple[int, int, int]:
    return (10 + 2 * c, 200 - c, 128)  # a class's label can be read back from its red channel


def _tiny_cifar100_files(n_train: int = 3, n_test: int = 1) -> dict[str, bytes]:
    """A CIFAR-100-shaped image-folder copy: 100 class folders of solid-colour 32×32 JPEGs."""
    files = {}
    for c in range(100):
        for split, n in (("train", n_train), ("test", n_test)):
            for i in range(n):
                files[f"{split}/class{c:03d}/{i:04d}.jpg"] = _jpeg(_colour(c))
    return files


def _write_tar(path: Path, files: dict[str, bytes], prefix: str = "") -> Path:
    with tarfile.open(path, "w:gz") as tf:
        for name, blob in files.items():
            info = tarfile.TarInfo(prefix + name)
            info.size = len(blob)
            tf.addfile(info, io.BytesIO(blob))
    return path


@pytest.fixture
def tiny_cifar100(isolated):
    """``$LOCALSGD_DATA/cifar100-jpeg.tar.gz`` (members under a ``cifar100-jpeg/`` prefix)."""
    files = _tiny_cifar100_files()
    return _write_tar(isolated / "data" / "cifar100-jpeg.tar.gz", files, prefix="cifar100-jpeg/")


# ---------------------------------------------------------------------------------- refactor
def test_folder_helpers_live_in_paths():
    assert data.cache_dir is paths.cache_dir and data.data_dirs is paths.data_dirs
    assert results.atomic_path is paths.atomic_path


# ---------------------------------------------------------------------------------- real CIFAR-10
@pytest.mark.skipif(SHARED_CIFAR10 is None,
                    reason="no CIFAR-10 copy in $LOCALSGD_DATA (CI sets it to the shared data)")
def test_real_cifar10_loads_validates_and_caches(slowdown):
    # one test on purpose: the first load decodes 60,000 JPEGs (~7 s), the rest reuse it
    ds = data.load_cifar("cifar10", download=False)
    assert str(SHARED_CIFAR10) in ds.source
    assert ds.train_x.shape == (50_000, 3, 32, 32) and ds.train_x.dtype == torch.uint8
    assert ds.test_x.shape == (10_000, 3, 32, 32) and ds.test_x.dtype == torch.uint8
    assert ds.train_y.dtype == torch.int64 and ds.test_y.dtype == torch.int64
    assert ds.classes == list(data.CIFAR10_CLASSES)
    assert torch.bincount(ds.train_y).tolist() == [5_000] * 10
    assert torch.bincount(ds.test_y).tolist() == [1_000] * 10
    assert ds.mean == pytest.approx((0.4913, 0.4821, 0.4465), abs=5e-4)
    assert ds.std == pytest.approx((0.245, 0.243, 0.261), abs=2e-3)

    start = time.perf_counter()
    again = data.load_cifar("cifar10", download=False)
    seconds = time.perf_counter() - start
    assert "decoded cache" in again.source
    assert seconds < 2.0 * slowdown, f"cached load took {seconds:.2f} s (typically ~0.15 s)"
    assert torch.equal(again.train_x, ds.train_x) and torch.equal(again.test_y, ds.test_y)
    assert again.mean == ds.mean and again.classes == ds.classes


# ---------------------------------------------------------------------------------- tiny copies
def test_tiny_cifar100_tarball_loads_and_caches(tiny_cifar100):
    with pytest.raises(ValueError, match="300 train / 100 test images.*incomplete"):
        data.load_cifar("cifar100", download=False)  # the real counts are checked by default
    ds = data.load_cifar("cifar100", download=False, expected_counts=None)
    assert ds.name == "cifar100" and str(tiny_cifar100) in ds.source
    assert ds.train_x.shape == (300, 3, 32, 32) and ds.test_x.shape == (100, 3, 32, 32)
    assert ds.classes == [f"class{c:03d}" for c in range(100)]
    assert torch.bincount(ds.train_y).tolist() == [3] * 100
    # class folders sort into label order: every image's colour encodes its own label
    red = ds.train_x[:, 0].float().mean(dim=(1, 2))
    assert torch.allclose(red, 10 + 2 * ds.train_y.float(), atol=3)
    assert ds.mean[2] == pytest.approx(128 / 255, abs=0.01)

    again = data.load_cifar("cifar100", download=False, expected_counts=None)
    assert "decoded cache" in again.source and str(data.cache_dir() / "cifar") in again.source
    assert torch.equal(again.train_x, ds.train_x) and again.std == ds.std


def test_image_folder_copy_equals_tarball(isolated):
    files = _tiny_cifar100_files(n_train=1, n_test=1)
    for name, blob in files.items():
        (isolated / "data" / "cifar100-jpeg" / name).parent.mkdir(parents=True, exist_ok=True)
        (isolated / "data" / "cifar100-jpeg" / name).write_bytes(blob)
    from_folder = data.load_cifar("cifar100", download=False, expected_counts=None)
    assert from_folder.source.endswith("cifar100-jpeg")
    _write_tar(isolated / "tiny.tar", files)
    os.rename(isolated / "data" / "cifar100-jpeg", isolated / "folder")
    os.rename(isolated / "tiny.tar", isolated / "data" / "cifar100-jpeg.tar")
    from_tar = data.load_cifar("cifar100", download=False, expected_counts=None)
    assert from_tar.source.endswith("cifar100-jpeg.tar")
    assert torch.equal(from_tar.train_x, from_folder.train_x)
    assert torch.equal(from_tar.test_y, from_folder.test_y)


@pytest.mark.parametrize("part", ["images", "meta"])
@pytest.mark.parametrize("damage", ["truncate", "flip a byte", "garbage"])
def test_corrupt_cache_is_decoded_again(tiny_cifar100, part, damage):
    ds = data.load_cifar("cifar100", expected_counts=None)
    (meta,) = (data.cache_dir() / "cifar").glob("cifar100-jpeg-*.npz")
    target = meta.with_suffix(".images.npy") if part == "images" else meta
    blob = bytearray(target.read_bytes())
    if damage == "truncate":
        blob = blob[: len(blob) // 2]
    elif damage == "flip a byte":
        blob[-len(blob) // 3] ^= 0xFF  # inside the pixels / inside a zip member
    else:
        blob = bytearray(b"not an array file")
    target.write_bytes(bytes(blob))
    with pytest.warns(UserWarning, match="corrupt or invalid decoded cache"):
        redone = data.load_cifar("cifar100", expected_counts=None)
    assert "decoded cache" not in redone.source
    assert torch.equal(redone.train_x, ds.train_x) and torch.equal(redone.test_y, ds.test_y)
    assert "decoded cache" in data.load_cifar("cifar100", expected_counts=None).source


def test_torchvision_pickle_layout(isolated, monkeypatch):
    """A (tiny) ``cifar-10-batches-py/`` in torchvision's format: rows are R, G, B planes."""
    import pickle

    import torchvision.datasets.cifar as tv_cifar

    monkeypatch.setattr(tv_cifar, "check_integrity", lambda *a, **k: True)  # md5s are of the real
    folder = isolated / "data" / "cifar-10-batches-py"
    folder.mkdir()
    rows = np.random.default_rng(0).integers(0, 256, (12, 3 * 32 * 32), dtype=np.uint8)
    files = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for i, fname in enumerate(files):
        entry = {"data": rows[2 * i: 2 * i + 2], "labels": [i, 9 - i]}
        (folder / fname).write_bytes(pickle.dumps(entry))
    (folder / "batches.meta").write_bytes(pickle.dumps({"label_names": list(data.CIFAR10_CLASSES)}))
    ds = data.load_cifar("cifar10", download=False, expected_counts=None)
    assert ds.source == f"torchvision pickles {folder}"
    assert torch.equal(ds.train_x, torch.from_numpy(rows[:10]).view(10, 3, 32, 32))
    assert torch.equal(ds.test_x, torch.from_numpy(rows[10:]).view(2, 3, 32, 32))
    assert ds.train_y.tolist() == [0, 9, 1, 8, 2, 7, 3, 6, 4, 5] and ds.test_y.tolist() == [5, 4]
    assert ds.classes == list(data.CIFAR10_CLASSES)
    again = data.load_cifar("cifar10", download=False, expected_counts=None)
    assert "decoded cache" in again.source and "cifar10-pickle-" in again.source


def test_corrupt_archive_is_a_clear_error(isolated):
    good = _write_tar(isolated / "good.tar.gz", _tiny_cifar100_files(n_train=1, n_test=1))
    bad = isolated / "data" / "cifar100-jpeg.tar.gz"
    bad.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(ValueError, match="cifar100-jpeg.tar.gz: corrupt or truncated archive"):
        data.load_cifar("cifar100", expected_counts=None)


def test_wrong_image_size_is_a_clear_error(isolated):
    files = {"train/a/0.jpg": _jpeg((1, 2, 3)), "train/b/0.jpg": _jpeg((1, 2, 3), size=28),
             "test/a/0.jpg": _jpeg((1, 2, 3))}
    _write_tar(isolated / "data" / "cifar10-jpeg.tar.gz", files)
    with pytest.raises(ValueError, match="train/b/0.jpg is"):
        data.load_cifar("cifar10", expected_counts=None)


def test_missing_cifar_names_what_and_where(isolated, monkeypatch):
    with pytest.raises(FileNotFoundError) as err:
        data.load_cifar("cifar10", download=False)
    msg = str(err.value)
    assert "LOCALSGD_DATA" in msg and "downloads are disabled" in msg
    assert "cifar10-jpeg.tar.gz" in msg and "cifar-10-batches-py" in msg
    assert str(isolated / "data") in msg

    def offline(name, root):
        raise OSError("network is unreachable")

    monkeypatch.setattr(data.cifar, "_torchvision_download", offline)
    with pytest.raises(FileNotFoundError, match="download failed: network is unreachable"):
        data.load_cifar("cifar100")


def test_decoded_cache_serves_when_source_is_gone(tiny_cifar100):
    ds = data.load_cifar("cifar100", expected_counts=None)
    tiny_cifar100.unlink()
    again = data.load_cifar("cifar100", download=False, expected_counts=None)
    assert "decoded cache" in again.source and torch.equal(again.train_y, ds.train_y)


# ---------------------------------------------------------------------------------- by name
def test_load_image_dataset_dispatches_by_name(isolated):
    syn = data.load_image_dataset("synthetic", n_train=40, n_test=20, seed=1)
    assert syn.name == "synthetic" and syn.train_x.shape == (40, 3, 32, 32)
    default = data.load_image_dataset("synthetic")
    assert (len(default.train_y), len(default.test_y)) == data.SYNTHETIC_COUNTS
    assert default.num_classes == 10 and default.test_x.shape[1:] == (3, 32, 32)
    # a missing real data set is an error, never a silent synthetic stand-in
    with pytest.raises(FileNotFoundError, match="LOCALSGD_DATA"):
        data.load_image_dataset("cifar10", download=False)
    with pytest.raises(ValueError, match="cifar10, cifar100, synthetic, imagenet"):
        data.load_image_dataset("mnist")


def test_synthetic_is_deterministic_balanced_and_learnable():
    ds = data.synthetic_image_dataset(400, 200, num_classes=4, image_size=16, seed=3)
    same = data.synthetic_image_dataset(400, 200, num_classes=4, image_size=16, seed=3)
    assert torch.equal(ds.train_x, same.train_x) and torch.equal(ds.test_y, same.test_y)
    assert not torch.equal(ds.train_x, data.synthetic_image_dataset(400, 200, 4, 16, 4).train_x)
    assert torch.bincount(ds.train_y).tolist() == [100] * 4
    # a linear model on augmented batches: the loss falls well below chance level (ln 4)
    torch.manual_seed(0)
    model = torch.nn.Linear(3 * 16 * 16, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    aug, g = data.Augment(ds.mean, ds.std), torch.Generator().manual_seed(0)
    for step in range(60):
        idx = torch.randint(0, 400, (64,), generator=g)
        loss = torch.nn.functional.cross_entropy(model(aug(ds.train_x[idx], g).flatten(1)),
                                                 ds.train_y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        logits = model(data.normalize(ds.test_x, ds.mean, ds.std).flatten(1))
    assert torch.nn.functional.cross_entropy(logits, ds.test_y) < 0.5 * np.log(4)


# ---------------------------------------------------------------------------------- subset
def test_subset_is_balanced_and_deterministic():
    ds = data.synthetic_image_dataset(1000, 300, num_classes=10, image_size=8)
    sub = ds.subset(105, 30, seed=7)
    counts = torch.bincount(sub.train_y, minlength=10)
    assert len(sub.train_y) == 105 and counts.max() - counts.min() == 1 and counts.min() == 10
    assert torch.bincount(sub.test_y, minlength=10).tolist() == [3] * 10
    again = ds.subset(105, 30, seed=7)
    assert torch.equal(sub.train_x, again.train_x) and torch.equal(sub.test_y, again.test_y)
    assert not torch.equal(ds.subset(105, 30, seed=8).train_x, sub.train_x)
    assert sub.mean == ds.mean and sub.classes == ds.classes and "subset" in sub.source
    # picked images are real members of the parent, and None keeps a split whole
    whole_test = ds.subset(50, None)
    assert torch.equal(whole_test.test_x, ds.test_x) and len(whole_test.train_y) == 50
    with pytest.raises(ValueError, match="subset of 1010 from 1000"):
        ds.subset(1010, None)
    skewed = dataclasses.replace(ds, train_x=ds.train_x[:4], train_y=torch.tensor([0, 0, 0, 1]),
                                 classes=ds.classes[:2], test_x=ds.test_x[:0],
                                 test_y=ds.test_y[:0])
    with pytest.raises(ValueError, match="class 1 would need 2 and has 1"):
        skewed.subset(4, None)


# ---------------------------------------------------------------------------------- partition
def test_partition_disjoint_complete_and_reshuffled_per_epoch():
    n, k = 1003, 4
    p = data.partition(n, k, epoch=0, seed=5)
    assert p.shape == (k, n // k) and p.dtype == torch.int64
    flat = p.flatten()
    assert len(torch.unique(flat)) == len(flat) == n - n % k  # disjoint; the remainder sits out
    assert flat.min() >= 0 and flat.max() < n
    assert torch.equal(p, data.partition(n, k, epoch=0, seed=5))  # every worker computes the same
    assert not torch.equal(p, data.partition(n, k, epoch=1, seed=5))  # reshuffled every epoch
    assert not torch.equal(p, data.partition(n, k, epoch=0, seed=6))
    # over epochs every sample is seen (the dropped remainder changes from epoch to epoch)
    seen = torch.cat([data.partition(n, k, e, 5).flatten() for e in range(10)])
    assert len(torch.unique(seen)) == n
    assert data.partition(8, 1, 0, 0).shape == (1, 8)
    with pytest.raises(ValueError, match="world_size"):
        data.partition(3, 4, 0, 0)


# ---------------------------------------------------------------------------------- augmentation
MEAN, STD = (0.5, 0.4, 0.3), (0.25, 0.2, 0.3)


def _images(b: int = 48, h: int = 8, w: int = 10) -> torch.Tensor:
    return torch.randint(1, 256, (b, 3, h, w), dtype=torch.uint8, generator=torch.Generator())


def test_normalize_matches_manual():
    x = _images()
    manual = (x.double() / 255 - torch.tensor(MEAN).view(1, 3, 1, 1)) / torch.tensor(STD).view(
        1, 3, 1, 1)
    out = data.normalize(x, MEAN, STD)
    assert out.dtype == torch.float32 and out.shape == x.shape
    torch.testing.assert_close(out.double(), manual, atol=1e-5, rtol=0)
    with pytest.raises(TypeError, match="uint8"):
        data.normalize(x.float(), MEAN, STD)


def test_augment_shape_dtype_and_determinism():
    x = _images()
    aug = data.Augment(MEAN, STD, pad=4)
    out = aug(x, torch.Generator().manual_seed(0))
    assert out.shape == x.shape and out.dtype == torch.float32
    assert torch.equal(out, aug(x, torch.Generator().manual_seed(0)))
    assert not torch.equal(out, aug(x, torch.Generator().manual_seed(1)))
    plain = data.Augment(MEAN, STD, pad=0, flip=False)(x, torch.Generator().manual_seed(0))
    assert torch.equal(plain, data.normalize(x, MEAN, STD))


def test_augment_crops_and_flips_like_the_reference():
    """Each output is one of the (2p+1)² zero-padded crops, maybe flipped; several occur."""
    x, p = _images(b=64), 4
    h, w = x.shape[2:]
    out = data.Augment((0.0, 0.0, 0.0), (1 / 255,) * 3, pad=p)(x, torch.Generator().manual_seed(2))
    out = out.round().to(torch.uint8)  # undo the normalization: (x / 255 - 0) * 255
    padded = torch.nn.functional.pad(x, (p, p, p, p))
    seen = set()
    for i in range(len(x)):
        crops = {(dy, dx): padded[i, :, dy:dy + h, dx:dx + w]
                 for dy in range(2 * p + 1) for dx in range(2 * p + 1)}
        matches = [(dy, dx, f) for (dy, dx), crop in crops.items() for f in (False, True)
                   if torch.equal(out[i], crop.flip(-1) if f else crop)]
        assert matches, f"image {i} is not a padded crop (or its mirror) of the input"
        seen.update(matches)
    assert {f for _, _, f in seen} == {False, True}
    assert len({(dy, dx) for dy, dx, _ in seen}) > 10  # pixels actually moved, in many ways


# ---------------------------------------------------------------------------------- ImageNet
def _image_tree(root: Path, classes=("n01440764", "n01443537"), per_class: int = 2) -> Path:
    for split in ("train", "val"):
        for c, wnid in enumerate(classes):
            (root / split / wnid).mkdir(parents=True)
            for i in range(per_class):
                Image.new("RGB", (64, 64), (40 * c, 10 * i, 90)).save(
                    root / split / wnid / f"{i}.png")
    return root


def test_imagenet_folders_on_a_tiny_tree(isolated):
    _image_tree(isolated / "data" / "imagenet")
    folders = data.imagenet_folders()  # found through $LOCALSGD_DATA/imagenet
    train, val = folders.train, folders.val
    assert len(train) == len(val) == 4 and train.classes == ["n01440764", "n01443537"]
    x, y = train[3]
    assert x.shape == (3, 224, 224) and x.dtype == torch.uint8 and y == 1
    xv, _ = val[0]
    assert xv.shape == (3, 224, 224)
    # val is deterministic (resize + centre crop): a constant image stays constant; normalized
    # (on the training device) with ImageNet's statistics
    assert torch.equal(xv, torch.tensor([0, 0, 90], dtype=torch.uint8).view(3, 1, 1).expand_as(xv))
    expected = (torch.tensor([0, 0, 90]) / 255 - torch.tensor(data.IMAGENET_MEAN)) / torch.tensor(
        data.IMAGENET_STD)
    got = data.normalize(xv[None], folders.mean, folders.std)[0].mean(dim=(1, 2))
    torch.testing.assert_close(got, expected.float(), atol=1e-6, rtol=0)
    small = data.load_image_dataset("imagenet", root=isolated / "data" / "imagenet", image_size=32,
                                    resize=40)
    assert small.train[0][0].shape == (3, 32, 32)


def test_imagenet_missing_names_layout(isolated):
    with pytest.raises(FileNotFoundError, match=r"train/<wnid>/\*\.JPEG.*LOCALSGD_DATA"):
        data.imagenet_folders()
    with pytest.raises(FileNotFoundError, match="nowhere"):
        data.imagenet_folders(isolated / "nowhere")
