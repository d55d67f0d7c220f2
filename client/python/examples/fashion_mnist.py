"""What the PyTorch examples share: Fashion-MNIST read from its IDX files, the training loop of
issue 17's flow (batches sent with `x.to("tt")`, the output brought back with `.to("cpu")` for
`F.cross_entropy` on the CPU, `loss.backward()` into the card, `ttd.optim.SGD` stepping there)
with a tqdm progress bar, the test accuracy, and the command line of every example.

Data: Debian's dataset-fashion-mnist (/usr/share/datasets/fashion-mnist, IDX files, gzipped),
or --data DIR. The package is taken from the build tree (client/python beside this folder)
unless `ttd` is importable; libttclient from $TTD_LIB, else the build tree's build/lib.
The daemon: --target, else $TTD_ADDRESS, else the default sockets.

Data-parallel: started by torchrun (or with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set as it
sets them), each rank joins torch.distributed's gloo group, takes its own card (--device, by
default tt:$LOCAL_RANK) of its ttd, and trains on its share of each global batch of --batch
images, ttd.parallel.DistributedDataParallel averaging the gradients; rank 0 prints."""
import argparse
import datetime
import gzip
import os
import struct
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

try:
    import ttd.torch as ttd
except ImportError:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import ttd.torch as ttd

try:
    from tqdm import tqdm
except ImportError:  # Debian's python3-tqdm is optional: without it, no progress bar
    tqdm = None

DATA = "/usr/share/datasets/fashion-mnist"


def read_idx(path):
    """An IDX file (gzipped or not) as a numpy array of its shape; ValueError naming the file
    when it is not one (truncated, corrupt)."""
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            data = f.read()
        zero, dtype, ndim = struct.unpack(">HBB", data[:4])
        dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
        if zero != 0 or dtype != 0x08:
            raise ValueError("its header is not an IDX file's of unsigned bytes")
        return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)
    except (OSError, EOFError, struct.error, ValueError) as e:
        raise ValueError(f"{path} is not a whole IDX file ({e}): fetch it again") from None


def load(data_dir, split, limit=None, shape=(784,)):
    """Images as float32 (N, *shape) in [0, 1] and labels as int64 (N,)."""
    def find(stem):
        for name in (stem + ".gz", stem):
            p = os.path.join(data_dir, name)
            if os.path.exists(p):
                return p
        raise FileNotFoundError(f"no {stem}[.gz] in {data_dir} (Debian's dataset-fashion-mnist, or --data DIR)")
    prefix = "train" if split == "train" else "t10k"
    images = read_idx(find(f"{prefix}-images-idx3-ubyte"))
    labels = read_idx(find(f"{prefix}-labels-idx1-ubyte"))
    if limit:
        images, labels = images[:limit], labels[:limit]
    x = torch.from_numpy(images.reshape((len(images),) + tuple(shape)).astype(np.float32) / 255.0)
    return x, torch.from_numpy(labels.astype(np.int64))


def train_epoch(tt_model, opt, x, y, batch, epoch, epochs, generator, device="tt", rank=0, world=1):
    """One epoch of global batches of `batch` images; of each, this rank trains on its
    batch // world (every rank draws the same order from the same generator)."""
    tt_model.train()
    order = torch.randperm(len(x), generator=generator)
    steps = len(x) // batch  # drop_last: the last partial batch is left out
    local = batch // world
    bar = None
    if tqdm is not None and rank == 0:
        bar = tqdm(total=steps, desc=f"epoch {epoch}/{epochs}", unit="batch", file=sys.stderr,
                   disable=not sys.stderr.isatty())
    running = 0.0
    for i in range(steps):
        idx = order[i * batch + rank * local:i * batch + (rank + 1) * local]
        out = tt_model(x[idx].to(device))        # runs on the card; the output stays there
        loss = F.cross_entropy(out.to("cpu"), y[idx])  # the loss on the CPU
        loss.backward()                           # reaches the card: .grad of each parameter there
        #                                           (data-parallel: averaged over the ranks)
        opt.step()
        opt.zero_grad()
        running = 0.9 * running + 0.1 * loss.item() if i else loss.item()
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{running:.4f}")
    if bar is not None:
        bar.close()
    return running


