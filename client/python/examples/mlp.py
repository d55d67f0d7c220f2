#!/usr/bin/python3
"""Trains a 784-512-10 MLP on Fashion-MNIST through ttd, in PyTorch (issue 17's flow on real data).

The batches go to the card with `x.to("tt")`, the model is `ttd.compile`d and moved with
`.to("tt")`, its output comes back with `.to("cpu")` for `F.cross_entropy` on the CPU, and
`loss.backward()` reaches the card, where `ttd.optim.SGD` steps. Prints `test accuracy: 0.xxxx`.
The data, the loop and the options: fashion_mnist.py beside this file.

    /usr/bin/python3 client/python/examples/mlp.py --epochs 1

Data-parallel, two ranks each on its own card of one ttd (`ttd --devices 2`), each global batch
of 64 split 32 and 32 (ttd.parallel.DistributedDataParallel; see docs/parallel.md, "PyTorch"):

    torchrun --nproc_per_node 2 client/python/examples/mlp.py --epochs 1
"""
import sys

import torch.nn as nn

from fashion_mnist import main


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(784, 512)
        self.relu = nn.ReLU()
        self.fc2 = nn.Linear(512, 10)

    def forward(self, x):
        return self.fc2(self.relu(self.fc1(x)))


if __name__ == "__main__":
    sys.exit(main("mlp.py", MLP, shape=(784,), lr=0.1, momentum=0.9, doc=__doc__))
