"""`localsgd bench proxy`: the long proxy's pilot grid runs and reports every point it times."""

import json

from localsgd.paper.bench import proxy
from localsgd.paper.cli import BENCHES


def test_the_pilot_grid_times_each_point_and_counts_its_flops(capsys):
    assert BENCHES["proxy"] == "localsgd.paper.bench.proxy"
    proxy.main(["--widths", "0.25", "--resolutions", "16", "8", "--batches", "4",
                "--layouts", "contiguous", "--precisions", "fp32", "--steps", "1",
                "--warmup", "0", "--rounds", "1", "--threads", "1", "--json"])
    out = json.loads(capsys.readouterr().out)
    points = out["points"]
    assert [p["resolution"] for p in points] == [16, 8]
    # a quarter of the pixels costs about a quarter of the FLOPs (convolutions dominate)
    assert 0.2 < points[1]["gflop_per_step"] / points[0]["gflop_per_step"] < 0.3
    assert all(p["img_per_s"] > 0 and 0 < p["matmul_fraction"] for p in points)
    assert out["matmul_gflops"]["fp32"] > 0
