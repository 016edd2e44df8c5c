"""Training: one run's configuration, how a machine runs it, the loop, and its front door.

* `localsgd.training.config`: `TrainConfig`, one run's recipe and execution choices, validated;
* `localsgd.training.plan`: `RunPlan`, how this machine runs a config (device, engine, threads,
  precision, layout), resolved once and then only read;
* `localsgd.training.loop`: the one training loop (`train`, `build_engine`), over
  `localsgd.training.state` (what it carries between updates) and
  `localsgd.training.batch_sources` (its mini-batches and test sums);
* `localsgd.training.checkpoint`: its saved state; `localsgd.training.packs`: many runs packed
  into one process (`train_runs`); `localsgd.training.results_key`: what a run's results are
  keyed by;
* `localsgd.training.runner`: the torchrun worker, its flags `localsgd.training.runner_args` and
  output folder `localsgd.training.runner_outputs`;
* `localsgd.training.cli`: ``localsgd train``, the one front door (either engine).
"""