def evaluate(tt_model, x, y, batch, device="tt"):
    tt_model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(x), batch):  # the last batch may be smaller: any batch size runs
            out = tt_model(x[i:i + batch].to(device)).to("cpu")
            correct += (out.argmax(dim=1) == y[i:i + batch]).sum().item()
    return correct / len(x)


def train(make_model, shape, lr, momentum, doc, argv=None):
    """Parses the command line (doc's first paragraph is its description; lr and momentum the
    defaults of --lr and --momentum), trains make_model() on images of `shape` through ttd
    and prints each epoch's loss and `test accuracy: 0.xxxx`. Returns the exit status."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=lr)
    ap.add_argument("--momentum", type=float, default=momentum)
    ap.add_argument("--target", default=None, help="ttd's address (default: $TTD_ADDRESS, then the default sockets)")
    ap.add_argument("--data", default=DATA, help=f"directory of Fashion-MNIST's IDX files (default {DATA})")
    ap.add_argument("--limit", type=int, default=None, metavar="N",
                    help="use the first N training images and N/4 test images (quick runs)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default=None,
                    help="the card (default tt; data-parallel: tt:$LOCAL_RANK, a card per rank of one ttd)")
    args = ap.parse_args(argv)
    if args.epochs < 1 or args.batch < 1 or (args.limit is not None and args.limit < args.batch):
        ap.error("--epochs and --batch must be positive, and --limit at least --batch")
    rank, world = 0, 1
    if "WORLD_SIZE" in os.environ:  # torchrun's environment: data-parallel
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
        rank, world = dist.get_rank(), dist.get_world_size()
        if args.batch % world:
            ap.error(f"--batch {args.batch} does not split over {world} ranks")
    device = args.device or (f"tt:{os.environ.get('LOCAL_RANK', 0)}" if world > 1 else "tt")

    torch.manual_seed(args.seed)
    x_train, y_train = load(args.data, "train", args.limit, shape)
    x_test, y_test = load(args.data, "test", max(1, args.limit // 4) if args.limit else None, shape)

    if args.target:
        ttd.connect(args.target)
    model = make_model()
    tt_model = ttd.compile(model)
    tt_model.to(device)  # parameters onto the card
    if world > 1:  # rank 0's parameters everywhere; each backward averages the .grads
        tt_model = ttd.parallel.DistributedDataParallel(tt_model)
    opt = ttd.optim.SGD(tt_model.parameters(), lr=args.lr, momentum=args.momentum)

    gen = torch.Generator().manual_seed(args.seed)
    start = time.time()
    for epoch in range(1, args.epochs + 1):
        loss = train_epoch(tt_model, opt, x_train, y_train, args.batch, epoch, args.epochs, gen, device, rank, world)
        if rank == 0:
            print(f"epoch {epoch}: loss {loss:.4f} ({time.time() - start:.1f} s)", flush=True)
    if rank == 0:  # every rank holds the same parameters: one evaluates
        acc = evaluate(tt_model, x_test, y_test, args.batch, device)
        print(f"test accuracy: {acc:.4f}", flush=True)
    if world > 1:
        dist.barrier()  # no rank leaves while rank 0 (the rendezvous store's host) may still need it
        dist.destroy_process_group()
    return 0


def main(prog, make_model, shape, lr, momentum, doc):
    """train(), with ttd down or the data missing told in one line rather than a traceback."""
    try:
        return train(make_model, shape, lr, momentum, doc)
    except (ttd.TTError, ttd.parallel.RankError, FileNotFoundError, ValueError) as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 1
