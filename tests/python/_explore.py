import torch, torch.distributed as dist
import cuda_p2p

def probe(ctx):
    out = {}
    W = ctx.world_size
    g = ctx.gloo
    def tryit(name, f):
        for grp_name, grp in (("gloo", g), ("p2p", None)):
            try:
                f(grp); out[(name, grp_name)] = "ok"
            except Exception as e:
                out[(name, grp_name)] = f"{type(e).__name__}: {str(e).splitlines()[0][:150]}"
    for dt in (torch.float32, torch.bfloat16, torch.int64):
        for n in (0, 1):
            t = lambda: torch.ones(n, dtype=dt)
            tryit(f"allreduce {dt} {n}", lambda grp: dist.all_reduce(t(), group=grp))
            tryit(f"allreduce avg {dt} {n}", lambda grp: dist.all_reduce(t(), op=dist.ReduceOp.AVG, group=grp))
            tryit(f"allreduce band {dt} {n}", lambda grp: dist.all_reduce(t(), op=dist.ReduceOp.BAND, group=grp))
            tryit(f"broadcast {dt} {n}", lambda grp: dist.broadcast(t(), 0, group=grp))
            tryit(f"reduce {dt} {n}", lambda grp: dist.reduce(t(), 0, group=grp))
            tryit(f"all_gather {dt} {n}", lambda grp: dist.all_gather([t() for _ in range(W)], t(), group=grp))
            tryit(f"agit {dt} {n}", lambda grp: dist.all_gather_into_tensor(torch.empty(n*W, dtype=dt), t(), group=grp))
            tryit(f"gather {dt} {n}", lambda grp: dist.gather(t(), [t() for _ in range(W)] if ctx.rank==0 else None, dst=0, group=grp))
            tryit(f"scatter {dt} {n}", lambda grp: dist.scatter(t(), [t() for _ in range(W)] if ctx.rank==0 else None, src=0, group=grp))
            tryit(f"reduce_scatter {dt} {n}", lambda grp: dist.reduce_scatter(t(), [t() for _ in range(W)], group=grp))
            tryit(f"rst {dt} {n}", lambda grp: dist.reduce_scatter_tensor(t(), torch.ones(n*W, dtype=dt), group=grp))
            tryit(f"a2a {dt} {n}", lambda grp: dist.all_to_all([t() for _ in range(W)], [t() for _ in range(W)], group=grp))
            tryit(f"a2as {dt} {n}", lambda grp: dist.all_to_all_single(torch.empty(n*W, dtype=dt), torch.ones(n*W, dtype=dt), group=grp))
            tryit(f"arc {dt} {n}", lambda grp: dist.all_reduce_coalesced([t(), t()], group=grp))
    return out

