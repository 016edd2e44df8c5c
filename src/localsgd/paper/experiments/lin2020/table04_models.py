"""Table 4 (App. F.1): parameters and flops per image of the paper's models, counted on the meta
device (`table04`) beside the printed numbers (`reported_table4`), and their compare rows
(`table04_rows`). The module is named for its notebook (table04_models): ``lin2020.table04`` is
the counting function.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd
import torch
from torch import nn

from localsgd.models import build_model, count_flops, count_params
from localsgd.paper.experiments.claims import claim_row
from localsgd.paper.results import repo_root

__all__ = ["FLOPS", "MACS", "TABLE4", "printed_rel_tol", "reported_table4",
           "resnet50_v1_strides", "table04", "table04_rows"]


# model → (Table 4's name, [(dataset, classes, input shape)])
TABLE4 = {
    "resnet20": ("ResNet-20", [("CIFAR-10", 10, (3, 32, 32)), ("CIFAR-100", 100, (3, 32, 32))]),
    "resnet50": ("ResNet-50", [("ImageNet-1k", 1000, (3, 224, 224))]),
    "densenet40_12": ("DenseNet-40-12",
                      [("CIFAR-10", 10, (3, 32, 32)), ("CIFAR-100", 100, (3, 32, 32))]),
    "wrn28_10": ("WideResNet-28-10",
                 [("CIFAR-10", 10, (3, 32, 32)), ("CIFAR-100", 100, (3, 32, 32))]),
}
MACS = "multiply-adds (MACs)"
FLOPS = "FLOPs (2 per multiply-add)"


def resnet50_v1_strides(model: nn.Module) -> nn.Module:
    """Move torchvision ResNet-50's downsampling stride from each bottleneck's 3×3 conv to its
    first 1×1 conv, as in He et al. (2016a)'s original ("v1"); parameters are unchanged. Used
    only to explain Table 4's ResNet-50 flop count."""
    for layer in (model.layer2, model.layer3, model.layer4):
        first = layer[0]
        first.conv1.stride, first.conv2.stride = first.conv2.stride, (1, 1)
    return model


def reported_table4(papers_dir: str | Path | None = None) -> pd.DataFrame:
    """Table 4 as transcribed in ``papers/lin2020_local_sgd/reported.csv``, one row per setting.

    Columns are the three metrics (floats) and, per metric, ``<metric> decimals``: the digits
    the paper prints, so a count can be checked "to the printed precision".
    """
    papers = Path(papers_dir) if papers_dir is not None else repo_root() / "papers"
    raw = pd.read_csv(papers / "lin2020_local_sgd" / "reported.csv", dtype=str,
                      keep_default_na=False)
    raw = raw[raw.artifact == "Table 4"]
    values = raw.pivot(index="setting", columns="metric", values="value")
    out = values.astype(float)
    for metric in values.columns:
        out[f"{metric} decimals"] = values[metric].map(
            lambda v: len(v.split(".")[1]) if "." in v else 0)
    return out


def printed_rel_tol(value: float, decimals: int) -> float:
    """Relative tolerance of "equal to the printed precision": half a unit in the last digit."""
    return 0.5 * 10.0 ** -decimals / abs(value)


