"""PyTorch front end: `import ttd.torch as ttd`.

- `t.to("tt")` on a plain torch tensor gives a device tensor (tt:0); `.to("cpu")`/`.cpu()` bring it
  back. torch.Tensor.to is patched for device strings starting with "tt" (torch 1.13 has no "tt"
  device); everything else goes to the original.
- `ttd.compile(module)` traces with torch.fx into a libttclient graph, built at the first call
  from that input's shape (libttclient then serves other batch sizes itself).
- Backward: a device output's `.to("cpu")` is a torch.autograd.Function whose backward sends
  the CPU gradient to the card (sum(out * grad) as a libttclient host loss, tt_backward).
- `ttd.optim.SGD` steps on the card with torch.optim.SGD's arguments."""
import torch
import torch.fx

from . import _lib

__all__ = ["compile", "connect", "optim", "Tensor", "TTError"]

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


class Tensor(torch.Tensor):
    """A tensor on a tt device: shape, dtype, device, repr and .to() work; any other op raises."""

    @staticmethod
    def __new__(cls, tt, run=None):
        r = torch.Tensor._make_wrapper_subclass(cls, tt.shape, dtype=_TORCH_DTYPES[tt.dtype], device="meta")
        r._tt = tt
        r._run = run  # the compiled module whose training forward made it, if any
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
        if isinstance(device, torch.device):
            device = str(device)
        if device is None:
            device = self._tt.device
        if _is_tt(device):
            tt_dtype = None if dtype is None else _DTYPES[dtype]
            return Tensor(self._tt.to(device, tt_dtype))
        if device != "cpu":
            raise RuntimeError(f"a tt tensor moves to \"cpu\" or a \"tt\" device, not {device!r}")
        if self._run is not None and self._run.training and torch.is_grad_enabled():
            out = _Download.apply(torch.empty(0, requires_grad=True), self)
        else:
            out = _torch_from_host(self._tt.to("cpu"))
        return out if dtype is None else out.to(dtype)


_METADATA = {torch.Tensor.size, torch.Tensor.dim, torch.Tensor.numel, torch.Tensor.element_size,
             torch.Tensor.is_floating_point, torch.Tensor.__format__}


class _Download(torch.autograd.Function):
    """A device output brought to the CPU, linked into torch's graph by a zero-element token.
    Backward: the CPU gradient goes to the card as sum(out_host * grad) through libttclient's
    autograd (tt_mul, tt_sum, tt_backward), which sends it and runs the module's backward."""

    @staticmethod
    def forward(ctx, token, dev):
        host = dev._tt.to("cpu")  # remembers the run it came from
        ctx.host, ctx.dev = host, dev
        return _torch_from_host(host)

    @staticmethod
    def backward(ctx, grad):
        if ctx.host is None:
            raise RuntimeError("trying to backward through a tt run a second time: its buffers were freed after "
                               "the first backward (the run is released, as torch's retain_graph=False)")
        g = _host_from_torch(grad.float())
        ctx.host.mul(g).sum().backward()
        ctx.host, ctx.dev = None, None
        return torch.zeros(0), None


_orig_to = torch.Tensor.to


def _tensor_to(self, *args, **kwargs):
    device = kwargs.get("device", args[0] if args else None)
    if _is_tt(device):
        dtype = kwargs.get("dtype", args[1] if len(args) > 1 else None)
        src = self if dtype is None or dtype == self.dtype else _orig_to(self, dtype)
        return Tensor(_host_from_torch(src).to(device))
    return _orig_to(self, *args, **kwargs)


torch.Tensor.to = _tensor_to


class Parameter:
    """A parameter of a compiled module, where the module is; .grad reads the device gradient."""

    def __init__(self, owner, name, shape, dtype):
        self._owner, self.name, self.shape, self.dtype = owner, name, torch.Size(shape), dtype
        self.requires_grad = True

    @property
    def device(self):
        return Device(self._owner._device) if _is_tt(self._owner._device) else torch.device("cpu")

    def _value(self):
        m = self._owner._built()
        return _torch_from_host(m.param(self.name).to("cpu"))

    def cpu(self):
        return self._value()

    def to(self, device):
        if device != "cpu":
            raise RuntimeError("a compiled module's parameter moves with its module (module.to(...))")
        return self._value()

    @property
    def data(self):
        return self._value()

    @property
    def grad(self):
        if self._owner._module is None:
            return None
        g = self._owner._module.param_grad(self.name)
        return None if g is None else _torch_from_host(g.to("cpu"))

    def __repr__(self):
        return f"Parameter({self.name}, size={tuple(self.shape)}, device='{self.device}')"


