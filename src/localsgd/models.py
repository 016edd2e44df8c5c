"""The paper's image models, their initialization, weight-decay groups and size/cost counts.

Lin, Stich, Jaggi (2020) §4.1 "Models" trains ResNet-20 on CIFAR-10/100, ResNet-50 on
ImageNet-1k, and DenseNet-40-12 and WideResNet-28-10 on CIFAR (Appendix F.1, Table 4 lists their
parameters and flops per image). Architectures are written from their own papers:

- ResNet-20: He et al. (2016a) "Deep Residual Learning for Image Recognition", §4.2 — a 3×3
  stem, 3 stages of n = 3 basic blocks (conv-BN-ReLU-conv-BN + shortcut, ReLU) with 16/32/64
  filters on 32/16/8 maps, global average pooling, fully connected classifier. Shortcuts are
  option A (identity; stride-2 subsampling plus zero channels when the width grows), the variant
  He et al. use on CIFAR and whose 0.27 M parameters Table 4 prints.
- DenseNet-40-12: Huang et al. (2017) "Densely Connected Convolutional Networks", §3-4 — the
  plain DenseNet (no bottleneck, no compression): 3 dense blocks of 12 BN-ReLU-Conv3×3 layers
  with growth rate k = 12, transitions BN-ReLU-Conv1×1 (c → c) + 2×2 average pooling. The stem
  has 2k = 24 channels: Huang et al. give 16 for this variant (2k only for DenseNet-BC), but
  only 24 reproduces Table 4 (1.06 M / 1.10 M parameters, 0.28 B multiply-adds); a 16-channel
  stem gives 1.02 M / 1.06 M and 0.265 B.
- WideResNet-28-10: Zagoruyko & Komodakis (2016) "Wide Residual Networks" — pre-activation
  basic blocks B(3,3), 4 per group, widths 16·k/32·k/64·k with k = 10, 1×1 conv shortcuts where
  the shape changes, no dropout.
- ResNet-50: ``torchvision.models.resnet50`` as is (note: torchvision's "v1.5" puts the stride
  on the 3×3 conv of each bottleneck, the original puts it on the first 1×1; same parameters,
  more multiply-adds).

§4.1 "Model initialization": He et al. (2015) normal init for convolutions, N(0, 0.01) for the
fully connected layer (following Goyal et al., 2017), and no weight decay on BatchNorm
coefficients (following He et al., 2016a).

Besides the paper's models, the toy models of timing runs and benchmarks live here too:
`timing_mlp` (emulated-compute timing runs), `wide_mlp` and `BagOfTokens` (the SlowMo break-even
benchmark) and `FFNStack` (the DDP / TorchDynamo benchmark). Table 4's counts beside the paper's
are `localsgd.paper.experiments.lin2020.table04`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

MODEL_NAMES = ("resnet20", "densenet40_12", "wrn28_10", "resnet50")
# not a paper model: timing runs with emulated compute (localsgd.paper.experiments.timing_validation)
# move ResNet-20's 1.08 MB in 4 tensors instead of 59, so the host's per-tensor work per update (autograd, DDP's
# bucket copies, the optimizer) stays ~1 ms and 16 processes on 2 cores do not contend for it
TIMING_MODEL_NAMES = ("mlp",)


def _ch(channels: float) -> int:
    """A scaled channel count: rounded, at least 1."""
    return max(1, round(channels))


# --------------------------------------------------------------------------- ResNet-20
class _BasicBlock(nn.Module):
    """He et al. (2016a) basic block, post-activation, option-A (parameter-free) shortcut."""

    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.stride, self.extra = stride, c_out - c_in

    def shortcut(self, x: Tensor) -> Tensor:
        # dims counted from the end: also runs on packed replicas' [B, K, C, H, W]
        if self.stride != 1:
            x = x[..., :: self.stride, :: self.stride]
        if self.extra:
            lo = self.extra // 2  # zero channels on both sides, as in He et al.'s option A
            x = F.pad(x, (0, 0, 0, 0, lo, self.extra - lo))
        return x

    def forward(self, x: Tensor) -> Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNetCifar(nn.Module):
    """He et al. (2016a) §4.2 CIFAR ResNet with 6n + 2 layers (n = 3: ResNet-20)."""

    def __init__(self, n: int = 3, num_classes: int = 10, width: float = 1.0):
        super().__init__()
        widths = [_ch(16 * width), _ch(32 * width), _ch(64 * width)]
        self.conv1 = nn.Conv2d(3, widths[0], 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        blocks, c_in = [], widths[0]
        for stage, c_out in enumerate(widths):
            for i in range(n):
                blocks.append(_BasicBlock(c_in, c_out, 2 if stage > 0 and i == 0 else 1))
                c_in = c_out
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(c_in, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        x = self.blocks(F.relu(self.bn1(self.conv1(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


# --------------------------------------------------------------------------- DenseNet-40-12
class _DenseLayer(nn.Module):
    """Huang et al. (2017) composite function H_l = BN-ReLU-Conv3×3, output concatenated."""

    def __init__(self, c_in: int, growth: int):
        super().__init__()
        self.bn = nn.BatchNorm2d(c_in)
        self.conv = nn.Conv2d(c_in, growth, 3, padding=1, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return torch.cat([x, self.conv(F.relu(self.bn(x)))], dim=1)


class _Transition(nn.Module):
    """BN-ReLU-Conv1×1 (no compression: DenseNet, not -BC) + 2×2 average pooling."""

    def __init__(self, c: int):
        super().__init__()
        self.bn = nn.BatchNorm2d(c)
        self.conv = nn.Conv2d(c, c, 1, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return F.avg_pool2d(self.conv(F.relu(self.bn(x))), 2)


class DenseNetCifar(nn.Module):
    """Huang et al. (2017) DenseNet for CIFAR: depth L = 3·layers + 4 (40 → 12 layers/block).

    ``stem`` defaults to 2·growth, the width that reproduces Table 4 (see the module docstring).
    """

    def __init__(self, depth: int = 40, growth: int = 12, num_classes: int = 10,
                 stem: int | None = None):
        super().__init__()
        if (depth - 4) % 3:
            raise ValueError(f"DenseNet depth must be 3·m + 4, got {depth}")
        per_block = (depth - 4) // 3
        stem = 2 * growth if stem is None else stem
        self.conv1 = nn.Conv2d(3, stem, 3, padding=1, bias=False)
        layers: list[nn.Module] = []
        c = stem
        for block in range(3):
            for _ in range(per_block):
                layers.append(_DenseLayer(c, growth))
                c += growth
            if block < 2:
                layers.append(_Transition(c))
        self.features = nn.Sequential(*layers)
        self.bn = nn.BatchNorm2d(c)
        self.fc = nn.Linear(c, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        x = F.relu(self.bn(self.features(self.conv1(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


# --------------------------------------------------------------------------- WRN-28-10
class _WideBlock(nn.Module):
    """Zagoruyko & Komodakis (2016) pre-activation block B(3,3); 1×1 conv shortcut on a shape
    change, fed (like the residual branch) by the pre-activated input."""

    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.bn1 = nn.BatchNorm2d(c_in)
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.proj = (nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False)
                     if stride != 1 or c_in != c_out else None)

    def forward(self, x: Tensor) -> Tensor:
        a = F.relu(self.bn1(x))
        out = self.conv2(F.relu(self.bn2(self.conv1(a))))
        return out + (x if self.proj is None else self.proj(a))


class WideResNet(nn.Module):
    """WRN-d-k: depth d = 6·N + 4 (28 → N = 4 blocks per group), widen factor k."""

    def __init__(self, depth: int = 28, k: float = 10, num_classes: int = 10,
                 width: float = 1.0):
        super().__init__()
        if (depth - 4) % 6:
            raise ValueError(f"WideResNet depth must be 6·N + 4, got {depth}")
        n = (depth - 4) // 6
        stem = _ch(16 * width)
        widths = [_ch(16 * k * width), _ch(32 * k * width), _ch(64 * k * width)]
        self.conv1 = nn.Conv2d(3, stem, 3, padding=1, bias=False)
        blocks, c_in = [], stem
        for group, c_out in enumerate(widths):
            for i in range(n):
                blocks.append(_WideBlock(c_in, c_out, 2 if group > 0 and i == 0 else 1))
                c_in = c_out
        self.blocks = nn.Sequential(*blocks)
        self.bn = nn.BatchNorm2d(c_in)
        self.fc = nn.Linear(c_in, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        x = F.relu(self.bn(self.blocks(self.conv1(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


# --------------------------------------------------------------------------- build + init
def _resnet50(num_classes: int, width: float) -> nn.Module:
    """torchvision's ResNet-50 (bottlenecks [3, 4, 6, 3]); at ``width`` != 1 every stage's
    planes (64, 128, 256, 512, hence outputs x4) are scaled, the 64-channel stem kept. Width 1.0
    is torchvision's model itself. (Its ``width_per_group`` only widens the 3x3 convs.)"""
    # deferred: torchvision takes about a second to import; only ResNet-50 needs it
    import torchvision
    from torchvision.models.resnet import Bottleneck, ResNet

    if width == 1.0:
        return torchvision.models.resnet50(weights=None, num_classes=num_classes)

    class _Scaled(ResNet):
        def _make_layer(self, block, planes, blocks, stride=1, dilate=False):
            return super()._make_layer(block, _ch(planes * width), blocks, stride, dilate)

    model = _Scaled(Bottleneck, [3, 4, 6, 3], num_classes=num_classes)
    model.fc = nn.Linear(_ch(512 * width) * Bottleneck.expansion, num_classes)
    return model


