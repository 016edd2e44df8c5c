"""Numerics policy: which float arithmetic a run uses, set once per process and recorded.

On Ampere and later GPUs PyTorch may run float32 convolutions (cuDNN's default) and, if asked,
matmuls in TF32 (10-bit mantissa), and cuDNN picks algorithms that are not bitwise
deterministic. The paper's arithmetic is float32. A run's ``precision`` is one of these, or
``auto`` (`resolve_precision`: ``tf32`` on CUDA, ``fp32`` elsewhere; measured on an H200,
TF32 trained the batched ResNet-20 replicas 1.5x as fast as fp32, figures/gpu/sweep.csv; a
CPU has no TF32, so there ``auto`` is exactly ``fp32``):

========  =====================================================================================
fp32      TF32 off for matmuls and cuDNN, ``set_float32_matmul_precision("highest")``.
tf32      TF32 on for matmuls and cuDNN convolutions, matmul precision ``"high"`` (faster;
          not the paper's arithmetic -- record it).
bf16      weights, optimizer and reductions stay float32 with TF32 off (as fp32); forward and
          backward run under ``torch.autocast(dtype=torch.bfloat16)`` where the training loop
          enters `autocast` (opt-in; the loop must use the helper).
========  =====================================================================================

``deterministic=True`` sets ``cudnn.deterministic=True``, ``cudnn.benchmark=False``,
``torch.use_deterministic_algorithms(True, warn_only=not strict)`` and (for cuBLAS on CUDA)
``CUBLAS_WORKSPACE_CONFIG=:4096:8`` unless already set (it must be set before the first cuBLAS
call of the process, so call `apply_numerics` before building the model).
``deterministic=False`` lets cuDNN benchmark and choose algorithms (``benchmark=True`` on CUDA).

`apply_numerics` returns a JSON-serialisable record of the flags actually in force (read back
after setting), meant for run metadata and figure provenance; `numerics_state` reads them
without changing anything.

The flag settings are verified on CPU only (they are process-global Python flags, settable
without a GPU); no GPU was available when this was written.
"""

from __future__ import annotations

import contextlib
import os
import platform
from typing import Any

import torch

__all__ = ["AUTO", "MEMORY_FORMATS", "PRECISIONS", "apply_numerics", "autocast", "memory_format",
           "numerics_scope", "numerics_state", "resolve_precision"]

PRECISIONS = ("fp32", "tf32", "bf16")
AUTO = "auto"  # a config's default: `resolve_precision` picks one of PRECISIONS per device


def resolve_precision(precision: str, device: str | torch.device | None = None) -> str:
    """``precision`` itself, or for ``"auto"``: ``"tf32"`` on CUDA, ``"fp32"`` elsewhere."""
    if precision == AUTO:
        return "tf32" if _device_type(device) == "cuda" else "fp32"
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {(AUTO, *PRECISIONS)}, got {precision!r}")
    return precision
MEMORY_FORMATS = ("auto", "contiguous", "channels_last")
CUBLAS_WORKSPACE = ":4096:8"


def _device_type(device: str | torch.device | None) -> str:
    if device is None:
        return "cpu"
    return torch.device(device).type


def _read(getter) -> Any:
    try:
        value = getter()
    except (RuntimeError, AttributeError) as exc:  # e.g. mixed legacy / new TF32 API
        return f"unreadable: {exc.__class__.__name__}"
    return value if isinstance(value, (bool, int, float, str, type(None))) else str(value)


def numerics_state() -> dict[str, Any]:
    """The process's current numerics flags (JSON-serialisable; nothing is changed)."""
    b = torch.backends
    state = {
        "cuda_matmul_allow_tf32": _read(lambda: b.cuda.matmul.allow_tf32),
        "cudnn_allow_tf32": _read(lambda: b.cudnn.allow_tf32),
        "float32_matmul_precision": _read(torch.get_float32_matmul_precision),
        "cudnn_deterministic": _read(lambda: b.cudnn.deterministic),
        "cudnn_benchmark": _read(lambda: b.cudnn.benchmark),
        "deterministic_algorithms": _read(torch.are_deterministic_algorithms_enabled),
        "deterministic_warn_only": _read(
            torch.is_deterministic_algorithms_warn_only_enabled),
        "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
    }
    # torch >= 2.9's fine-grained API, recorded when present
    for key, getter in (("fp32_precision_cuda_matmul", lambda: b.cuda.matmul.fp32_precision),
                        ("fp32_precision_cudnn_conv", lambda: b.cudnn.conv.fp32_precision)):
        if hasattr(b.cuda.matmul, "fp32_precision"):
            state[key] = _read(getter)
    return state


