"""ttd.optim's SGD, Adam and AdamW stepping on the card, against torch.optim on the CPU: learning rates
changed between steps, schedulers, arguments, zero_grad and state_dict (whole models trained 20
steps: test_parity.py)."""
import copy

import pytest
import torch
import torch.nn.functional as F

import ttd.torch as ttd
from training import MLP, OPTIMIZERS, assert_trains_as_torch, cross_entropy, train


def _mlp():
    """The MLP (seed 0), a batch of 8 and its labels."""
    torch.manual_seed(0)
    model, x = MLP(False), torch.randn(8, 32)
    return model, x, torch.randint(0, 10, (8,))


@pytest.mark.parametrize("opt_name", ["sgd_momentum", "adam"])
def test_lr_change_between_steps(opt_name):
    """param_groups[0]["lr"] set between steps (a scheduler's job) matches torch."""
    model, x, y = _mlp()
    assert_trains_as_torch(model, x, y, cross_entropy, opt_name, steps=12, lr_at={4: 0.02, 8: 0.001})


def test_step_lr_scheduler():
    """torch's StepLR drives a ttd optimizer as it drives torch's."""
    ref, x, y = _mlp()
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
    ref, x, y = _mlp()
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
    ref, x, y = _mlp()
    a = ttd.compile(copy.deepcopy(ref)).to("tt")
    opt_a = ttd_cls(a.parameters(), **kw)
    train(a, opt_a, x, y, cross_entropy, 5, "tt")
    sd, msd = opt_a.state_dict(), a.state_dict()
    assert set(sd["state"]) == set(range(4)) and float(sd["state"][0]["step"]) == 5
    b = ttd.compile(copy.deepcopy(ref)).to("tt")
    b.load_state_dict(msd)
    b(x.to("tt"))
    opt_b = ttd_cls(b.parameters(), **kw)
    opt_b.load_state_dict(sd)
    la = train(a, opt_a, x, y, cross_entropy, 5, "tt")
    lb = train(b, opt_b, x, y, cross_entropy, 5, "tt")
    assert la == lb
