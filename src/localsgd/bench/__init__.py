"""Benchmarks, one module each, every one a ``main(argv)`` behind ``localsgd bench NAME``:

* `localsgd.bench.averaging`: our flat-buffer averager vs torch's ``average_parameters``.
* `localsgd.bench.replicas`: samples/s of the replica engines vs one plain model.
* `localsgd.bench.ddp`: DDP eager vs TorchDynamo's DDP modes (``optimize_ddp``).
* `localsgd.bench.convex`: the convex simulator vs its NumPy reference.
* `localsgd.bench.breakeven`: the SlowMo page's break-even rule (a library call, not a command).

`localsgd.bench.common` gives them one output: what they ran on (`machine`) and one JSON line or
``key: value`` lines (`emit`).
"""
