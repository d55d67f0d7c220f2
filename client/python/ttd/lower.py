"""torch.fx graphs lowered onto libttclient graphs: which torch ops ttd runs, and the error
naming the op, the node and the forward's line for any other. Below module.py."""
import linecache
import math
import operator
import os
import re

import torch
import torch.fx

from . import _lib
from .convert import _get_client, _host_from_torch

F = torch.nn.functional


_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep


def _where(node):
    """", at FILE:LINE in FUNCTION: SOURCE" of the user's forward that made node, where fx
    recorded it (a torch.fx.Tracer with record_stack_traces=True; innermost frame first): the
    innermost frame outside torch among those inside fx's trace (F.relu's own frames are
    torch's; the frames past trace are whoever called it). A node fx makes only at its first
    use (a tensor attribute such as x.T) used nowhere in forward has only its caller's
    frames: ", in forward". "" when fx recorded nothing."""
    found = list(re.finditer(r'File "([^"]+)", line (\d+), in (\w+)', node.stack_trace or ""))
    if not found:
        return ""
    trace = next((i for i, f in enumerate(found) if f.group(1).startswith(_TORCH_DIR) and f.group(3) == "trace"), 0)
    m = next((f for f in found[:trace] if not f.group(1).startswith(_TORCH_DIR)), None)
    if m is None:
        return ", in forward"
    src = linecache.getline(m.group(1), int(m.group(2))).strip()
    return f", at {m.group(1)}:{m.group(2)} in {m.group(3)}" + (f": {src}" if src else "")


_INVALID_ARGUMENT = 3


def _fail(node, what, why):
    raise NotImplementedError(f"ttd.compile: {what} (node {node.name}{_where(node)}) {why}")


def _tensors_only(node, op, ins):
    """Refuses a constant among op's inputs ins (each an fx node, or a (name, tensor) parameter)."""
    for a in ins:
        if not isinstance(a, (torch.fx.Node, tuple)):
            _fail(node, op, f"with a constant argument {a!r} is not supported: ttd's {op} takes tensors only")


def _arg(node, i, name, default=None):
    if name in node.kwargs:
        return node.kwargs[name]
    return node.args[i] if len(node.args) > i else default


def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def _ints(v):
    return "[" + ",".join(str(int(x)) for x in v) + "]"


def _attrs(**kw):
    return ";".join(f"{k}={_ints(v) if isinstance(v, (tuple, list)) else v}" for k, v in kw.items()) or None


_UNARY = {"relu": (F.relu, torch.relu), "sigmoid": (torch.sigmoid, F.sigmoid), "tanh": (torch.tanh, F.tanh),
          "exp": (torch.exp,), "log": (torch.log,)}
_BINARY = {"add": (operator.add, torch.add, operator.iadd), "sub": (operator.sub, torch.sub, operator.isub),
           "mul": (operator.mul, torch.mul, operator.imul),
           "div": (operator.truediv, torch.div, torch.true_divide, operator.itruediv)}


_INPLACE_OPS = (operator.iadd, operator.isub, operator.imul, operator.itruediv)
_AUGMENTED = (operator.add, operator.sub, operator.mul, operator.truediv)  # what fx makes of x += y
_VIEW_METHODS = {"view", "view_as", "reshape", "reshape_as", "transpose", "permute", "flatten", "unflatten", "t"}
_VIEW_FUNCTIONS = (torch.reshape, torch.transpose, torch.permute, torch.flatten)
_VIEW_MODULES = (torch.nn.Flatten, torch.nn.Unflatten, torch.nn.Identity)


def _is_size(n):
    """x.size(dim) with an integer dim (a torch.Size is not supported)."""
    return isinstance(n, torch.fx.Node) and n.op == "call_method" and n.target == "size" and \
        isinstance(_arg(n, 1, "dim"), int)


def _param_value(g, env, name, p):
    """The graph's value of parameter name (p, its torch value), made at its first use (a tied
    parameter is used under several names, all resolved to one)."""
    key = ("param", name)
    if key not in env:
        env[key] = g.param_from(name, _host_from_torch(p))
    return env[key]


