"""ttd.compile on each supported torch op: run on a card and left on "cpu", compared with the
same module in plain torch; unsupported ops and attributes fail at compile time."""
import copy
import pytest
import torch
import torch.fx
import torch.nn as nn
import torch.nn.functional as F

import ttd.torch as ttd
from ttd.lower import Lowering


class Fn(nn.Module):
    """A module whose forward is fn(self, x)."""

    def __init__(self, fn, **subs):
        super().__init__()
        self.fn = fn
        for k, v in subs.items():
            setattr(self, k, v)

    def forward(self, x):
        return self.fn(self, x)


class Two(nn.Module):
    """forward(x, y) = fn(x, y): tensor-tensor ops."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x, y):
        return self.fn(x, y)


def _img():
    return torch.randn(2, 3, 8, 8)


def _vec():
    return torch.randn(4, 6)


def _pos():
    return torch.rand(4, 6) + 0.5


def _idx():
    return torch.tensor([[0, 3, 9], [2, 2, 7]], dtype=torch.int32)


CASES = {
    "Linear": (lambda: nn.Sequential(nn.Linear(6, 5)), _vec),
    "Conv2d": (lambda: Fn(lambda s, x: s.conv1(x), conv1=nn.Conv2d(3, 4, 3, stride=2, padding=1)), _img),
    "Conv2d-nobias-rect": (lambda: Fn(lambda s, x: s.conv1(x), conv1=nn.Conv2d(3, 2, (3, 2), stride=(1, 2),
                                                                                  bias=False)), _img),
    "F.conv2d": (lambda: Fn(lambda s, x: F.conv2d(x, s.w, s.b, 1, 1), w=nn.Parameter(torch.randn(2, 3, 3, 3)),
                            b=nn.Parameter(torch.randn(2))), _img),
    "ReLU": (lambda: nn.ReLU(), _vec),
    "GELU": (lambda: nn.GELU(), _vec),
    "Sigmoid": (lambda: nn.Sigmoid(), _vec),
    "Tanh": (lambda: nn.Tanh(), _vec),
    "Softmax": (lambda: nn.Softmax(dim=-1), _vec),
    "Softmax-dim1": (lambda: nn.Softmax(dim=1), _vec),
    "LogSoftmax": (lambda: nn.LogSoftmax(dim=-1), _vec),
    "LayerNorm": (lambda: Fn(lambda s, x: s.ln(x), ln=nn.LayerNorm(6, eps=1e-3)), _vec),
    "LayerNorm-noaffine": (lambda: nn.LayerNorm(6, elementwise_affine=False), _vec),
    "F.layer_norm": (lambda: Fn(lambda s, x: F.layer_norm(x, (6,))), _vec),
    "Embedding": (lambda: Fn(lambda s, x: s.emb(x), emb=nn.Embedding(10, 4)), _idx),
    "F.embedding": (lambda: Fn(lambda s, x: F.embedding(x, s.w), w=nn.Parameter(torch.randn(10, 3))), _idx),
    "Dropout": (lambda: nn.Sequential(nn.Linear(6, 6), nn.Dropout(0.3)), _vec),
    "F.dropout-eval": (lambda: Fn(lambda s, x: F.dropout(x, 0.5, training=False)), _vec),
    "MaxPool2d": (lambda: nn.MaxPool2d(2), _img),
    "MaxPool2d-pad": (lambda: nn.MaxPool2d(3, stride=2, padding=1), _img),
    "AvgPool2d": (lambda: nn.AvgPool2d(2), _img),
    "AvgPool2d-pad": (lambda: nn.AvgPool2d(3, stride=2, padding=1), _img),
    "F.pools": (lambda: Fn(lambda s, x: F.avg_pool2d(F.max_pool2d(x, 2), 2, 1)), _img),
    "Flatten": (lambda: nn.Sequential(nn.Flatten(), nn.Linear(192, 3)), _img),
    "Flatten-mid": (lambda: nn.Flatten(1, 2), _img),
    "Unflatten": (lambda: nn.Unflatten(1, (2, 3)), _vec),
    "Sequential-CNN": (lambda: nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                             nn.Flatten(), nn.Linear(64, 10), nn.LogSoftmax(dim=-1)), _img),
    "F.unary": (lambda: Fn(lambda s, x: F.relu(x) + F.gelu(x) + x.tanh() + torch.tanh(x) + x.exp() +
                           torch.sigmoid(x) + x.relu()), _vec),
    "log": (lambda: Fn(lambda s, x: torch.log(x) + x.log()), _pos),
    "F.softmax": (lambda: Fn(lambda s, x: F.softmax(x, dim=-1) + F.log_softmax(x, -1) + x.softmax(-1) +
                             torch.softmax(x, -1)), _vec),
    "softmax-other-dims": (lambda: Fn(lambda s, x: F.softmax(x, dim=1) + F.log_softmax(x, 0) + x.softmax(-3) +
                                      torch.softmax(x, 2) + torch.log_softmax(x, -2)), _img),
    "matmul-1d": (lambda: Fn(lambda s, x: (x @ s.v).reshape(-1, 1) + x.matmul(s.w) + s.u @ x.transpose(0, 1),
                             v=nn.Parameter(torch.randn(6)), w=nn.Parameter(torch.randn(6)),
                             u=nn.Parameter(torch.randn(6))), _vec),
    "matmul-1d-batched": (lambda: Fn(lambda s, x: (x @ s.v).sum(-1, keepdim=True) + (s.u @ x).sum(-1, keepdim=True),
                                     v=nn.Parameter(torch.randn(6)), u=nn.Parameter(torch.randn(3))),
                          lambda: torch.randn(2, 3, 6)),
    "matmul": (lambda: Fn(lambda s, x: (x @ s.w) + torch.matmul(x, s.w) + x.matmul(s.w),
                          w=nn.Parameter(torch.randn(6, 3))), _vec),
    "arith": (lambda: Fn(lambda s, x: (x + s.b) * s.b - x / (s.b.exp()) + torch.add(x, x) + x.mul(s.b),
                         b=nn.Parameter(torch.randn(6))), _vec),
    "scalar-arith": (lambda: Fn(lambda s, x: (x * 0.5 + 2 - x / 3.0) * (1 - x) + 4 / (x + 3) - 2 * x +
                                torch.add(x, 1.5) + x.div(7) + torch.mul(x, -2)), _vec),
    "view-reshape": (lambda: Fn(lambda s, x: x.view(-1, 2, 3).reshape(4, 6) + torch.reshape(x, (4, 6))), _vec),
    "view-size": (lambda: Fn(lambda s, x: x.view(x.size(0), -1) + x.reshape(x.size(0), x.size(1), -1).flatten(1)),
                  _img),
    "flatten-fn": (lambda: Fn(lambda s, x: torch.flatten(x, 1) + x.flatten(1)), _img),
    "transpose-permute": (lambda: Fn(lambda s, x: x.transpose(1, 2).permute(0, 2, 3, 1) +
                                     torch.transpose(x, 1, 2).permute((0, 2, 3, 1))), _img),
    "sum-mean": (lambda: Fn(lambda s, x: x.sum(dim=1, keepdim=True) + x.mean(1, True) + torch.sum(x, (1,), True) +
                            x.mean(dim=-1, keepdim=True) + x.sum()), _vec),
    "mean-all": (lambda: Fn(lambda s, x: torch.mean(x.sum(dim=(2, 3)), dim=0)), _img),
    "sum-mean-numpy-names": (lambda: Fn(lambda s, x: x - x.mean(axis=-1, keepdims=True) + x.sum(axis=1, keepdims=True) +
                                        torch.sum(x, axis=0)), _vec),
    "input-keyword": (lambda: Fn(lambda s, x: torch.add(input=torch.matmul(input=x, other=s.w), other=1.5),
                                 w=nn.Parameter(torch.randn(6, 3))), _vec),
}


def _check(model, x, device):
    want = model(x)
    tt_model = ttd.compile(model)
    tt_model.eval()
    if device == "tt":
        tt_model.to("tt")
        got = tt_model(x.to("tt")).to("cpu")
    else:
        got = tt_model(x)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("device", ["tt", "cpu"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_op_matches_torch(case, device):
    """Each supported op, compiled, gives torch's answer on a card and left on the CPU."""
    torch.manual_seed(0)
    make, data = CASES[case]
    model = make().eval()
    _check(model, data(), device)


