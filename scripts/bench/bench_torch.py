#!/usr/bin/env python3
"""Issue 17's speed lines, through the PyTorch front end (`import ttd.torch as ttd`):

- torch_mlp_step_b64, _b256: ms per training step of the 784-512-10 MLP made as
  client/python/examples/mlp.py makes it (x.to("tt"), the compiled model on the card,
  out.to("cpu"), F.cross_entropy on the CPU, loss.backward(), ttd.optim.SGD step and
  zero_grad on the card), random data, against the same step in plain PyTorch on the CPU
  (scripts/bench/torch_step.py --serve in a child process, the faster of 1 thread and all
  cores), repetitions alternating, each preceded by untimed steps, medians.
- torch_layer_share_b64: the share in % of the ttd.torch step that the Python layer itself
  costs: the time spent inside the ttd package's functions the step calls (a tensor's .to,
  the compiled module's call, a run's backward, the optimizer's step and zero_grad, the
  device tensor's __torch_function__, the frees torch's graph and the garbage collector
  make), less the time of the libttclient calls made inside them (every function of
  ttd._lib._L wrapped, in this process only), over the step's time; median over
  repetitions; reference 15 %.
- torch_outside_share_b64: the share in % of the same step spent outside libttclient at
  all: the layer above plus the user's loss (F.cross_entropy and its backward), torch's
  autograd engine and the loop; 1 - C time / step time. No goal: the part of it that is not
  the layer is what the same loss costs a plain PyTorch step too.
- torch_layer_us_tiny: us per step in the Python layer (as torch_layer_share_b64 counts it)
  of the same flow with a program of a few microseconds on the card (a 16-32-10 MLP at batch
  8: no wait to speak of), against the whole step of that MLP in plain PyTorch on the CPU in
  this process: the layer's floor, next to what PyTorch's own Python and dispatch cost for
  the same step.
- torch_op_after_pause: us of PyTorch's own F.cross_entropy forward and backward on the
  step's 64 x 10 logits right after a busy wait as long as the step's time in libttclient
  (the client's wait for the card), against the same back to back: what this machine
  charges code that did not just run, which the share above pays at every step.

Prints JSON lines {name, ours, reference, unit, ratio, better} for scripts/bench/bench.

  PYTHONPATH=client/python TTD_LIB=build/lib/libttclient.so \\
    bench_torch.py --target unix:SOCK [--daemon-pid PID] [--reps 15 --steps 50]"""
import argparse
import inspect
import json
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "client", "python", "examples"))
from mlp import MLP  # noqa: E402  the example's model, timed as the example trains it

HERE = os.path.dirname(os.path.abspath(__file__))
WARMUP = 10  # untimed steps before each repetition, as bench_train and torch_step.py


def log(msg):
    print(f"  bench_torch: {msg}", file=sys.stderr, flush=True)


def record(name, ours, reference, unit, better="lower"):
    ratio = ours / reference if reference else float("nan")
    print(json.dumps({"name": name, "ours": float(f"{ours:.6g}"), "reference": float(f"{reference:.6g}"),
                      "unit": unit, "ratio": float(f"{ratio:.4g}"), "better": better}), flush=True)
    log(f"{name:<24} ours {ours:10.4g}  reference {reference:10.4g} {unit:<8} ratio {ratio:.3f} ({better} is better)")


def cpu_ns(pid):
    total = 0
    try:
        for t in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{t}/schedstat") as f:
                    total += int(f.read().split()[0])
            except OSError:
                pass
    except OSError:
        return None
    return total


def wait_idle(pid, max_ms=2000, window_ms=10, busy=0.02):
    """As bench_wait_idle: until pid's threads ran under 2 % of a 10 ms window."""
    if not pid:
        return
    start, before = time.perf_counter(), cpu_ns(pid)
    if before is None:
        return
    while True:
        time.sleep(window_ms / 1e3)
        after = cpu_ns(pid)
        if after is None or after - before < window_ms * 1e6 * busy or (time.perf_counter() - start) * 1e3 >= max_ms:
            return
        before = after


class Step:
    """A training step of the module make_module() returns, on four fixed random batches of
    `batch` x `features` used in turn: through ttd.torch as the example trains (x.to("tt"),
    the compiled module on the card, out.to("cpu"), F.cross_entropy on the CPU,
    loss.backward(), ttd.optim.SGD's step and zero_grad on the card), or, with ttd None, in
    plain PyTorch on the CPU."""

    def __init__(self, ttd, batch, make_module=MLP, features=784, seed=1):
        torch.manual_seed(seed)
        module = make_module()
        self.tt = ttd is not None
        if self.tt:
            self.model = ttd.compile(module)
            self.model.to("tt")
            self.model.train()
            self.opt = ttd.optim.SGD(self.model.parameters(), lr=0.1)
        else:
            self.model = module
            self.opt = torch.optim.SGD(module.parameters(), lr=0.1)
        self.xs = [torch.rand(batch, features) for _ in range(4)]
        self.ys = [torch.randint(0, 10, (batch,)) for _ in range(4)]
        self.i = 0

    def run(self, steps):
        """ms per step."""
        t0 = time.perf_counter()
        for _ in range(steps):
            k = self.i % 4
            self.i += 1
            out = self.model(self.xs[k].to("tt")).to("cpu") if self.tt else self.model(self.xs[k])
            loss = F.cross_entropy(out, self.ys[k])
            loss.backward()
            self.opt.step()
            self.opt.zero_grad()
        return (time.perf_counter() - t0) * 1e3 / max(steps, 1)


