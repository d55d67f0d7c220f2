"""torch.optim's optimizers, stepping on the card over a compiled module's parameters.

SGD, Adam and AdamW take torch.optim's arguments, in keywords or in one parameter group, and
check them as torch does (ValueError; NotImplementedError for what the card lacks); they
update the parameters of one compiled module where the module is (tt_sgd_opts,
tt_adam_opts), made at the first step when the module has not run yet. They are
torch.optim.Optimizer instances, so torch's schedulers drive them: param_groups[0]'s lr goes
to the card through tt_optimizer_set_lr, its other arguments (momentum, betas, ...) through
the optimizer's state file (tt_optimizer_save, tt_optimizer_load)."""
import collections
import json
import os
import struct
import tempfile
import weakref

import torch
from torch.optim.optimizer import required

from . import _lib
from .convert import _host_from_torch
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
    """The common part: one parameter group holding the parameters of one compiled module.

    The card steps every parameter of the module; one torch would not step (frozen, left
    out of the optimizer, or without a .grad) keeps its value and its optimizer state."""

    def __init__(self, params, defaults):
        params = list(params)
        if params and isinstance(params[0], dict):  # torch's param groups: one is supported
            if len(params) != 1:
                raise NotImplementedError(f"ttd.optim.{type(self).__name__} over a compiled module takes one "
                                          f"parameter group: give its parameters one lr, momentum, ... or use one "
                                          f"optimizer per compiled module")
            group = dict(params[0])
            params = list(group.pop("params"))
            defaults = {**defaults, **group}
        if defaults["lr"] is required:
            raise ValueError("parameter group didn't specify a value of required optimization parameter lr")
        self._check(defaults)
        owners = {id(p._owner): p._owner for p in params if isinstance(p, Parameter)}
        given = {p.name for p in params if isinstance(p, Parameter)}
        if (len(owners) != 1 or len(given) != len(params)
                or any(p.requires_grad and p.name not in given for p in next(iter(owners.values()))._params.values())):
            raise NotImplementedError(f"ttd.optim.{type(self).__name__} takes the parameters of one compiled "
                                      f"module (tt_model.parameters()): all of them, or all but frozen ones")
        self._owner = next(iter(owners.values()))
        self._members = {p.name for p in params}
        self.defaults = defaults
        self.state = collections.defaultdict(dict)
        self.param_groups = [dict(params=params, **defaults)]
        self._opt = None
        self._sent = None  # the card's arguments, as _card_args gives them
        self._parked = None  # this optimizer's state file while another's is on the card (_claim)
        self._pending = None  # a state file load_state_dict took before the module ran: loaded at _get
        if self._owner._module is not None:
            self._get()  # the card checks the arguments now

    @staticmethod
    def _check(group):
        """Raises as torch.optim's constructor does for a bad argument, NotImplementedError for
        one the card does not support."""
        raise NotImplementedError

    def _card_args(self, group):
        """The arguments of the card's optimizer, by the names of its state file's metadata."""
        raise NotImplementedError

    def _has_state(self):
        """Whether a step changes the optimizer's state (momentum, Adam's moments)."""
        raise NotImplementedError

    def _make(self, module, args):
        raise NotImplementedError

    def _fit_state(self, tensors, args):
        """A state file's tensors made fit for the arguments args."""
        return tensors

    def _get(self):
        """The card's optimizer, with param_groups[0]'s arguments (changed by a scheduler or by
        hand since the last step: lr through tt_optimizer_set_lr, the others through the state
        file's metadata)."""
        group = self.param_groups[0]
        self._check(group)
        args = self._card_args(group)
        if self._opt is None:
            self._opt = _value_error(self._make, self._owner._built(), args)
            self._claim()
            if self._pending is not None:
                data, self._pending = self._pending, None
                self._load_file(data)
        elif self._owner._state_owner is None or self._owner._state_owner() is not self:
            self._claim()
        if self._sent is None:
            pass
        elif args["lr"] != self._sent["lr"] and {k for k in args if args[k] != self._sent[k]} == {"lr"}:
            _value_error(self._opt.set_lr, args["lr"])
        elif args != self._sent:
            tensors, meta = _read_safetensors(self._save_state())
            meta.update({k: repr(float(v)) for k, v in args.items()})
            self._load_state(tensors=self._fit_state(tensors, args), meta=meta)
        self._sent = args
        return self._opt

    def _claim(self):
        """Puts this optimizer's state on the card, as each of torch's optimizers has its own:
        the card keeps one per parameter, so the state there of another optimizer of the module
        (still in use) is parked in it as a file, and this one's comes back from its own, or
        starts afresh (step 0, no buffers) where another's, or that of one gone, was there."""
        module = self._owner
        ref = module._state_owner
        other = ref() if ref is not None else None
        if other is not None and other._opt is not None:
            other._parked = other._save_state()
        if self._parked is not None:
            self._load_state(self._parked)
            self._parked = None
        elif ref is not None:  # a fresh state: every parameter at step 0, with no buffers
            args = self._card_args(self.param_groups[0])
            meta = {"format": "ttd.optimizer", "optimizer": self._kind,
                    **{k: repr(float(v)) for k, v in args.items()}}
            self._load_state(tensors={f"{n}.step": torch.zeros((), dtype=torch.int32) for n in module._params},
                             meta=meta)
        module._state_owner = weakref.ref(self)

    def _save_state(self):
        """The card's optimizer state file (tt_optimizer_save), as bytes."""
        with tempfile.TemporaryDirectory(prefix="ttd-") as tmp:
            path = os.path.join(tmp, "optimizer.safetensors")
            self._opt.save(path)
            with open(path, "rb") as f:
                return f.read()

    def _load_state(self, data=None, tensors=None, meta=None):
        """tt_optimizer_load of a state file: its bytes (data), or {name: CPU tensor} and its
        metadata, which libttclient writes (tt_safetensors_save_metadata)."""
        with tempfile.TemporaryDirectory(prefix="ttd-") as tmp:
            path = os.path.join(tmp, "optimizer.safetensors")
            if data is not None:
                with open(path, "wb") as f:
                    f.write(data)
            else:
                named = [(k, _host_from_torch(v)) for k, v in tensors.items()]
                _lib.safetensors_save(self._owner._built().client, path, named, meta)
            _value_error(self._opt.load, path)

    def add_param_group(self, param_group):
        raise NotImplementedError(f"ttd.optim.{type(self).__name__} has one parameter group: the parameters of "
                                  f"one compiled module")

    def step(self, closure=None):
        """One update from the current .grad, where the module is; closure as torch's. As
        torch's, a parameter without a .grad (frozen, none since zero_grad(set_to_none=True),
        or not reached by the backward) or not in this optimizer is not updated."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        owner = self._owner
        if owner._module is None:  # not run yet: no .grad
            return loss
        opt = self._get()
        held = [p for p in owner._params.values() if p.name not in self._members or p.name not in owner._with_grad]
        if len(held) == len(owner._params):
            return loss
        values = [(p, p._value()) for p in held]
        before = _read_safetensors(self._save_state())[0] if held and self._has_state() else None
        opt.step()
        for p, v in values:
            owner._module.param(p.name).copy_(_host_from_torch(v))
        if before is not None:
            names = {p.name for p in held}
            after, meta = _read_safetensors(self._save_state())
            kept = {k: v for k, v in after.items() if k.rsplit(".", 1)[0] not in names}
            kept.update({k: v for k, v in before.items() if k.rsplit(".", 1)[0] in names})
            self._load_state(tensors=kept, meta=meta)
        return loss

    def zero_grad(self, set_to_none=False):
        """Every .grad becomes 0 (torch 1.13's default), or None with set_to_none until a
        backward reaches it."""
        if self._owner._module is not None:
            self._get().zero_grad()
        self._owner._grads_zeroed(set_to_none)

    def state_dict(self):
        """torch's layout ({"state": {index: {...}}, "param_groups": [...]}); the card's state
        file rides along under "ttd_state" for load_state_dict."""
        groups = [{k: v for k, v in self.param_groups[0].items() if k != "params"}]
        groups[0]["params"] = list(range(len(self.param_groups[0]["params"])))
        out = {"state": {}, "param_groups": groups}
        if self._opt is None and self._pending is None:
            return out
        data = self._pending if self._opt is None else (self._get(), self._save_state())[1]
        tensors, _ = _read_safetensors(data)
        for i, p in enumerate(self.param_groups[0]["params"]):
            s = {k[len(p.name) + 1:]: v for k, v in tensors.items() if k.startswith(p.name + ".")}
            if "step" in s:
                s["step"] = torch.tensor(float(s["step"].reshape(-1)[0]))
            out["state"][i] = s
        out["ttd_state"] = data
        return out

    def load_state_dict(self, state_dict):
        """Replaces the arguments and, from a ttd optimizer's state_dict, the state (at the first
        step where the module has not run yet, as after a restart: model.load_state_dict, then
        opt.load_state_dict, then train)."""
        group = state_dict["param_groups"][0]
        data = state_dict.get("ttd_state")
        if data is None and state_dict.get("state"):
            raise NotImplementedError("load_state_dict takes the state_dict of a ttd.optim optimizer")
        for k, v in group.items():
            if k != "params":
                self.param_groups[0][k] = v
        if data is not None and self._owner._module is None:  # not run yet: loaded at the first step
            self._pending = data
        elif data is not None:
            self._get()
            self._load_file(data)
        self._check(self.param_groups[0])

    def _load_file(self, data):
        """Loads a state file of this optimizer's (its bytes) onto the card; the card's arguments
        are then the file's, float32."""
        self._load_state(data)
        meta = _read_safetensors(data)[1]
        self._sent = {k: float(meta[k]) for k in self._card_args(self.param_groups[0])}


