"""torch.fx graphs lowered onto libttclient graphs: which torch ops ttd runs, and the error
naming the op and the node for any other. Below module.py."""
import torch
import torch.fx

from . import _lib
from .convert import _DTYPES, _get_client, _host_from_torch


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


class Lowering:
    """One traced module (gm) and its parameters' names: checked at compile time, lowered at
    the first call."""

    def __init__(self, gm, param_names):
        self._gm = gm
        self._params = param_names
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


    def build(self, example):
        """A libttclient graph for the inputs' dtypes and shapes; also sets n_outputs and
        tuple_out (whether forward returns a tuple)."""
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
                self.n_outputs, self.tuple_out = len(outs), isinstance(node.args[0], (tuple, list))
            else:
                env[node.name] = self._lower(node, graph, env)
        return graph
