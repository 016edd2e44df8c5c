"""The device / backend rule (localsgd.device), init_from_env's use of it, and the numerics
policy (localsgd.numerics) -- all with CUDA mocked: no GPU is needed or used."""

import json
import os

import pytest
import torch

from localsgd import device as D
from localsgd import distributed, numerics

GPU_COUNTS = (0, 1, 2, 8)


def _expect(device: str, torchrun: bool, local_rank: int, local_world: int, gpus: int):
    """The rule written out independently of `resolve`: (device str, backend) or an error key."""
    dev = torch.device(device)
    if dev.type == "cpu":
        return "cpu", "gloo"
    if gpus == 0:
        return "no-cuda"
    if torchrun and dev.index is not None and local_world > 1:
        return "explicit-index"
    if torchrun and dev.index is None and local_world > gpus:
        return "too-many-procs"
    index = dev.index if dev.index is not None else (local_rank if torchrun else 0)
    if index >= gpus:
        return "ordinal"
    return f"cuda:{index}", "nccl"


ERROR_WORDS = {  # each error names the problem and a fix
    "no-cuda": ("no CUDA GPU", "set device: cpu"),
    "explicit-index": ("would put every process on GPU", "use device 'cuda'"),
    "too-many-procs": ("processes per node but only", "--nproc-per-node"),
    "ordinal": ("GPU(s) are visible", "pick one of those"),
}


def _cases():
    for device in ("cpu", "cuda", "cuda:0", "cuda:1"):
        for gpus in GPU_COUNTS:
            yield device, False, 0, 1, gpus
            for local_world in (1, 2, 8, 16):
                for local_rank in sorted({0, local_world - 1}):
                    yield device, True, local_rank, local_world, gpus


@pytest.mark.parametrize("device,torchrun,local_rank,local_world,gpus", list(_cases()))
def test_rule_for_every_combination(device, torchrun, local_rank, local_world, gpus):
    want = _expect(device, torchrun, local_rank, local_world, gpus)
    kwargs = {"torchrun": torchrun, "local_rank": local_rank, "local_world_size": local_world,
                  "cuda_available": gpus > 0, "cuda_count": gpus}
    if isinstance(want, str):
        with pytest.raises(D.DeviceError) as err:
            D.resolve(device, **kwargs)
        for word in ERROR_WORDS[want]:
            assert word in str(err.value), (want, str(err.value))
        return
    p = D.resolve(device, **kwargs)
    assert (str(p.device), p.backend) == want
    assert p.torchrun is torchrun
    assert p.device_id == (p.device if p.device.type == "cuda" else None)
    json.dumps(p.to_dict())


def test_cuda_under_torchrun_is_local_rank():
    # 8 processes on an 8-GPU node: process i on cuda:i
    got = [D.resolve("cuda", torchrun=True, local_rank=r, local_world_size=8,
                     cuda_available=True, cuda_count=8).device for r in range(8)]
    assert got == [torch.device("cuda", r) for r in range(8)]
    # one process per node may name its GPU
    assert D.resolve("cuda:1", torchrun=True, local_rank=0, local_world_size=1,
                     cuda_available=True, cuda_count=2).device == torch.device("cuda", 1)


def test_one_gpu_eight_processes_fails_before_training():
    with pytest.raises(D.DeviceError, match=r"8 processes per node but only 1 visible GPU"):
        D.resolve("cuda", torchrun=True, local_rank=3, local_world_size=8, cuda_available=True,
                  cuda_count=1)
    # the replica engine is the fix: one process simulating the 8 workers on cuda:0
    assert D.resolve("cuda", torchrun=False, cuda_available=True,
                     cuda_count=1).device == torch.device("cuda", 0)


@pytest.mark.parametrize("torchrun", [False, True])
def test_explicit_backend_errors(torchrun):
    kw = {"torchrun": torchrun, "local_rank": 0, "local_world_size": 1}
    with pytest.raises(D.DeviceError, match=r"backend 'nccl' with device 'cpu'.*drop --backend"):
        D.resolve("cpu", backend="nccl", cuda_available=True, cuda_count=2, **kw)
    with pytest.raises(D.DeviceError, match=r"backend 'gloo' with device 'cuda'"):
        D.resolve("cuda", backend="gloo", cuda_available=True, cuda_count=2, **kw)
    with pytest.raises(D.DeviceError, match="backend must be one of"):
        D.resolve("cpu", backend="mpi", cuda_available=False, cuda_count=0, **kw)
    # restating the device's own backend is fine
    assert D.resolve("cpu", backend="gloo", cuda_available=True, cuda_count=2, **kw).backend \
        == "gloo"
    assert D.resolve("cuda", backend="nccl", cuda_available=True, cuda_count=2, **kw).backend \
        == "nccl"


