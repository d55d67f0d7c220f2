"""The boundary of torch's autograd and the card's.

Device tensors stay out of torch's graph. One that gradients must reach has an anchor: a CPU
tensor of its shape and dtype in torch's graph, whose values nothing reads: -0.0 expanded (no
memory), or for a run's small output a tensor of its own. A tensor uploaded
from a CPU tensor that requires grad is anchored to it (_Upload passes the gradient through);
the outputs of a training run are anchored to the run (_Run), whose inputs are the anchors of
the run's inputs; a download (.to("cpu")) is a copy of the anchor with the values written
over it, and torch's clone hands the download's gradient to the anchor. So torch
sums every gradient reaching a device tensor at its anchor, and calls each run's backward
once with the gradients of all of its outputs. That backward sends them to the card
(tt_backward_grads) and hands its inputs' gradients, brought to the CPU, to the anchors
upstream: CPU layers before the card, and modules before it in a chain, train too.

A run's activations live as long as torch's graph keeps the run: its Backward keeps the
run (retain_graph, in libttclient), and when torch frees the graph (after a backward
without retain_graph, or when the graph is dropped) the release that the tensor the run's
node saves owns goes with the saved tensors and releases it; a Backward
still waiting for the module's next Execute then frees it there, with no call of its own."""
import math

import torch

from . import _lib
from .convert import _TORCH_DTYPES, _read_into, _torch_from_tt

_LEAF = torch.empty(0, requires_grad=True)  # makes every run's anchors require grad; gets no gradient
# _LEAF's node in every graph: torch.autograd.backward runs it, torch.autograd.grad and
# backward(inputs=...) do not (they leave the parameters' .grad alone)
_LEAF_NODE = _LEAF.view_as(_LEAF).grad_fn.next_functions[0][0]


_NEG_ZERO = {}  # dtype: the 0-dim -0.0 every anchor of that dtype views (never written)


def _anchor(shape, dtype=torch.float32):
    base = _NEG_ZERO.get(dtype)
    if base is None:
        base = _NEG_ZERO[dtype] = torch.full((), -0.0, dtype=dtype)
    return base.expand(shape)


_SMALL_OUTPUT = 16384  # elements: a run's output up to this size has an anchor of its own memory


def _output_anchor(shape, dtype):
    """A run's output's anchor: for a small output, a tensor of its own memory, never read (a
    download's copy of a contiguous tensor costs half that of an expanded one, and the values
    are written over the copy); for a larger one, -0.0 expanded (no memory)."""
    return torch.empty(shape, dtype=dtype) if math.prod(shape) <= _SMALL_OUTPUT else _anchor(shape, dtype)


class _Upload(torch.autograd.Function):
    """x.to("tt") of a CPU tensor that requires grad: the device tensor's anchor, whose
    gradient is x's."""

    @staticmethod
    def forward(ctx, x):
        ctx.dtype = x.dtype
        return _anchor(x.shape, x.dtype)

    @staticmethod
    def backward(ctx, grad):
        return grad.to(ctx.dtype)


class _RunState:
    """What a run's backward needs: the libttclient tensors of its outputs and of its inputs
    that take a gradient (in the order of _Run's anchors)."""

    __slots__ = ("outputs", "inputs", "before_backward", "after_backward")

    def __init__(self, outputs, inputs, before_backward=None, after_backward=None):
        self.outputs, self.inputs = outputs, inputs
        self.before_backward, self.after_backward = before_backward, after_backward


class _Release:
    """Releases a run's activations (tt_release_run) when it goes: its one owner is the tensor
    the run's node saves, which torch frees with the graph's saved tensors (after a backward
    without retain_graph, or when the graph is dropped)."""

    __slots__ = ("output",)

    def __init__(self, output):
        self.output = output

    def __del__(self):
        if _lib._L is None:
            return  # the interpreter is ending: the session's close frees it
        try:
            self.output.release_run()
        except _lib.TTError:
            pass  # a session already gone has freed it


