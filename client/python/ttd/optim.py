"""torch.optim's optimizers, stepping on the card over a compiled module's parameters.

SGD, Adam and AdamW take torch.optim's arguments and check them as torch does (ValueError);
they update every parameter of one compiled module where the module is (tt_sgd_opts,
tt_adam_opts), made at the first step when the module has not run yet. They are
torch.optim.Optimizer instances, so torch's lr schedulers drive them: param_groups[0]["lr"]
is read and set between steps (tt_optimizer_set_lr)."""
import collections
import json
import os
import struct
import tempfile

import torch
from torch.optim.optimizer import required

from . import _lib
from .module import Parameter

_INVALID_ARGUMENT = 3


def _value_error(fn, *args):
    """fn(*args), a libttclient argument error raised as torch.optim raises its own: ValueError."""
    try:
        return fn(*args)
    except _lib.TTError as e:
        if e.code == _INVALID_ARGUMENT:
            raise ValueError(str(e)) from None
        raise


def _read_safetensors(data):
    """{name: CPU tensor} and the metadata of a safetensors file's bytes (F32 and I32)."""
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    dtypes = {"F32": torch.float32, "I32": torch.int32, "BF16": torch.bfloat16}
    out = {}
    for name, h in header.items():
        a, b = h["data_offsets"]
        buf = bytearray(data[8 + n + a:8 + n + b])
        t = torch.frombuffer(buf, dtype=dtypes[h["dtype"]]) if buf else torch.empty(0, dtype=dtypes[h["dtype"]])
        out[name] = t.reshape(h["shape"]).clone()
    return out, meta


