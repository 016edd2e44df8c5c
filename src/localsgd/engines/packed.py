"""K replicas of a CIFAR ResNet packed into channel groups: one model K times as wide, every
convolution with ``groups * K`` groups, every BatchNorm over ``K * C`` channels.

Activations are ``[B, K * C, H, W]``: channels ``k*C .. (k+1)*C - 1`` belong to replica k, so a
grouped convolution is K independent convolutions, a BatchNorm over ``K * C`` channels is K
independent BatchNorms (statistics per channel over batch and space), and element-wise ops and
pooling never mix replicas. The packed weights are reshapes of the batched engine's
``[K, *shape]`` parameter stacks (copies: each stack is a strided column block of the ``[K, n]``
flat buffer), so gradients flow back into the same stack the averagers and the optimizer use.
Same computation as `torch.vmap` over the replicas (equal in float32/float64,
tests/test_packed.py; under bf16 autocast BatchNorm's input stays bf16 here, float32 in the
vmap), but cuDNN sees one grouped convolution in the GPU's preferred layout instead of vmap's
transposes around it: on an H100, ResNet-20 with K = 16, B_loc = 128 trains at 0.96x the
images/s of one model at batch 2,048, vmap at 0.63x (figures/gpu/h100/packed.json).

Only the models below are packed (`supports`); the channel-dimension ops of other models
(DenseNet's concatenations, torchvision's ResNet-50) would mix replicas if packed blindly.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from localsgd.models import ResNetCifar, WideResNet

__all__ = ["logits", "supports"]


def supports(model: nn.Module) -> bool:
    """Whether `logits` can run ``model``: a `ResNetCifar` or `WideResNet` whose BatchNorms keep
    running statistics with a fixed momentum (cumulative averaging would need a host read)."""
    if type(model) not in (ResNetCifar, WideResNet):
        return False
    return all(m.affine and m.track_running_stats and m.momentum is not None
               for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm))


class _Packed:
    """The packed ops over one model's stacked parameters and buffers (names as the model's)."""

    def __init__(self, k: int, params: dict[str, torch.Tensor],
                 buffers: dict[str, torch.Tensor]):
        self.k, self.p, self.b = k, params, buffers

    def conv(self, m: nn.Conv2d, name: str, h: torch.Tensor) -> torch.Tensor:
        w = self.p[f"{name}.weight"]  # [K, C_out, C_in / groups, kh, kw]
        bias = self.p.get(f"{name}.bias")
        return F.conv2d(h, w.reshape(-1, *w.shape[2:]), None if bias is None else bias.reshape(-1),
                        m.stride, m.padding, m.dilation, m.groups * self.k)

    def bn(self, m: nn.BatchNorm2d, name: str, h: torch.Tensor) -> torch.Tensor:
        # running stats: views of the contiguous [K, C] stacks, updated in place
        training = m.training  # each BatchNorm's own mode, as the vmapped module honours it
        out = F.batch_norm(h, self.b[f"{name}.running_mean"].view(-1),
                           self.b[f"{name}.running_var"].view(-1),
                           self.p[f"{name}.weight"].reshape(-1), self.p[f"{name}.bias"].reshape(-1),
                           training, m.momentum, m.eps)
        if training:
            self.b[f"{name}.num_batches_tracked"].add_(1)  # as nn.BatchNorm2d counts
        return out

    def per_replica(self, h: torch.Tensor, fn: Callable[[torch.Tensor], torch.Tensor],
                    ) -> torch.Tensor:
        """``fn`` on ``[B, K, C, H, W]`` (a channel-dimension op), back to ``[B, K * C', H, W]``."""
        b, _, height, width = h.shape
        out = fn(h.reshape(b, self.k, -1, height, width))
        return out.reshape(b, -1, *out.shape[3:])

    def head(self, fc: nn.Linear, h: torch.Tensor) -> torch.Tensor:
        """Global average pool and the K linear layers: logits ``[K, B, classes]``."""
        f = F.adaptive_avg_pool2d(h, 1).reshape(h.shape[0], self.k, -1)
        out = torch.einsum("bkc,koc->kbo", f, self.p["fc.weight"])
        return out if fc.bias is None else out + self.p["fc.bias"][:, None]


def _resnet_block(pk: _Packed, m: nn.Module, name: str, h: torch.Tensor) -> torch.Tensor:
    out = F.relu(pk.bn(m.bn1, f"{name}.bn1", pk.conv(m.conv1, f"{name}.conv1", h)))
    out = pk.bn(m.bn2, f"{name}.bn2", pk.conv(m.conv2, f"{name}.conv2", out))
    if m.stride != 1 or m.extra:  # option A, per replica: zero channels around each one's own
        h = pk.per_replica(h, m.shortcut)
    return F.relu(out + h)


def _wide_block(pk: _Packed, m: nn.Module, name: str, h: torch.Tensor) -> torch.Tensor:
    a = F.relu(pk.bn(m.bn1, f"{name}.bn1", h))
    out = F.relu(pk.bn(m.bn2, f"{name}.bn2", pk.conv(m.conv1, f"{name}.conv1", a)))
    out = pk.conv(m.conv2, f"{name}.conv2", out)
    return out + (h if m.proj is None else pk.conv(m.proj, f"{name}.proj", a))


def logits(model: nn.Module, params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor],
           x: torch.Tensor, memory_format: torch.memory_format = torch.contiguous_format,
           ) -> torch.Tensor:
    """The K replicas' outputs ``[K, B, classes]`` for inputs ``x`` ``[K, B, C, H, W]``:
    ``model``'s forward (a `supports` model, in its train/eval mode) with replica k's
    parameters ``params[name][k]`` and buffers ``buffers[name][k]`` (running statistics are
    updated in place in train mode). ``memory_format``: the packed activations' layout."""
    k, b = x.shape[0], x.shape[1]
    pk = _Packed(k, params, buffers)
    h = x.transpose(0, 1).reshape(b, -1, *x.shape[3:]).contiguous(memory_format=memory_format)
    if isinstance(model, ResNetCifar):
        h = F.relu(pk.bn(model.bn1, "bn1", pk.conv(model.conv1, "conv1", h)))
        for i, block in enumerate(model.blocks):
            h = _resnet_block(pk, block, f"blocks.{i}", h)
    elif isinstance(model, WideResNet):
        h = pk.conv(model.conv1, "conv1", h)
        for i, block in enumerate(model.blocks):
            h = _wide_block(pk, block, f"blocks.{i}", h)
        h = F.relu(pk.bn(model.bn, "bn", h))
    else:
        raise TypeError(f"{type(model).__name__} cannot be packed (see localsgd.engines.packed."
                         "supports); use the batched engine's vmap path (packed=False)")
    return pk.head(model.fc, h)