def _linear_weights(graph, name, lin_w, lin_b, x):
    w = graph.param_from(f"{name}.weight", _host_from_torch(lin_w))
    ins = [x, w]
    if lin_b is not None:
        ins.append(graph.param_from(f"{name}.bias", _host_from_torch(lin_b)))
    return graph.op("linear", ins)


def _softmax_dim(node, args, kwargs):
    dim = kwargs.get("dim", args[1] if len(args) > 1 else None)
    if dim != -1 or kwargs.get("dtype") is not None:
        raise NotImplementedError(f"ttd.compile: softmax over dim={dim} (node {node.name}) is not supported: only "
                                  f"the last dim (dim=-1)")


class CompiledModule:
    """What ttd.compile returns: the traced module, run through libttclient."""

    def __init__(self, module):
        self._source = module
        self._gm = torch.fx.symbolic_trace(module)
        self._params = {n: Parameter(self, n, p.shape, p.dtype) for n, p in module.named_parameters()}
        self._device = getattr(module, "_ttd_device", "cpu")
        self.training = module.training
        self._module = None
        self._check_ops()

    def _check_ops(self):
        for node in self._gm.graph.nodes:
            self._lower(node, None, None, check_only=True)

    # One node onto the graph; check_only: say at compile time if it is unsupported.
    def _lower(self, node, graph, env, check_only=False):
        F = torch.nn.functional
        if node.op in ("placeholder", "output") and check_only:
            return None
        if node.op == "get_attr":  # a parameter used by a functional op (F.linear(x, self.w, self.b))
            p = self._gm.get_parameter(node.target) if node.target in self._params else None
            if p is None:
                raise NotImplementedError(f"ttd.compile: attribute {node.target} (node {node.name}) is not a "
                                          f"parameter: buffers and constants are not supported yet")
            return None if check_only else graph.param_from(node.target, _host_from_torch(p))
        if node.op == "call_module":
            sub = self._gm.get_submodule(node.target)
            if isinstance(sub, torch.nn.Linear):
                return None if check_only else _linear_weights(graph, node.target, sub.weight, sub.bias,
                                                               env[node.args[0].name])
            if isinstance(sub, torch.nn.ReLU):
                return None if check_only else graph.op("relu", [env[node.args[0].name]])
            if isinstance(sub, torch.nn.Softmax):
                if sub.dim != -1 and check_only:
                    raise NotImplementedError(f"ttd.compile: Softmax(dim={sub.dim}) (node {node.name}) is not "
                                              f"supported: only the last dim")
                return None if check_only else graph.op("softmax", [env[node.args[0].name]])
            raise NotImplementedError(f"ttd.compile: module {type(sub).__name__} ({node.target}, node {node.name}) is "
                                      f"not supported yet")
        if node.op == "call_function" or node.op == "call_method":
            t = node.target
            if t in (F.relu, torch.relu) or t == "relu":
                return None if check_only else graph.op("relu", [env[node.args[0].name]])
            if t in (F.softmax, torch.softmax) or t == "softmax":
                if check_only:
                    _softmax_dim(node, node.args, node.kwargs)
                return None if check_only else graph.op("softmax", [env[node.args[0].name]])
            if t is F.linear:
                w = node.kwargs.get("weight", node.args[1] if len(node.args) > 1 else None)
                b = node.kwargs.get("bias", node.args[2] if len(node.args) > 2 else None)
                ins = [a for a in (node.args[0], w, b) if a is not None]
                if any(not isinstance(a, torch.fx.Node) for a in ins):
                    raise NotImplementedError(f"ttd.compile: F.linear (node {node.name}) with a constant argument is "
                                              f"not supported yet")
                return None if check_only else graph.op("linear", [env[a.name] for a in ins])
            what = getattr(t, "__name__", str(t))
            raise NotImplementedError(f"ttd.compile: {node.op} {what} (node {node.name}) is not supported yet")
        raise NotImplementedError(f"ttd.compile: {node.op} {node.target} (node {node.name}) is not supported")

    def _build(self, example):
        client = _get_client()
        graph = _lib.Graph(client, seed=0)
        env = {}
        inputs = 0
        for node in self._gm.graph.nodes:
            if node.op == "placeholder":
                env[node.name] = graph.input(node.name, _DTYPES[example[inputs].dtype], tuple(example[inputs].shape))
                inputs += 1
            elif node.op == "output":
                outs = node.args[0] if isinstance(node.args[0], (tuple, list)) else (node.args[0],)
                for o in outs:
                    graph.output(env[o.name])
                self._n_outputs, self._tuple_out = len(outs), isinstance(node.args[0], (tuple, list))
            else:
                env[node.name] = self._lower(node, graph, env)
        m = _lib.Module(graph)
        m.train(self.training)
        if self._device != "cpu":
            m.to(self._device)
        self._module = m

    def _built(self):
        if self._module is None:
            raise RuntimeError("this compiled module has not run yet: its graph is built at the first call, from "
                               "that input's shape")
        return self._module

    def to(self, device):
        device = str(device)
        if not (_is_tt(device) or device == "cpu"):
            raise RuntimeError(f"a compiled module moves to \"cpu\" or \"tt\", not {device!r}")
        self._device = device
        if self._module is not None:
            self._module.to(device)
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

    def parameters(self):
        return iter(list(self._params.values()))

    def named_parameters(self):
        return iter(list(self._params.items()))

    def __call__(self, *inputs):
        on_tt = _is_tt(self._device)
        for i, x in enumerate(inputs):
            if isinstance(x, Tensor) != on_tt:
                where = "a tt device tensor" if isinstance(x, Tensor) else "a CPU tensor"
                raise RuntimeError(f"input {i} is {where} but the module is on {self._device!r}: move it with "
                                   f".to({self._device!r})")
        if self._module is None:
            self._build(inputs)
        tts = [x._tt if on_tt else _host_from_torch(x) for x in inputs]
        training = self.training and torch.is_grad_enabled()
        if self.training and not training:
            self._module.train(False)  # torch.no_grad(): keep no run
        try:
            outs = self._module.forward(tts)
        finally:
            if self.training and not training:
                self._module.train(True)
        run = self if training else None
        res = [Tensor(o, run) for o in outs]
        if not on_tt:  # a module left on "cpu" runs in process and answers CPU tensors
            res = [r.to("cpu") for r in res]
        return tuple(res) if self._tuple_out else res[0]