@pytest.mark.parametrize("device", ["tt", "cpu"])
def test_tensor_tensor_ops(device):
    """+ - * / and @ between two inputs."""
    model = Two(lambda x, y: (x + y) * (x - y) / (y.exp()) + (x @ y.transpose(0, 1)).sum(dim=1, keepdim=True))
    x, y = torch.randn(4, 6), torch.randn(4, 6)
    want = model(x, y)
    tt_model = ttd.compile(model)
    if device == "tt":
        tt_model.to("tt")
        got = tt_model(x.to("tt"), y.to("tt")).to("cpu")
    else:
        got = tt_model(x, y)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_view_size_follows_the_batch():
    """x.view(x.size(0), -1) compiled at one batch runs another."""
    model = Fn(lambda s, x: s.l(x.view(x.size(0), -1)), l=nn.Linear(192, 3))
    tt_model = ttd.compile(model)
    for n in (2, 5):
        x = torch.randn(n, 3, 8, 8)
        torch.testing.assert_close(tt_model(x), model(x), rtol=1e-4, atol=1e-5)


def test_parameter_names_are_torchs():
    """Submodule parameters come in under torch's names."""
    model = nn.Sequential(nn.Conv2d(3, 2, 3), nn.Flatten(), nn.LayerNorm(72))
    tt_model = ttd.compile(model)
    tt_model(_img())
    assert sorted(n for n, _ in tt_model.named_parameters()) == sorted(n for n, _ in model.named_parameters())
    torch.testing.assert_close(dict(tt_model.named_parameters())["0.weight"].cpu(), model[0].weight.detach())


