"""The experiments, one module per source over shared grid helpers (configurations, grids and
every claim's verdict; notebooks call these):

* `localsgd.paper.experiments.grid`: grids of `TrainConfig` runs, time axes, time-to-accuracy,
  speed-ups.
* `localsgd.paper.experiments.claims`: the verdict rule (one-sided 95 % t bound), the regime check and claim rows.
* `localsgd.paper.experiments.lin2020`: Lin et al. (2020)'s figures and tables (Figures 6-10,
  Tables 1-7, App. B, D), a package with one module per artifact.
* `localsgd.paper.experiments.slowmo`: fairscale's SlowMo page (quality grid and summary).
* `localsgd.paper.experiments.dynamo`: the TorchDynamo + DDP update's claims (`localsgd.paper.bench.ddp`).
* `localsgd.paper.experiments.hsgd_blog`: the PyTorch hierarchical-SGD blog's benchmark schemes.
* `localsgd.paper.experiments.timing_validation`: the wall-clock model against real torchrun runs.
* `localsgd.paper.experiments.comm_quality`: beyond the sources, communication against quality
  (DiLoCo, streaming DiLoCo, compressed averages beside local SGD).
* `localsgd.paper.experiments.convex`: §3.4's time model and the Figure 4 / 5 sweeps over the convex
  simulator (`localsgd.convex`).
"""
