"""The reproduction: the sources' experiments and the harness that turns them into figures.

Built on the library (`localsgd`), never imported by it (tests/test_import_contracts.py):

* `localsgd.paper.experiments`: one module per source (lin2020, slowmo, dynamo, hsgd_blog,
  timing_validation, convex) over `grid` (runs through the results cache, time axes) and
  `claims` (the one verdict rule);
* `localsgd.paper.bench`: the benchmarks (averaging, replicas, convex; the compiled-DDP and
  SlowMo break-even ones feed the dynamo and slowmo notebooks);
* the notebook harness: `notebook` (parameters, Session), `results` (tidy CSVs, provenance, the
  results cache), `reproduce` (papermill over every notebook), `report` (figures/REPORT.md);
* tools of the `localsgd` command (`cli`): `dry_run`, `profile`, `speed`, `gpu_plan`, `doctor`,
  and the straggler explorer (`explore`).

Needs the ``[paper]`` extra (pandas, seaborn, papermill, JupyterLab).
"""
