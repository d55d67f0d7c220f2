"""ttd.optim's SGD, Adam and AdamW stepping on the card, against torch.optim on the CPU."""
import copy

import pytest
import torch
import torch.nn.functional as F

import ttd.torch as ttd


class MNISTLinear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = torch.nn.Linear(784, 10)

    def forward(self, x):
        return F.softmax(self.l1(x), dim=-1)


class MLP(torch.nn.Module):
    def __init__(self, softmax):
        super().__init__()
        self.l1, self.relu, self.l2 = torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)
        self.softmax = softmax

    def forward(self, x):
        y = self.l2(self.relu(self.l1(x)))
        return F.softmax(y, dim=-1) if self.softmax else y


# Settings where 20 steps stay well-conditioned: with L1 on MNISTLinear's softmax, Adam with
# betas (0.8, 0.99) amplifies float32 rounding (1e-7) exponentially from step 12 on, in torch
# against itself on another summation order as much as against the card.
OPTIMIZERS = {
    "sgd": (torch.optim.SGD, ttd.optim.SGD, dict(lr=0.1)),
    "sgd_momentum": (torch.optim.SGD, ttd.optim.SGD, dict(lr=0.05, momentum=0.9, weight_decay=1e-3)),
    "sgd_nesterov": (torch.optim.SGD, ttd.optim.SGD, dict(lr=0.05, momentum=0.9, nesterov=True)),
    "adam": (torch.optim.Adam, ttd.optim.Adam, dict(lr=1e-2)),
    "adam_wd": (torch.optim.Adam, ttd.optim.Adam, dict(lr=5e-3, betas=(0.85, 0.99), weight_decay=1e-2)),
    "adamw": (torch.optim.AdamW, ttd.optim.AdamW, dict(lr=1e-2)),
}


def _modules(name):
    torch.manual_seed(0)
    if name == "mnist":
        return MNISTLinear(), torch.rand(8, 784), "l1"
    return MLP(softmax=name == "mlp_softmax"), torch.randn(8, 32), "ce"


