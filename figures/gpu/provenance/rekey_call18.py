"""Keep call 18's H100 Table 1 runs under today's results key, so their figure can be redrawn.

Run once on 2026-11-29 (figures/gpu/README.md, "Call 18's runs kept under today's key"):

    .venv/bin/python figures/gpu/provenance/rekey_call18.py

Call 18 (commit 380cee0) wrote its 12 cache entries (`h100/converged/call18_table01/`) under the
former key, a hash of the library's definitions; runs are keyed by meaning now
(`localsgd.training.results_key`). The evidence that the arithmetic those runs depend on has not
changed since is the CPU's, by a chain: 380cee0 -> 4d91cb5 and -> 1e34512 (CPU records bitwise
unchanged, two runs checked at each), 1e34512 -> cc703aa (golden records bitwise equal; the CPU's
kept Table 1 runs were re-keyed there without retraining), and `RESULTS_VERSION` never bumped
since (the golden test fails when numbers change without a bump). It covers the CPU's float32
arithmetic, not CUDA's TF32 / cuDNN kernels, which are not bitwise repeatable run to run anyway
(figures/gpu/README.md, call 18). Each entry's records are copied unchanged; its ``.json`` held
only ``name`` and ``params`` (no library hash or commit was recorded then): the parameters are
written as today's whole config (fields added since at their defaults), with the results version
and a ``rekeyed`` note. The folder written is the kept-runs folder a render with
``--out-dir figures/gpu/h100`` reads (`localsgd reproduce` keeps converged runs in
``<out-dir>/converged/runs``); the proof that the keys serve is that render, which trained
nothing.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from localsgd.paper.experiments import grid
from localsgd.training.config import TrainConfig
from localsgd.training.results_key import RESULTS_VERSION

HERE = Path(__file__).resolve().parents[1] / "h100" / "converged"
SOURCE, KEPT = HERE / "call18_table01", HERE / "runs"


def main() -> None:
    KEPT.mkdir(exist_ok=True)
    for meta_path in sorted(SOURCE.glob("train-*.json")):
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        cfg = TrainConfig.from_dict(meta["params"])
        name = grid._entry(cfg).name  # the file name today's key gives these parameters
        meta = {**meta, "params": cfg.to_dict(), "results_version": RESULTS_VERSION,
                "rekeyed": {"from": meta_path.name, "on": "2026-11-29",
                            "by": "figures/gpu/provenance/rekey_call18.py"}}
        (KEPT / name).with_suffix(".json").write_text(json.dumps(meta, indent=2, sort_keys=True)
                                                      + "\n", encoding="utf-8")
        shutil.copyfile(meta_path.with_suffix(".csv"), KEPT / name)
        assert grid.find_kept(cfg, KEPT) is not None, name
        print(meta_path.name, "->", name)


if __name__ == "__main__":
    main()