def timing_mlp(num_classes: int = 10, width: float = 1.0) -> nn.Module:
    """``"mlp"``: flatten a 3×32×32 image, Linear(3072, 88·width), ReLU, Linear(→ classes).

    Not a paper model: with 10 classes it holds 271,314 float32 parameters (1.085 MB, ResNet-20
    has 269,722) in 4 tensors, for timing runs whose compute is emulated (``--compute-ms``):
    what the all-reduces move is the same, the host's per-tensor overhead is not (see
    `TIMING_MODEL_NAMES`)."""
    hidden = max(1, round(88 * width))
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, hidden), nn.ReLU(),
                         nn.Linear(hidden, num_classes))


def wide_mlp(width: int, num_classes: int = 10) -> nn.Module:
    """A byte-heavy MLP on 3×32×32 images: flatten, two hidden layers of ``width``, a linear
    head (the SlowMo break-even benchmark's "mlp": many bytes for moderate compute)."""
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, width), nn.ReLU(),
                         nn.Linear(width, width), nn.ReLU(), nn.Linear(width, num_classes))


class BagOfTokens(nn.Module):
    """A byte-heavy, compute-light model (an embedding table, as in the NLP models the SlowMo page
    targets): 64 token ids per image from its pixels, mean of their embeddings, a linear head."""

    def __init__(self, rows: int, dim: int = 256, num_classes: int = 10):
        super().__init__()
        self.rows = rows
        self.emb = nn.Embedding(rows, dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        ids = (x.flatten(1)[:, :64].abs() * 997).long() % self.rows
        return self.head(self.emb(ids).mean(1))


class FFNStack(nn.Module):
    """Residual feed-forward blocks ``x + W2 relu(W1 x)`` (hidden 2x width) and a linear head
    (the DDP / TorchDynamo benchmark's models, `localsgd.paper.bench.ddp`).

    A user-defined module on purpose: Dynamo does not start a frame in ``torch.nn`` code, so a
    bare ``nn.Sequential`` under ``torch.compile(DDP(...))`` would run uncompiled.
    """

    def __init__(self, width: int, blocks: int, classes: int = 10):
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(width, 2 * width), nn.ReLU(), nn.Linear(2 * width, width))
            for _ in range(blocks))
        self.head = nn.Linear(width, classes)

    def forward(self, x: Tensor) -> Tensor:
        for block in self.blocks:
            x = x + block(x)
        return self.head(x)