def probe2(ctx):
    out = {}
    W, r = ctx.world_size, ctx.rank
    g = ctx.gloo
    def tryit(name, f):
        for grp_name, grp in (("gloo", g), ("p2p", dist.group.WORLD)):
            try:
                out[(name, grp_name)] = repr(f(grp))[:200]
            except Exception as e:
                out[(name, grp_name)] = f"EXC {type(e).__name__}: {str(e).splitlines()[0][:200]}"
    t = lambda: torch.ones(3)
    def fut(work):
        try:
            f = work.get_future()
            return f.wait()
        except Exception as e:
            return f"nofuture {type(e).__name__}: {str(e).splitlines()[0][:100]}"
    tryit("ar fut", lambda grp: fut(dist.all_reduce(t(), group=grp, async_op=True)))
    tryit("bc fut", lambda grp: fut(dist.broadcast(t(), 0, group=grp, async_op=True)))
    tryit("reduce fut", lambda grp: fut(dist.reduce(t(), 0, group=grp, async_op=True)))
    tryit("ag fut", lambda grp: fut(dist.all_gather([t() for _ in range(W)], t(), group=grp, async_op=True)))
    tryit("agit fut", lambda grp: fut(dist.all_gather_into_tensor(torch.empty(3*W), t(), group=grp, async_op=True)))
    tryit("gather fut", lambda grp: fut(dist.gather(t(), [t() for _ in range(W)] if r==0 else None, 0, group=grp, async_op=True)))
    tryit("scatter fut", lambda grp: fut(dist.scatter(t(), [t() for _ in range(W)] if r==0 else None, 0, group=grp, async_op=True)))
    tryit("rs fut", lambda grp: fut(dist.reduce_scatter(t(), [t() for _ in range(W)], group=grp, async_op=True)))
    tryit("rst fut", lambda grp: fut(dist.reduce_scatter_tensor(t(), torch.ones(3*W), group=grp, async_op=True)))
    tryit("a2a fut", lambda grp: fut(dist.all_to_all([t() for _ in range(W)], [t() for _ in range(W)], group=grp, async_op=True)))
    tryit("a2as fut", lambda grp: fut(dist.all_to_all_single(torch.empty(3*W), torch.ones(3*W), group=grp, async_op=True)))
    tryit("barrier fut", lambda grp: fut(dist.barrier(group=grp, async_op=True)))
    tryit("arc fut", lambda grp: fut(dist.all_reduce_coalesced([t(), t()], group=grp, async_op=True)))
    def sr(grp):
        peer = r ^ 1
        if r % 2 == 0:
            w = dist.isend(t(), peer, group=grp); a = fut(w); w.wait()
            x = torch.zeros(3); w = dist.irecv(x, peer, group=grp); b = fut(w); w.wait()
        else:
            x = torch.zeros(3); w = dist.irecv(x, peer, group=grp); b = fut(w); w.wait()
            w = dist.isend(t(), peer, group=grp); a = fut(w); w.wait()
        return a, b
    tryit("sendrecv fut", sr)
    def batch(grp):
        x = torch.zeros(3)
        ops = [dist.P2POp(dist.isend, t(), (r+1)%W, group=grp), dist.P2POp(dist.irecv, x, (r-1)%W, group=grp)]
        reqs = dist.batch_isend_irecv(ops)
        res = [type(q).__name__ for q in reqs]
        for q in reqs: q.wait()
        return res, x
    tryit("batch", batch)
    def cm(grp):
        ts = [t(), t()*2]
        with dist._coalescing_manager(group=grp, async_ops=True) as c:
            for x in ts: dist.all_reduce(x, group=grp)
        c.wait()
        return ts
    tryit("cm ar", cm)
    def cm2(grp):
        ins = [t(), t()*2]; outs = [torch.empty(3*W), torch.empty(3*W)]
        with dist._coalescing_manager(group=grp, async_ops=True) as c:
            for i, o in zip(ins, outs): dist.all_gather_into_tensor(o, i, group=grp)
        c.wait()
        return outs
    tryit("cm agit", cm2)
    def cm3(grp):
        ins = [torch.ones(3*W), torch.ones(3*W)*2]; outs = [torch.empty(3), torch.empty(3)]
        with dist._coalescing_manager(group=grp, async_ops=True) as c:
            for i, o in zip(ins, outs): dist.reduce_scatter_tensor(o, i, group=grp)
        c.wait()
        return outs
    tryit("cm rst", cm3)
    def cm4(grp):
        ts = [t(), t()*2]
        with dist._coalescing_manager(group=grp, device=torch.device("cpu"), async_ops=True) as c:
            for x in ts: dist.all_reduce(x, group=grp)
        c.wait()
        return ts
    tryit("cm ar dev", cm4)
    tryit("meta", lambda grp: dist.all_reduce(torch.ones(3, device="meta"), group=grp))
    tryit("send self", lambda grp: grp.send([t()], r, 0).wait())
    tryit("mb", lambda grp: dist.monitored_barrier(group=grp))
    tryit("obj", lambda grp: (lambda l: (dist.all_gather_object(l, {"r": r}, group=grp), l))([None]*W))
    return out

