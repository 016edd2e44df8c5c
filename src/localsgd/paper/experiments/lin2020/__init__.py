"""Lin, Stich, Patel, Jaggi (2020), "Don't Use Large Mini-Batches, Use Local SGD" (§4, App. B, C,
D, F): one module per artifact with its configurations, its tables and the claim checks beside
them, over `common` (what several artifacts share).

Grids run through `localsgd.paper.experiments.grid.run_grid` (cached); time axes, speed-ups and
verdicts are `localsgd.paper.experiments.grid`'s. Each training artifact's module has
``configs(P, seeds)``: the `TrainConfig`s its notebook trains, from the notebook's parameters
``P`` (plus labels where the notebook needs them), and ``base(P)`` where the notebook saves its
base run. The notebook and `localsgd.paper.gpu_plan` both call it, so no grid is written twice.
One function per artifact turns its measured table into compare rows (`claims.claim_row`) with a
verdict by the one rule (`claims.verdict`: one-sided 95 % t bound); tests/test_claims_lin2020*.py feed them
hand-made records.

* `fig01`: Figure 1 (§1), the all-reduce time over processes, measured on the emulated cluster.
* `fig06`: Figure 6 (§4.2.1), H = 1 … 16 on CIFAR-10: grid, speed-up and test-accuracy claims.
* `fig07`: Figure 7 (§4.2.1), scaling over K: grid and claims (`scaling_table` is `common`'s).
* `fig08`: Figure 8 (§4.2.2), ResNet-50 on ImageNet: runs, torchrun commands, claim.
* `fig09`: Figure 9 (§4.3), hierarchical local SGD under delays: grid and claim.
* `fig10`: Figure 10 (App. F.2.2), CIFAR-100: grid and claim.
* `sec43`: §4.3's hierarchical against flat averaging as nodes are added (emulated cluster).
* `table01`: Table 1 (§4.2.1, App. C), large batches with and without the tricks.
* `table02`: Table 2 (§4.3), training time over H: fitted cost model, stragglers, claim.
* `table03`: Table 3 (§4.3, App. B), topologies at H·H^b = 16: grid and claim; its
  "# of sync." rows counted by the schedule (the appB_comm_cost notebook).
* `table04_models`: Table 4 (App. F.1), parameter and flop counts.
* `table05`: Table 5 (App. F.2.1), three models on CIFAR-10/100 at H = 1 and 8.
* `table06_07`: Tables 6-7 (App. D, F.3), momentum schemes.
* `common`: seed pairing, verdict text, run notes, the paper's cells, speed-up tables, step costs.

Every name the notebooks, tests and other modules use is re-exported here
(``lin2020.fig06_claims``, ``lin2020.table02_fit``, ``lin2020.fig06_configs`` = ``fig06.configs``).
"""

from localsgd.paper.experiments.lin2020 import (
    common,
    fig01,
    fig06,
    fig07,
    fig08,
    fig09,
    fig10,
    sec43,
    table01,
    table02,
    table03,
    table04_models,
    table05,
    table06_07,
)
from localsgd.paper.experiments.lin2020.common import (
    cifar_run_note,
    scaling_table,
    step_costs_from_running_times,
    table5_step_costs,
)
from localsgd.paper.experiments.lin2020.fig06 import FIG06_CLAIM, FIG06_TEST_CLAIM, fig06_claims
from localsgd.paper.experiments.lin2020.fig06 import configs as fig06_configs
from localsgd.paper.experiments.lin2020.fig07 import fig07_claims
from localsgd.paper.experiments.lin2020.fig08 import (
    FIG08_BASELINE,
    FIG08_CONFIG_DIR,
    FIG08_TORCHRUN_ONLY,
    fig08_claims,
    fig08_configs,
    fig08_load_runs,
    fig08_runs,
    fig08_torchrun,
    fig08_torchrun_only,
)
from localsgd.paper.experiments.lin2020.fig09 import fig09_claims
from localsgd.paper.experiments.lin2020.fig10 import FIG10_MAX_LOSS, fig10_claims
from localsgd.paper.experiments.lin2020.table01 import (
    TABLE01_CLAIM,
    table01_claims,
    table01_configs,
    table01_reported,
)
from localsgd.paper.experiments.lin2020.table02 import (
    TABLE02_CLAIM,
    TABLE02_MIN_H,
    TABLE02_RISE_MIN,
    TABLE02_SETTING,
    Table02Fit,
    barrier_time_per_update,
    fit_step_costs,
    resnet20_param_bytes,
    table02_claims,
    table02_fit,
    table02_fit_lines,
    table02_model_variants,
    table02_reported,
    table02_rises,
    table02_stragglers,
    update_and_sync_counts,
)
from localsgd.paper.experiments.lin2020.table03 import appB_rows, appB_table3, table03_claims
from localsgd.paper.experiments.lin2020.table04_models import (
    FLOPS,
    MACS,
    TABLE4,
    printed_rel_tol,
    reported_table4,
    resnet50_v1_strides,
    table04,
    table04_rows,
)
from localsgd.paper.experiments.lin2020.table05 import (
    TABLE05_BY,
    TABLE05_CLAIM,
    TABLE05_DATASETS,
    TABLE05_MODELS,
    table05_claims,
    table05_configs,
    table05_data,
    table05_final,
    table05_status,
)
from localsgd.paper.experiments.lin2020.table06_07 import (
    TABLE06_CLAIMS,
    momentum_config,
    table06_07_claims,
    table06_07_configs,
    table06_07_reported,
)

__all__ = [
    "FIG06_CLAIM", "FIG06_TEST_CLAIM", "FIG08_BASELINE", "FIG08_CONFIG_DIR", "FIG08_TORCHRUN_ONLY",
    "FIG10_MAX_LOSS", "FLOPS", "MACS", "TABLE01_CLAIM", "TABLE02_CLAIM", "TABLE02_MIN_H",
    "TABLE02_RISE_MIN", "TABLE02_SETTING", "TABLE05_BY", "TABLE05_CLAIM", "TABLE05_DATASETS",
    "TABLE05_MODELS", "TABLE06_CLAIMS", "TABLE4", "Table02Fit", "appB_rows", "appB_table3",
    "barrier_time_per_update", "cifar_run_note", "common", "fig01", "fig06", "fig06_claims",
    "fig06_configs", "fig07", "fig07_claims", "fig08", "fig08_claims", "fig08_configs",
    "fig08_load_runs", "fig08_runs", "fig08_torchrun", "fig08_torchrun_only", "fig09",
    "fig09_claims", "fig10", "fig10_claims", "fit_step_costs", "momentum_config",
    "printed_rel_tol", "reported_table4", "resnet20_param_bytes", "resnet50_v1_strides",
    "scaling_table", "sec43", "step_costs_from_running_times", "table01", "table01_claims",
    "table01_configs", "table01_reported", "table02", "table02_claims", "table02_fit",
    "table02_fit_lines", "table02_model_variants", "table02_reported", "table02_rises",
    "table02_stragglers", "table03", "table03_claims", "table04", "table04_models", "table04_rows",
    "table05", "table05_claims", "table05_configs", "table05_data", "table05_final",
    "table05_status", "table06_07", "table06_07_claims", "table06_07_configs",
    "table06_07_reported", "table5_step_costs", "update_and_sync_counts"
]