class _Attend(nn.Module):
    """Attention pooling as people write it: a score per position from a vector (a 1-D matmul
    on the right), a softmax over the positions (dim 1 of 2), a 1-D matmul on the left."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.v = nn.Parameter(torch.randn(8))
        self.u = nn.Parameter(torch.randn(6))

    def forward(self, x):
        h = self.proj(x)
        w = F.softmax(h @ self.v, dim=1)
        return F.log_softmax(w.reshape(-1, 6, 1) * h, dim=-2).sum(1) + self.u @ h


def test_vector_matmul_and_softmax_over_a_middle_dim_train_as_torch():
    """1-D matmuls and a softmax over a dim other than the last give torch's outputs and
    .grads at two batch sizes, the gradients summed across the two backwards."""
    torch.manual_seed(4)
    ref = _Attend()
    cm = ttd.compile(copy.deepcopy(ref)).to("tt")
    for batch in (2, 5):
        x = torch.randn(batch, 6, 8)
        got, want = cm(x.to("tt")).to("cpu"), ref(x)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        (got * got).sum().backward()
        (want * want).sum().backward()
    for name, p in ref.named_parameters():
        torch.testing.assert_close(dict(cm.named_parameters())[name].grad.to("cpu"), p.grad, rtol=1e-4, atol=1e-4)


BAD = {
    "tensor*inf": (lambda: Fn(lambda s, x: x * float("inf")), "mul by inf"),
    "tensor*bool": (lambda: Fn(lambda s, x: x * True), "mul of x and True"),
    "gelu-tanh": (lambda: nn.GELU(approximate="tanh"), "GELU(approximate='tanh')"),
    "conv-dilation": (lambda: nn.Conv2d(3, 2, 3, dilation=2), "dilation=(2, 2)"),
    "conv-groups": (lambda: nn.Conv2d(4, 2, 3, groups=2), "groups=2"),
    "conv-reflect": (lambda: nn.Conv2d(3, 2, 3, padding=1, padding_mode="reflect"), "padding_mode='reflect'"),
    "conv-same": (lambda: Fn(lambda s, x: s.c(x), c=nn.Conv2d(3, 2, 3, padding="same")), "padding='same'"),
    "pool-ceil": (lambda: nn.MaxPool2d(2, ceil_mode=True), "ceil_mode=True"),
    "avgpool-exclude": (lambda: nn.AvgPool2d(3, padding=1, count_include_pad=False), "count_include_pad=False"),
    "layernorm-2d": (lambda: nn.LayerNorm((3, 6)), "normalized_shape=(3, 6)"),
    "embedding-pad": (lambda: nn.Embedding(10, 3, padding_idx=0), "embedding("),
    "module": (lambda: nn.BatchNorm1d(6), "module BatchNorm1d"),
    "function": (lambda: Fn(lambda s, x: torch.abs(x)), "abs"),
    "view-runtime": (lambda: Fn(lambda s, x: x.view(x.size(), -1)), "size"),
    "size-arith": (lambda: Fn(lambda s, x: x.view(x.size(0) * 2, -1)), "size"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_unsupported_fails_at_compile_time(case):
    """An op or attribute ttd cannot express raises at ttd.compile, naming it and the node."""
    make, what = BAD[case]
    m = make()
    if not isinstance(m, Fn):  # a submodule, as users write them (a root module is traced through)
        m = Fn(lambda s, x: s.m(x), m=m)
    with pytest.raises(NotImplementedError) as e:
        ttd.compile(m)
    msg = str(e.value)
    assert what in msg and "(node " in msg, msg


def test_error_names_the_forward_line():
    """Traced with record_stack_traces, the error names the user's forward line."""
    class Bad(nn.Module):
        def forward(self, x):
            y = x.relu()
            return torch.abs(y)  # the unsupported line

    tracer = torch.fx.Tracer()
    tracer.record_stack_traces = True
    gm = torch.fx.GraphModule(Bad(), tracer.trace(Bad()))
    with pytest.raises(NotImplementedError) as e:
        Lowering(gm, set())
    msg = str(e.value)
    assert "node abs" in msg and "test_compile.py" in msg and "the unsupported line" in msg, msg