def apply_numerics(precision: str = "fp32", deterministic: bool = False,
                   device: str | torch.device | None = None, *,
                   strict: bool = False) -> dict[str, Any]:
    """Set the process-wide numerics flags for ``precision`` and ``deterministic`` (see the
    module docstring) and return what is in force.

    Args:
        precision: 'fp32' (default, the paper's arithmetic), 'tf32' or 'bf16' (autocast, opt-in).
        deterministic: deterministic cuDNN / torch algorithms (slower) instead of benchmarked.
        device: the run's device; only its type matters (cuDNN benchmark and the cuBLAS
            workspace variable are CUDA matters). The flags are set on every device type.
        strict: with ``deterministic``, raise on an op without a deterministic implementation
            (``warn_only=False``) instead of warning.

    Returns:
        A JSON-serialisable dict: the request (precision, deterministic, strict, device type,
        autocast dtype or None), `numerics_state()` read back, and torch / CUDA / cuDNN versions.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    dtype = _device_type(device)
    tf32 = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32  # convolutions (and RNNs)
    torch.set_float32_matmul_precision("high" if tf32 else "highest")
    if deterministic:
        if dtype == "cuda":
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
        torch.use_deterministic_algorithms(True, warn_only=not strict)
    else:
        torch.backends.cudnn.deterministic = False
        torch.backends.cudnn.benchmark = dtype == "cuda"
        torch.use_deterministic_algorithms(False)
    record = {
        "precision": precision,
        "deterministic": bool(deterministic),
        "strict": bool(strict),
        "device_type": dtype,
        "autocast_dtype": "bfloat16" if precision == "bf16" else None,
        **numerics_state(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "python": platform.python_version(),
    }
    return record


def memory_format(choice: str, device: str | torch.device | None = None,
                  threads: int | None = None) -> torch.memory_format:
    """The layout image batches [B, C, H, W] are handed to the model in.

    'contiguous' (NCHW) and 'channels_last' (NHWC) are taken as asked. 'auto' is channels-last
    on a CPU whose run has one intra-op thread (``threads``, default `torch.get_num_threads`)
    and contiguous otherwise; `localsgd.training.loop.train` runs a CPU run of K >= 2 replicas with
    one thread per op (`TrainConfig.host_threads`), so there 'auto' is channels-last. Measured
    (`localsgd bench replicas --layouts`, ResNet-20 replicas, one thread; AVX-512 and AVX2
    code paths of one CPU, and two 2-core AMD EPYC machines; docs/benchmarks.md): NHWC trains
    0.98-1.05x as fast as NCHW at width 0.25 / batch 32, 1.16-1.23x at width 0.5 / batch 64
    and 1.74-1.96x at width 0.5 / batch 1024 (with two threads per op 0.77x, 0.92x and
    1.18-1.57x). On GPUs 'auto' keeps NCHW (unmeasured here). Only the inputs change layout:
    convolutions then run NHWC, the weights keep theirs. Results differ from NCHW's at float32
    round-off.
    """
    if choice not in MEMORY_FORMATS:
        raise ValueError(f"memory_format must be one of {MEMORY_FORMATS}, got {choice!r}")
    if choice == "auto":
        single = (threads if threads is not None else torch.get_num_threads()) == 1
        choice = "channels_last" if _device_type(device) == "cpu" and single else "contiguous"
    return torch.channels_last if choice == "channels_last" else torch.contiguous_format


def autocast(precision: str, device: str | torch.device | None = None):
    """The context a training step runs its forward (and loss) in: ``torch.autocast`` to
    bfloat16 for ``precision='bf16'``, a no-op otherwise. ``with autocast(p, dev): loss = ...``;
    call ``backward()`` outside it (as PyTorch recommends)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if precision != "bf16":
        return contextlib.nullcontext()
    return torch.autocast(device_type=_device_type(device), dtype=torch.bfloat16)


@contextlib.contextmanager
def numerics_scope(precision: str = "fp32", deterministic: bool = False,
                   device: str | torch.device | None = None, *, strict: bool = False):
    """`apply_numerics` for the duration of a ``with`` block (yields its record), then put
    back the flags that were in force (for checks such as ``localsgd doctor`` and tests)."""
    b = torch.backends
    saved = (b.cuda.matmul.allow_tf32, b.cudnn.allow_tf32, torch.get_float32_matmul_precision(),
             b.cudnn.deterministic, b.cudnn.benchmark,
             torch.are_deterministic_algorithms_enabled(),
             torch.is_deterministic_algorithms_warn_only_enabled(),
             os.environ.get("CUBLAS_WORKSPACE_CONFIG"))
    try:
        yield apply_numerics(precision, deterministic, device, strict=strict)
    finally:
        b.cuda.matmul.allow_tf32, b.cudnn.allow_tf32 = saved[0], saved[1]
        torch.set_float32_matmul_precision(saved[2])
        b.cudnn.deterministic, b.cudnn.benchmark = saved[3], saved[4]
        torch.use_deterministic_algorithms(saved[5], warn_only=saved[6])
        if saved[7] is None:
            os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
        else:
            os.environ["CUBLAS_WORKSPACE_CONFIG"] = saved[7]
