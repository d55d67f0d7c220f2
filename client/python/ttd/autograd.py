"""The boundary of torch's autograd and the card's: a device output brought to the CPU joins
torch's graph, and its backward runs the module's backward on the card."""
import torch

from .convert import _host_from_torch, _torch_from_host


class _Download(torch.autograd.Function):
    """The link of one device output into torch's graph, made at its first .to("cpu") and kept
    on the device tensor: its output is an anchor (zeros expanded to the output's shape, no
    memory) that every download of that output (_Copy) hangs from, so torch sums the gradients
    of all of them, and of every use of each, before this backward runs once.
    Backward: the CPU gradient goes to the card as sum(out_host * grad) through libttclient's
    autograd (tt_mul, tt_sum, tt_backward), which sends it and runs the module's backward."""

    @staticmethod
    def forward(ctx, token, host):
        ctx.host = host  # the download remembers the run it came from
        return torch.zeros(()).expand(tuple(host.shape))

    @staticmethod
    def backward(ctx, grad):
        if ctx.host is None:
            raise RuntimeError("trying to backward through a tt run a second time: its buffers were freed after "
                               "the first backward (the run is released, as torch's retain_graph=False)")
        g = _host_from_torch(grad.float())
        ctx.host.mul(g).sum().backward()
        ctx.host = None
        return torch.zeros(0), None


class _Copy(torch.autograd.Function):
    """One download of a device output: a CPU copy of its values whose gradient goes to the
    output's anchor (_Download)."""

    @staticmethod
    def forward(ctx, anchor, host):
        return _torch_from_host(host)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def download(dev):
    """dev (a device output of a training run) on the CPU, in torch's graph; downloading it
    again gives another copy whose gradient is summed with the others'."""
    link = getattr(dev, "_link", None)
    if link is None:
        host = dev._tt.to("cpu")
        link = dev._link = (_Download.apply(torch.empty(0, requires_grad=True), host), host)
    return _Copy.apply(*link)