class _Run(torch.autograd.Function):
    """One training forward of a compiled module, as a node of torch's graph: the anchors of
    its inputs in, the anchors of its outputs out."""

    @staticmethod
    def forward(ctx, state, leaf, *input_anchors):
        ctx.state = state  # on ctx: saved-tensor hooks (save_on_cpu) hand backward other objects
        ctx.set_materialize_grads(False)  # outputs no loss used get None, and send nothing
        holder = torch.Tensor()  # saved: the graph's saved tensors own the run's release
        holder._ttd_release = _Release(state.outputs[0])
        ctx.save_for_backward(holder)
        return tuple([_output_anchor(o.shape, _TORCH_DTYPES[o.dtype]) for o in state.outputs])

    @staticmethod
    def backward(ctx, *grads):
        ctx.saved_tensors  # torch's own error for a graph already freed (no retain_graph)
        if torch.is_grad_enabled():
            raise RuntimeError("create_graph=True through a compiled module is not supported: ttd's backward "
                               "records no graph (no double backward); take higher derivatives on the CPU")
        if not torch._C._will_engine_execute_node(_LEAF_NODE):
            raise RuntimeError("torch.autograd.grad (or backward(inputs=...)) through a compiled module is not "
                               "supported: its backward always adds into the module's parameters' .grad; call "
                               "loss.backward() and read the input's .grad")
        state = ctx.state
        pairs = [(o, _wire_grad(g)) for o, g in zip(state.outputs, grads) if g is not None]
        if state.before_backward is not None:
            state.before_backward(tuple([i for i, g in enumerate(grads) if g is not None]))
        if pairs:
            _lib.backward([o for o, _ in pairs], [g for _, g in pairs], retain_graph=True)
        if state.after_backward is not None:
            state.after_backward()  # inside torch's backward: the run's .grads are (queued) on the card
        input_grads = []
        for t in state.inputs:
            g = t.take_grad()
            input_grads.append(None if g is None else _torch_from_tt(g))
        return (None, None, *input_grads)


def _wire_grad(g):
    """g as libttclient takes a gradient: a contiguous float32 tensor whose memory holds its
    values (g itself in the common case, checked without a torch op)."""
    if g.dtype is torch.float32 and g.is_contiguous() and not g.is_neg():
        return g
    return g.float().resolve_neg().contiguous()


def run(outputs, inputs, input_anchors, before_backward=None, after_backward=None):
    """The anchors of a training run's outputs (libttclient tensors), in torch's graph after
    the anchors of the inputs that take a gradient (inputs: their libttclient tensors).
    before_backward: None, or called inside torch's backward, before the run's gradients go
    to the card, with the indices of the outputs that got one (a tuple). after_backward: None, or
    called with no arguments inside torch's backward each time this run's backward has sent
    its gradients to the card (ttd.parallel queues its all-reduce)."""
    return _Run.apply(_RunState(outputs, inputs, before_backward, after_backward), _LEAF, *input_anchors)


def upload_anchor(x):
    """The anchor of x.to("tt") for a CPU tensor x: None unless x takes a gradient."""
    return _Upload.apply(x) if x.requires_grad and torch.is_grad_enabled() else None


def download(t, anchor):
    """t's values (a libttclient tensor, on a card or the host) as a CPU torch tensor, in
    torch's graph below anchor when there is one (and grad is enabled): a copy of the anchor
    (its CloneBackward hands the gradient to it, and keeps nothing) whose -0.0s the values
    then overwrite in memory, one torch op where adding the values to the anchor took two."""
    if anchor is None or not torch.is_grad_enabled():
        return _torch_from_tt(t)
    dtype = _TORCH_DTYPES[t.dtype]
    if anchor.dtype != dtype:  # bfloat16 uploaded from float32: the download stays bfloat16
        anchor = anchor.to(dtype)
    return _read_into(t, anchor.clone(memory_format=torch.contiguous_format))
