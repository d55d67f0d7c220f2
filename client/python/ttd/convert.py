"""Between torch and libttclient: the process's client, dtypes, the "tt" device object, and
host tensors copied either way. Below every other module of the package but _lib."""
import torch

from . import _lib


TTError = _lib.TTError
_DTYPES = {torch.float32: _lib.FLOAT32, torch.bfloat16: _lib.BFLOAT16, torch.int32: _lib.INT32}
_TORCH_DTYPES = {v: k for k, v in _DTYPES.items()}
_client = None


def connect(target=None):
    """Connects (or reconnects) the process's session: target None means $TTD_ADDRESS, then the
    default sockets (as tt_connect)."""
    global _client
    _client = _lib.Client(target)
    return _client


def _get_client():
    return _client if _client is not None else connect()


def _is_tt(device):
    return isinstance(device, str) and (device == "tt" or device.startswith("tt:"))


class Device:
    """A "tt" device as torch 1.13 cannot name one: prints as tt:0."""

    def __init__(self, name):
        self.name = name
        self.type = "tt"
        head = name.split("/")[0]
        self.index = int(head.split(":")[1]) if ":" in head else 0

    def __str__(self):
        return self.name

    def __repr__(self):
        return f"device(type='tt', index={self.index})"

    def __eq__(self, other):
        return str(self) == str(other) or (str(other) == "tt" and self.index == 0 and "/" not in self.name)

    def __hash__(self):
        return hash(self.name)


def _host_from_torch(t):
    """A libttclient host tensor with a copy of a CPU torch tensor's values."""
    if t.dtype not in _DTYPES:
        raise TypeError(f"a tt device holds float32, bfloat16 or int32, not {t.dtype}: convert it first "
                        f"(e.g. .float())")
    src = t.detach().contiguous()
    return _lib.Tensor.from_host(_get_client(), src.data_ptr(), _DTYPES[src.dtype], tuple(src.shape))


def _torch_from_host(h):
    out = torch.empty(h.shape, dtype=_TORCH_DTYPES[h.dtype])
    if h.nbytes:
        h.copy_to(out.data_ptr())
    return out
