"""Benchmarks, one module each, every one a ``main(argv)`` behind ``localsgd bench NAME``:

* `localsgd.paper.bench.allocator`: CPU training images/s with glibc's default allocator vs
  the harness's (`ALLOCATOR_ENV`, which `localsgd reproduce` gives its kernels).
* `localsgd.paper.bench.averaging`: our flat-buffer averager vs torch's ``average_parameters``.
* `localsgd.paper.bench.proxy`: one ResNet-20 worker's images/s over the long proxy's levers
  (resolution, width, batch, layout, bf16), beside the machine's matmul rate.
* `localsgd.paper.bench.replicas`: samples/s of the replica engines vs one plain model.
* `localsgd.paper.bench.ddp`: DDP eager vs TorchDynamo's DDP modes (``optimize_ddp``).
* `localsgd.paper.bench.convex`: the convex simulator vs its NumPy reference.
* `localsgd.paper.bench.breakeven`: the SlowMo page's break-even rule (a library call, not a command).

`localsgd.paper.bench.common` gives them one output: what they ran on (`machine`) and one JSON line or
``key: value`` lines (`emit`).
"""
