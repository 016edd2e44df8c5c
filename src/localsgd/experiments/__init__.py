"""The experiments, one module per source over shared grid helpers (configurations, grids and
every claim's verdict; notebooks call these):

* `localsgd.experiments.grid`: grids of `TrainConfig` runs, time axes, time-to-accuracy,
  speed-ups.
* `localsgd.experiments.claims`: the seed-spread verdict rule and claim rows.
* `localsgd.experiments.lin2020`: Lin et al. (2020)'s tables and figures (Tables 1, 2, 4, 5,
  Figure 7, App. D).
* `localsgd.experiments.slowmo`: fairscale's SlowMo page (quality grid and summary).
* `localsgd.experiments.dynamo`: the TorchDynamo + DDP update's claims (`localsgd.bench.ddp`).
* `localsgd.experiments.hsgd_blog`: the PyTorch hierarchical-SGD blog's benchmark schemes.
* `localsgd.experiments.timing_validation`: the wall-clock model against real torchrun runs.
* `localsgd.experiments.convex`: §3.4's time model and the Figure 4 / 5 sweeps over the convex
  simulator (`localsgd.convex`).
"""
