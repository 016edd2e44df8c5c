"""Time: what communication costs and what a schedule's wall clock is.

* `localsgd.timing.comm`: Appendix B's all-reduce arithmetic and eq. (6).
* `localsgd.timing.cluster`: `Cluster` and `modelled_time`, the deep-learning figures' time axes.
* `localsgd.timing.stragglers`: emulated stalls and the runner's compute / waiting /
  communication split.
* `localsgd.timing.scheme`: `Scheme`, one communication schedule, and its per-step plan.
* `localsgd.timing.simulate`: the wall-clock simulator of sync, local, hierarchical SGD, SlowMo
  and SGP with stragglers.
* `localsgd.timing.plan`: the schedule planner (``localsgd plan``).

Pure numpy / pandas: nothing here imports torch.
"""
