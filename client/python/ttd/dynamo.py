"""torch.compile(model, backend="tt"), the proposal's torch 2 spelling of ttd.compile.

Where torch >= 2.0 is installed, importing ttd.torch registers the backend "tt" with
TorchDynamo. Dynamo hands it each graph it captures (an fx GraphModule holding the model's
submodules and parameters) with example inputs; the backend compiles it with ttd.compile,
places it on the card, and returns a function that runs it there: CPU inputs go to the card,
outputs come back as CPU tensors in torch's graph, so a loss on the CPU and its backward
reach the card as with ttd.compile. The card holds the parameters, which start from the
model's values; `ttd.dynamo_modules()` lists the modules the backend compiled that are still
in use, whose parameters ttd.optim steps. With torch 1.13 (Debian's) there is no torch.compile and nothing is
registered; `backend` itself works with any fx GraphModule."""
import weakref

import torch

from .module import CompiledModule
from .tensor import Tensor

_compiled = []  # weak references to the modules the backend compiled, in order: each lives as
                # long as Dynamo keeps the function that runs it
_registered = False


def backend(gm, example_inputs, device="tt"):
    """A TorchDynamo backend: gm compiled with ttd.compile on device; the function returned
    takes and gives what gm.forward does, with CPU tensors (device tensors pass as they are)."""
    cm = CompiledModule(gm).to(device)
    _compiled[:] = [r for r in _compiled if r() is not None]
    _compiled.append(weakref.ref(cm))

    def run(*args):
        moved = [a if isinstance(a, Tensor) or not isinstance(a, torch.Tensor) else a.to(device) for a in args]
        return _to_cpu(cm(*moved))

    run.ttd_module = cm
    return run


def _to_cpu(out):
    """out, forward's structure (tensors, tuples, lists, dicts, None), with its tensors on the CPU."""
    if isinstance(out, dict):
        return {k: _to_cpu(v) for k, v in out.items()}
    if isinstance(out, (tuple, list)):
        return type(out)(_to_cpu(v) for v in out)
    return None if out is None else out.to("cpu")


def dynamo_modules():
    """The modules the "tt" backend compiled (oldest first) that are still in use, e.g. to
    give their parameters to ttd.optim."""
    return [m for m in (r() for r in _compiled) if m is not None]


def register():
    """Registers backend as "tt" with TorchDynamo when this torch has it (>= 2.0), once;
    returns whether it is registered."""
    global _registered
    if _registered:
        return True
    try:
        from torch._dynamo import register_backend
    except ImportError:
        return False
    register_backend(compiler_fn=backend, name="tt")
    _registered = True
    return True