def init_weights(model: nn.Module) -> nn.Module:
    """§4.1 initialization (after Goyal et al., 2017): He et al. (2015) normal init (fan_out,
    ReLU gain) for convolutions, N(0, 0.01) and zero bias for fully connected layers, BatchNorm
    weight 1 and bias 0. Returns ``model``."""
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, mean=0.0, std=0.01)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.modules.batchnorm._BatchNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
    return model


def build_model(name: str, num_classes: int = 10, width: float = 1.0) -> nn.Module:
    """One of the paper's models (§4.1; App. F.1 Table 4), §4.1-initialized.

    Args:
        name: ``"resnet20"``, ``"densenet40_12"``, ``"wrn28_10"`` or ``"resnet50"`` (or
            ``"mlp"``, `timing_mlp`: not a paper model, for emulated-compute timing runs).
        num_classes: outputs of the classifier (10 CIFAR-10, 100 CIFAR-100, 1000 ImageNet).
        width: channel multiplier for reduced-scale runs (base widths of the ResNets -- for
            ResNet-50 every stage but its stem --, growth rate of DenseNet, whose stem is
            2 × growth); 1.0 is the paper's model.

    Deterministic given ``torch.manual_seed``; build under ``torch.device("meta")`` to count
    parameters and flops without allocating weights.
    """
    if width <= 0:
        raise ValueError(f"width must be > 0, got {width}")
    if name == "resnet20":
        model = ResNetCifar(3, num_classes, width)
    elif name == "densenet40_12":
        model = DenseNetCifar(40, _ch(12 * width), num_classes)
    elif name == "wrn28_10":
        model = WideResNet(28, 10, num_classes, width)
    elif name == "resnet50":
        model = _resnet50(num_classes, width)
    elif name == "mlp":
        model = timing_mlp(num_classes, width)
    else:
        raise ValueError(f"unknown model {name!r}; valid names: "
                         f"{', '.join(MODEL_NAMES + TIMING_MODEL_NAMES)}")
    return init_weights(model)


