"""Evaluation under torchrun: each process evaluates its shard of the test batches and the sums
are added up in batch order, so the result is bitwise the unsharded one (issue 32: with every
rank evaluating the whole test set, Figure 8's 30 ranks each read all 50 k validation images)."""

import torch
from torch import nn

from localsgd import data
from localsgd.distributed import spawn
from localsgd.training.batch_sources import combine_eval, eval_batches, evaluate
from localsgd.training.config import TrainConfig
from localsgd.training.loop import build_engine, train


def test_shards_add_up_bitwise_to_the_whole_test_set():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 5))
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 256, (103, 3, 8, 8), generator=g, dtype=torch.uint8)
    y = torch.randint(0, 5, (103,), generator=g)
    mean, std = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)
    whole = evaluate(model, x, y, mean, std, batch=10)
    for n in (1, 2, 3, 7, 11, 12):  # 11 batches: a shard may be empty
        shards = [eval_batches(model, x, y, mean, std, 10, shard=(i, n)) for i in range(n)]
        assert sum(len(s) for s in shards) == 11
        assert combine_eval(shards) == whole  # exactly: the same sums in the same order


def _dataset():
    return data.synthetic_image_dataset(64, 50, num_classes=4, image_size=8, seed=0)


CFG = TrainConfig(dataset="synthetic", model="resnet20", width=0.25, world_size=2,
                  local_batch=8, local_steps=2, epochs=1, eval_batch=10, augment=False)


def _eval_images_per_rank(rank, world):
    seen = []

    def count(module, args, out):  # the whole model's forward in eval mode: one test batch
        if type(module).__name__ == "ResNetCifar" and not module.training:
            seen.append(args[0].shape[0])

    handle = nn.modules.module.register_module_forward_hook(count)
    try:
        rec = train(CFG, dataset=_dataset(), progress=False,
                    engine=lambda c, n, k: build_engine(c, n, k, kind="ddp"))
    finally:
        handle.remove()
    return sum(seen), rec[["test_acc", "test_loss"]].values.tolist()


def test_each_rank_evaluates_its_shard_and_all_agree_with_one_process():
    (seen0, rec0), (seen1, rec1) = spawn(_eval_images_per_rank, 2)
    records = len(rec0)
    # 50 test images in 5 batches: rank 0 takes batches 0, 2, 4 and rank 1 batches 1, 3
    assert (seen0, seen1) == (30 * records, 20 * records)
    assert rec0 == rec1
    single = train(CFG, dataset=_dataset(), progress=False)  # the replica engine, one process
    assert single[["test_acc", "test_loss"]].values.tolist() == rec0
