"""PyTorch front end: `import ttd.torch as ttd`.

- `t.to("tt")` on a plain torch tensor gives a device tensor (tt:0); `.to("cpu")`/`.cpu()` bring it
  back (ttd/tensor.py). torch.Tensor.to and nn.Module.to accept device strings starting with
  "tt" (torch 1.13 has no "tt" device); everything else goes to the originals.
- `ttd.compile(module)` traces with torch.fx into a libttclient graph, built at the first call
  from that input's shape (ttd/module.py); libttclient serves other batch sizes itself.
- Backward: a device output's `.to("cpu")` joins torch's autograd (ttd/autograd.py).
- `ttd.optim.SGD` steps on the card with torch.optim.SGD's arguments (ttd/optim.py).
- `ttd.parallel.DistributedDataParallel` averages .grad across torch.distributed ranks (ttd/parallel.py).
- With torch >= 2.0, `torch.compile(model, backend="tt")` means ttd.compile (ttd/dynamo.py).

The package's layers, bottom-up: _lib (the one binding to libttclient), convert, autograd,
tensor, lower (torch ops onto ttd graphs), module, optim, parallel, dynamo; this module only gathers
their names."""
from . import dynamo, optim, parallel
from .convert import TTError, connect
from .dynamo import dynamo_modules
from .module import compile
from .tensor import Tensor

dynamo.register()

__all__ = ["compile", "connect", "dynamo_modules", "optim", "parallel", "Tensor", "TTError"]
