"""The paper's models (§4.1; App. F.1 Table 4): sizes, flops, init, weight-decay mask, vmap."""

import copy
import math

import pytest
import torch
from torch import nn
from torch.func import functional_call, stack_module_state, vmap

from localsgd import models as M
from localsgd.paper.experiments import lin2020

NAMES = ["resnet20", "densenet40_12", "wrn28_10", "resnet50"]
SMALL = {"resnet20": 0.25, "densenet40_12": 0.25, "wrn28_10": 0.1}  # widths for real forwards
# Table 4 cells no build of ours can equal to the printed digits, and why (papers/…/notes.md)
KNOWN_DIFFERENCES = {
    # the 100-way classifier adds 90·65 = 5,850 parameters: 0.2756 M; the paper repeats CIFAR-10's
    "model=ResNet-20; dataset=CIFAR-100": 275_572,
    # torchvision's ResNet-50 has 25.557 M; the paper prints the customary "25 M" as 25.00
    "model=ResNet-50; dataset=ImageNet-1k": 25_557_032,
}


def meta_model(name: str, num_classes: int = 10, width: float = 1.0) -> nn.Module:
    with torch.device("meta"):  # shapes only: full-size models build in milliseconds
        return M.build_model(name, num_classes=num_classes, width=width)


@pytest.fixture(scope="module")
def table():
    return lin2020.table04()


@pytest.fixture(scope="module")
def paper():
    return lin2020.reported_table4()


# ------------------------------------------------------------------ Table 4 counts
def test_table4_covers_every_reported_row(table, paper):
    assert sorted(table.setting) == sorted(paper.index)


@pytest.mark.parametrize("setting", ["model=ResNet-20; dataset=CIFAR-10",
                                     "model=ResNet-20; dataset=CIFAR-100",
                                     "model=ResNet-50; dataset=ImageNet-1k",
                                     "model=DenseNet-40-12; dataset=CIFAR-10",
                                     "model=DenseNet-40-12; dataset=CIFAR-100",
                                     "model=WideResNet-28-10; dataset=CIFAR-10",
                                     "model=WideResNet-28-10; dataset=CIFAR-100"])
def test_parameter_count_equals_table4_to_printed_precision(setting, paper):
    label, dataset = (part.split("=")[1] for part in setting.split("; "))
    name = next(n for n, (lab, _) in lin2020.TABLE4.items() if lab == label)
    classes = next(c for d, c, _ in lin2020.TABLE4[name][1] if d == dataset)
    params = M.count_params(meta_model(name, classes))
    printed, decimals = paper.loc[setting, "parameters"], paper.loc[setting, "parameters decimals"]
    if setting in KNOWN_DIFFERENCES:
        assert params == KNOWN_DIFFERENCES[setting]
        assert round(params / 1e6, decimals) != printed  # still a difference: update the notes
        assert abs(params / 1e6 / printed - 1) < 0.025
    else:
        assert round(params / 1e6, decimals) == printed


def test_flop_conventions(table):
    t = table.set_index("setting")
    cifar = t[t.dataset != "ImageNet-1k"]
    # CIFAR rows print multiply-adds, and match them to the printed digits
    assert (cifar.convention == lin2020.MACS).all() and cifar.flops_match.all()
    assert (t.macs * 2 == t.flops).all()
    # ResNet-50 prints FLOPs = 2 x multiply-adds; torchvision (v1.5) is 6 % above the paper
    r50 = t.loc["model=ResNet-50; dataset=ImageNet-1k"]
    assert r50.convention == lin2020.FLOPS and not r50.flops_match
    assert 0.05 < r50.flops_per_image_billion / r50.paper_flops_billion - 1 < 0.07
    ratio = 1000 * t.flops_per_image_billion / t.params_million
    assert (ratio - t.ratio).abs().max() < 1e-9


def test_resnet50_v1_strides_give_the_papers_flops(paper):
    model = lin2020.resnet50_v1_strides(meta_model("resnet50", 1000))
    flops = M.count_flops(model, (3, 224, 224))
    assert round(flops / 1e9, 1) == paper.loc["model=ResNet-50; dataset=ImageNet-1k",
                                              "flops per image"]
    assert M.count_params(model) == KNOWN_DIFFERENCES["model=ResNet-50; dataset=ImageNet-1k"]


def test_count_flops_checks_shape_and_restores_mode():
    model = M.build_model("resnet20", width=0.25)
    model.train()
    assert M.count_flops(model, (1, 3, 32, 32)) == M.count_flops(model, (3, 32, 32)) > 0
    assert model.training
    with pytest.raises(ValueError, match="one image"):
        M.count_flops(model, (2, 3, 32, 32))


# ------------------------------------------------------------------ build
@pytest.mark.parametrize("name", ["resnet20", "densenet40_12", "wrn28_10"])
def test_forward_shape_small_width(name):
    torch.manual_seed(0)
    model = M.build_model(name, num_classes=7, width=SMALL[name])
    out = model(torch.randn(2, 3, 32, 32))
    assert out.shape == (2, 7) and torch.isfinite(out).all()


@pytest.fixture(scope="module")
def resnet50():
    torch.manual_seed(0)
    return M.build_model("resnet50", num_classes=1000)