def _train(model, opt, x, y, loss_kind, steps, device, lr_at=None):
    losses = []
    for step in range(steps):
        if lr_at and step in lr_at:
            opt.param_groups[0]["lr"] = lr_at[step]
        out = model(x.to(device) if device == "tt" else x)
        out = out.to("cpu")
        loss = F.l1_loss(out, y) if loss_kind == "l1" else F.cross_entropy(out, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def _parity(model_name, opt_name, steps=20, lr_at=None):
    ref, x, loss_kind = _modules(model_name)
    torch.manual_seed(1)
    y = torch.rand(8, 10) if loss_kind == "l1" else torch.randint(0, 10, (8,))
    tt_model = ttd.compile(copy.deepcopy(ref)).to("tt")
    torch_cls, ttd_cls, kw = OPTIMIZERS[opt_name]
    ref_losses = _train(ref, torch_cls(ref.parameters(), **kw), x, y, loss_kind, steps, "cpu", lr_at)
    tt_losses = _train(tt_model, ttd_cls(tt_model.parameters(), **kw), x, y, loss_kind, steps, "tt", lr_at)
    torch.testing.assert_close(torch.tensor(tt_losses), torch.tensor(ref_losses), rtol=1e-4, atol=1e-6)
    got, want = tt_model.state_dict(), ref.state_dict()
    assert list(got) == list(want)
    for k in want:  # relative 1e-4 of the tensor's scale: Adam moves near-zero entries by ~lr whatever
        # their gradient's rounding, so an entry-wise rtol alone cannot hold there
        atol = 1e-4 * want[k].abs().max().item()
        torch.testing.assert_close(got[k], want[k], rtol=1e-4, atol=atol, msg=lambda m: f"{k}: {m}")


@pytest.mark.parametrize("opt_name", list(OPTIMIZERS))
@pytest.mark.parametrize("model_name", ["mnist", "mlp", "mlp_softmax"])
def test_parity_with_torch_optim(model_name, opt_name):
    """20 steps through ttd match torch.optim on the CPU: each loss and every parameter."""
    _parity(model_name, opt_name)


@pytest.mark.parametrize("opt_name", ["sgd_momentum", "adam"])
def test_lr_change_between_steps(opt_name):
    """param_groups[0]["lr"] set between steps (a scheduler's job) matches torch."""
    _parity("mlp", opt_name, steps=12, lr_at={4: 0.02, 8: 0.001})


def test_step_lr_scheduler():
    """torch's StepLR drives a ttd optimizer as it drives torch's."""
    ref, x, _ = _modules("mlp")
    y = torch.randint(0, 10, (8,))
    tt_model = ttd.compile(copy.deepcopy(ref)).to("tt")
    losses = []
    for model, cls, dev in ((ref, torch.optim.SGD, "cpu"), (tt_model, ttd.optim.SGD, "tt")):
        opt = cls(model.parameters(), lr=0.2, momentum=0.5)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
        run = []
        for _ in range(10):
            loss = F.cross_entropy(model(x.to(dev) if dev == "tt" else x).to("cpu"), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            sched.step()
            run.append(loss.item())
        losses.append(run)
        assert opt.param_groups[0]["lr"] == pytest.approx(0.2 * 0.5 ** 3)
    torch.testing.assert_close(torch.tensor(losses[1]), torch.tensor(losses[0]), rtol=1e-4, atol=1e-6)


def test_argument_errors_are_value_errors():
    """Bad arguments raise ValueError with torch.optim's messages, or libttclient's."""
    m = ttd.compile(MLP(False)).to("tt")
    with pytest.raises(ValueError, match="Invalid learning rate: -1"):
        ttd.optim.SGD(m.parameters(), lr=-1)
    with pytest.raises(ValueError, match="Invalid momentum value"):
        ttd.optim.SGD(m.parameters(), lr=0.1, momentum=-0.5)
    with pytest.raises(ValueError, match="Nesterov momentum requires"):
        ttd.optim.SGD(m.parameters(), lr=0.1, nesterov=True)
    with pytest.raises(ValueError, match="required optimization parameter lr"):
        ttd.optim.SGD(m.parameters())
    with pytest.raises(ValueError, match="Invalid beta parameter at index 1: 1"):
        ttd.optim.Adam(m.parameters(), betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="Invalid epsilon value"):
        ttd.optim.AdamW(m.parameters(), eps=-1)
    m(torch.randn(2, 32).to("tt"))  # built: the card checks too (eps > 0, finite values)
    with pytest.raises(ValueError, match="eps"):
        ttd.optim.Adam(m.parameters(), eps=0.0)
    opt = ttd.optim.SGD(m.parameters(), lr=0.1)
    opt.param_groups[0]["lr"] = float("nan")
    with pytest.raises(ValueError):
        opt.step()


def test_adamw_default_weight_decay_is_torchs():
    m = ttd.compile(MLP(False))
    assert ttd.optim.AdamW(m.parameters()).defaults["weight_decay"] == 1e-2
    assert torch.optim.AdamW(MLP(False).parameters()).defaults["weight_decay"] == 1e-2


def test_zero_grad_set_to_none():
    """zero_grad() leaves zeros (torch 1.13's default); set_to_none=True leaves None until the
    next backward, which then accumulates from zero."""
    ref, x, _ = _modules("mlp")
    y = torch.randint(0, 10, (8,))
    m = ttd.compile(copy.deepcopy(ref)).to("tt")
    opt = ttd.optim.SGD(m.parameters(), lr=0.1)
    F.cross_entropy(m(x.to("tt")).to("cpu"), y).backward()
    F.cross_entropy(ref(x), y).backward()
    for p, q in zip(m.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6)
    opt.zero_grad()
    assert all(torch.count_nonzero(p.grad) == 0 for p in m.parameters())
    opt.zero_grad(set_to_none=True)
    assert all(p.grad is None for p in m.parameters())
    F.cross_entropy(m(x.to("tt")).to("cpu"), y).backward()
    for p, q in zip(m.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6)
    m.zero_grad(set_to_none=True)
    assert all(p.grad is None for p in m.parameters())


@pytest.mark.parametrize("opt_name", ["sgd_momentum", "adam"])
def test_optimizer_state_dict_resumes(opt_name):
    """An optimizer's state_dict loaded into a fresh one continues as the original would."""
    torch_cls, ttd_cls, kw = OPTIMIZERS[opt_name]
    ref, x, _ = _modules("mlp")
    y = torch.randint(0, 10, (8,))
    a = ttd.compile(copy.deepcopy(ref)).to("tt")
    opt_a = ttd_cls(a.parameters(), **kw)
    _train(a, opt_a, x, y, "ce", 5, "tt")
    sd, msd = opt_a.state_dict(), a.state_dict()
    assert set(sd["state"]) == set(range(4)) and float(sd["state"][0]["step"]) == 5
    b = ttd.compile(copy.deepcopy(ref)).to("tt")
    b.load_state_dict(msd)
    b(x.to("tt"))
    opt_b = ttd_cls(b.parameters(), **kw)
    opt_b.load_state_dict(sd)
    la = _train(a, opt_a, x, y, "ce", 5, "tt")
    lb = _train(b, opt_b, x, y, "ce", 5, "tt")
    assert la == lb