def probe3(ctx):
    out = {}
    W, r = ctx.world_size, ctx.rank
    O = cuda_p2p.ProcessGroupCudaP2P.Options
    o = O(); o.buffer_size = 1234
    g1 = dist.new_group([0, 1], backend="cuda_p2p", pg_options=o)
    if r > 1: g1 = dist.group.WORLD
    b1 = cuda_p2p.get_cuda_p2p_backend(g1)
    out["g1 before"] = (b1.options.buffer_size, b1.options.group_name, list(b1.options.global_ranks_in_group), b1.options._timeout)
    g2 = dist.new_group(list(range(W)), backend="cuda_p2p", pg_options=o)
    b2 = cuda_p2p.get_cuda_p2p_backend(g2)
    out["g1 after"] = (b1.options.buffer_size, b1.options.group_name, list(b1.options.global_ranks_in_group))
    out["g2"] = (b2.options.buffer_size, b2.options.group_name, list(b2.options.global_ranks_in_group), g2.group_name, g1.group_name)
    out["same"] = b1.options is b2.options
    b = cuda_p2p.get_cuda_p2p_backend()
    out["attrs"] = [a for a in dir(b) if not a.startswith("__")]
    out["name"] = (b.name(), b.rank(), b.size(), dist.get_backend(), type(b.wrapped_backend("cpu")).__name__, b.wrapped_backend("cuda"))
    try:
        b.allreduce([torch.ones(3, device="meta")])
        out["meta"] = "no error"
    except Exception as e:
        out["meta"] = f"{type(e).__name__}: {str(e).splitlines()[0]}"
    try:
        dist.all_reduce(torch.ones(3, device="meta"), group=g2); out["meta dist"] = "no error"
    except Exception as e:
        out["meta dist"] = f"{type(e).__name__}: {str(e).splitlines()[0]}"
    try:
        b.allreduce([])
        out["empty"] = "no error"
    except Exception as e:
        out["empty"] = f"{type(e).__name__}: {str(e).splitlines()[0]}"
    try:
        b.wrapped_backend("meta")
    except Exception as e:
        out["wb meta"] = f"{type(e).__name__}: {str(e).splitlines()[0]}"
    out["getb"] = (dist.group.WORLD._get_backend(torch.device("cpu")) is b, dist.group.WORLD._get_backend(torch.device("cuda")) is b)
    ng = dist.new_group([0], backend="cuda_p2p")
    out["ng"] = repr(ng)
    for f in (cuda_p2p.get_cuda_p2p_backend, cuda_p2p.is_cuda_p2p_group):
        try: out[f.__name__ + " ng"] = repr(f(ng))
        except Exception as e: out[f.__name__ + " ng"] = f"{type(e).__name__}: {str(e).splitlines()[0]}"
    import datetime
    mg = dist.new_group(backend="cuda_p2p")
    t = __import__("time").time()
    if r != W - 1:
        try:
            dist.monitored_barrier(group=mg, timeout=datetime.timedelta(seconds=1), wait_all_ranks=True)
            out["mb fail"] = "no error"
        except Exception as e:
            out["mb fail"] = f"{type(e).__name__}: {str(e)[:300]}"
    out["mb time"] = __import__("time").time() - t
    return out

def probe4(ctx):
    import time
    t0 = time.time()
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module, ColwiseParallel, RowwiseParallel
    import torch.nn as nn
    W = ctx.world_size
    mesh = init_device_mesh("cpu", (W,))
    g = mesh.get_group()
    out = {"is_p2p": cuda_p2p.is_cuda_p2p_group(g), "same_default": g is dist.group.WORLD}
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))
    ref = __import__("copy").deepcopy(m)
    parallelize_module(m, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    x = torch.randn(5, 8, generator=torch.Generator().manual_seed(1))
    y = m(x); y.sum().backward()
    yr = ref(x); yr.sum().backward()
    out["fwd"] = (y - yr).abs().max().item()
    out["grad"] = max((p.grad.full_tensor() - q.grad).abs().max().item() for p, q in zip(m.parameters(), ref.parameters()))
    mesh2 = init_device_mesh("cpu", (W,))
    out["mesh2 same group"] = mesh2.get_group() is g
    out["t"] = time.time() - t0
    return out

def probe5(ctx):
    out = {}
    W, r = ctx.world_size, ctx.rank
    R = dist.ReduceOp
    for dt in (torch.float32, torch.bfloat16, torch.int64):
        for op in (R.SUM, R.AVG, R.PRODUCT, R.MIN, R.MAX, R.BAND, R.BOR, R.BXOR):
            for name, f in [
                ("ar", lambda g: dist.all_reduce(torch.ones(3, dtype=dt), op=op, group=g)),
                ("reduce", lambda g: dist.reduce(torch.ones(3, dtype=dt), 0, op=op, group=g)),
                ("rs", lambda g: dist.reduce_scatter(torch.ones(3, dtype=dt), [torch.ones(3, dtype=dt) for _ in range(W)], op=op, group=g)),
                ("rst", lambda g: dist.reduce_scatter_tensor(torch.ones(3, dtype=dt), torch.ones(3*W, dtype=dt), op=op, group=g)),
                ("arc", lambda g: dist.all_reduce_coalesced([torch.ones(3, dtype=dt)], op=op, group=g)),
            ]:
                res = []
                for g in (ctx.gloo, None):
                    try: f(g); res.append("ok")
                    except Exception as e: res.append(str(e).splitlines()[0][:80])
                if res[0] != "ok" or res[1] != "ok":
                    out[(name, str(dt), str(op))] = res
    return out

def probe6(ctx):
    W = ctx.world_size
    out = {}
    for name, g in (("gloo", ctx.gloo), ("p2p", None)):
        w = dist.reduce_scatter(torch.ones(3), [torch.ones(3) for _ in range(W)], group=g, async_op=True)
        out[name, "rs"] = (type(w).__name__, w.wait(), w.is_completed(), w.is_success() if hasattr(w, "is_success") else None, w.exception())
        w = dist.reduce_scatter_tensor(torch.ones(3), torch.ones(3*W), group=g, async_op=True)
        out[name, "rst"] = (type(w).__name__, w.wait(), w.is_completed(), w.exception())
    return out
