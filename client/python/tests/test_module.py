"""A compiled module's torch manners (parameters, state_dict, load_state_dict, zero_grad) and
ttd.connect, compared against plain torch on the CPU."""
import copy
import os
import tempfile

import pytest
import torch
import torch.nn.functional as F

import ttd.torch as ttd


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l1, self.relu, self.l2 = torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)

    def forward(self, x):
        return self.l2(self.relu(self.l1(x)))


def _pair(device="tt"):
    torch.manual_seed(0)
    ref = MLP()
    return ref, ttd.compile(copy.deepcopy(ref)).to(device)


def _assert_same(sd, want):
    assert list(sd) == list(want)
    for k in want:
        assert sd[k].device.type == "cpu"
        assert torch.equal(sd[k], want[k]), k


def test_parameters_before_the_first_call():
    """parameters() and named_parameters() answer before the module has run, with torch's names
    and shapes, and give their values."""
    ref, m = _pair()
    assert [n for n, _ in m.named_parameters()] == [n for n, _ in ref.named_parameters()]
    assert [p.shape for p in m.parameters()] == [p.shape for p in ref.parameters()]
    assert all(p.grad is None for p in m.parameters())
    assert torch.equal(next(m.parameters()).cpu(), ref.l1.weight.detach())


def test_parameter_sizes_are_torchs():
    """A parameter answers numel(), nelement(), dim(), ndim and size() as torch's, so the usual
    count of a model's parameters works."""
    ref, m = _pair()
    assert sum(p.numel() for p in m.parameters()) == sum(p.numel() for p in ref.parameters())
    for p, r in zip(m.parameters(), ref.parameters()):
        assert (p.numel(), p.nelement(), p.dim(), p.ndim, p.size()) == (r.numel(), r.nelement(), r.dim(), r.ndim, r.size())
        assert p.size(0) == r.size(0) and p.size(-1) == r.size(-1)


@pytest.mark.parametrize("device", ["tt", "cpu"])
def test_state_dict_names_and_values_are_torchs(device):
    """state_dict() gives CPU tensors under torch's names, before and after the first call."""
    ref, m = _pair(device)
    _assert_same(m.state_dict(), ref.state_dict())
    x = torch.randn(3, 16)
    m(x.to(device) if device == "tt" else x)
    _assert_same(m.state_dict(), ref.state_dict())