def test_cpu_device_never_picks_nccl_even_with_gpus():
    p = D.resolve("cpu", torchrun=True, local_rank=1, local_world_size=2, cuda_available=True,
                  cuda_count=2)
    assert (p.device, p.backend, p.device_id) == (torch.device("cpu"), "gloo", None)


def test_mps_and_unknown_devices():
    with pytest.raises(D.DeviceError, match="no MPS backend"):
        D.resolve("mps", torchrun=True, local_rank=0, local_world_size=1, cuda_available=False,
                  cuda_count=0, mps_available=True)
    with pytest.raises(D.DeviceError, match="mps.is_available"):
        D.resolve("mps", torchrun=False, cuda_available=False, cuda_count=0)
    assert D.resolve("mps", torchrun=False, cuda_available=False, cuda_count=0,
                     mps_available=True).device.type == "mps"
    with pytest.raises(D.DeviceError, match="not a torch device"):
        D.resolve("gpu0", torchrun=False, cuda_available=True, cuda_count=1)
    with pytest.raises(D.DeviceError, match="not supported"):
        D.resolve("meta", torchrun=False, cuda_available=True, cuda_count=1)


def test_resolve_from_env_reads_torchrun_and_torch(monkeypatch):
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    p = D.resolve_from_env("cuda")
    assert (p.device, p.backend, p.torchrun) == (torch.device("cuda", 1), "nccl", True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(D.DeviceError, match="2 processes per node but only 1"):
        D.resolve_from_env("cuda")
    monkeypatch.delenv("RANK")
    assert D.resolve_from_env("cuda").device == torch.device("cuda", 0)  # replicas
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(D.DeviceError, match="no CUDA GPU"):
        D.resolve_from_env("cuda")


# --------------------------------------------------------------------------- init_from_env


@pytest.fixture
def fake_dist(monkeypatch):
    """torchrun's environment for rank 1 of 2 on one node, with init_process_group, set_device
    and the rank queries recorded instead of run."""
    for k, v in {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                 "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}.items():
        monkeypatch.setenv(k, v)
    calls = {"init": [], "set_device": []}
    dist = distributed.dist
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group",
                        lambda backend=None, **kw: calls["init"].append((backend, kw)))
    monkeypatch.setattr(dist, "get_rank", lambda: 1)
    monkeypatch.setattr(dist, "get_world_size", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls["set_device"].append(d))
    return calls


def _gpus(monkeypatch, n):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: n)


def test_init_from_env_cuda_passes_device_id(fake_dist, monkeypatch):
    _gpus(monkeypatch, 2)
    rank, world, dev = distributed.init_from_env(device="cuda")
    assert (rank, world, dev) == (1, 2, torch.device("cuda", 1))
    assert fake_dist["init"] == [("nccl", {"device_id": torch.device("cuda", 1)})]
    assert fake_dist["set_device"] == [torch.device("cuda", 1)]


def test_init_from_env_takes_a_resolved_placement(fake_dist, monkeypatch):
    _gpus(monkeypatch, 8)
    placement = D.resolve_from_env("cuda")
    assert distributed.init_from_env(placement=placement)[2] == torch.device("cuda", 1)
    assert fake_dist["init"] == [("nccl", {"device_id": torch.device("cuda", 1)})]
    with pytest.raises(ValueError, match="contradicts"):
        distributed.init_from_env("gloo", placement=placement)


def test_init_from_env_cpu_uses_gloo_even_with_gpus(fake_dist, monkeypatch):
    _gpus(monkeypatch, 2)
    assert distributed.init_from_env(device="cpu")[2] == torch.device("cpu")
    assert distributed.init_from_env()[2] == torch.device("cpu")  # the old call: no backend
    assert fake_dist["init"] == [("gloo", {}), ("gloo", {})]
    assert fake_dist["set_device"] == []


def test_init_from_env_old_signature(fake_dist, monkeypatch):
    # phase-1 callers pass only --backend: 'nccl' means one GPU per process
    _gpus(monkeypatch, 2)
    assert distributed.init_from_env("nccl")[2] == torch.device("cuda", 1)
    assert fake_dist["init"][-1] == ("nccl", {"device_id": torch.device("cuda", 1)})
    assert distributed.init_from_env("gloo")[2] == torch.device("cpu")
    assert fake_dist["init"][-1] == ("gloo", {})


