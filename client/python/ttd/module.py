"""ttd.compile's module: traced with torch.fx, lowered onto a libttclient graph at the first
call, run on a card or in process, with torch's manners (to, train/eval, parameters)."""
import collections
import functools
import os
import tempfile

import torch
import torch.fx

from . import _lib, autograd
from .convert import Device, _device_name, _host_from_torch, _is_tt, _torch_from_tt
from .lower import Lowering
from .tensor import Tensor


_FAILED_PRECONDITION = 9

_VIEWS = {"detach", "view", "view_as", "reshape", "reshape_as", "__getitem__", "expand", "expand_as", "t",
          "transpose", "permute", "flatten", "squeeze", "unsqueeze", "narrow", "select", "as_strided", "unbind",
          "split", "chunk", "flip", "contiguous", "__get__"}


# The dunders that write their left operand (x += y, x[i] = y): on a Snapshot, refused.
_INPLACE_DUNDERS = {"__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__", "__imod__",
                    "__ipow__", "__iand__", "__ior__", "__ixor__", "__ilshift__", "__irshift__", "__imatmul__",
                    "__idiv__"}


class Snapshot(torch.Tensor):
    """A CPU copy of a compiled module's parameter or .grad (p.data, p.grad): read it as any
    CPU tensor; an in-place op on it or on a view of it raises, since the change would not
    reach the module (torch.nn.utils.clip_grad_norm_ and p.data.zero_() included)."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        out = (kwargs or {}).get("out")
        writes_self = (name.endswith("_") and not name.endswith("__")) or name in _INPLACE_DUNDERS
        if (writes_self and args and isinstance(args[0], Snapshot)) or any(
                isinstance(o, Snapshot) for o in (out if isinstance(out, (tuple, list)) else (out,))):
            raise RuntimeError(f"{name} on a compiled module's parameter or .grad (a CPU copy of the module's) would "
                               f"not reach the module: edit parameters with load_state_dict; clipping or editing "
                               f".grad in place is not supported")
        if name in _VIEWS:
            return super().__torch_function__(func, types, args, kwargs)
        with torch._C.DisableTorchFunction():
            return func(*args, **(kwargs or {}))

    def __reduce_ex__(self, protocol):  # pickled (torch.save) as the plain tensor it copies
        return self.as_subclass(torch.Tensor).__reduce_ex__(protocol)


class Parameter:
    """A parameter of a compiled module, where the module is; .grad reads the device gradient.
    requires_grad as torch's: a frozen parameter gets no .grad from backward, so optimizers
    leave it as it is."""

    def __init__(self, owner, name, shape, dtype, requires_grad=True):
        self._owner, self.name, self.shape, self.dtype = owner, name, torch.Size(shape), dtype
        self.requires_grad = bool(requires_grad)

    def requires_grad_(self, requires_grad=True):
        self.requires_grad = bool(requires_grad)
        return self

    @property
    def device(self):
        return Device(self._owner._device) if _is_tt(self._owner._device) else torch.device("cpu")

    @property
    def ndim(self):
        return len(self.shape)

    def dim(self):
        return len(self.shape)

    def size(self, dim=None):
        return self.shape if dim is None else self.shape[dim]

    def numel(self):
        return self.shape.numel()

    nelement = numel

    def _value(self):
        if self._owner._module is None:  # not run yet: the traced module's value
            return self._owner._gm.get_parameter(self.name).detach().clone()
        return _torch_from_tt(self._owner._module.param(self.name))

    @property
    def data(self):
        return self._value().as_subclass(Snapshot)

    def cpu(self):
        return self._value()

    def to(self, device):
        if _device_name(device) != "cpu":
            raise RuntimeError("a compiled module's parameter moves with its module (module.to(...))")
        return self._value()

    @property
    def grad(self):
        if self._owner._module is None or self.name not in self._owner._with_grad:
            return None
        g = self._owner._module.param_grad(self.name)
        return None if g is None else _torch_from_tt(g).as_subclass(Snapshot)

    def __repr__(self):
        return f"Parameter({self.name}, size={tuple(self.shape)}, device='{self.device}')"


class CompiledModule:
    """What ttd.compile returns: the traced module, run through libttclient."""

    def __init__(self, module):
        self._source = module
        tracer = torch.fx.Tracer()
        tracer.record_stack_traces = True  # compile errors name the line of forward
        self._gm = torch.fx.GraphModule(module, tracer.trace(module))
        self._params = {n: Parameter(self, n, p.shape, p.dtype, p.requires_grad) for n, p in module.named_parameters()}
        # state_dict's names, a tied parameter's under each of its names: {name: canonical name}
        canonical = {id(p): n for n, p in module.named_parameters()}
        self._state_names = {n: canonical[id(v)] for n, v in module.state_dict(keep_vars=True).items()
                             if id(v) in canonical}
        self._device = getattr(module, "_ttd_device", "cpu")
        self.training = module.training
        self._module = None
        self._fixed = None  # the built dims past the batch of each input, where the graph depends on them
        self._zeroer = None  # a stateless SGD whose tt_zero_grad serves zero_grad()
        self._with_grad = set()  # the parameters whose .grad is not None (torch's)
        self._stale = set()  # frozen parameters a backward reached: their card .grad is not torch's
        self._lowering = Lowering(self._gm, set(self._params),
                                  {n: c for n, c in self._state_names.items() if n != c})
        self._output_params = self._lowering.output_params()
        self._reached = {}  # outputs given a gradient (indices) -> the parameters they reach
        self._after_backward = None  # ttd.parallel's hook: called in each run's backward
        # torch's .grad of each frozen parameter that has one (CPU copies): backward leaves it
        # as it is in torch, so the card's, which a backward still adds to, is put back
        self._kept = {}
        self._put_back = ()  # the names of those the run being sent reached
        self._state_owner = None  # weakref to the ttd.optim optimizer whose state the card holds

    def _build(self, example):
        m = _lib.Module(self._lowering.build(example))
        # the built dims each input must keep: past the batch, or all of them (batch_fixed)
        skip = 0 if self._lowering.batch_fixed else 1
        fixed = self._lowering.fixed_shapes or self._lowering.batch_fixed
        self._fixed = [t.shape[skip:] for t in example] if fixed else None
        m.train(self.training)
        if self._device != "cpu":
            m.to(self._device)
        self._module = m

    def _eval_run(self, inputs, on_tt):
        """In eval under grad mode: whether the forward keeps a run, as torch records one, because
        an input takes a gradient (a frozen network between a trainable one and the loss). ttd's
        eval keeps none, and its training forward differs from eval only in dropout: a graph
        with dropout raises."""
        if not any((x._anchor is not None) if on_tt else x.requires_grad for x in inputs):
            return False
        if self._lowering.has_dropout:
            raise RuntimeError("this compiled module is in eval() and has dropout, and input(s) take a gradient: "
                               "ttd keeps no graph of an eval forward, so the gradient would not flow back through "
                               "it; call .train() (dropout on), or wrap the call in torch.no_grad() (no gradient)")
        return True

    def _check_fixed(self, tts):
        """Refuses inputs whose dims past the batch differ from those the graph's sizes came from."""
        for i, (t, dims) in enumerate(zip(tts, self._fixed)):
            if self._lowering.batch_fixed and t.shape != dims:
                raise RuntimeError(f"input {i} has shape {tuple(t.shape)}, but this compiled module's graph reshapes "
                                   f"with sizes that depend on the batch (a view or reshape of a dim other than the "
                                   f"batch, or Unflatten of the batch dim), fixed at the first call's, so it takes "
                                   f"inputs of shape {tuple(dims)} only: give that shape, or compile the module "
                                   f"again for another")
            if not self._lowering.batch_fixed and t.shape[1:] != dims:
                raise RuntimeError(f"input {i} has shape {tuple(t.shape)}, but this compiled module's graph took its "
                                   f"view/reshape/flatten sizes from the first call's (*, {', '.join(map(str, dims))}) "
                                   f"and serves other batch sizes only: give inputs of that shape (pad them)")

    def _check_client(self, tts):
        """Refuses device inputs of another connection than the module's (ttd.connect called again
        since the module was built): that session cannot name them."""
        client = self._module.client
        for i, t in enumerate(tts):
            if t.client is not client:
                raise RuntimeError(f"input {i} went to the card through another connection than this compiled "
                                   f"module's (ttd.connect was called again since its first call): compile the "
                                   f"module again (ttd.compile) to use the new connection, or keep the first one")

    def _built(self):
        if self._module is None:
            raise RuntimeError("this compiled module has not run yet: its graph is built at the first call, from "
                               "that input's shape")
        return self._module

    def to(self, device):
        device = _device_name(device)
        if not (_is_tt(device) or device == "cpu"):
            raise RuntimeError(f"a compiled module moves to \"cpu\" or \"tt\", not {device!r}")
        if self._module is not None:
            try:
                self._module.to(device)
            except _lib.TTError as e:
                if e.code != _FAILED_PRECONDITION:
                    raise
                raise _lib.TTError(e.code, f"the compiled module cannot move to {device!r}: forward run(s) pending, "
                                           f"their outputs wait for a backward; call loss.backward(), or drop the "
                                           f"outputs (del out), before moving it") from None
        self._device = device  # once moved: a refused move leaves the module where it was
        return self

    def cpu(self):
        return self.to("cpu")

    def train(self, mode=True):
        self.training = bool(mode)
        if self._module is not None:
            self._module.train(self.training)
        return self

    def eval(self):
        return self.train(False)

    def zero_grad(self, set_to_none=False):
        """torch's Module.zero_grad (set_to_none defaults to False in torch 1.13): every .grad
        becomes 0, or None until a backward reaches it with set_to_none."""
        if self._module is not None:
            if self._zeroer is None:
                self._zeroer = _lib.Optimizer.sgd(self._module, 0.0)
            self._zeroer.zero_grad()
        self._grads_zeroed(set_to_none)

    def _grads_zeroed(self, set_to_none):
        """Every .grad on the card is 0: torch's .grad follows (None with set_to_none)."""
        self._stale.clear()
        self._kept.clear()
        if set_to_none:
            self._with_grad.clear()

    def _on_backward(self, outputs):
        """A run's backward, before its gradients go to the card, outputs: the indices of the
        outputs that got one (a tuple). The parameters it reaches get a .grad as torch's do: a
        frozen one none (its card .grad, which still sums, is stale); one that had none starts
        at 0. A frozen one that has a .grad keeps it: its value is kept to be put back when the
        gradients have gone (_backward_sent)."""
        reached = self._reached.get(outputs)
        if reached is None:
            if len(self._reached) >= 256:  # subsets of many outputs: the cache stays bounded
                self._reached.clear()
            reached = self._reached[outputs] = tuple(self._params[n] for n in sorted(
                set().union(*(self._output_params[i] for i in outputs))))
        with_grad = self._with_grad
        put_back = []
        for p in reached:
            name = p.name
            if not p.requires_grad and name in with_grad:
                if name not in self._kept:
                    self._kept[name] = _torch_from_tt(self._module.param_grad(name))
                put_back.append(name)
            elif not p.requires_grad:
                self._stale.add(name)
            elif name not in with_grad:
                if name in self._stale:
                    self._module.param_grad(name).copy_(_host_from_torch(torch.zeros(p.shape)))
                    self._stale.discard(name)
                with_grad.add(name)
        self._put_back = tuple(put_back)

    def _backward_sent(self, hook=None):
        """A run's backward has sent its gradients (queued on the card): the .grad of each frozen
        parameter it reached that has one goes back to torch's value; then hook, ttd.parallel's
        when the run's forward was made (or None)."""
        for name in self._put_back:
            self._module.param_grad(name).copy_(_host_from_torch(self._kept[name]))
        self._put_back = ()
        if hook is not None:
            hook()

    def state_dict(self):
        """torch's state_dict: CPU copies of the parameters, under torch's names (a tied
        parameter under each of its names)."""
        values = {n: p._value() for n, p in self._params.items()}
        return collections.OrderedDict((n, values[c]) for n, c in self._state_names.items())

    def load_state_dict(self, state_dict, strict=True):
        """torch's load_state_dict: the values onto the module wherever it is. Missing or
        unexpected keys (strict) and shape mismatches raise RuntimeError as torch's do, and
        leave the module unchanged; returns (missing_keys, unexpected_keys)."""
        missing = [k for k in self._state_names if k not in state_dict]
        unexpected = [k for k in state_dict if k not in self._state_names]
        errors = []
        if strict:
            if unexpected:
                errors.append("Unexpected key(s) in state_dict: " + ", ".join(f'"{k}"' for k in unexpected) + ". ")
            if missing:
                errors.append("Missing key(s) in state_dict: " + ", ".join(f'"{k}"' for k in missing) + ". ")
        values = {}
        for key, name in self._state_names.items():
            if key not in state_dict:
                continue
            p, v = self._params[name], state_dict[key]
            v = v if isinstance(v, torch.Tensor) and not isinstance(v, Tensor) else v.to("cpu")
            if tuple(v.shape) != tuple(p.shape):
                errors.append(f"size mismatch for {key}: copying a param with shape {v.shape} from checkpoint, the "
                              f"shape in current model is {p.shape}.")
            values[name] = v.detach().to(p.dtype).contiguous()
        if errors:
            raise RuntimeError(f"Error(s) in loading state_dict for {type(self._source).__name__}:\n\t" +
                               "\n\t".join(errors))
        if self._module is None:  # not run yet: the traced module's values, read at the first call
            with torch.no_grad():
                for name, v in values.items():
                    self._gm.get_parameter(name).copy_(v)
        elif values:
            named = [(n, _host_from_torch(values[n] if n in values else p._value())) for n, p in self._params.items()]
            with tempfile.TemporaryDirectory(prefix="ttd-") as tmp:
                path = os.path.join(tmp, "state.safetensors")
                _lib.safetensors_save(self._module.client, path, named)
                self._module.load(path)
        return torch.nn.modules.module._IncompatibleKeys(missing, unexpected)

    def parameters(self):
        return iter(list(self._params.values()))

    def named_parameters(self):
        return iter(list(self._params.items()))

    def __call__(self, *inputs):
        on_tt = _is_tt(self._device)
        for i, x in enumerate(inputs):
            if isinstance(x, Tensor) != on_tt or not (on_tt or isinstance(x, torch.Tensor)):
                if not isinstance(x, torch.Tensor):
                    want = f"tensors on {self._device!r} (t.to({self._device!r}))" if on_tt else "CPU tensors"
                    raise TypeError(f"input {i} is {type(x).__name__} {x!r:.40}, not a tensor: this compiled module "
                                    f"takes {want}")
                where = "a tt device tensor" if isinstance(x, Tensor) else "a CPU tensor"
                raise RuntimeError(f"input {i} is {where} but the module is on {self._device!r}: move it with "
                                   f".to({self._device!r})")
        tts = [x._tt if on_tt else _host_from_torch(x) for x in inputs]
        if self._module is None:
            self._build(tts)
        elif on_tt:
            self._check_client(tts)
        if self._fixed is not None:
            self._check_fixed(tts)
        training = torch.is_grad_enabled() and (self.training or self._eval_run(inputs, on_tt))
        # The inputs whose gradient torch wants (a CPU layer or a module upstream): their
        # anchors in torch's graph (a CPU input is its own), and the run returns their gradients.
        anchors = [x._anchor if on_tt else (x if x.requires_grad else None) for x in inputs] if training else []
        watched = [(t, a) for t, a in zip(tts, anchors) if a is not None]
        for t, _ in watched:
            t.set_requires_grad()
        # The module's mode for this forward: train() under torch.no_grad() keeps no run, but
        # one with dropout draws its masks as torch's does, and lets its run go at once.
        mode = training or (self.training and self._lowering.has_dropout)
        if self.training != mode:
            self._module.train(mode)  # torch.no_grad(): keep no run; _eval_run: keep one
        try:
            outs = self._module.forward(tts)
        finally:
            if self.training != mode:
                self._module.train(self.training)
        if mode and not training and outs:
            outs[0].release_run()
        if training:
            hook = self._after_backward  # ttd.parallel sets it around the forward only
            sent = self._backward_sent if hook is None else functools.partial(self._backward_sent, hook)
            out_anchors = autograd.run(outs, [t for t, _ in watched], [a for _, a in watched], self._on_backward, sent)
        else:
            out_anchors = [None] * len(outs)
        res = [Tensor(o, a) for o, a in zip(outs, out_anchors)]
        if not on_tt:  # a module left on "cpu" runs in process and answers CPU tensors
            res = [r.to("cpu") for r in res]
        return self._lowering.unflatten(res)


def compile(module):
    """Traces a torch nn.Module (torch.fx) into a module that runs through ttd."""
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"ttd.compile takes a torch.nn.Module, not {type(module).__name__}")
    return CompiledModule(module)


_orig_module_to = torch.nn.Module.to


def _module_to(self, *args, **kwargs):
    device = kwargs.get("device", args[0] if args else None)
    if _is_tt(device):
        dtype = kwargs.get("dtype", args[1] if len(args) > 1 else None)
        if dtype is not None:  # module.to("tt", torch.bfloat16): the dtype as torch's, the device at compile
            _orig_module_to(self, dtype)
        self._ttd_device = _device_name(device)  # honoured by ttd.compile
        return self
    if device is not None and not isinstance(device, torch.dtype):
        self.__dict__.pop("_ttd_device", None)  # the later move wins
    return _orig_module_to(self, *args, **kwargs)


torch.nn.Module.to = _module_to