class _CardOptimizer(torch.optim.Optimizer):
    """The common part: one parameter group holding all of one compiled module's parameters."""

    def __init__(self, params, defaults):
        params = list(params)
        if params and isinstance(params[0], dict):  # torch's param groups: one is supported
            if len(params) != 1:
                raise NotImplementedError(f"{type(self).__name__} over a compiled module takes one parameter group")
            group = dict(params[0])
            params = list(group.pop("params"))
            defaults = {**defaults, **group}
        if defaults["lr"] is required:
            raise ValueError("parameter group didn't specify a value of required optimization parameter lr")
        owners = {id(p._owner): p._owner for p in params if isinstance(p, Parameter)}
        if (len(owners) != 1 or len(params) != len(next(iter(owners.values()))._params)
                or len({id(p) for p in params}) != len(params)):
            raise NotImplementedError(f"ttd.optim.{type(self).__name__} takes all the parameters of one compiled "
                                      f"module (tt_model.parameters())")
        self._owner = next(iter(owners.values()))
        self.defaults = defaults
        self.state = collections.defaultdict(dict)
        self.param_groups = [dict(params=params, **defaults)]
        self._opt = None
        self._lr_sent = defaults["lr"]
        if self._owner._module is not None:
            self._get()  # the card checks the arguments now

    def _make(self, module):
        raise NotImplementedError

    def _get(self):
        if self._opt is None:
            self._opt = _value_error(self._make, self._owner._built())
            self._lr_sent = self.defaults["lr"]
        lr = self.param_groups[0]["lr"]
        if lr != self._lr_sent:  # a scheduler or the user set param_groups[0]["lr"]
            if not 0.0 <= lr:
                raise ValueError(f"Invalid learning rate: {lr}")
            _value_error(self._opt.set_lr, lr)
            self._lr_sent = lr
        return self._opt

    def add_param_group(self, param_group):
        raise NotImplementedError(f"ttd.optim.{type(self).__name__} has one parameter group: all of a compiled "
                                  f"module's parameters")

    def step(self, closure=None):
        """One update from the current .grad, where the module is; closure as torch's."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._get().step()
        return loss

    def zero_grad(self, set_to_none=False):
        """Every .grad becomes 0 (torch 1.13's default), or None with set_to_none until the next
        training run."""
        if self._owner._module is not None:
            self._get().zero_grad()
        if set_to_none:
            self._owner._grad_none = True

    def state_dict(self):
        """torch's layout ({"state": {index: {...}}, "param_groups": [...]}); the card's state
        file rides along under "ttd_state" for load_state_dict."""
        groups = [{k: v for k, v in self.param_groups[0].items() if k != "params"}]
        groups[0]["params"] = list(range(len(self.param_groups[0]["params"])))
        out = {"state": {}, "param_groups": groups}
        if self._opt is None:
            return out
        with tempfile.TemporaryDirectory(prefix="ttd-") as tmp:
            path = os.path.join(tmp, "optimizer.safetensors")
            self._get().save(path)
            with open(path, "rb") as f:
                data = f.read()
        tensors, _ = _read_safetensors(data)
        for i, p in enumerate(self.param_groups[0]["params"]):
            s = {k[len(p.name) + 1:]: v for k, v in tensors.items() if k.startswith(p.name + ".")}
            if "step" in s:
                s["step"] = torch.tensor(float(s["step"].reshape(-1)[0]))
            out["state"][i] = s
        out["ttd_state"] = data
        return out

    def load_state_dict(self, state_dict):
        """Replaces the arguments and, from a ttd optimizer's state_dict, the state."""
        group = state_dict["param_groups"][0]
        data = state_dict.get("ttd_state")
        if data is None and state_dict.get("state"):
            raise NotImplementedError("load_state_dict takes the state_dict of a ttd.optim optimizer")
        for k, v in group.items():
            if k != "params":
                self.param_groups[0][k] = v
        if data is not None:
            opt = self._get()
            with tempfile.TemporaryDirectory(prefix="ttd-") as tmp:
                path = os.path.join(tmp, "optimizer.safetensors")
                with open(path, "wb") as f:
                    f.write(data)
                _value_error(opt.load, path)
            self._lr_sent = opt.lr
            if self.param_groups[0]["lr"] != self._lr_sent:  # the file's lr is a float32
                self._get()


class SGD(_CardOptimizer):
    """torch.optim.SGD's signature; steps on the card (tt_sgd_opts)."""

    def __init__(self, params, lr=required, momentum=0, dampening=0, weight_decay=0, nesterov=False, *,
                 maximize=False, foreach=None, differentiable=False):
        if lr is not required and lr < 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if momentum < 0.0:
            raise ValueError(f"Invalid momentum value: {momentum}")
        if weight_decay < 0.0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        if maximize or differentiable:
            raise NotImplementedError("ttd.optim.SGD: maximize and differentiable are not supported")
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                                      nesterov=nesterov, maximize=False, foreach=foreach, differentiable=False))

    def _make(self, module):
        d = self.defaults
        return _lib.Optimizer.sgd(module, d["lr"], d["momentum"], d["dampening"], d["weight_decay"], d["nesterov"])


class Adam(_CardOptimizer):
    """torch.optim.Adam's signature; steps on the card (tt_adam_opts)."""

    _decoupled = False

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, amsgrad=False, *,
                 foreach=None, maximize=False, capturable=False, differentiable=False, fused=False):
        if not 0.0 <= lr:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        if not 0.0 <= betas[0] < 1.0:
            raise ValueError(f"Invalid beta parameter at index 0: {betas[0]}")
        if not 0.0 <= betas[1] < 1.0:
            raise ValueError(f"Invalid beta parameter at index 1: {betas[1]}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if amsgrad or maximize or differentiable or fused:
            raise NotImplementedError(f"ttd.optim.{type(self).__name__}: amsgrad, maximize, differentiable and "
                                      f"fused are not supported")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, amsgrad=False,
                                      foreach=foreach, maximize=False, capturable=capturable,
                                      differentiable=False, fused=False))

    def _make(self, module):
        d = self.defaults
        return _lib.Optimizer.adam(module, d["lr"], d["betas"][0], d["betas"][1], d["eps"], d["weight_decay"],
                                   self._decoupled)


class AdamW(Adam):
    """torch.optim.AdamW's signature (decoupled weight decay, 1e-2 by default); on the card."""

    _decoupled = True

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False, **kw):
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, **kw)
