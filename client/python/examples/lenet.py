#!/usr/bin/python3
"""Trains LeNet-5 on Fashion-MNIST through ttd, in PyTorch (issue 17's flow on real data).

LeNet-5 on 1x28x28 images: Conv2d(1, 6, 5, padding=2), ReLU, MaxPool2d(2), Conv2d(6, 16, 5),
ReLU, MaxPool2d(2), Flatten, Linear 400-120-84-10 with ReLUs, all on the card; cross-entropy
on the CPU, SGD with momentum on the card. Prints `test accuracy: 0.xxxx`. The data, the loop
and the options: fashion_mnist.py beside this file.

    /usr/bin/python3 client/python/examples/lenet.py --epochs 1
"""
import sys

import torch.nn as nn

from fashion_mnist import main


class LeNet5(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                                      nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2))
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(),
                                        nn.Linear(84, 10))

    def forward(self, x):
        return self.classifier(self.features(x))


if __name__ == "__main__":
    sys.exit(main("lenet.py", LeNet5, shape=(1, 28, 28), lr=0.05, momentum=0.9, doc=__doc__))
