"""Device tensors: `t.to("tt")` on a plain torch tensor, and what a tensor on a tt device
answers (shape, dtype, device, repr, .to); any other op raises, naming it."""
import torch

from .autograd import download, upload_anchor
from .convert import _TORCH_DTYPES, Device, _device_from_torch, _device_name, _dtype_of, _is_tt


_META = torch.device("meta")  # a device object: a string would be parsed at every wrap


class Tensor(torch.Tensor):
    """A tensor on a tt device: shape, dtype, device, repr and .to() work; any other op raises."""

    @staticmethod
    def __new__(cls, tt, anchor=None):
        r = torch.Tensor._make_wrapper_subclass(cls, tt.shape, dtype=_TORCH_DTYPES[tt.dtype], device=_META)
        r._tt = tt
        r._anchor = anchor  # its place in torch's graph when gradients reach it (autograd.py), else None
        return r

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        # Metadata (shape, dtype, size(), dim(), ...) is the wrapper's own; any op raises here,
        # named as the user called it (l1_loss, not the aten sub it decomposes into).
        name = getattr(func, "__name__", str(func))
        if name == "__get__" or func in _METADATA:
            with torch._C.DisableTorchFunction():
                return func(*args, **(kwargs or {}))
        raise RuntimeError(f"{name} is not supported on a tt device tensor (no CPU fallback): move it to the CPU "
                           f"first with .to(\"cpu\")")

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        name = getattr(getattr(func, "overloadpacket", func), "__name__", str(func))
        raise RuntimeError(f"{name} is not supported on a tt device tensor (no CPU fallback): move it to the CPU "
                           f"first with .to(\"cpu\")")

    @property
    def device(self):
        return Device(self._tt.device)

    @property
    def is_tt(self):
        return True

    def __repr__(self, *args, **kwargs):
        return f"tensor(<on {self._tt.device}>, size={tuple(self.shape)}, dtype={self.dtype}, device='{self._tt.device}')"

    def cpu(self):
        return self.to("cpu")

    def to(self, *args, **kwargs):
        device = kwargs.get("device", args[0] if args else None)
        dtype = kwargs.get("dtype", args[1] if len(args) > 1 else None)
        if isinstance(device, torch.dtype):
            device, dtype = None, device
        device = self._tt.device if device is None else _device_name(device)
        if _is_tt(device):
            tt_dtype = None if dtype is None else _dtype_of(dtype)
            return Tensor(self._tt.to(device, tt_dtype), self._anchor)  # the gradient of both is the anchor's
        if device != "cpu":
            raise RuntimeError(f"a tt tensor moves to \"cpu\" or a \"tt\" device, not {device!r}")
        out = download(self._tt, self._anchor)
        return out if dtype is None else out.to(dtype)


_METADATA = {torch.Tensor.size, torch.Tensor.dim, torch.Tensor.numel, torch.numel, torch.Tensor.__len__,
             torch.Tensor.element_size,
             torch.Tensor.is_floating_point, torch.Tensor.__format__}


_orig_to = torch.Tensor.to


def _tensor_to(self, *args, **kwargs):
    device = kwargs.get("device", args[0] if args else None)
    if _is_tt(device):
        dtype = kwargs.get("dtype", args[1] if len(args) > 1 else None)
        src = self if dtype is None or dtype == self.dtype else _orig_to(self, dtype)
        return Tensor(_device_from_torch(src, _device_name(device)), upload_anchor(self))
    return _orig_to(self, *args, **kwargs)


torch.Tensor.to = _tensor_to