def compile(module):
    """Traces a torch nn.Module (torch.fx) into a module that runs through ttd."""
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"ttd.compile takes a torch.nn.Module, not {type(module).__name__}")
    return CompiledModule(module)


_orig_module_to = torch.nn.Module.to


def _module_to(self, *args, **kwargs):
    device = kwargs.get("device", args[0] if args else None)
    if _is_tt(device):
        self._ttd_device = device  # honoured by ttd.compile
        return self
    return _orig_module_to(self, *args, **kwargs)


torch.nn.Module.to = _module_to


class _Optim:
    class SGD:
        """torch.optim.SGD's signature; steps on the card (tt_sgd_opts) over a compiled module's
        parameters, all of them."""

        def __init__(self, params, lr, momentum=0, dampening=0, weight_decay=0, nesterov=False):
            params = list(params)
            owners = {id(p._owner): p._owner for p in params if isinstance(p, Parameter)}
            if len(owners) != 1 or len(params) != len(next(iter(owners.values()))._params):
                raise NotImplementedError("ttd.optim.SGD takes all the parameters of one compiled module "
                                          "(tt_model.parameters())")
            self._owner = next(iter(owners.values()))
            self.defaults = dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                                 nesterov=nesterov)
            self._opt = None

        def _get(self):
            if self._opt is None:
                d = self.defaults
                self._opt = _lib.Optimizer.sgd(self._owner._built(), d["lr"], d["momentum"], d["dampening"],
                                               d["weight_decay"], d["nesterov"])
            return self._opt

        def step(self):
            self._get().step()

        def zero_grad(self, set_to_none=False):
            if self._owner._module is not None:
                self._get().zero_grad()


optim = _Optim
