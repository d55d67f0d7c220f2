#!/usr/bin/python3
"""PyTorch CPU references for the examples' figures: the same data, model, loss,
optimizer, batch size and epochs as build/bin/{mlp,mnist_linear,lenet}.

    /usr/bin/python3 scripts/pytorch_reference.py mlp|mnist_linear|lenet [--epochs N]

Needs Debian's python3-torch (not installed by install-deps: only these figures use it).
Prints "test accuracy: 0.XXXX"."""
import argparse
import gzip
import struct

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

DATA = "/usr/share/datasets/fashion-mnist"


def idx(path):
    with gzip.open(path, "rb") as f:
        raw = f.read()
    magic, count = struct.unpack(">II", raw[:8])
    if magic == 0x803:
        rows, cols = struct.unpack(">II", raw[8:16])
        return np.frombuffer(raw[16:], dtype=np.uint8).reshape(count, rows * cols).astype(np.float32) / 255.0
    return np.frombuffer(raw[8:], dtype=np.uint8).astype(np.int64)


def model_of(name):
    if name == "mlp":
        return nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 10)), 0.1, 0.0
    if name == "mnist_linear":
        return nn.Linear(784, 10), 0.01, 0.0
    return nn.Sequential(
        nn.Unflatten(1, (1, 28, 28)), nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
        nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, 10)), 0.02, 0.9


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("example", choices=["mlp", "mnist_linear", "lenet"])
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    xtr, ytr = torch.from_numpy(idx(f"{DATA}/train-images-idx3-ubyte.gz")), torch.from_numpy(idx(f"{DATA}/train-labels-idx1-ubyte.gz"))
    xte, yte = torch.from_numpy(idx(f"{DATA}/t10k-images-idx3-ubyte.gz")), torch.from_numpy(idx(f"{DATA}/t10k-labels-idx1-ubyte.gz"))
    model, lr, momentum = model_of(args.example)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    batch = 64
    for _ in range(args.epochs):
        order = torch.randperm(len(xtr))
        for s in range(len(xtr) // batch):
            i = order[s * batch:(s + 1) * batch]
            out = model(xtr[i])
            if args.example == "mnist_linear":
                loss = F.l1_loss(out, F.one_hot(ytr[i], 10).float())
            else:
                loss = F.cross_entropy(out, ytr[i])
            opt.zero_grad()
            loss.backward()
            opt.step()
    with torch.no_grad():
        acc = (model(xte).argmax(1) == yte).float().mean().item()
    print(f"test accuracy: {acc:.4f}")


if __name__ == "__main__":
    main()
