"""torch.compile(model, backend="tt"): the TorchDynamo backend, on an fx graph as Dynamo
hands it (any torch), and through torch.compile itself where torch >= 2.0."""
import copy
import gc
import weakref

import pytest
import torch
import torch.nn.functional as F

import ttd.torch as ttd
from ttd import dynamo

TORCH2 = int(torch.__version__.split(".")[0]) >= 2


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def _check_step(fn, cm, ref, x, t):
    """fn(x) equals ref(x) as a CPU tensor in torch's graph; its loss's backward fills the
    card parameters' .grad as torch's, and ttd.optim steps them."""
    out = fn(x)
    assert out.device.type == "cpu" and out.requires_grad
    torch.testing.assert_close(out, ref(x), rtol=1e-5, atol=1e-6)
    F.mse_loss(out, t).backward()
    F.mse_loss(ref(x), t).backward()
    got = dict(cm.named_parameters())
    for name, p in ref.named_parameters():
        torch.testing.assert_close(got[name].grad, p.grad, rtol=1e-4, atol=1e-6)
    ttd.optim.SGD(cm.parameters(), lr=0.1).step()
    torch.optim.SGD(ref.parameters(), lr=0.1).step()
    torch.testing.assert_close(fn(x), ref(x), rtol=1e-4, atol=1e-5)


def test_backend_on_a_dynamo_style_graph():
    """backend(gm, example_inputs) as Dynamo calls it: the function runs gm on the card."""
    ref = _model()
    gm = torch.fx.symbolic_trace(copy.deepcopy(ref))
    x, t = torch.randn(5, 12), torch.randn(5, 4)
    fn = dynamo.backend(gm, [x])
    assert ttd.dynamo_modules()[-1] is fn.ttd_module
    _check_step(fn, fn.ttd_module, ref, x, t)


def test_registered_only_where_torch_has_dynamo():
    """register() says whether this torch has TorchDynamo: never on torch 1.x."""
    assert dynamo.register() == TORCH2


@pytest.mark.skipif(not TORCH2, reason=f"torch.compile needs torch >= 2.0; this is torch {torch.__version__}")
def test_torch_compile_backend_tt():
    """torch.compile(model, backend="tt") runs the model on the card, as ttd.compile does."""
    ref = _model()
    fn = torch.compile(copy.deepcopy(ref), backend="tt")
    x, t = torch.randn(5, 12), torch.randn(5, 4)
    fn(x)  # Dynamo compiles at the first call
    _check_step(fn, ttd.dynamo_modules()[-1], ref, x, t)


def test_compiled_modules_go_with_their_function():
    """dynamo_modules() lists a compiled module while its function lives, not after."""
    fn = dynamo.backend(torch.fx.symbolic_trace(_model()), [torch.randn(2, 12)])
    assert any(m is fn.ttd_module for m in ttd.dynamo_modules())
    cm_ref = weakref.ref(fn.ttd_module)
    del fn
    gc.collect()
    assert cm_ref() is None  # the backend's list does not keep it (or its card memory)


def test_backend_returns_forwards_structure():
    """A graph returning a list or a dict (of tensors and None) gives the same structure back,
    its tensors on the CPU."""
    class Outs(torch.nn.Module):
        def __init__(self, kind):
            super().__init__()
            self.l, self.kind = torch.nn.Linear(4, 3), kind

        def forward(self, x):
            h = self.l(x)
            return [h, torch.relu(h)] if self.kind == "list" else {"h": h, "none": None}

    x = torch.randn(2, 4)
    for kind in ("list", "dict"):
        ref = Outs(kind)
        fn = dynamo.backend(torch.fx.symbolic_trace(copy.deepcopy(ref)), [x])
        got, want = fn(x), ref(x)
        assert type(got) is type(want)
        pairs = zip(got, want) if kind == "list" else ((got[k], want[k]) for k in want)
        for g, w in pairs:
            if w is None:
                assert g is None
            else:
                assert g.device.type == "cpu"
                torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