# --------------------------------------------------------------------------- weight decay
def no_weight_decay_mask(model: nn.Module) -> list[bool]:
    """One flag per tensor of ``model.parameters()`` (in order): True for BatchNorm weights and
    biases, which get no weight decay (§4.1, following He et al., 2016a)."""
    bn = {id(p) for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)
          for p in m.parameters(recurse=False)}
    return [id(p) in bn for p in model.parameters()]


def param_groups(params: Iterable[Tensor], mask: list[bool],
                 weight_decay: float) -> list[dict]:
    """Two optimizer param groups, ``[decay, no decay]``, split by position with ``mask``.

    Position-based so it also serves stacked replica tensors that are no module's attributes;
    both groups are always returned (one may be empty) so their order is fixed.
    """
    params = list(params)
    if len(params) != len(mask):
        raise ValueError(f"{len(params)} parameters but a mask of {len(mask)} entries; build "
                         "the mask from the same model the parameters come from")
    return [
        {"params": [p for p, skip in zip(params, mask) if not skip], "weight_decay": weight_decay},
        {"params": [p for p, skip in zip(params, mask) if skip], "weight_decay": 0.0},
    ]


# --------------------------------------------------------------------------- counts
def count_params(model: nn.Module) -> int:
    """Number of parameters (Table 4's "communication" column: what an all-reduce moves)."""
    return sum(p.numel() for p in model.parameters())


def count_flops(model: nn.Module, input_shape: Sequence[int]) -> int:
    """FLOPs of one forward pass of one image in eval mode, by ``FlopCounterMode``.

    ``input_shape`` is ``(C, H, W)`` (or ``(1, C, H, W)``). The counter counts a multiply-add as
    2 FLOPs and only matrix products/convolutions (no BN, ReLU, pooling, additions). The input
    lives on the model's device, so a model built on ``meta`` is counted without computing.
    """
    shape = tuple(input_shape)
    if len(shape) == 3:
        shape = (1, *shape)
    if len(shape) != 4 or shape[0] != 1:
        raise ValueError(f"input_shape must be (C, H, W) for one image, got {tuple(input_shape)}")
    # deferred: it imports triton (~0.2 s), which no training process needs
    from torch.utils.flop_counter import FlopCounterMode

    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            model(torch.zeros(shape, device=device))
    finally:
        model.train(was_training)
    return int(counter.get_total_flops())
