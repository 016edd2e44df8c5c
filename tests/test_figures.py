"""Committed figures fit a journal page: at most `results.PRINT_WIDTH` (7.5) inches wide at
print size (150 dpi, or the dpi a PNG states: the browser screenshot's), drawn with no text under
7 pt (`notebook.PRINT_STYLE`)."""

from pathlib import Path

import pandas as pd
import pytest
from PIL import Image

from localsgd.paper import notebook, results

ROOT = Path(__file__).resolve().parents[1]
PNGS = sorted((ROOT / "figures").rglob("*.png"))  # GPU artifacts and the screenshot too


@pytest.mark.parametrize("png", PNGS, ids=[str(p.relative_to(ROOT)) for p in PNGS])
def test_a_committed_figure_fits_a_page(png):
    image = Image.open(png)
    dpi = image.info.get("dpi", (150,))[0]
    assert image.size[0] <= results.PRINT_WIDTH * dpi + 1, f"{image.size[0] / dpi:.2f} in wide"


def test_the_print_style_has_no_text_under_7_points():
    sizes = {k: v for k, v in notebook.PRINT_STYLE.items() if "size" in k and "marker" not in k}
    assert sizes and min(sizes.values()) >= 7


def test_a_wide_figure_is_narrowed_when_saved(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(20, 3))
    for ax in axes:
        ax.plot([0, 1], [0, 1], label="a label long enough to widen the figure")
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.suptitle("a title " * 30)
    results.save_figure("wide", fig, pd.DataFrame({"x": [1]}), out_dir=tmp_path, params={},
                        mode="smoke", scale="reduced")
    width_px, _ = Image.open(tmp_path / "wide.png").size
    assert width_px <= results.PRINT_WIDTH * 150 + 1
    fig2, axes2 = notebook.panels(3)
    assert len(axes2) == 3 and fig2.get_size_inches()[0] <= results.PRINT_WIDTH


def test_no_notebook_or_plot_sets_text_under_7_points():
    """An explicit ``fontsize=`` or ``labelsize=`` under 7 would undo the print style."""
    import re

    small = re.compile(r"\b(fontsize|labelsize)\s*=\s*([0-6](\.\d+)?)\b")
    found = [f"{path.relative_to(ROOT)}: {m.group(0)}"
             for path in [*(ROOT / "notebooks").glob("*.ipynb"),
                          *(ROOT / "src" / "localsgd" / "paper").rglob("*.py")]
             for m in small.finditer(path.read_text())]
    assert found == [], found