def _named(t, name, fns):
    return t == name or t in fns


def _build(tree, outputs):
    """tree (Lowering._out_tree) with each index i replaced by outputs[i]. A function of its
    own: a recursive closure would hold outputs in a reference cycle, keeping the runs they
    anchor until the garbage collector runs."""
    if isinstance(tree, int):
        return outputs[tree]
    if tree is None:
        return None
    if isinstance(tree, dict):
        return {k: _build(x, outputs) for k, x in tree.items()}
    return type(tree)(_build(x, outputs) for x in tree)


class Lowering:
    """One traced module (gm) and its parameters' names: checked at compile time, lowered at
    the first call."""

    def __init__(self, gm, param_names, aliases=None):
        """aliases: {name: canonical name} of parameters reachable under several names (tied)."""
        self._gm = gm
        self._params = param_names
        self._aliases = aliases or {}
        self.has_dropout = False  # whether forward has dropout that train()/eval() turn on and off
        self._check_ops()
        self._out_nodes, self._out_tree = self._plan_outputs()

    def _plan_outputs(self):
        """What forward returns: a tensor, or tuples, lists and dicts of tensors and None, nested,
        a tensor there more than once: the distinct tensors (the graph's outputs, in order) and
        the structure with each replaced by its index. Anything else fails at compile time."""
        node = next(n for n in self._gm.graph.nodes if n.op == "output")
        nodes, index = [], {}

        def plan(v):
            if isinstance(v, torch.fx.Node):
                if v.name not in index:
                    index[v.name] = len(nodes)
                    nodes.append(v)
                return index[v.name]
            if v is None:
                return None
            if isinstance(v, (tuple, list)):
                return (tuple if isinstance(v, tuple) else list)(plan(x) for x in v)
            if isinstance(v, dict):
                return {k: plan(x) for k, x in v.items()}
            _fail(node, f"returning {type(v).__name__} {v!r:.40}", "is not supported: forward returns tensors, None, "
                  "and tuples, lists or dicts of them")
        tree = plan(node.args[0])
        if not nodes:
            _fail(node, "a forward that returns no tensor", "is not supported: return the tensors to compute")
        return nodes, tree

    def unflatten(self, outputs):
        """forward's result, as its structure, from the graph's outputs (one value each)."""
        return _build(self._out_tree, outputs)

    def _param_name(self, name):
        return self._aliases.get(name, name)

    def output_params(self):
        """For each output of forward, the names of the parameters it depends on."""
        deps = {}
        for node in self._gm.graph.nodes:
            own = set()
            if node.op == "get_attr" and self._param_name(node.target) in self._params:
                own.add(self._param_name(node.target))
            elif node.op == "call_module":
                sub = self._gm.get_submodule(node.target)
                own.update(self._param_name(f"{node.target}.{n}") for n, _ in sub.named_parameters())
            for a in node.all_input_nodes:
                own |= deps[a.name]
            deps[node.name] = own
        return [deps[o.name] for o in self._out_nodes]

    def _check_ops(self):
        order = {n: i for i, n in enumerate(self._gm.graph.nodes)}
        for node in self._gm.graph.nodes:
            if node.op not in ("placeholder", "output"):
                self._plan(node)
                if self._inplace(node):
                    self._check_inplace(node, order)
                elif node.target in _AUGMENTED and not node.users:
                    _fail(node, node.target.__name__, "has a result nothing uses: fx traces x += y as x + y, so an "
                          "in-place update would be lost; write x = x + y (or drop the unused expression)")

    def _inplace(self, node):
        """Whether node writes its first input in place (inplace=True, x += y)."""
        if node.op == "call_module":
            return getattr(self._gm.get_submodule(node.target), "inplace", False) is True
        if node.op != "call_function":
            return False
        if node.target in _INPLACE_OPS:
            return True
        i = {F.relu: 1, F.dropout: 3}.get(node.target)
        return i is not None and _arg(node, i, "inplace", False) is True

    def _base(self, n):
        """The node whose memory n views (n itself if it is no view)."""
        while isinstance(n, torch.fx.Node) and (
                (n.op == "call_method" and n.target in _VIEW_METHODS) or
                (n.op == "call_function" and n.target in _VIEW_FUNCTIONS) or
                (n.op == "call_module" and isinstance(self._gm.get_submodule(n.target), _VIEW_MODULES))):
            n = n.args[0]
        return n

    def _check_inplace(self, node, order):
        """ttd computes an in-place op out of place: the same values wherever its input, and
        every view of it, is read no more after it, and forward's inputs and the parameters
        are not written. Anything else raises."""
        base = self._base(node.args[0])
        what = (f"{type(self._gm.get_submodule(node.target)).__name__}(inplace=True)" if node.op == "call_module" else
                node.target.__name__ + ("" if node.target in _INPLACE_OPS else "(inplace=True)"))
        if not isinstance(base, torch.fx.Node) or base.op in ("placeholder", "get_attr"):
            _fail(node, what, "writes forward's input or a parameter, which ttd does not: use "
                  "its out-of-place form (inplace=False, x = x + y)")
        for later in self._gm.graph.nodes:
            if order[later] > order[node] and any(self._base(a) is base for a in later.all_input_nodes):
                _fail(node, what, f"writes {base.name}, which {later.name} reads after it; ttd "
                      f"computes it out of place: use its result instead (h = F.relu(h)), or inplace=False")

    def _lower(self, node, graph, env, check_only=False):
        emit = self._plan(node)
        return None if check_only else emit(graph, env)

    # A node's plan: checked now (raises naming the op, the node and the line), emitted by
    # calling it with (graph, env) at build time.
    def _plan(self, node):
        if node.op == "get_attr":  # a parameter used by a functional op (F.linear(x, self.w, self.b))
            name = self._param_name(node.target)
            if name not in self._params:
                _fail(node, f"attribute {node.target}", "is not a parameter: buffers and constants are not supported")
            p = self._gm.get_parameter(node.target)
            return lambda g, env: _param_value(g, env, name, p)
        if node.op == "call_module":
            return self._plan_module(node, self._gm.get_submodule(node.target))
        if node.op in ("call_function", "call_method"):
            return self._plan_function(node, node.target)
        _fail(node, f"{node.op} {node.target}", "is not supported")

    @staticmethod
    def _op(node, op, ins, attrs=None):
        """A plan of one ttd op on ins (fx nodes, or (name, tensor) parameters)."""
        _tensors_only(node, op, ins)

        def emit(g, env):
            vals = [env[a.name] if isinstance(a, torch.fx.Node) else _param_value(g, env, *a) for a in ins]
            return g.op(op, vals, attrs)
        return emit

    def _view_sizes(self, node, x, shape):
        """view/reshape with x.size(d) entries: resolved from the built shapes; an entry that is
        some input's size(0) becomes -1 (the batch follows), the -1 it replaces the product.
        Any other size, and that product, are the built shapes' (fixed_shapes)."""
        def emit(g, env):
            dims, batch = [], None
            for i, d in enumerate(shape):
                if isinstance(d, int):
                    dims.append(d)
                    continue
                src, k = d.args[0], _arg(d, 1, "dim")
                dims.append(g.shape(env[src.name])[k])
                if k == 0 and batch is None:
                    batch = i
                else:
                    self.fixed_shapes = True
            if -1 in dims and batch is not None:
                self.fixed_shapes = True
                known = 1
                for d in dims:
                    known *= d if d != -1 else 1
                n = 1
                for d in g.shape(env[x.name]):
                    n *= d
                dims[dims.index(-1)] = n // known if known else 0
            if batch is not None:
                dims[batch] = -1
            self._reshapes.append(tuple(dims))
            return g.op("reshape", [env[x.name]], _attrs(shape=dims))
        return emit

    def _reshape_plan(self, node, x, shape_of, batch_free=lambda in_shape: True):
        """reshape whose shape depends on the input's (shape_of(input shape) -> new shape, where
        a -1 is the rest): every size is the built shapes' (fixed_shapes), a -1 resolved there,
        but the leading one, which follows the batch (-1) where batch_free(input shape) says it
        scales with it; else the batch is the built one too (batch_fixed)."""
        def emit(g, env):
            self.fixed_shapes = True
            in_shape = list(g.shape(env[x.name]))
            shape = list(shape_of(in_shape))
            if -1 in shape:
                known, n = 1, 1
                for d in shape:
                    known *= d if d != -1 else 1
                for d in in_shape:
                    n *= d
                shape[shape.index(-1)] = n // known if known else 0
            if shape and batch_free(in_shape):
                shape[0] = -1
            elif shape:
                self.batch_fixed = True
            self._reshapes.append(tuple(shape))
            return g.op("reshape", [env[x.name]], _attrs(shape=shape))
        return emit

    # ---- modules ----
    def _plan_module(self, node, sub):
        nn = torch.nn
        x = node.args[0] if node.args else None
        name = type(sub).__name__
        par = lambda attr: (self._param_name(f"{node.target}.{attr}"), getattr(sub, attr))  # noqa: E731
        if isinstance(sub, nn.Linear):
            return self._op(node, "linear", [x, par("weight")] + ([par("bias")] if sub.bias is not None else []))
        if isinstance(sub, (nn.ReLU, nn.Sigmoid, nn.Tanh)):
            return self._op(node, name.lower(), [x])
        if isinstance(sub, nn.GELU):
            if sub.approximate != "none":
                _fail(node, f"GELU(approximate={sub.approximate!r})",
                      "is not supported: ttd's gelu is the exact (erf) one")
            return self._op(node, "gelu", [x])
        if isinstance(sub, (nn.Softmax, nn.LogSoftmax)):
            return self._softmax(node, "softmax" if isinstance(sub, nn.Softmax) else "log_softmax", x, sub.dim, None)
        if isinstance(sub, nn.Conv2d):
            return self._conv(node, x, par("weight"), par("bias") if sub.bias is not None else None, sub.stride,
                              sub.padding, sub.dilation, sub.groups, sub.padding_mode)
        if isinstance(sub, nn.LayerNorm):
            wb = [par("weight"), par("bias")] if sub.elementwise_affine else []
            return self._layer_norm(node, x, sub.normalized_shape, wb, sub.eps)
        if isinstance(sub, nn.Embedding):
            return self._embedding(node, x, par("weight"), sub.padding_idx, sub.max_norm, sub.scale_grad_by_freq,
                                   sub.sparse)
        if isinstance(sub, nn.Dropout):
            self.has_dropout = True
            return self._op(node, "dropout", [x], _attrs(p=float(sub.p)))
        if isinstance(sub, (nn.MaxPool2d, nn.AvgPool2d)):
            return self._pool(node, x, sub)
        if isinstance(sub, nn.Flatten):
            return self._flatten(node, x, sub.start_dim, sub.end_dim)
        if isinstance(sub, nn.Unflatten):
            return self._unflatten(node, x, sub.dim, sub.unflattened_size)
        if isinstance(sub, nn.Identity):
            return lambda g, env: env[x.name]
        _fail(node, f"module {name} ({node.target})", "is not supported")

    # ---- functions and tensor methods ----
    def _plan_function(self, node, t):
        x = _arg(node, 0, "input")
        what = t if isinstance(t, str) else getattr(t, "__name__", str(t))
        if node.kwargs.get("out") is not None:
            _fail(node, f"{what}(out=...)", "is not supported: ttd's ops make new tensors; write y = op(x)")
        for op, fns in _UNARY.items():
            if _named(t, op, fns):
                return self._op(node, op, [x])
        if _named(t, "gelu", (F.gelu,)):
            if _arg(node, 1, "approximate", "none") != "none":
                _fail(node, "gelu(approximate='tanh')", "is not supported: ttd's gelu is the exact (erf) one")
            return self._op(node, "gelu", [x])
        for op, fn in (("softmax", (F.softmax, torch.softmax)), ("log_softmax", (F.log_softmax, torch.log_softmax))):
            if _named(t, op, fn):
                return self._softmax(node, op, x, _arg(node, 1, "dim"), _arg(node, 3 if t in fn[:1] else 2, "dtype"))
        for op, fns in _BINARY.items():
            if _named(t, op, fns):
                if node.kwargs.get("alpha", 1) != 1 or node.kwargs.get("rounding_mode") is not None:
                    _fail(node, what, f"with {dict(node.kwargs)} is not supported")
                a, b = x, _arg(node, 1, "other")
                if isinstance(a, torch.fx.Node) and isinstance(b, torch.fx.Node):
                    return self._op(node, op, [a, b])
                return self._scalar_op(node, op, a, b)
        if _named(t, "matmul", (operator.matmul, torch.matmul)):
            return self._matmul(node, x, _arg(node, 1, "other"))
        if t is F.linear:
            return self._op(node, "linear", [a for a in (x, _arg(node, 1, "weight"), _arg(node, 2, "bias"))
                                              if a is not None])
        if t is F.conv2d:
            return self._conv(node, x, _arg(node, 1, "weight"), _arg(node, 2, "bias"), _arg(node, 3, "stride", 1),
                              _arg(node, 4, "padding", 0), _arg(node, 5, "dilation", 1), _arg(node, 6, "groups", 1),
                              "zeros")
        if t is F.layer_norm:
            wb = [_arg(node, 2, "weight"), _arg(node, 3, "bias")]
            if (wb[0] is None) != (wb[1] is None):
                _fail(node, "layer_norm", "with a weight but no bias (or a bias but no weight) is not supported")
            return self._layer_norm(node, x, _arg(node, 1, "normalized_shape"), [w for w in wb if w is not None],
                                    _arg(node, 4, "eps", 1e-5))
        if t is F.embedding:
            return self._embedding(node, x, _arg(node, 1, "weight"), _arg(node, 2, "padding_idx"),
                                   _arg(node, 3, "max_norm"), _arg(node, 5, "scale_grad_by_freq", False),
                                   _arg(node, 6, "sparse", False))
        if t is F.dropout:
            if not _arg(node, 2, "training", True):
                return lambda g, env: env[x.name]
            self.has_dropout = True
            return self._op(node, "dropout", [x], _attrs(p=float(_arg(node, 1, "p", 0.5))))
        if t in (F.max_pool2d, F.avg_pool2d):
            k = _arg(node, 1, "kernel_size")
            spec = dict(kernel_size=k, stride=_arg(node, 2, "stride") or k, padding=_arg(node, 3, "padding", 0))
            if t is F.max_pool2d:
                spec.update(dilation=_arg(node, 4, "dilation", 1), ceil_mode=_arg(node, 5, "ceil_mode", False),
                            return_indices=_arg(node, 6, "return_indices", False))
                return self._pool(node, x, torch.nn.MaxPool2d(**spec))
            spec.update(ceil_mode=_arg(node, 4, "ceil_mode", False),
                        count_include_pad=_arg(node, 5, "count_include_pad", True),
                        divisor_override=_arg(node, 6, "divisor_override"))
            return self._pool(node, x, torch.nn.AvgPool2d(**spec))
        if _named(t, "flatten", (torch.flatten,)):
            return self._flatten(node, x, _arg(node, 1, "start_dim", 0), _arg(node, 2, "end_dim", -1))
        if _is_size(node):  # only as a size of view/reshape (x.view(x.size(0), -1)), checked there
            for user in node.users:
                if not (user.op == "call_method" and user.target in ("view", "reshape")) and user.target is not \
                        torch.reshape:
                    _fail(node, "size", f"used by {user.name} is not supported: only in view/reshape's shape")
            return lambda g, env: None
        if _named(t, "unflatten", ()):
            return self._unflatten(node, x, _arg(node, 1, "dim"), _arg(node, 2, "sizes"))
        if _named(t, "view", ()) or _named(t, "reshape", (torch.reshape,)):
            shape = node.args[1:] if len(node.args) > 1 else (node.kwargs.get("shape") or node.kwargs.get("size"),)
            if len(shape) == 1 and isinstance(shape[0], (tuple, list, torch.Size)):
                shape = tuple(shape[0])
            if all(isinstance(d, int) for d in shape):
                return self._op(node, "reshape", [x], _attrs(shape=list(shape)))
            if not all(isinstance(d, int) or _is_size(d) for d in shape):
                _fail(node, what, f"to a shape computed at run time ({shape}) is not supported: give the sizes as "
                      "integers or x.size(dim), -1 for the batch")
            return self._view_sizes(node, x, shape)
        if _named(t, "transpose", (torch.transpose,)):
            return self._op(node, "transpose", [x], _attrs(dim0=_arg(node, 1, "dim0"), dim1=_arg(node, 2, "dim1")))
        if _named(t, "permute", (torch.permute,)):
            perm = node.args[1:] if len(node.args) > 1 else (node.kwargs.get("dims"),)
            if len(perm) == 1 and isinstance(perm[0], (tuple, list)):
                perm = tuple(perm[0])
            return self._op(node, "permute", [x], _attrs(perm=list(perm)))
        for op, fn in (("sum", torch.sum), ("mean", torch.mean)):
            if _named(t, op, (fn,)):
                dim = _arg(node, 1, "dim", node.kwargs.get("axis"))  # numpy's names too, as torch takes them
                keep = _arg(node, 2, "keepdim", node.kwargs.get("keepdims", False))
                if node.kwargs.get("dtype") is not None:
                    _fail(node, what, "with dtype= is not supported")
                axes = None if dim is None else ([dim] if isinstance(dim, int) else list(dim))
                kw = {"keepdim": int(bool(keep))}
                if axes is not None:
                    kw["axes"] = axes
                return self._op(node, op, [x], _attrs(**kw))
        if t is getattr and len(node.args) > 1 and isinstance(node.args[1], str):
            attr = node.args[1]
            hint = ": write x.transpose(0, 1) for a matrix's .T, x.transpose(-2, -1) for .mT" \
                if attr in ("T", "mT") else ""
            _fail(node, f"the tensor attribute .{attr}", f"is not supported{hint}")
        _fail(node, f"{node.op} {what}", "is not supported")

    # ---- shared by the module and functional forms ----
    def _softmax(self, node, op, x, dim, dtype):
        """ttd's softmax is over the last dim: over another, the dim is swapped with the last
        one before and after it (two transposes, which the backward goes through as well)."""
        if dim is None or dtype is not None or not isinstance(dim, int):
            _fail(node, f"{op}(dim={dim}, dtype={dtype})", "is not supported: give dim, no dtype")
        _tensors_only(node, op, [x])

        def emit(g, env):
            v = env[x.name]
            nd = len(g.shape(v))
            d = dim + nd if dim < 0 else dim
            if not 0 <= d < nd:
                _fail(node, f"{op}(dim={dim})", f"is out of range for an input of {nd} dims")
            if d == nd - 1:
                return g.op(op, [v])
            swap = _attrs(dim0=d, dim1=nd - 1)
            return g.op("transpose", [g.op(op, [g.op("transpose", [v], swap)])], swap)
        return emit

    def _matmul(self, node, a, b):
        """torch.matmul / @: ttd's matmul where both sides have 2 dims or more. A 1-D side is
        taken as torch takes it: on the left a row, on the right a column, reshaped to one and
        dropped from the product after (the product's other sizes are the built shapes', its
        leading one follows the batch, as _reshape_plan's)."""
        _tensors_only(node, "matmul", [a, b])

        def emit(g, env):
            va, vb = [env[v.name] if isinstance(v, torch.fx.Node) else _param_value(g, env, *v) for v in (a, b)]
            sa, sb = g.shape(va), g.shape(vb)
            if len(sa) >= 2 and len(sb) >= 2:
                return g.op("matmul", [va, vb])
            if len(sa) < 2 and len(sb) < 2:
                _fail(node, f"matmul of inputs of {len(sa)} and {len(sb)} dims", "is not supported: ttd has no 0-dim "
                      "tensors; write (a * b).sum(-1, keepdim=True) for a dot product")
            if len(sb) == 1:
                product = g.op("matmul", [va, g.op("reshape", [vb], _attrs(shape=[sb[0], 1]))])
                shape = list(sa[:-1])
            elif len(sa) == 1:
                product = g.op("matmul", [g.op("reshape", [va], _attrs(shape=[1, sa[0]])), vb])
                shape = list(sb[:-2]) + [sb[-1]]
            else:
                _fail(node, f"matmul of inputs of {len(sa)} and {len(sb)} dims", "is not supported: as torch's, "
                      "each input needs 1 dim at least")
            if len(shape) > 1:
                self.fixed_shapes = True
            shape[0] = -1
            self._reshapes.append(tuple(shape))
            return g.op("reshape", [product], _attrs(shape=shape))
        return emit

    def _scalar_op(self, node, op, a, b):
        """op of a tensor and a Python number: ttd's op with one input and the attribute scalar
        (reverse=1 for number op tensor), computed in float32 as torch computes it."""
        x, c, reverse = (a, b, False) if isinstance(a, torch.fx.Node) else (b, a, True)
        if not isinstance(x, torch.fx.Node) or isinstance(c, bool) or not isinstance(c, (int, float)):
            _fail(node, f"{op} of {a!r} and {b!r}", "is not supported: ttd's add/sub/mul/div take two tensors, or a "
                  "tensor and a Python number (make any other constant a parameter or a second input)")
        try:
            value = float(c)
        except OverflowError:
            value = math.inf
        if not math.isfinite(value):
            _fail(node, f"{op} by {c!r}", "is not supported: the number must be finite")
        attrs = {"scalar": repr(value)}
        if reverse and op in ("sub", "div"):
            attrs["reverse"] = 1
        return self._op(node, op, [x], _attrs(**attrs))

    def _conv(self, node, x, w, b, stride, padding, dilation, groups, padding_mode):
        if isinstance(padding, str):
            if padding != "valid":
                _fail(node, f"conv2d(padding={padding!r})", "is not supported: give the padding as integers")
            padding = 0
        if _pair(dilation) != (1, 1) or groups != 1 or padding_mode != "zeros":
            _fail(node, f"conv2d(dilation={dilation}, groups={groups}, padding_mode={padding_mode!r})",
                  "is not supported: ttd's conv2d has dilation 1, groups 1 and zero padding")
        return self._op(node, "conv2d", [x, w] + ([b] if b is not None else []),
                        _attrs(stride=_pair(stride), padding=_pair(padding)))

    def _layer_norm(self, node, x, shape, wb, eps):
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        if len(shape) != 1:
            _fail(node, f"layer_norm(normalized_shape={shape})", "is not supported: ttd normalises the last dim only")
        emit = self._op(node, "layer_norm", [x] + wb, _attrs(eps=repr(float(eps))))

        def checked(g, env):
            last = g.shape(env[x.name])[-1] if g.shape(env[x.name]) else None
            if last != shape[0]:
                raise _lib.TTError(_INVALID_ARGUMENT, f"layer_norm's normalized_shape is ({shape[0]},) but the "
                                                      f"input's last dim is {last}: give the input's last dim")
            return emit(g, env)
        return checked

    def _embedding(self, node, x, w, padding_idx, max_norm, scale_grad_by_freq, sparse):
        if padding_idx is not None or max_norm is not None or scale_grad_by_freq or sparse:
            _fail(node, "embedding(padding_idx/max_norm/scale_grad_by_freq/sparse)",
                  "is not supported: ttd's embedding is the plain lookup")
        return self._op(node, "embedding", [x, w])

    def _pool(self, node, x, sub):
        op = "max_pool2d" if isinstance(sub, torch.nn.MaxPool2d) else "avg_pool2d"
        if sub.ceil_mode:
            _fail(node, f"{op}(ceil_mode=True)", "is not supported")
        if op == "max_pool2d" and (_pair(sub.dilation) != (1, 1) or sub.return_indices):
            _fail(node, f"{op}(dilation={sub.dilation}, return_indices={sub.return_indices})", "is not supported")
        if op == "avg_pool2d" and (not sub.count_include_pad or sub.divisor_override is not None):
            _fail(node, f"{op}(count_include_pad={sub.count_include_pad}, divisor_override={sub.divisor_override})",
                  "is not supported: ttd divides by the whole window")
        stride = sub.stride if sub.stride else sub.kernel_size
        return self._op(node, op, [x], _attrs(kernel=_pair(sub.kernel_size), stride=_pair(stride),
                                              padding=_pair(sub.padding)))

    def _flatten(self, node, x, start, end):
        if end == -1:
            return self._op(node, "flatten", [x], _attrs(start_dim=start))
        if start < 0 or end < 0:
            _fail(node, f"flatten(start_dim={start}, end_dim={end})", "is not supported: give end_dim=-1, or both "
                  "dims counted from 0")

        def shape_of(s):
            n = 1
            for d in s[start:end + 1]:
                n *= d
            return list(s[:start]) + [n] + list(s[end + 1:])
        return self._reshape_plan(node, x, shape_of)

    def _unflatten(self, node, x, dim, sizes):
        if not isinstance(dim, int):
            _fail(node, f"Unflatten(dim={dim!r})", "with a named dim is not supported")
        # Unflattening the batch dim follows another batch only where its first size is -1
        # (Unflatten(0, (-1, 4))); Unflatten(0, (2, 4)) takes batches of 8 only, as torch's.
        return self._reshape_plan(node, x, lambda s: list(s[:dim % len(s)]) + list(sizes) + list(s[dim % len(s) + 1:]),
                                  batch_free=lambda s: dim % len(s) != 0 or list(sizes)[:1] == [-1])

    def build(self, example):
        """A libttclient graph for the dtypes and shapes of example (libttclient tensors); also
        sets n_outputs (the distinct tensors forward returns), fixed_shapes (whether a size
        taken from a shape, other than the batch, is a constant of the graph: then inputs whose
        dims past the first differ from example's would get its sizes) and batch_fixed (whether
        the batch itself is one: then only example's shapes are served)."""
        self.fixed_shapes = False
        self.batch_fixed = False
        shapes = [tuple(t.shape) for t in example]
        graph, reshapes = self._build_graph([t.dtype for t in example], shapes)
        if reshapes and not self.batch_fixed:
            self._check_batch_follows([t.dtype for t in example], shapes, reshapes)
        return graph

    def _check_batch_follows(self, dtypes, shapes, reshapes):
        """Builds the graph again at twice the batch (shapes only, in libttclient: the inputs
        led by the first input's size doubled, others, a mask [T, T] or a scalar, as they are)
        and compares the sizes each reshape was given: a reshape serves other batch sizes only
        where its sizes are the same at both (the batch one left free, -1). Where one differs (a size taken from
        a dim that is not the batch, a -1 resolved over it, the batch moved off dim 0 before),
        or the graph cannot be built at twice the batch, the batch is fixed too (batch_fixed),
        so that another batch is refused naming the shape, never given wrong sizes."""
        if not shapes[0]:
            self.batch_fixed = True
            return
        fixed_shapes = self.fixed_shapes
        batch = shapes[0][0]  # inputs led by another size (a mask [T, T]) keep it
        try:
            _, probed = self._build_graph(dtypes, [(2 * s[0],) + tuple(s[1:]) if s and s[0] == batch else s for s in shapes])
        except (_lib.TTError, NotImplementedError):
            probed = None
        self.fixed_shapes = fixed_shapes
        if probed != reshapes:
            self.batch_fixed = True

    def _build_graph(self, dtypes, shapes):
        """The graph at these input dtypes and shapes, and the sizes given to its reshapes."""
        self._reshapes = []
        client = _get_client()
        graph = _lib.Graph(client, seed=0)
        env = {}
        inputs = 0
        for node in self._gm.graph.nodes:
            if node.op == "placeholder":
                env[node.name] = graph.input(node.name, dtypes[inputs], shapes[inputs])
                inputs += 1
            elif node.op == "output":
                for o in self._out_nodes:
                    graph.output(env[o.name])
                self.n_outputs = len(self._out_nodes)
            else:
                try:
                    env[node.name] = self._lower(node, graph, env)
                except _lib.TTError as e:  # refused at these shapes: say where in forward
                    raise _lib.TTError(e.code, f"ttd.compile: node {node.name}{_where(node)}: {e.message}, at input "
                                               f"shape(s) {shapes}") from None
        return graph, self._reshapes
