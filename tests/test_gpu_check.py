"""`localsgd gpu-check` at toy size on the CPU: every part runs and writes what the plan reads."""

import csv
import json

import pytest
import torch

from localsgd.paper import gpu_plan
from localsgd.paper.cli import main as cli_main


def test_gpu_check_toy_on_cpu_writes_every_part_and_feeds_the_plan(tmp_path, capsys):
    out = tmp_path / "gpu"
    code = cli_main(["gpu-check", "--toy", "--device", "cpu", "--out", str(out),
                     "--only", "fig06_cifar10_local_sgd", "fig10_cifar100"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    doctor = json.loads((out / "doctor.json").read_text())
    assert {c["name"]: c["status"] for c in doctor["checks"]}["ReplicaEngine on cpu"] == "ok"
    sweep = list(csv.DictReader((out / "sweep.csv").read_text().splitlines()))
    # 3 precisions x 2 layouts x (one model at B and K*B, sequential replicas, batched ones
    # vmapped and packed, a pack of K / 2 runs of K = 2); on a GPU also the packed step
    # compiled in tf32 and bf16 (NCHW)
    assert len(sweep) == 36 and all(float(r["images_per_s"]) > 0 for r in sweep), sweep
    assert {r["configuration"] for r in sweep} == {
        "single_b4", "single_b8", "replica_k2_b4", "batched_k2_b4", "packed_k2_b4",
        "runpack_r1x2_b4"}
    loop = {r["notebook"]: r for r in csv.DictReader((out / "loop.csv").read_text().splitlines())}
    fig06 = loop["fig06_cifar10_local_sgd"]
    assert fig06["status"] == "ok" and int(fig06["updates"]) == 2
    assert int(fig06["train_images"]) == 2 * int(fig06["world_size"]) * 2  # 2 per worker (toy)
    assert float(fig06["compute_s"]) > 0 and float(fig06["images_per_s"]) > 0
    # CIFAR-100 is not on this machine: reported, not fatal, and never downloaded
    assert loop["fig10_cifar100"]["status"].startswith("skipped: FileNotFoundError")
    provenance = json.loads((out / "provenance.json").read_text())
    assert provenance["gpu"] == fig06["gpu"] and provenance["size"]["k"] == 2
    # the plan takes the loop's fp32 rows as measured throughputs for that device name
    measured = gpu_plan.measured_throughputs(out / "loop.csv")
    tp = measured[(fig06["gpu"], "resnet20")]
    assert tp.status == "measured" and tp.images_per_s == float(fig06["images_per_s"])
    items = gpu_plan.paper_items(gpu_plan.Path(__file__).parents[1] / "notebooks",
                                 ["fig06_cifar10_local_sgd"])
    text = gpu_plan.plan(items, fig06["gpu"], {**gpu_plan.THROUGHPUT, **measured}).format()
    assert "MEASURED throughputs" in text.splitlines()[0] and "[measured]" in text


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_gpu_check_says_in_one_line_that_there_is_no_gpu(tmp_path, capsys):
    assert cli_main(["gpu-check", "--device", "cuda", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --device cuda: ") and err.count("\n") == 1, err
    assert not (tmp_path / "o").exists()  # nothing written


def test_a_skipped_notebook_names_no_folder_of_the_machine():
    # the H200's loop.csv named the GPU machine's folders in its skip reasons
    from localsgd.paper.gpu_check import short_paths

    text = ("ImageNet not found (looked for train/ and val/ in /work/main/.gpu/data/imagenet, "
            "/tmp/lcache/imagenet). Lay it out as <root>/train/<wnid>/*.JPEG")
    assert short_paths(text) == ("ImageNet not found (looked for train/ and val/ in "
                                 ".../imagenet, .../imagenet). Lay it out as "
                                 "<root>/train/<wnid>/*.JPEG")