def test_tensor_attribute_error_names_the_attribute_and_the_forward():
    """x.T, a node fx makes at its first use: the error names the attribute and what to write
    instead, and the user's line where that use is in forward, never a line of ttd's own."""
    class UsedInForward(nn.Module):
        def forward(self, x):
            return x.T @ x  # the line with .T

    class Returned(nn.Module):
        def forward(self, x):
            return x.T

    msgs = []
    for cls in (UsedInForward, Returned):
        with pytest.raises(NotImplementedError) as e:
            ttd.compile(cls())(torch.rand(3, 3))
        msgs.append(str(e.value))
    for msg in msgs:
        assert "the tensor attribute .T" in msg and "x.transpose(0, 1)" in msg, msg
        assert "module.py" not in msg and "ttd/" not in msg, msg
    assert "test_compile.py" in msgs[0] and "the line with .T" in msgs[0], msgs[0]
    assert ", in forward)" in msgs[1], msgs[1]


@pytest.mark.parametrize("fn, first, other", [
    (lambda s, x: s.l(x.view(x.size(0), x.size(1), 2, 4).transpose(1, 2).reshape(x.size(0), x.size(1), 8)),
     (4, 6, 8), (4, 3, 8)),
    (lambda s, x: s.l(x.view(x.size(0), -1)), (2, 2, 4), (2, 4, 2)),
    (lambda s, x: s.l(x.flatten(1, 2)), (2, 2, 4), (3, 4, 2)),
    (lambda s, x: s.l(s.u(x).flatten(1, 2)), (2, 8), (2, 16)),
    (lambda s, x: s.l(s.u(x.flatten(0, 1)).flatten(1, 2)), (2, 2, 8), (2, 4, 8)),
])
def test_sizes_taken_from_a_shape_serve_other_batches_and_refuse_other_dims(fn, first, other):
    """Sizes taken from the input's shape past the batch (x.size(1), the -1 beside x.size(0),
    flatten) are the first call's: another batch runs as torch does, other dims are refused
    naming the shape the graph serves, never answered with the first call's sizes."""
    m = Fn(fn, l=nn.Linear(8, 3), u=nn.Unflatten(1, (-1, 4)))
    c = ttd.compile(m).to("tt")
    for shape in (first, (7,) + first[1:]):
        x = torch.randn(shape)
        torch.testing.assert_close(c(x.to("tt")).cpu(), m(x), rtol=1e-5, atol=1e-5)
    want = ", ".join(map(str, first[1:]))
    with pytest.raises(RuntimeError, match=rf"input 0 has shape \({', '.join(map(str, other))}\).*first call's "
                                           rf"\(\*, {want}\).*give inputs of that shape"):
        c(torch.randn(other).to("tt"))


