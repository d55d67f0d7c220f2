"""The boundary of torch's autograd and the card's: a device output brought to the CPU joins
torch's graph, and its backward runs the module's backward on the card."""
import torch

from .convert import _host_from_torch, _torch_from_host


class _Download(torch.autograd.Function):
    """A device output brought to the CPU, linked into torch's graph by a zero-element token.
    Backward: the CPU gradient goes to the card as sum(out_host * grad) through libttclient's
    autograd (tt_mul, tt_sum, tt_backward), which sends it and runs the module's backward."""

    @staticmethod
    def forward(ctx, token, dev):
        host = dev._tt.to("cpu")  # remembers the run it came from
        ctx.host, ctx.dev = host, dev
        return _torch_from_host(host)

    @staticmethod
    def backward(ctx, grad):
        if ctx.host is None:
            raise RuntimeError("trying to backward through a tt run a second time: its buffers were freed after "
                               "the first backward (the run is released, as torch's retain_graph=False)")
        g = _host_from_torch(grad.float())
        ctx.host.mul(g).sum().backward()
        ctx.host, ctx.dev = None, None
        return torch.zeros(0), None