@pytest.mark.parametrize("device", ["tt", "cpu"])
@pytest.mark.parametrize("built", [False, True])
def test_load_state_dict_round_trip(device, built):
    """Values loaded go onto the module wherever it is, run or not; the outputs follow them."""
    ref, m = _pair(device)
    x = torch.randn(3, 16)
    run = (lambda: m(x.to(device) if device == "tt" else x).to("cpu"))
    if built:
        run()
    torch.manual_seed(7)
    other = MLP()
    res = m.load_state_dict(other.state_dict())
    assert res.missing_keys == [] and res.unexpected_keys == []
    _assert_same(m.state_dict(), other.state_dict())
    torch.testing.assert_close(run(), other(x), rtol=1e-5, atol=1e-6)
    m.load_state_dict(ref.state_dict())
    _assert_same(m.state_dict(), ref.state_dict())
    torch.testing.assert_close(run(), ref(x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("built", [False, True])
def test_load_state_dict_errors_as_torchs(built):
    """Missing and unexpected keys (strict) and a wrong shape raise RuntimeError, as torch's
    load_state_dict does, and leave the module unchanged."""
    ref, m = _pair()
    if built:
        m(torch.randn(2, 16).to("tt"))
    sd = ref.state_dict()
    missing = {k: v for k, v in sd.items() if k != "l2.bias"}
    with pytest.raises(RuntimeError, match='Missing key\\(s\\) in state_dict: "l2.bias"'):
        m.load_state_dict(missing)
    with pytest.raises(RuntimeError, match='Missing key\\(s\\) in state_dict: "l2.bias"'):
        ref.load_state_dict(missing)
    with pytest.raises(RuntimeError, match='Unexpected key\\(s\\) in state_dict: "extra"'):
        m.load_state_dict({**sd, "extra": torch.zeros(1)})
    bad = {**sd, "l1.weight": torch.zeros(5, 5)}
    with pytest.raises(RuntimeError, match="size mismatch for l1.weight"):
        m.load_state_dict(bad)
    with pytest.raises(RuntimeError, match="size mismatch for l1.weight"):
        ref.load_state_dict(bad)
    _assert_same(m.state_dict(), ref.state_dict())
    res = m.load_state_dict({**missing, "extra": torch.zeros(1)}, strict=False)
    assert res.missing_keys == ["l2.bias"] and res.unexpected_keys == ["extra"]
    _assert_same(m.state_dict(), ref.state_dict())


def test_module_zero_grad():
    """zero_grad() on the module zeroes every .grad; set_to_none=True reads None."""
    ref, m = _pair()
    m.zero_grad()  # before the first call: nothing to do
    x, y = torch.randn(4, 16), torch.randint(0, 4, (4,))
    F.cross_entropy(m(x.to("tt")).to("cpu"), y).backward()
    F.cross_entropy(ref(x), y).backward()
    for p, q in zip(m.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6)
    m.zero_grad()
    assert all(torch.count_nonzero(p.grad) == 0 for p in m.parameters())
    m.zero_grad(set_to_none=True)
    assert all(p.grad is None for p in m.parameters())


def test_connect_with_options(ttd_daemon):
    """ttd.connect takes tt_connect_options' options; a session made with them works."""
    c = ttd.connect(ttd_daemon, client_name="pytest", timeout=30, shm=False)
    assert c is not None
    assert torch.equal(torch.arange(6.0).to("tt").cpu(), torch.arange(6.0))
    ttd.connect()  # back to $TTD_ADDRESS, the defaults


def test_input_of_another_connection_is_refused_naming_it(ttd_daemon):
    """After ttd.connect again, a module built on the first connection refuses inputs moved
    through the new one, saying to compile it again; one compiled anew runs on the new one."""
    ref, m = _pair()
    x = torch.randn(4, 16)
    m(x.to("tt"))
    ttd.connect()
    with pytest.raises(RuntimeError, match="input 0 went to the card through another connection.*compile the module"):
        m(x.to("tt"))
    m2 = ttd.compile(copy.deepcopy(ref)).to("tt")
    torch.testing.assert_close(m2(x.to("tt")).cpu(), ref(x), rtol=1e-5, atol=1e-6)


def test_connect_to_nothing_says_how_to_start_ttd():
    """When no ttd answers, TTError names the address and how to start ttd there."""
    with tempfile.TemporaryDirectory() as tmp:
        target = f"unix:{os.path.join(tmp, 'nothing.sock')}"
        with pytest.raises(ttd.TTError) as e:
            ttd.connect(target)
    msg = str(e.value)
    assert target in msg and "ttd --listen" in msg and "UNAVAILABLE" in msg
    assert torch.equal(torch.ones(2).to("tt").cpu(), torch.ones(2))  # the session in place still works


def test_tied_weights_are_one_parameter():
    """A weight shared by two layers is one parameter as in torch: parameters() lists it once,
    state_dict under both names, and training keeps it shared, matching torch."""
    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(4, 4, bias=False), torch.nn.Linear(4, 4, bias=False)
            self.b.weight = self.a.weight

        def forward(self, x):
            return self.b(torch.relu(self.a(x)))

    torch.manual_seed(0)
    ref = Tied()
    m = ttd.compile(copy.deepcopy(ref)).to("tt")
    assert [n for n, _ in m.named_parameters()] == [n for n, _ in ref.named_parameters()] == ["a.weight"]
    x, y = torch.randn(16, 4), torch.randn(16, 4)
    for model, opt, dev in ((ref, torch.optim.SGD(ref.parameters(), lr=0.1), "cpu"),
                            (m, ttd.optim.SGD(m.parameters(), lr=0.1), "tt")):
        for _ in range(3):
            F.mse_loss(model(x.to(dev) if dev == "tt" else x).to("cpu"), y).backward()
            opt.step()
            opt.zero_grad()
    sd = m.state_dict()
    assert list(sd) == list(ref.state_dict()) == ["a.weight", "b.weight"]
    for k, v in ref.state_dict().items():
        torch.testing.assert_close(sd[k], v, rtol=1e-5, atol=1e-6)
    m.load_state_dict(ref.state_dict())


def test_in_place_edits_of_grad_and_data_raise():
    """clip_grad_norm_, clip_grad_value_ and in-place edits of p.data or p.grad, which could not
    reach the module, raise naming what to do; reading them works as torch's."""
    ref, m = _pair()
    x = torch.randn(8, 16)
    F.mse_loss(m(x.to("tt")).cpu(), torch.zeros(8, 4)).backward()
    F.mse_loss(ref(x), torch.zeros(8, 4)).backward()
    norm = torch.stack([p.grad.norm() for p in ref.parameters()]).norm()
    torch.testing.assert_close(torch.stack([p.grad.norm() for p in m.parameters()]).norm(), norm)
    for clip in (lambda ps: torch.nn.utils.clip_grad_norm_(ps, 0.1),
                 lambda ps: torch.nn.utils.clip_grad_value_(ps, 1e-3)):
        with pytest.raises(RuntimeError, match="would not reach the module: edit parameters with load_state_dict"):
            clip(m.parameters())
    p = dict(m.named_parameters())["l1.weight"]
    with torch.no_grad():
        for edit in (lambda: p.data.zero_(), lambda: p.data.copy_(torch.zeros(p.shape)), lambda: p.grad.mul_(2),
                     lambda: p.data.__setitem__(0, 1.0)):
            with pytest.raises(RuntimeError, match="would not reach the module"):
                edit()
    assert torch.equal(p.data * 1, ref.l1.weight.detach())


def test_refused_move_leaves_the_module_where_it_was():
    """A move refused while a training run waits for its backward raises naming what to do, and
    the module stays on the card, usable."""
    ref, m = _pair()
    x = torch.randn(4, 16)
    out = m(x.to("tt"))
    with pytest.raises(ttd.TTError, match=r"call loss.backward\(\), or drop the outputs"):
        m.to("cpu")
    assert str(next(m.parameters()).device) == "tt:0"
    del out
    torch.testing.assert_close(m(x.to("tt")).cpu(), ref(x), rtol=1e-5, atol=1e-6)


def test_later_move_before_compile_wins_and_cpu_module_takes_int64():
    """model.to("tt") then model.to("cpu") before compiling compiles for the CPU; a module on
    the CPU takes int64 indices as one on the card does, and refuses float64 naming it."""
    torch.manual_seed(0)
    ref = torch.nn.Embedding(10, 4)
    src = copy.deepcopy(ref).to("tt").to("cpu")
    m = ttd.compile(src)
    idx = torch.tensor([[1, 2, 3]])
    torch.testing.assert_close(m(idx), ref(idx))
    lin = ttd.compile(torch.nn.Linear(3, 2))
    with pytest.raises(TypeError, match="not torch.float64: convert it first"):
        lin(torch.randn(2, 3, dtype=torch.float64))


def test_dropout_under_no_grad_in_train_mode_drops_and_keeps_no_run():
    """train() under torch.no_grad(): dropout drops as torch's does, the output takes no
    gradient, and no run is left waiting (the module moves at once)."""
    m = ttd.compile(torch.nn.Sequential(torch.nn.Dropout(0.5))).to("tt")
    x = torch.ones(64, 64)
    with torch.no_grad():
        outs = [m(x.to("tt")).cpu() for _ in range(2)]
    for out in outs:
        assert not out.requires_grad and 0.4 < (out == 0).float().mean() < 0.6
        assert torch.equal(out[out != 0], torch.full_like(out[out != 0], 2.0))
    assert not torch.equal(outs[0], outs[1])
    m.to("cpu")
    m.eval()
    with torch.no_grad():
        assert torch.equal(m(x), x)


def test_snapshots_are_read_by_in_place_ops_on_other_tensors():
    """p.data and p.grad are sources of in-place ops and out= on plain tensors (an EMA, a grad
    accumulator) and take int() as torch's; only writing them raises."""
    ref, m = _pair()
    x = torch.randn(8, 16)
    F.mse_loss(m(x.to("tt")).cpu(), torch.zeros(8, 4)).backward()
    F.mse_loss(ref(x), torch.zeros(8, 4)).backward()
    p, q = dict(m.named_parameters())["l1.weight"], ref.l1.weight
    ema, acc, buf = torch.zeros(p.shape), torch.zeros(p.shape), torch.empty(p.shape)
    ema.mul_(0.9).add_(p.data, alpha=0.1)
    acc.add_(p.grad)
    torch.mul(p.grad, 2, out=buf)
    torch.testing.assert_close(ema, 0.1 * q.detach(), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(acc, q.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(buf, 2 * q.grad, rtol=1e-5, atol=1e-6)
    assert int(p.data[0, 0] > 0) == int(q[0, 0] > 0)
    with pytest.raises(RuntimeError, match="would not reach the module"):
        torch.mul(ema, 2, out=p.grad)
    with pytest.raises(RuntimeError, match="would not reach the module"):
        g = p.grad
        g += 1


def test_move_to_where_the_module_is_keeps_grad_and_optimizer_state():
    """model.to("tt") on a module already there (every epoch, as torch code does) moves nothing:
    .grad and the momentum buffers stay, and training matches torch's."""
    ref, m = _pair()
    opt = ttd.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    torch.manual_seed(1)
    for _ in range(3):
        x, y = torch.randn(8, 16), torch.randn(8, 4)
        m.to("tt")
        m.to("tt:0")
        F.mse_loss(m(x.to("tt")).cpu(), y).backward()
        F.mse_loss(ref(x), y).backward()
        m.to("tt")
        grad = dict(m.named_parameters())["l2.bias"].grad
        torch.testing.assert_close(grad, ref.l2.bias.grad, rtol=1e-5, atol=1e-6)
        opt.step(), ref_opt.step()
        opt.zero_grad(), ref_opt.zero_grad()
    for k, v in ref.state_dict().items():
        torch.testing.assert_close(m.state_dict()[k], v, rtol=1e-5, atol=1e-6)


def test_module_to_tt_with_a_dtype_converts_as_torchs():
    """module.to("tt", torch.bfloat16) and module.to(device="tt", dtype=...) convert the
    parameters as torch's does, and compile for the card."""
    for move in (lambda mod: mod.to("tt", torch.bfloat16), lambda mod: mod.to(device="tt", dtype=torch.bfloat16)):
        mod = torch.nn.Linear(4, 2)
        assert move(mod) is mod
        assert mod.weight.dtype == torch.bfloat16
        m = ttd.compile(mod)
        assert str(next(m.parameters()).device) == "tt:0"
        assert m.state_dict()["weight"].dtype == torch.bfloat16


def test_dropout_of_one_drops_everything_as_torchs():
    """nn.Dropout(1.0) in training zeroes its output and the gradient through it, as torch's."""
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Dropout(1.0))
    m = ttd.compile(copy.deepcopy(ref)).to("tt")
    x = torch.randn(5, 4)
    out = m(x.to("tt")).cpu()
    assert torch.equal(out, torch.zeros(5, 3))
    out.sum().backward()
    ref(x).sum().backward()
    assert torch.equal(dict(m.named_parameters())["0.weight"].grad * 1, ref[0].weight.grad)