@pytest.mark.parametrize("fn", [
    lambda s, x: s.l2(F.relu(s.l(x), inplace=True)),
    lambda s, x: s.l2(s.act(s.l(x))),
    lambda s, x: s.l2(F.dropout(s.act(s.l(x)), 0.0, s.training, inplace=True)),
    lambda s, x: (lambda h: (h, s.l2(s.act(h.view(h.size(0), -1)))))(s.l(x))[1],
])
def test_inplace_whose_input_is_read_no_more_runs_as_torch(fn):
    """An in-place activation on a value read no more after it (nn.ReLU(inplace=True) in a
    stack of layers) gives torch's values, forward and backward."""
    torch.manual_seed(0)
    m = Fn(fn, l=nn.Linear(4, 4), l2=nn.Linear(4, 3), act=nn.ReLU(inplace=True))
    c = ttd.compile(m).to("tt")
    x = torch.randn(6, 4)
    out = c(x.to("tt")).cpu()
    torch.testing.assert_close(out, m(x), rtol=1e-5, atol=1e-6)
    out.sum().backward()
    m(x).sum().backward()
    torch.testing.assert_close(dict(c.named_parameters())["l.weight"].grad, m.l.weight.grad, rtol=1e-5, atol=1e-6)


class _InplaceThenRead(nn.Module):
    def __init__(self, how):
        super().__init__()
        self.l, self.act, self.how = nn.Linear(4, 4), nn.ReLU(inplace=True), how

    def forward(self, x):
        h = self.l(x)
        if self.how == "functional":
            F.relu(h, inplace=True)
            return h
        if self.how == "module, view read after":
            v = h.view(-1, 4)
            return self.act(h) + v
        if self.how == "+=":
            y = h
            h += 1
            return y
        return self.act(x)  # forward's input


@pytest.mark.parametrize("how, what", [("functional", r"relu\(inplace=True\) \(node relu, at .*F.relu\(h, inplace"),
                                       ("module, view read after", r"ReLU\(inplace=True\) \(node act,.*reads after"),
                                       ("+=", r"add \(node add,.*h \+= 1"),
                                       ("input", r"ReLU\(inplace=True\).*writes forward's input")])
def test_inplace_whose_input_is_read_after_fails_at_compile_time(how, what):
    """An in-place op whose input (or a view of it) is read after it, or that writes forward's
    input, or x += y (which fx traces as x + y), would differ from torch computed out of place:
    refused at compile time naming the op, the node and the line, saying what to do."""
    with pytest.raises(NotImplementedError, match=what + r".*(use its result|out-of-place form|x = x \+ y)"):
        ttd.compile(_InplaceThenRead(how))


def test_unflattening_the_batch_into_fixed_sizes_takes_that_batch_only():
    """Unflatten(0, (2, 4)) serves batches of 8 only, as torch's (another batch is refused naming
    the shape, never reinterpreted); Unflatten(0, (-1, 4)) follows the batch."""
    m = Fn(lambda s, x: s.l(s.u(x).sum(1)), l=nn.Linear(3, 2), u=nn.Unflatten(0, (2, 4)))
    c = ttd.compile(m).to("tt")
    x = torch.randn(8, 3)
    torch.testing.assert_close(c(x.to("tt")).cpu(), m(x), rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match=r"input 0 has shape \(4, 3\).*takes inputs of shape \(8, 3\) only"):
        c(torch.randn(4, 3).to("tt"))
    m = Fn(lambda s, x: s.l(s.u(x).sum(1)), l=nn.Linear(3, 2), u=nn.Unflatten(0, (-1, 4)))
    c = ttd.compile(m).to("tt")
    for n in (8, 12):
        x = torch.randn(n, 3)
        torch.testing.assert_close(c(x.to("tt")).cpu(), m(x), rtol=1e-5, atol=1e-5)


