"""One rank of test_parallel.py's data-parallel runs, started as torchrun would start it
(RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TTD_ADDRESS in the environment; DP_DEVICE the card,
"tt" by default), and what both sides share: the model and the global batches.

    dp_worker.py SCENARIO OUT   (SCENARIO: train, train_built, exit, heads, recover, subgroup;
                                 "{}" in OUT: the rank)

train: SGD and Adam, 20 steps each on this rank's half of every global batch, after a
no_sync accumulation check; OUT gets torch.save of the results. train_built: SGD only, the
module run once before wrapping (the broadcast then writes into the card). exit: rank 1
leaves after one step; rank 0's next backward must raise ttd.parallel.RankError. heads: rank 0's
loss reaches one head of a two-headed model, rank 1's both: each rank's backward must raise,
naming the other head. recover: a backward that raises (a run older than a step) on both
ranks after another run's backward queued the averaging, then two steps, which must still be
averaged. subgroup: rank 1 alone in a process
group without rank 0 wraps and trains."""
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import ttd.torch as ttd  # noqa: E402

GLOBAL_BATCH, STEPS, MICRO = 16, 20, 2
OPTIMIZERS = {"sgd": (ttd.optim.SGD, dict(lr=0.05, momentum=0.9)), "adam": (ttd.optim.Adam, dict(lr=1e-2))}
BUCKET_MB = 4096 / 2**20  # 4 KiB buckets: the MLP's four parameters in three buckets


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1, self.relu, self.l2 = nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10)

    def forward(self, x):
        return self.l2(self.relu(self.l1(x)))


class Heads(nn.Module):
    def __init__(self):
        super().__init__()
        self.body, self.a, self.b = nn.Linear(32, 16), nn.Linear(16, 10), nn.Linear(16, 10)

    def forward(self, x):
        h = F.relu(self.body(x))
        return self.a(h), self.b(h)


def model(seed=0):
    torch.manual_seed(seed)
    return MLP()


def batches(n):
    """n global batches of GLOBAL_BATCH: inputs and labels."""
    g = torch.Generator().manual_seed(1234)
    return [(torch.randn(GLOBAL_BATCH, 32, generator=g), torch.randint(0, 10, (GLOBAL_BATCH,), generator=g))
            for _ in range(n)]


def shard(t, rank, world):
    n = len(t) // world
    return t[rank * n:(rank + 1) * n]


def train(m, device, opt_name, data, rank=0, world=1):
    """STEPS steps of m (a DDP or a compiled module) on rank's part of each global batch."""
    cls, kw = OPTIMIZERS[opt_name]
    opt = cls(m.parameters(), **kw)
    for x, y in data:
        loss = F.cross_entropy(m(shard(x, rank, world).to(device)).to("cpu"), shard(y, rank, world))
        loss.backward()
        opt.step()
        opt.zero_grad()


def accumulate(m, device, x, y, rank=0, world=1):
    """MICRO micro-batches of rank's part of x, the loss of each divided by MICRO, all but the
    last under no_sync (when m is a DDP): the .grads then hold the gradient of the mean loss."""
    xs, ys = shard(x, rank, world).chunk(MICRO), shard(y, rank, world).chunk(MICRO)
    for i, (xi, yi) in enumerate(zip(xs, ys)):
        last = i == MICRO - 1
        ctx = m.no_sync() if hasattr(m, "no_sync") and not last else _nothing()
        with ctx:
            (F.cross_entropy(m(xi.to(device)).to("cpu"), yi) / MICRO).backward()
    return {n: p.grad for n, p in m.module.named_parameters()} if hasattr(m, "module") else \
        {n: p.grad for n, p in m.named_parameters()}


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def main(scenario, out):
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = os.environ.get("DP_DEVICE", "tt")
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=10))
    result = {}
    data = batches(STEPS)
    if scenario == "train":
        for opt_name in OPTIMIZERS:
            # each rank starts from other weights: the wrap broadcasts rank 0's (seed 0)
            ddp = ttd.parallel.DistributedDataParallel(ttd.compile(model(seed=rank)).to(device),
                                                       bucket_cap_mb=BUCKET_MB)
            if opt_name == "sgd":  # a no_sync accumulation first, on a model of its own
                acc = ttd.parallel.DistributedDataParallel(ttd.compile(model(seed=rank)).to(device),
                                                           bucket_cap_mb=BUCKET_MB)
                before = acc._collectives
                result["no_sync"] = accumulate(acc, device, *data[0], rank, world)
                result["no_sync_collectives"] = acc._collectives - before
            train(ddp, device, opt_name, data, rank, world)
            result[opt_name] = ddp.module.state_dict()
    elif scenario == "train_built":
        tt_model = ttd.compile(model(seed=rank)).to(device)
        with torch.no_grad():
            tt_model(torch.zeros(2, 32).to(device))  # built: the broadcast writes into the card
        ddp = ttd.parallel.DistributedDataParallel(tt_model, bucket_cap_mb=BUCKET_MB)
        result["device"] = str(next(ddp.parameters()).device)
        train(ddp, device, "sgd", data, rank, world)
        result["sgd"] = ddp.module.state_dict()
    elif scenario == "heads":
        torch.manual_seed(0)
        ddp = ttd.parallel.DistributedDataParallel(ttd.compile(Heads()).to(device))
        x, y = data[0]
        a, b = ddp(shard(x, rank, world).to(device))
        loss = F.cross_entropy(a.to("cpu"), shard(y, rank, world))
        if rank == 1:
            loss = loss + F.cross_entropy(b.to("cpu"), shard(y, rank, world))
        try:
            loss.backward()
            result["error"] = None
        except RuntimeError as e:
            result["error"] = str(e)
    elif scenario == "recover":
        ddp = ttd.parallel.DistributedDataParallel(ttd.compile(model()).to(device))
        opt = ttd.optim.SGD(ddp.parameters(), lr=0.05)
        x, y = (shard(t, rank, world) for t in data[0])
        old = F.cross_entropy(ddp(x.to(device)).to("cpu"), y)
        F.cross_entropy(ddp(x.to(device)).to("cpu"), y).backward()
        opt.step()
        new = F.cross_entropy(ddp(x.to(device)).to("cpu"), y)
        try:
            (new + old).backward()  # new's run queues the averaging; old's forward came before the step
            result["error"] = None
        except RuntimeError as e:
            result["error"] = str(e)
        train(ddp, device, "sgd", data[1:3], rank, world)
        result["sgd"] = ddp.module.state_dict()
    elif scenario == "subgroup":
        group = dist.new_group([1])  # every rank makes it; rank 1 alone is in it
        if rank == 1:
            ddp = ttd.parallel.DistributedDataParallel(ttd.compile(model(seed=1)).to(device), process_group=group)
            train(ddp, device, "sgd", data[:2], 0, 1)
            result["sgd"] = ddp.module.state_dict()
    elif scenario == "exit":
        ddp = ttd.parallel.DistributedDataParallel(ttd.compile(model()).to(device))
        train(ddp, device, "sgd", data[:1], rank, world)
        if rank == 1:
            return 0  # leaves early: rank 0's next all-reduce has no peer
        start = time.time()
        try:
            train(ddp, device, "sgd", data[1:2], rank, world)
            result["error"] = None
        except ttd.parallel.RankError as e:
            result["error"], result["lost"] = str(e), e.lost
        result["seconds"] = time.time() - start
    torch.save(result, out.format(rank))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
