"""ttd.compile's module: traced with torch.fx, lowered onto a libttclient graph at the first
call, run on a card or in process, with torch's manners (to, train/eval, parameters)."""
import torch
import torch.fx

from . import _lib
from .convert import _DTYPES, Device, _get_client, _host_from_torch, _is_tt, _torch_from_host
from .tensor import Tensor


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