class _Outs(nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.l, self.kind = nn.Linear(4, 2), kind

    def forward(self, x):
        h = self.l(x)
        return {"dict": lambda: {"out": h, "relu": F.relu(h)}, "nested": lambda: (h, [h, F.relu(h)]),
                "none": lambda: (h, None), "twice": lambda: (h, h), "int": lambda: (h, 3)}[self.kind]()


@pytest.mark.parametrize("kind", ["dict", "nested", "none", "twice"])
def test_outputs_keep_forwards_structure(kind):
    """forward may return dicts, lists and tuples of tensors, nested, None among them, and a
    tensor more than once: the compiled module returns the same structure, and a tensor
    returned twice gets the sum of both gradients, as torch's."""
    torch.manual_seed(0)
    m = _Outs(kind)
    c = ttd.compile(copy.deepcopy(m)).to("tt")
    x = torch.randn(3, 4)
    got, want = c(x.to("tt")), m(x)
    flat_got, flat_want = [], []

    def walk(g, w):
        assert type(g) is type(w) or (isinstance(w, torch.Tensor) and isinstance(g, torch.Tensor)), (g, w)
        if isinstance(w, dict):
            assert list(g) == list(w)
            for k in w:
                walk(g[k], w[k])
        elif isinstance(w, (tuple, list)):
            assert len(g) == len(w)
            for a, b in zip(g, w):
                walk(a, b)
        elif w is not None:
            flat_got.append(g.to("cpu"))
            flat_want.append(w)
    walk(got, want)
    for a, b in zip(flat_got, flat_want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    sum(t.sum() * (i + 1) for i, t in enumerate(flat_got)).backward()
    sum(t.sum() * (i + 1) for i, t in enumerate(flat_want)).backward()
    torch.testing.assert_close(dict(c.named_parameters())["l.bias"].grad, m.l.bias.grad, rtol=1e-5, atol=1e-6)


def test_returning_a_constant_fails_at_compile_time():
    with pytest.raises(NotImplementedError, match="returning int 3.*forward returns tensors, None"):
        ttd.compile(_Outs("int"))


@pytest.mark.parametrize("fn", [
    lambda s, x: (lambda h: h.reshape(h.size(0), -1))(x.transpose(0, 1)),
    lambda s, x: x.transpose(0, 1).unflatten(1, (2, -1)),
    lambda s, x: x.transpose(0, 1).flatten(1, 2),
    lambda s, x: x.view(s.w.size(0), -1),
])
def test_reshapes_not_following_the_batch_take_that_batch_only(fn):
    """A reshape whose sizes depend on the batch other than through its leading dim (sizes of
    a dim that is not the batch, a -1 over the batch, a parameter's size) gives torch's
    answer at the first call's shapes and refuses another batch naming the shape it serves,
    never answering it with the first call's sizes."""
    m = Fn(fn, w=nn.Parameter(torch.randn(3, 2)))
    c = ttd.compile(m).to("tt")
    x = torch.randn(2, 6, 4)
    torch.testing.assert_close(c(x.to("tt")).cpu(), m(x))
    with pytest.raises(RuntimeError, match=r"input 0 has shape \(4, 6, 4\).*takes inputs of shape \(2, 6, 4\) only"):
        c(torch.randn(4, 6, 4).to("tt"))


def test_out_and_a_layer_norm_of_another_size_are_refused():
    """out= fails at compile time naming it (ttd's ops make new tensors); a layer_norm whose
    normalized_shape is not the input's last dim fails at the first call, as torch's does."""
    with pytest.raises(NotImplementedError, match=r"exp\(out=...\).*write y = op\(x\)"):
        ttd.compile(Fn(lambda s, x: torch.exp(x, out=x) * 2))
    c = ttd.compile(Fn(lambda s, x: F.layer_norm(x, (4,)))).to("tt")
    with pytest.raises(ttd.TTError, match=r"normalized_shape is \(4,\) but the input's last dim is 6"):
        c(torch.randn(2, 6).to("tt"))


def test_an_input_not_led_by_the_batch_keeps_other_batches_served():
    """An input whose leading size is not the batch (a mask [3, 4]) beside reshapes that follow
    the batch: the graph serves other batch sizes as torch does (the check at twice the batch
    leaves that input as it is)."""
    class Masked(nn.Module):
        def forward(self, x, mask):
            h = x.view(x.size(0), 3, 4) + mask
            return h.reshape(h.size(0), -1).softmax(-1)

    m = Masked()
    c = ttd.compile(m).to("tt")
    mask = torch.randn(3, 4)
    for batch in (2, 5):
        x = torch.randn(batch, 12)
        torch.testing.assert_close(c(x.to("tt"), mask.to("tt")).cpu(), m(x, mask))
