"""Probe (session 2026-11-26c): K ResNet-20s packed in channel groups ([B, K*C, H, W], grouped
convolutions, one BatchNorm over K*C channels) vs the vmap engine vs one model at batch K*B.
Parameters are the BatchedReplicaEngine's stacked views, so the packed step trains the same stack.
Usage: python packed.py [cpu-check|gpu OUT.json]"""
import json, statistics, sys, time
import torch, torch.nn.functional as F
from localsgd.models import build_model
from localsgd.engines.batched import BatchedReplicaEngine
from localsgd.schedule import SyncSchedule
from localsgd.topology import Topology

def packed_losses(P, Bf, x, y, K, fmt):
    B, H, W = x.shape[1], x.shape[3], x.shape[4]
    h = x.transpose(0, 1).reshape(B, K * 3, H, W).contiguous(memory_format=fmt)
    def conv(h, n, s):
        w = P[n + ".weight"]
        return F.conv2d(h, w.reshape(K * w.shape[1], *w.shape[2:]), stride=s, padding=1, groups=K)
    def bn(h, n):
        return F.batch_norm(h, Bf[n + ".running_mean"].view(-1), Bf[n + ".running_var"].view(-1),
                            P[n + ".weight"].reshape(-1), P[n + ".bias"].reshape(-1), True, 0.1, 1e-5)
    h = F.relu(bn(conv(h, "conv1", 1), "bn1"))
    c = P["conv1.weight"].shape[1]
    for i in range(9):
        n = f"blocks.{i}"
        cout = P[n + ".conv1.weight"].shape[1]
        s = 2 if cout != c else 1
        o = F.relu(bn(conv(h, n + ".conv1", s), n + ".bn1"))
        o = bn(conv(o, n + ".conv2", 1), n + ".bn2")
        sc = h
        if s != 1:
            sc = sc[:, :, ::s, ::s]
        if cout != c:
            b_, _, hh, ww = sc.shape
            lo = (cout - c) // 2
            sc = F.pad(sc.reshape(b_, K, c, hh, ww), (0, 0, 0, 0, lo, cout - c - lo)).reshape(b_, K * cout, hh, ww)
        h, c = F.relu(o + sc), cout
    f = F.adaptive_avg_pool2d(h, 1).reshape(B, K, c)
    logits = torch.einsum("bkc,koc->bko", f, P["fc.weight"]) + P["fc.bias"]
    return F.cross_entropy(logits.permute(0, 2, 1), y.t(), reduction="none").mean(0)

def make(K, b, device, dtype=torch.float32):
    torch.manual_seed(0)
    model_fn = lambda: build_model("resnet20", num_classes=10).to(dtype)
    e = BatchedReplicaEngine(model_fn, SyncSchedule(Topology.from_paper(K, 8)),
                             lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=1e-4),
                             seed=0, device=device)
    g = torch.Generator().manual_seed(1)
    xs = [torch.rand((b, 3, 32, 32), generator=g).to(device, dtype) for _ in range(K)]
    ys = [torch.randint(0, 10, (b,), generator=g).to(device) for _ in range(K)]
    return e, xs, ys

def cpu_check():
    K, b = 3, 8
    e, xs, ys = make(K, b, "cpu", torch.float64)
    x, y = torch.stack(xs), torch.stack(ys)
    l1, _ = e._forward(x, y, F.cross_entropy)
    l1.sum().backward()
    g1 = {n: p.grad.clone() for n, p in e.params.items()}
    rm1 = {n: t.clone() for n, t in e.buffers.items()}
    e2, _, _ = make(K, b, "cpu", torch.float64)
    l2 = packed_losses(e2.params, e2.buffers, x, y, K, torch.contiguous_format)
    l2.sum().backward()
    print("loss diff", (l1 - l2).abs().max().item())
    print("grad diff", max((g1[n] - p.grad).abs().max().item() for n, p in e2.params.items()))
    print("buf diff", max((rm1[n].double() - t.double()).abs().max().item() for n, t in e2.buffers.items()))

def gpu(out):
    from localsgd.numerics import apply_numerics
    dev = torch.device("cuda")
    apply_numerics("tf32", False, dev)
    K, b = 16, 128
    res = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__}
    def timeit(name, step, images, windows=5, calls=20, warm=10):
        try:
            for _ in range(warm): step()
            torch.cuda.synchronize()
            r = []
            for _ in range(windows):
                t = time.perf_counter()
                for _ in range(calls): step()
                torch.cuda.synchronize()
                r.append(calls * images / (time.perf_counter() - t))
            res[name] = round(statistics.median(r), 1)
        except Exception as exc:
            res[name] = f"{type(exc).__name__}: {str(exc)[:300]}"
        print(name, res[name], flush=True)
        json.dump(res, open(out, "w"), indent=1)
    for fmt_name, fmt in (("nhwc", torch.channels_last), ("nchw", torch.contiguous_format)):
        torch.manual_seed(0)
        m = build_model("resnet20", num_classes=10).to(dev).to(memory_format=fmt)
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
        e, xs, ys = make(K, b, dev)
        X, Y = torch.cat(xs).contiguous(memory_format=fmt), torch.cat(ys)
        def single(m=m, opt=opt, X=X, Y=Y):
            opt.zero_grad(set_to_none=True); F.cross_entropy(m(X), Y).backward(); opt.step()
        timeit(f"single_b2048_{fmt_name}", single, K * b)
        batches = [(x.contiguous(memory_format=fmt), y) for x, y in zip(xs, ys)]
        timeit(f"vmap_k16_{fmt_name}", lambda: e.step(batches, F.cross_entropy, sync=False), K * b)
        x, y = torch.stack(xs), torch.stack(ys)
        def packed(e=e, x=x, y=y, fmt=fmt):
            e.optimizer.zero_grad(set_to_none=True)
            packed_losses(e.params, e.buffers, x, y, K, fmt).sum().backward()
            e.optimizer.step()
        timeit(f"packed_k16_{fmt_name}", packed, K * b)
    # compiled variants (compile time reported)
    e, xs, ys = make(K, b, dev); x, y = torch.stack(xs), torch.stack(ys)
    f = torch.compile(lambda P, Bf, x, y: packed_losses(P, Bf, x, y, K, torch.channels_last))
    def packed_c():
        e.optimizer.zero_grad(set_to_none=True)
        f(e.params, e.buffers, x, y).sum().backward()
        e.optimizer.step()
    t = time.perf_counter(); packed_c(); torch.cuda.synchronize(); res["packed_compile_s"] = round(time.perf_counter() - t, 1)
    timeit("packed_k16_nhwc_compiled", packed_c, K * b)
    torch.manual_seed(0)
    m = build_model("resnet20", num_classes=10).to(dev).to(memory_format=torch.channels_last)
    mc = torch.compile(m)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    X, Y = torch.cat(xs).contiguous(memory_format=torch.channels_last), torch.cat(ys)
    def single_c():
        opt.zero_grad(set_to_none=True); F.cross_entropy(mc(X), Y).backward(); opt.step()
    t = time.perf_counter(); single_c(); torch.cuda.synchronize(); res["single_compile_s"] = round(time.perf_counter() - t, 1)
    timeit("single_b2048_nhwc_compiled", single_c, K * b)

if __name__ == "__main__":
    cpu_check() if sys.argv[1] == "cpu-check" else gpu(sys.argv[2])
