#!/usr/bin/env python3
"""Two builds compared on the PyTorch MLP training step, in pairs: on a guest whose speed
changes in phases of seconds, two runs of `make bench` minutes apart differ by more than most
changes do, while two repetitions taken back to back see the same phase.

Starts each ttd (--admin off) on a socket of its own with a client process per daemon that
trains the step of bench_torch.py (TTStep: the 784-512-10 MLP through `ttd.torch`), then
alternates repetitions between the two, which one goes first alternating too, and prints per
batch the medians of each side and of the per-pair ratio B/A, and how many pairs B won: for
the step, and for its time outside libttclient (bench_torch.py's LibTimer, every call of
ttd._lib._L wrapped in both clients alike).

  PYTHONPATH=client/python TTD_LIB=build/lib/libttclient.so \\
    /usr/bin/python3 scripts/bench/ab_step.py OLD/bin/ttd build/bin/ttd [--pairs 30 --batches 64,256]

Each side's client is this tree's ttd package over TTD_LIB unless --client-a/--client-b name
another client/python folder and --lib-a/--lib-b another libttclient.so: with one ttd binary
given twice, the comparison is of the Python layers (or client libraries); with --env-a/--env-b,
of settings read from the environment (TTD_SPIN=0). One ttd binary serving both clients (the
same path twice) still runs as two daemons."""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CLIENT = os.path.join(HERE, "..", "..", "client", "python")

# The client side: one process per daemon, answering "BATCH STEPS" lines with ms per step of
# one repetition (after 10 untimed steps), as bench_torch.py times ours.
CHILD = r"""
import sys
sys.path.insert(0, sys.argv[3])
sys.path.insert(0, sys.argv[2])
import ttd.torch as ttd
from ttd import _lib
from bench_torch import LibTimer, TTStep, WARMUP
ttd.connect(sys.argv[1])
timer = LibTimer(_lib)
timer.install()
steps = {}
for line in sys.stdin:
    batch, n = (int(v) for v in line.split())
    if batch not in steps:
        steps[batch] = TTStep(ttd, batch)
        steps[batch].run(2 * WARMUP)
    steps[batch].run(WARMUP)
    timer.reset()
    ms = steps[batch].run(n)
    print(f"{ms:.6f} {ms * 1e3 - timer.seconds * 1e6 / n:.3f}", flush=True)
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
    ap.add_argument("--client-a", default=CLIENT, help="A's client/python folder (default: this tree's)")
    ap.add_argument("--client-b", default=CLIENT, help="B's client/python folder")
    ap.add_argument("--lib-a", default=None, help="A's libttclient.so (default: $TTD_LIB)")
    ap.add_argument("--lib-b", default=None, help="B's libttclient.so")
    ap.add_argument("--env-a", action="append", default=[], metavar="NAME=VALUE",
                    help="set in A's client's environment (repeatable), e.g. TTD_SPIN=0")
    ap.add_argument("--env-b", action="append", default=[], metavar="NAME=VALUE", help="the same for B's client")
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="ttd-ab-")
    daemons, clients = [], []
    try:
        for i, binary in enumerate((a.a, a.b)):
            sock = os.path.join(work, f"{i}.sock")
            daemons.append(start_daemon(binary, sock))
            client, lib, extra = (a.client_a, a.lib_a, a.env_a) if i == 0 else (a.client_b, a.lib_b, a.env_b)
            env = dict(os.environ, **({"TTD_LIB": lib} if lib else {}))
            env.update(kv.split("=", 1) for kv in extra)
            clients.append(subprocess.Popen([sys.executable, "-c", CHILD, "unix:" + sock, os.path.abspath(client), HERE],
                                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env))

        def rep(side, batch, n):
            clients[side].stdin.write(f"{batch} {n}\n")
            clients[side].stdin.flush()
            line = clients[side].stdout.readline()
            if not line:
                sys.exit(f"ab_step: the client of {(a.a, a.b)[side]} ended")
            return [float(v) for v in line.split()]

        for batch in (int(b) for b in a.batches.split(",")):
            n = 200 if batch <= 8 else 60 if batch <= 64 else 25  # about 0.1-0.2 s a repetition
            ta, tb = [], []
            for p in range(a.pairs):
                t = {}
                for side in ((0, 1) if p % 2 == 0 else (1, 0)):
                    t[side] = rep(side, batch, n)
                ta.append(t[0])
                tb.append(t[1])
            for k, (what, unit) in enumerate((("step", "ms"), ("outside libttclient", "us"))):
                xa, xb = [v[k] for v in ta], [v[k] for v in tb]
                ratios = [y / x for x, y in zip(xa, xb)]
                print(f"batch {batch} {what}: A {statistics.median(xa):.3f} {unit}, B {statistics.median(xb):.3f} {unit}; "
                      f"B/A {statistics.median(ratios):.3f} (median of {a.pairs} pairs), "
                      f"B lower in {sum(r < 1 for r in ratios)}", flush=True)
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
