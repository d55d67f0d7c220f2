#!/usr/bin/env python3
"""Two ttd builds compared on the PyTorch MLP training step, in pairs: on a guest whose speed
changes in phases of seconds, two runs of `make bench` minutes apart differ by more than most
changes do, while two repetitions taken back to back see the same phase.

Starts each ttd (--admin off) on a socket of its own with a client process per daemon that
trains the step of bench_torch.py (TTStep: the 784-512-10 MLP through `ttd.torch`), then
alternates repetitions between the two, which one goes first alternating too, and prints per
batch the medians of each side and of the per-pair ratio B/A, and how many pairs B won.

  PYTHONPATH=client/python TTD_LIB=build/lib/libttclient.so \\
    /usr/bin/python3 scripts/bench/ab_step.py OLD/bin/ttd build/bin/ttd [--pairs 30 --batches 64,256]

Both daemons run the client library of TTD_LIB: the comparison is of the daemons."""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))

# The client side: one process per daemon, answering "BATCH STEPS" lines with ms per step of
# one repetition (after 10 untimed steps), as bench_torch.py times ours.
CHILD = r"""
import sys
sys.path.insert(0, sys.argv[2])
import ttd.torch as ttd
from bench_torch import TTStep, WARMUP
ttd.connect(sys.argv[1])
steps = {}
for line in sys.stdin:
    batch, n = (int(v) for v in line.split())
    if batch not in steps:
        steps[batch] = TTStep(ttd, batch)
        steps[batch].run(2 * WARMUP)
    steps[batch].run(WARMUP)
    print(f"{steps[batch].run(n):.6f}", flush=True)
"""


def start_daemon(binary, sock):
    p = subprocess.Popen([binary, "--listen", "unix:" + sock, "--insecure", "--admin", "off", "--log-level", "warn"])
    for _ in range(500):
        if os.path.exists(sock):
            return p
        if p.poll() is not None:
            sys.exit(f"ab_step: {binary} did not start")
        time.sleep(0.02)
    sys.exit(f"ab_step: {binary} made no socket at {sock}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a", help="ttd binary A (the baseline)")
    ap.add_argument("b", help="ttd binary B")
    ap.add_argument("--pairs", type=int, default=30)
    ap.add_argument("--batches", default="64,256")
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="ttd-ab-")
    daemons, clients = [], []
    try:
        for i, binary in enumerate((a.a, a.b)):
            sock = os.path.join(work, f"{i}.sock")
            daemons.append(start_daemon(binary, sock))
            clients.append(subprocess.Popen([sys.executable, "-c", CHILD, "unix:" + sock, HERE],
                                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))

        def rep(side, batch, n):
            clients[side].stdin.write(f"{batch} {n}\n")
            clients[side].stdin.flush()
            line = clients[side].stdout.readline()
            if not line:
                sys.exit(f"ab_step: the client of {(a.a, a.b)[side]} ended")
            return float(line)

        for batch in (int(b) for b in a.batches.split(",")):
            n = 200 if batch <= 8 else 60 if batch <= 64 else 25  # about 0.1-0.2 s a repetition
            ta, tb = [], []
            for p in range(a.pairs):
                t = {}
                for side in ((0, 1) if p % 2 == 0 else (1, 0)):
                    t[side] = rep(side, batch, n)
                ta.append(t[0])
                tb.append(t[1])
            ratios = [y / x for x, y in zip(ta, tb)]
            print(f"batch {batch}: A {statistics.median(ta):.3f} ms, B {statistics.median(tb):.3f} ms; "
                  f"B/A {statistics.median(ratios):.3f} (median of {a.pairs} pairs), "
                  f"B faster in {sum(r < 1 for r in ratios)}", flush=True)
    finally:
        for c in clients:
            c.stdin.close()
            c.wait()
        for d in daemons:
            d.terminate()
            d.wait()
        for f in os.listdir(work):
            os.unlink(os.path.join(work, f))
        os.rmdir(work)


if __name__ == "__main__":
    main()