def table04(models: Sequence[str] | None = None,
            papers_dir: str | Path | None = None) -> pd.DataFrame:
    """Our counts beside App. F.1 Table 4: one row per model and dataset.

    Columns: ``params``, ``flops`` (FlopCounterMode, one image, 2 per multiply-add), ``macs``
    (= flops / 2), the paper's three numbers, ``convention`` (MACs or FLOPs: whichever is closer
    to the paper's "flops per image"), ``flops_per_image_billion`` (ours in that convention),
    ``ratio`` (flops per image / parameters in billion / million, Table 4's last column), and
    ``params_rel_tol``/``flops_rel_tol``: half a unit of the paper's last printed digit, relative.
    Models are built on the meta device, so even WRN-28-10 and ResNet-50 count in a second.
    """
    paper = reported_table4(papers_dir)
    rows = []
    for name in models if models is not None else list(TABLE4):
        if name not in TABLE4:
            raise ValueError(f"unknown model {name!r}; Table 4 has {', '.join(TABLE4)}")
        label, datasets = TABLE4[name]
        for dataset, classes, shape in datasets:
            with torch.device("meta"):  # shapes only: no weights allocated, no compute
                model = build_model(name, num_classes=classes)
            params, flops = count_params(model), count_flops(model, shape)
            macs = flops // 2
            setting = f"model={label}; dataset={dataset}"
            p = paper.loc[setting]
            p_flops = p["flops per image"]
            # the convention whose count is closer (relatively) to the printed number
            err_macs, err_flops = abs(macs / 1e9 / p_flops - 1), abs(flops / 1e9 / p_flops - 1)
            convention, ours = (MACS, macs) if err_macs <= err_flops else (FLOPS, flops)
            note = ""
            if name == "resnet50":
                v1 = count_flops(resnet50_v1_strides(model), shape)
                note = (f"torchvision is ResNet-50 v1.5 (stride on the 3x3 conv); with the "
                        f"original v1 strides: {v1 / 1e9:.3f} B FLOPs = {v1 / 2e9:.3f} B MACs")
            rows.append({
                "model": label, "dataset": dataset, "setting": setting, "name": name,
                "num_classes": classes, "input_shape": "x".join(map(str, shape)),
                "params": params, "flops": flops, "macs": macs,
                "paper_params_million": p["parameters"], "paper_flops_billion": p_flops,
                "paper_ratio": p["computation/communication scaling ratio"],
                "params_million": params / 1e6, "convention": convention,
                "flops_per_image_billion": ours / 1e9,
                "ratio": (ours / 1e9) / (params / 1e6) * 1000,  # billion / million, as printed
                "params_rel_tol": printed_rel_tol(p["parameters"], p["parameters decimals"]),
                "flops_rel_tol": printed_rel_tol(p_flops, p["flops per image decimals"]),
                "note": note,
            })
    df = pd.DataFrame(rows)
    df["params_match"] = ((df.params_million / df.paper_params_million - 1).abs()
                          <= df.params_rel_tol)
    df["flops_match"] = ((df.flops_per_image_billion / df.paper_flops_billion - 1).abs()
                         <= df.flops_rel_tol)
    return df


def table04_rows(table: pd.DataFrame) -> list[dict]:
    """Compare rows of App. F.1 Table 4 from `table04`'s table: per model and data set the
    parameters (million), flops per image (billion, in the paper's convention for the row) and
    their ratio. Exact counts at full width, so no claim and no seed: the report checks each
    count against the printed one within half a unit of its last digit (``rel_tol``); the
    ratio has none (the paper divides its rounded numbers)."""

    conv = {MACS: "multiply-adds (paper's convention for this row)",
            FLOPS: "FLOPs = 2 x multiply-adds (paper's convention for this row)"}
    notes = {  # where our exact count and the printed one differ beyond printing precision
        "model=ResNet-20; dataset=CIFAR-100": "100-way classifier adds 5,850 parameters "
                                              "(0.2756 M); the paper repeats CIFAR-10's 0.27",
        "model=ResNet-50; dataset=ImageNet-1k": "torchvision ResNet-50 has 25.557 M; the paper "
                                                "prints the customary 25 M",
    }
    rows = []
    for r in table.itertuples():
        rows += [
            claim_row("Table 4", r.setting, "parameters", r.params_million, unit="million",
                      rel_tol=r.params_rel_tol, note=notes.get(r.setting, "exact count")),
            claim_row("Table 4", r.setting, "flops per image", r.flops_per_image_billion,
                      unit="billion", rel_tol=r.flops_rel_tol,
                      note="; ".join(filter(None, [conv[r.convention], r.note]))),
            claim_row("Table 4", r.setting, "computation/communication scaling ratio", r.ratio,
                      note="ours from unrounded counts; the paper divides its rounded numbers"),
        ]
    return rows