def tiny_mlp():
    """16-32-10: a card program of a few microseconds."""
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))


class Reference:
    """torch_step.py --serve: "BATCH THREADS STEPS WARMUP" in, ms per step out."""

    def __init__(self, python):
        self.p = subprocess.Popen([python, os.path.join(HERE, "torch_step.py"), "--serve"],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def rep(self, batch, threads, steps):
        self.p.stdin.write(f"{batch} {threads} {steps} {WARMUP}\n")
        self.p.stdin.flush()
        return float(self.p.stdout.readline())

    def close(self):
        self.p.stdin.close()
        self.p.wait()


class LibTimer:
    """Wraps every libttclient function of ttd._lib._L to sum the seconds spent in C."""

    def __init__(self, lib):
        self.L, self.seconds, self.calls, self.orig = lib._L, 0.0, 0, {}
        self.per = {}

    def install(self):
        pc = time.perf_counter
        names = [n for n in dir(self.L) if n.startswith("tt_")]
        for n in names:
            f = getattr(self.L, n)
            if not callable(f):
                continue
            self.orig[n] = f

            def wrap(*a, _f=f, _n=n):
                t0 = pc()
                try:
                    return _f(*a)
                finally:
                    dt = pc() - t0
                    self.seconds += dt
                    self.calls += 1
                    c = self.per.get(_n)
                    self.per[_n] = (c[0] + 1, c[1] + dt) if c else (1, dt)
            setattr(self.L, n, wrap)

    def uninstall(self):
        for n, f in self.orig.items():
            setattr(self.L, n, f)
        self.orig = {}

    def reset(self):
        self.seconds, self.calls, self.per = 0.0, 0, {}


class LayerTimer:
    """Wraps the ttd package's entry points a training step goes through to sum the seconds
    spent inside them less the libttclient calls they make (lib_timer's seconds, which must be
    installed too). A call inside another is counted once, in the outer one."""

    def __init__(self, lib_timer):
        self.lib_timer, self.seconds, self.depth, self.orig = lib_timer, 0.0, 0, []

    def entry_points(self):
        from ttd import _lib, autograd, module, optim, tensor
        return [(torch.Tensor, "to"), (tensor.Tensor, "to"), (tensor.Tensor, "cpu"),
                (tensor.Tensor, "__torch_function__"), (module.CompiledModule, "__call__"),
                (autograd._Run, "backward"), (autograd._Upload, "backward"), (autograd._Release, "__del__"),
                (optim.SGD, "step"), (optim.SGD, "zero_grad"), (_lib.Tensor, "__del__")]

    def install(self):
        pc = time.perf_counter

        def wrap(f):
            def timed(*a, **k):
                if self.depth:
                    return f(*a, **k)
                self.depth = 1
                c0, t0 = self.lib_timer.seconds, pc()
                try:
                    return f(*a, **k)
                finally:
                    self.seconds += (pc() - t0) - (self.lib_timer.seconds - c0)
                    self.depth = 0
            return timed
        for owner, name in self.entry_points():
            # as the class finds it (torch.optim wraps a subclass's step in its own __dict__)
            raw = inspect.getattr_static(owner, name)
            self.orig.append((owner, name, owner.__dict__.get(name)))
            kind = type(raw) if isinstance(raw, (staticmethod, classmethod)) else None
            setattr(owner, name, kind(wrap(raw.__func__)) if kind else wrap(raw))

    def uninstall(self):
        for owner, name, raw in reversed(self.orig):
            if raw is None:
                delattr(owner, name)
            else:
                setattr(owner, name, raw)
        self.orig = []


def wrapper_cost():
    """Seconds one wrapped call adds over an unwrapped one: logged only, not subtracted, so the
    Python share stays an upper bound."""
    pc = time.perf_counter
    acc = [0.0]

    def f():
        return None

    def w(*a):
        t0 = pc()
        try:
            return f(*a)
        finally:
            acc[0] += pc() - t0
    n = 20000
    t0 = pc()
    for _ in range(n):
        f()
    t1 = pc()
    for _ in range(n):
        w()
    t2 = pc()
    return ((t2 - t1) - (t1 - t0)) / n


def after_pause(pause_s, blocks=8, runs=50):
    """Median us of F.cross_entropy forward and backward on 64 x 10 logits right after a busy
    wait of pause_s, and back to back, in alternating blocks of runs."""
    logits = torch.rand(64, 10, requires_grad=True)
    labels = torch.randint(0, 10, (64,))
    pc = time.perf_counter
    times = ([], [])
    for block in range(blocks):
        paused = block % 2
        for _ in range(runs):
            if paused:
                end = pc() + pause_s
                while pc() < end:
                    pass
            t0 = pc()
            F.cross_entropy(logits, labels).backward()
            times[paused].append(pc() - t0)
    return statistics.median(times[1]) * 1e6, statistics.median(times[0]) * 1e6


def tiny_layer_cost(ttd, lib, reps, steps=200):
    """(us per step of tiny_mlp at batch 8 in the Python layer (LayerTimer), us per step of it
    in plain PyTorch), medians over reps alternating repetitions."""
    ours, plain = (Step(t, 8, tiny_mlp, 16, seed=2) for t in (ttd, None))
    timer = LibTimer(lib)
    layer = LayerTimer(timer)
    timer.install()
    layer.install()
    own, theirs = [], []
    try:
        ours.run(WARMUP)
        plain.run(WARMUP)
        for _ in range(reps):
            layer.seconds = 0.0
            ours.run(steps)
            own.append(layer.seconds * 1e6 / steps)
            theirs.append(plain.run(steps) * 1e3)
    finally:
        layer.uninstall()
        timer.uninstall()
    return statistics.median(own), statistics.median(theirs)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=None)
    ap.add_argument("--daemon-pid", type=int, default=0)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--reps", type=int, default=int(os.environ.get("BENCH_REPS", 0) or 15))
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--batches", default="64,256")
    a = ap.parse_args()

    ref = Reference(a.python)  # before ttd's client starts its gRPC threads
    import ttd.torch as ttd
    from ttd import _lib
    if a.target:
        ttd.connect(a.target)
    threads = sorted({1, os.cpu_count() or 1})
    steps = {}
    for batch in (int(b) for b in a.batches.split(",")):
        s = steps[batch] = Step(ttd, batch)
        s.run(WARMUP)
        ours, theirs = [], {t: [] for t in threads}
        for _ in range(a.reps):
            wait_idle(ref.p.pid)
            s.run(WARMUP)
            ours.append(s.run(a.steps))
            wait_idle(a.daemon_pid)
            for t in threads:
                theirs[t].append(ref.rep(batch, t, a.steps))
        med = {t: statistics.median(v) for t, v in theirs.items()}
        log(f"PyTorch at batch {batch}: " + ", ".join(f"{v:.3f} ms/step on {t} thread(s)" for t, v in med.items()))
        record(f"torch_mlp_step_b{batch}", statistics.median(ours), min(med.values()), "ms")
    ref.close()

    # The Python layer's share at batch 64: the layer's own time, and all time outside the C
    # calls, against the whole step.
    s = steps.get(64) or Step(ttd, 64)
    timer = LibTimer(_lib)
    layer = LayerTimer(timer)
    timer.install()
    layer.install()
    shares, outside, step_ms = [], [], []
    try:
        s.run(WARMUP)
        for _ in range(a.reps):
            wait_idle(a.daemon_pid)
            s.run(WARMUP)
            timer.reset()
            layer.seconds = 0.0
            ms = s.run(a.steps)
            c_ms = timer.seconds * 1e3 / a.steps
            step_ms.append(ms)
            shares.append(100.0 * layer.seconds * 1e3 / a.steps / ms)
            outside.append(100.0 * (1 - c_ms / ms))
        per = sorted(timer.per.items(), key=lambda kv: -kv[1][1])
    finally:
        layer.uninstall()
        timer.uninstall()
    share, outside_share = statistics.median(shares), statistics.median(outside)
    ms = statistics.median(step_ms)
    log(f"batch 64 with wrapped calls: {ms:.3f} ms/step, {timer.calls / a.steps:.0f} libttclient calls/step "
        f"(wrapper adds ~{wrapper_cost() * 1e6:.2f} us each, counted as Python); the layer "
        f"{ms * share * 10:.0f} us/step, outside libttclient {ms * outside_share * 10:.0f} us/step")
    log("C time per step, last repetition: " + ", ".join(
        f"{n} {c // a.steps}x {t * 1e3 / a.steps:.3f} ms" for n, (c, t) in per[:6]))
    record("torch_layer_share_b64", share, 15.0, "%")
    record("torch_outside_share_b64", outside_share, 15.0, "%")
    tiny_ours, tiny_torch = tiny_layer_cost(ttd, _lib, a.reps)
    record("torch_layer_us_tiny", tiny_ours, tiny_torch, "us")
    wait_ms = ms * (1 - outside_share / 100)
    paused, back_to_back = after_pause(wait_ms / 1e3)
    log(f"F.cross_entropy forward and backward: {back_to_back:.1f} us back to back, {paused:.1f} us after a "
        f"{wait_ms:.2f} ms busy wait")
    record("torch_op_after_pause", paused, back_to_back, "us")


if __name__ == "__main__":
    main()