def test_init_from_env_errors_before_any_process_group(fake_dist, monkeypatch):
    _gpus(monkeypatch, 1)  # 2 processes on this node, 1 GPU
    with pytest.raises(D.DeviceError, match="2 processes per node but only 1"):
        distributed.init_from_env(device="cuda")
    with pytest.raises(D.DeviceError, match="backend 'nccl' with device 'cpu'"):
        distributed.init_from_env("nccl", device="cpu")
    _gpus(monkeypatch, 0)
    with pytest.raises(D.DeviceError, match="no CUDA GPU"):
        distributed.init_from_env("nccl")
    with pytest.raises(D.DeviceError, match="would put every process on GPU 0"):
        _gpus(monkeypatch, 2)
        distributed.init_from_env(device="cuda:0")
    assert fake_dist["init"] == [] and fake_dist["set_device"] == []


# --------------------------------------------------------------------------- numerics


@pytest.fixture
def restore_numerics():
    b = torch.backends
    saved = (b.cuda.matmul.allow_tf32, b.cudnn.allow_tf32, torch.get_float32_matmul_precision(),
             b.cudnn.deterministic, b.cudnn.benchmark, torch.are_deterministic_algorithms_enabled(),
             torch.is_deterministic_algorithms_warn_only_enabled(),
             os.environ.get("CUBLAS_WORKSPACE_CONFIG"))
    yield
    (b.cuda.matmul.allow_tf32, b.cudnn.allow_tf32) = saved[:2]
    torch.set_float32_matmul_precision(saved[2])
    b.cudnn.deterministic, b.cudnn.benchmark = saved[3:5]
    torch.use_deterministic_algorithms(saved[5], warn_only=saved[6])
    if saved[7] is None:
        os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
    else:
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = saved[7]


@pytest.mark.parametrize("precision,tf32,matmul", [("fp32", False, "highest"),
                                                   ("tf32", True, "high"),
                                                   ("bf16", False, "highest")])
@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_apply_numerics_flags(restore_numerics, monkeypatch, precision, tf32, matmul,
                              deterministic, device):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    rec = numerics.apply_numerics(precision, deterministic, device)
    b = torch.backends
    assert b.cuda.matmul.allow_tf32 is tf32 and b.cudnn.allow_tf32 is tf32
    assert torch.get_float32_matmul_precision() == matmul
    assert b.cudnn.deterministic is deterministic
    assert b.cudnn.benchmark is (not deterministic and device == "cuda")
    assert torch.are_deterministic_algorithms_enabled() is deterministic
    if deterministic:
        assert torch.is_deterministic_algorithms_warn_only_enabled()  # strict=False default
    assert os.environ.get("CUBLAS_WORKSPACE_CONFIG") == (
        ":4096:8" if deterministic and device == "cuda" else None)
    # the record says what is in force and survives JSON
    assert rec["precision"] == precision and rec["deterministic"] is deterministic
    assert rec["cuda_matmul_allow_tf32"] is tf32 and rec["cudnn_allow_tf32"] is tf32
    assert rec["float32_matmul_precision"] == matmul
    assert rec["autocast_dtype"] == ("bfloat16" if precision == "bf16" else None)
    assert json.loads(json.dumps(rec)) == rec


def test_apply_numerics_strict_and_bad_precision(restore_numerics):
    numerics.apply_numerics("fp32", True, "cpu", strict=True)
    assert torch.are_deterministic_algorithms_enabled()
    assert not torch.is_deterministic_algorithms_warn_only_enabled()
    with pytest.raises(ValueError, match="precision must be one of"):
        numerics.apply_numerics("fp16")
    json.dumps(numerics.numerics_state())


def test_autocast_helper():
    x = torch.randn(4, 4)
    with numerics.autocast("bf16", "cpu"):
        assert (x @ x).dtype == torch.bfloat16
    for p in ("fp32", "tf32"):
        with numerics.autocast(p, "cpu"):
            assert (x @ x).dtype == torch.float32
    with pytest.raises(ValueError):
        numerics.autocast("fp8")


def test_memory_format_rule():
    cl, nchw = torch.channels_last, torch.contiguous_format
    assert numerics.memory_format("auto", "cpu", threads=1) is cl  # measured faster there
    assert numerics.memory_format("auto", "cpu", threads=2) is nchw
    assert numerics.memory_format("auto", "cuda:0", threads=1) is nchw  # unmeasured: unchanged
    for dev in ("cpu", "cuda"):
        assert numerics.memory_format("channels_last", dev, threads=2) is cl
        assert numerics.memory_format("contiguous", dev, threads=1) is nchw
    with pytest.raises(ValueError, match="memory_format must be one of"):
        numerics.memory_format("nhwc", "cpu")


def test_init_from_env_really_joins_a_gloo_group(monkeypatch):
    # not mocked: a 1-process gloo group from torchrun-style variables, device cpu
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for k, v in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                 "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(k, v)
    dist = distributed.dist
    assert not dist.is_initialized()
    try:
        assert distributed.init_from_env(device="cpu") == (0, 1, torch.device("cpu"))
        assert dist.get_backend() == "gloo"
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