class SGD(_CardOptimizer):
    """torch.optim.SGD's signature; steps on the card (tt_sgd_opts)."""

    _kind = "SGD"  # the card optimizer's name in its state files

    def __init__(self, params, lr=required, momentum=0, dampening=0, weight_decay=0, nesterov=False, *,
                 maximize=False, foreach=None, differentiable=False):
        self._kept_buffers = {}  # momentum buffers while momentum is 0 (_fit_state)
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                                      nesterov=nesterov, maximize=maximize, foreach=foreach,
                                      differentiable=differentiable))

    @staticmethod
    def _check(g):
        if g["lr"] is not required and g["lr"] < 0.0:
            raise ValueError(f"Invalid learning rate: {g['lr']}")
        if g["momentum"] < 0.0:
            raise ValueError(f"Invalid momentum value: {g['momentum']}")
        if g["weight_decay"] < 0.0:
            raise ValueError(f"Invalid weight_decay value: {g['weight_decay']}")
        if g["nesterov"] and (g["momentum"] <= 0 or g["dampening"] != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        if g.get("maximize") or g.get("differentiable"):
            raise NotImplementedError("ttd.optim.SGD: maximize and differentiable are not supported (the card "
                                      "minimises): leave them False")

    def _card_args(self, g):
        return dict(lr=g["lr"], momentum=g["momentum"], dampening=g["dampening"], weight_decay=g["weight_decay"],
                    nesterov=int(bool(g["nesterov"])))

    def _has_state(self):
        return self.param_groups[0]["momentum"] != 0

    def _fit_state(self, tensors, args):
        """As torch's: momentum set to 0 keeps each momentum buffer (aside, as the card's steps
        with momentum 0 keep none) for momentum to resume from; a parameter with none (never
        stepped with momentum) starts one at its next step, its step count back to 0."""
        buffers = {k: v for k, v in tensors.items() if k.endswith(".momentum_buffer")}
        if args["momentum"] == 0:
            self._kept_buffers.update(buffers)
            return tensors
        out = dict(tensors)
        for k in [k for k in tensors if k.endswith(".step")]:
            name = k[:-5] + ".momentum_buffer"
            if name not in buffers and name in self._kept_buffers:
                out[name] = self._kept_buffers[name]
            elif name not in buffers:
                out[k] = torch.zeros_like(tensors[k])
        self._kept_buffers.clear()
        return out

    def _make(self, module, a):
        return _lib.Optimizer.sgd(module, a["lr"], a["momentum"], a["dampening"], a["weight_decay"], a["nesterov"])


class Adam(_CardOptimizer):
    """torch.optim.Adam's signature; steps on the card (tt_adam_opts)."""

    _decoupled = False
    _kind = "Adam"

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, amsgrad=False, *,
                 foreach=None, maximize=False, capturable=False, differentiable=False, fused=False):
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                                      foreach=foreach, maximize=maximize, capturable=capturable,
                                      differentiable=differentiable, fused=fused))

    @classmethod
    def _check(cls, g):
        betas = g["betas"]
        if not 0.0 <= g["lr"]:
            raise ValueError(f"Invalid learning rate: {g['lr']}")
        if not 0.0 <= g["eps"]:
            raise ValueError(f"Invalid epsilon value: {g['eps']}")
        if not 0.0 <= betas[0] < 1.0:
            raise ValueError(f"Invalid beta parameter at index 0: {betas[0]}")
        if not 0.0 <= betas[1] < 1.0:
            raise ValueError(f"Invalid beta parameter at index 1: {betas[1]}")
        if not 0.0 <= g["weight_decay"]:
            raise ValueError(f"Invalid weight_decay value: {g['weight_decay']}")
        if g.get("amsgrad") or g.get("maximize") or g.get("differentiable") or g.get("fused"):
            raise NotImplementedError(f"ttd.optim.{cls.__name__}: amsgrad, maximize, differentiable and fused are "
                                      f"not supported: leave them False")

    def _card_args(self, g):
        return dict(lr=g["lr"], beta1=g["betas"][0], beta2=g["betas"][1], eps=g["eps"],
                    weight_decay=g["weight_decay"])

    def _has_state(self):
        return True

    def _make(self, module, a):
        return _lib.Optimizer.adam(module, a["lr"], a["beta1"], a["beta2"], a["eps"], a["weight_decay"],
                                   self._decoupled)


class AdamW(Adam):
    """torch.optim.AdamW's signature (decoupled weight decay, 1e-2 by default); on the card."""

    _decoupled = True
    _kind = "AdamW"

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False, **kw):
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, **kw)
