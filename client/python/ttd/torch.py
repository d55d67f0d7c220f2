"""PyTorch front end: `import ttd.torch as ttd`.

- `t.to("tt")` on a plain torch tensor gives a device tensor (tt:0); `.to("cpu")`/`.cpu()` bring it
  back (ttd/tensor.py). torch.Tensor.to and nn.Module.to accept device strings starting with
  "tt" (torch 1.13 has no "tt" device); everything else goes to the originals.
- `ttd.compile(module)` traces with torch.fx into a libttclient graph, built at the first call
  from that input's shape (ttd/module.py); libttclient serves other batch sizes itself.
- Backward: a device output's `.to("cpu")` joins torch's autograd (ttd/autograd.py).
- `ttd.optim.SGD` steps on the card with torch.optim.SGD's arguments (ttd/optim.py).

The package's layers, bottom-up: _lib (the one binding to libttclient), convert, autograd,
tensor, lower (torch ops onto ttd graphs), module, optim; this module only gathers their
names."""
from . import optim
from .convert import TTError, connect
from .module import compile
from .tensor import Tensor

__all__ = ["compile", "connect", "optim", "Tensor", "TTError"]