def test_resnet50_forward_on_64px(resnet50):
    with torch.no_grad():
        assert resnet50.eval()(torch.randn(2, 3, 64, 64)).shape == (2, 1000)


def test_initialization_follows_section_4_1(resnet50):
    torch.manual_seed(0)
    for model in (M.build_model("resnet20"), M.build_model("wrn28_10", width=0.2), resnet50):
        fc = [m for m in model.modules() if isinstance(m, nn.Linear)]
        assert len(fc) == 1
        assert fc[0].weight.std().item() == pytest.approx(0.01, rel=0.15)
        assert fc[0].weight.mean().abs().item() < 0.003 and (fc[0].bias == 0).all()
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                assert (m.weight == 1).all() and (m.bias == 0).all()
        # He et al. (2015), fan_out: std = sqrt(2 / (out_channels * kh * kw))
        conv = max((m for m in model.modules() if isinstance(m, nn.Conv2d)),
                   key=lambda m: m.weight.numel())
        out_ch, _, kh, kw = conv.weight.shape
        assert conv.weight.std().item() == pytest.approx(math.sqrt(2 / (out_ch * kh * kw)),
                                                         rel=0.05)


@pytest.mark.parametrize("name", ["resnet20", "densenet40_12", "wrn28_10"])
def test_width_multiplier_shrinks_params(name):
    full, half = (M.count_params(meta_model(name, width=w)) for w in (1.0, 0.5))
    assert half < 0.4 * full  # parameters scale roughly with width squared


def test_resnet50_width_scales_its_stages_and_unknown_names_are_listed():
    full = M.count_params(meta_model("resnet50", 1000))
    quarter = M.build_model("resnet50", num_classes=10, width=0.25)
    assert quarter.layer1[0].conv1.out_channels == 16 and quarter.layer4[-1].conv3.out_channels == 512
    assert quarter.fc.in_features == 512 and quarter.conv1.out_channels == 64  # stem kept
    assert M.count_params(quarter) < full / 12  # ~ width squared
    assert quarter.eval()(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    with pytest.raises(ValueError, match="width"):
        M.build_model("resnet50", width=0.0)
    with pytest.raises(ValueError, match="resnet20.*densenet40_12.*wrn28_10.*resnet50"):
        M.build_model("resnet18")


def test_deterministic_under_seed():
    def state(seed):
        torch.manual_seed(seed)
        return M.build_model("densenet40_12", width=0.25).state_dict()

    a, b, c = state(0), state(0), state(1)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


# ------------------------------------------------------------------ weight decay
@pytest.mark.parametrize("name", NAMES)
def test_mask_marks_exactly_batchnorm_params(name):
    model = meta_model(name, width=1.0 if name == "resnet50" else 0.25)
    mask = M.no_weight_decay_mask(model)
    names = [n for n, _ in model.named_parameters()]
    assert len(mask) == len(list(model.parameters()))
    for n, flag in zip(names, mask):
        owner = model.get_submodule(n.rsplit(".", 1)[0])
        assert flag == isinstance(owner, nn.BatchNorm2d), n
    # in these models every 1-D parameter except the classifier's bias is a BN coefficient
    ndim = [p.ndim == 1 and not n.startswith("fc.") for n, p in model.named_parameters()]
    assert mask == ndim


def test_param_groups_partition_by_position():
    model = M.build_model("resnet20", width=0.25)
    mask = M.no_weight_decay_mask(model)
    # stacked replica tensors are no module attributes: groups must go by position
    stacked, _ = stack_module_state([model, copy.deepcopy(model)])
    params = list(stacked.values())
    decay, no_decay = M.param_groups(params, mask, weight_decay=1e-4)
    assert decay["weight_decay"] == 1e-4 and no_decay["weight_decay"] == 0.0
    ids = [id(p) for p in decay["params"]] + [id(p) for p in no_decay["params"]]
    assert sorted(ids) == sorted(id(p) for p in params) and len(set(ids)) == len(params)
    assert [id(p) for p in no_decay["params"]] == [id(p) for p, m in zip(params, mask) if m]
    assert len(no_decay["params"]) == 2 * 19  # 19 BN layers in ResNet-20, weight + bias each
    torch.optim.SGD(M.param_groups(model.parameters(), mask, 1e-4), lr=0.1, momentum=0.9)
    with pytest.raises(ValueError, match="mask"):
        M.param_groups(params[:-1], mask, 1e-4)


# ------------------------------------------------------------------ replicas
def test_functional_call_vmap_matches_each_copy():
    torch.manual_seed(0)
    copies = [M.build_model("resnet20", width=0.25) for _ in range(2)]  # different weights
    params, buffers = stack_module_state(copies)  # per-replica BN buffers
    base = copy.deepcopy(copies[0]).to("meta")
    x = torch.randn(2, 4, 3, 32, 32)

    def run(p, b, xb):
        return functional_call(base, (p, b), (xb,))

    out = vmap(run)(params, buffers, x)  # train mode: BN updates the stacked buffers
    ref = torch.stack([m(xb) for m, xb in zip(copies, x)])
    torch.testing.assert_close(out, ref)
    for k, m in enumerate(copies):
        torch.testing.assert_close(buffers["bn1.running_mean"][k], m.bn1.running_mean)
        torch.testing.assert_close(buffers["blocks.8.bn2.running_var"][k],
                                   m.blocks[8].bn2.running_var)
