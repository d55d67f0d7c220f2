#!/usr/bin/env python3
"""The reference for bench_train: one training step of the 784-512-10 ReLU MLP in PyTorch on
the CPU, in process (nn.Linear, ReLU, nn.Linear, F.cross_entropy, SGD lr 0.1), on four fixed
random batches used in turn, as scripts/bench/bench_mlp.c does through ttd.

  torch_step.py --batch 64 [--steps 50 --reps 7 --warmup 10]
      prints ms per step: for 1 and 2 threads the median over reps of a repetition's mean,
      and the faster of the two on stdout.
  torch_step.py --serve
      for bench_train, which interleaves our repetitions with these: reads lines
      "BATCH THREADS STEPS WARMUP" and answers each with the ms per step of one repetition
      of STEPS steps after WARMUP untimed ones (a model per batch and thread count, warmed
      up on first use); ends at end of input."""
import argparse
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

WARMUP = 10


class Step:
    def __init__(self, batch, threads, warmup=WARMUP):
        self.threads = threads
        torch.set_num_threads(threads)
        torch.manual_seed(1)
        self.model = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 10))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.xs = [torch.rand(batch, 784) for _ in range(4)]
        self.ys = [torch.randint(0, 10, (batch,)) for _ in range(4)]
        self.i = 0
        self.run(warmup)

    def run(self, steps):
        """Mean ms per step over `steps` steps."""
        torch.set_num_threads(self.threads)
        t0 = time.perf_counter()
        for _ in range(steps):
            k = self.i % 4
            self.i += 1
            self.opt.zero_grad()
            loss = F.cross_entropy(self.model(self.xs[k]), self.ys[k])
            loss.backward()
            self.opt.step()
        return (time.perf_counter() - t0) * 1e3 / max(steps, 1)


def serve():
    steps = {}
    for line in sys.stdin:
        batch, threads, n, warmup = (int(v) for v in line.split())
        if (batch, threads) not in steps:
            steps[batch, threads] = Step(batch, threads)
        steps[batch, threads].run(warmup)
        print(f"{steps[batch, threads].run(n):.6f}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=WARMUP)
    ap.add_argument("--serve", action="store_true")
    a = ap.parse_args()
    if a.serve:
        return serve()
    best = None
    for threads in (1, 2):
        s = Step(a.batch, threads, a.warmup)
        ms = statistics.median(s.run(a.steps) for _ in range(a.reps))
        print(f"batch {a.batch}, {threads} thread(s): {ms:.3f} ms/step", file=sys.stderr)
        best = ms if best is None else min(best, ms)
    print(f"{best:.4f}")


if __name__ == "__main__":
    main()
