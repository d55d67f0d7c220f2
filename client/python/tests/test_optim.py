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


@pytest.mark.parametrize("run_first", [True, False])
@pytest.mark.parametrize("opt_name", ["sgd_momentum", "adam"])
def test_optimizer_state_dict_resumes(opt_name, run_first):
    """An optimizer's state_dict loaded into a fresh one continues as the original would, also
    loaded before the new module's first call (a restart: load both state dicts, then train)."""
    torch_cls, ttd_cls, kw = OPTIMIZERS[opt_name]
    ref, x, y = _mlp()
    a = ttd.compile(copy.deepcopy(ref)).to("tt")
    opt_a = ttd_cls(a.parameters(), **kw)
    train(a, opt_a, x, y, cross_entropy, 5, "tt")
    sd, msd = opt_a.state_dict(), a.state_dict()
    assert set(sd["state"]) == set(range(4)) and float(sd["state"][0]["step"]) == 5
    b = ttd.compile(copy.deepcopy(ref)).to("tt")
    b.load_state_dict(msd)
    if run_first:
        b(x.to("tt"))
    opt_b = ttd_cls(b.parameters(), **kw)
    opt_b.load_state_dict(sd)
    if not run_first:
        assert float(opt_b.state_dict()["state"][0]["step"]) == 5
    la = train(a, opt_a, x, y, cross_entropy, 5, "tt")
    lb = train(b, opt_b, x, y, cross_entropy, 5, "tt")
    assert la == lb


def _side_by_side(ref, tt_model, opts, loop):
    """loop(model, opt, device) run on the torch model with torch's optimizer and on the
    compiled one with ttd's (opts: (torch's class, ttd's class, keyword arguments))."""
    torch_cls, ttd_cls, kw = opts
    for model, cls, dev in ((ref, torch_cls, "cpu"), (tt_model, ttd_cls, "tt")):
        loop(model, cls, dev, kw)


@pytest.mark.parametrize("subset", [False, True])
@pytest.mark.parametrize("opts", [(torch.optim.SGD, ttd.optim.SGD, dict(lr=0.1, momentum=0.9, weight_decay=0.01)),
                                  (torch.optim.AdamW, ttd.optim.AdamW, dict(lr=0.05))])
def test_frozen_parameters_are_not_stepped(opts, subset):
    """A parameter frozen before compiling, or on the compiled module, gets no .grad and no
    step, as torch's; so does one left out of the optimizer (subset: only the trainable
    ones given); a parameter unfrozen later trains on as torch's does."""
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    ref[0].weight.requires_grad_(False)
    tt_model = ttd.compile(copy.deepcopy(ref)).to("tt")
    ref[2].weight.requires_grad_(False)
    dict(tt_model.named_parameters())["2.weight"].requires_grad = False
    x, y = torch.randn(8, 4), torch.randn(8, 2)
    results = []

    def loop(model, cls, dev, kw):
        opt = cls([p for p in model.parameters() if p.requires_grad or not subset], **kw)
        for i in range(6):
            if i == 3:
                dict(model.named_parameters())["2.weight"].requires_grad_(True)
            F.mse_loss(model(x.to(dev) if dev == "tt" else x).to("cpu"), y).backward()
            if i == 0:
                results.append([p.grad is None for p in model.parameters()])
            opt.step()
            model.zero_grad()
        results.append({k: v.detach().clone() for k, v in model.state_dict().items()})
    _side_by_side(ref, tt_model, opts, loop)
    assert results[2] == results[0] == [True, False, True, False]
    for k, v in results[1].items():
        torch.testing.assert_close(results[3][k], v, rtol=1e-5, atol=1e-6)


def _tanh_pair():
    """A 4-8-2 tanh MLP in torch and compiled onto the card, and a batch of 5 for it."""
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    return ref, ttd.compile(copy.deepcopy(ref)).to("tt"), torch.randn(5, 4), torch.randn(5, 2)


@pytest.mark.parametrize("zero_each_step", [True, False])
@pytest.mark.parametrize("opts", [(torch.optim.SGD, ttd.optim.SGD, dict(lr=0.1, momentum=0.9, weight_decay=0.01)),
                                  (torch.optim.Adam, ttd.optim.Adam, dict(lr=0.05))])
def test_parameter_frozen_after_it_had_a_grad_keeps_torchs_grad(opts, zero_each_step):
    """A parameter frozen once it has a .grad keeps that .grad through later backwards (zeros
    after zero_grad), and the optimizer steps it with that .grad (momentum, weight decay and
    Adam's moments still move it), as torch's; unfrozen, it trains on as torch's."""
    ref, tt_model, x, y = _tanh_pair()
    results = []

    def loop(model, cls, dev, kw):
        opt = cls(model.parameters(), **kw)
        w = dict(model.named_parameters())["0.weight"]
        grads = []
        for i in range(6):
            if i in (2, 4):
                w.requires_grad_(i == 4)
            if zero_each_step or i == 2:
                opt.zero_grad()
            F.mse_loss(model(x.to(dev) if dev == "tt" else x).to("cpu"), y).backward()
            grads.append(w.grad.detach().clone())
            opt.step()
        results.append((grads, {k: v.detach().clone() for k, v in model.state_dict().items()}))
    _side_by_side(ref, tt_model, opts, loop)
    (want_grads, want), (got_grads, got) = results
    for i, (g, wg) in enumerate(zip(got_grads, want_grads)):
        torch.testing.assert_close(g, wg, rtol=1e-5, atol=1e-6, msg=f"step {i}")
    for k, v in want.items():
        torch.testing.assert_close(got[k], v, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("opts", [(torch.optim.SGD, ttd.optim.SGD, dict(lr=0.1, momentum=0.9)),
                                  (torch.optim.Adam, ttd.optim.Adam, dict(lr=0.05))])
def test_step_skips_parameters_without_grad(opts):
    """After zero_grad(set_to_none=True), a step with no backward moves nothing, and one after a
    backward that reached only some parameters moves only those, as torch's; a parameter
    skipped for a while resumes with its own optimizer state."""
    class Two(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(6, 3), torch.nn.Linear(6, 3)

        def forward(self, x):
            return self.a(x), self.b(x)

    torch.manual_seed(0)
    ref = Two()
    tt_model = ttd.compile(copy.deepcopy(ref)).to("tt")
    x, y = torch.randn(8, 6), torch.randn(8, 3)
    results = []

    def loop(model, cls, dev, kw):
        opt = cls(model.parameters(), **kw)
        for k in (0, 1, 1, None, 1, 0, 0):
            if k is not None:
                F.mse_loss(model(x.to(dev) if dev == "tt" else x)[k].to("cpu"), y).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        results.append({k: v.detach().clone() for k, v in model.state_dict().items()})
    _side_by_side(ref, tt_model, opts, loop)
    for k, v in results[0].items():
        torch.testing.assert_close(results[1][k], v, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("opts,schedule", [
    ((torch.optim.SGD, ttd.optim.SGD, dict(lr=0.1, momentum=0.9)),
     lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=0.1, total_steps=12)),
    ((torch.optim.Adam, ttd.optim.Adam, dict(lr=0.01)),
     lambda o: torch.optim.lr_scheduler.CyclicLR(o, 0.001, 0.01, step_size_up=3, cycle_momentum=False)),
    ((torch.optim.SGD, ttd.optim.SGD, dict(lr=0.05)), None),
    ((torch.optim.Adam, ttd.optim.Adam, dict(lr=0.01)), None)])
def test_param_group_changes_reach_the_card(opts, schedule):
    """momentum, betas and weight_decay changed in param_groups (by a scheduler, by hand, by
    load_state_dict) step as torch's do."""
    ref, x, y = _mlp()
    tt_model = ttd.compile(copy.deepcopy(ref)).to("tt")
    results = []

    def loop(model, cls, dev, kw):
        opt = cls(model.parameters(), **kw)
        sched = schedule(opt) if schedule else None
        for i in range(12):
            F.cross_entropy(model(x.to(dev) if dev == "tt" else x).to("cpu"), y).backward()
            opt.step()
            opt.zero_grad()
            if sched is not None:
                sched.step()
            elif i == 3:
                opt.param_groups[0]["weight_decay"] = 0.1
                if "momentum" in opt.param_groups[0]:
                    opt.param_groups[0]["momentum"] = 0.5
                else:
                    opt.param_groups[0]["betas"] = (0.5, 0.9)
            elif i == 7:
                sd = opt.state_dict()
                sd["param_groups"][0]["weight_decay"] = 0.0
                opt.load_state_dict(sd)
        results.append({k: v.detach().clone() for k, v in model.state_dict().items()})
    _side_by_side(ref, tt_model, opts, loop)
    for k, v in results[0].items():
        torch.testing.assert_close(results[1][k], v, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("cls,flag", [(ttd.optim.SGD, "maximize"), (ttd.optim.SGD, "differentiable"),
                                      (ttd.optim.Adam, "amsgrad"), (ttd.optim.AdamW, "maximize"),
                                      (ttd.optim.Adam, "fused")])
def test_param_group_flags_checked_as_keywords(cls, flag):
    """A flag the card lacks is refused in a parameter group as in the keyword form, and a
    bad value in a group raises torch's ValueError."""
    m = ttd.compile(MLP(False))
    with pytest.raises(NotImplementedError, match=f"{flag}.*not supported"):
        cls(m.parameters(), lr=0.1, **{flag: True})
    with pytest.raises(NotImplementedError, match=f"{flag}.*not supported"):
        cls([{"params": m.parameters(), flag: True}], lr=0.1)
    with pytest.raises(ValueError, match="Invalid weight_decay value"):
        cls([{"params": m.parameters(), "weight_decay": -1.0}], lr=0.1)
    with pytest.raises(NotImplementedError, match="one parameter group"):
        params = list(m.parameters())
        cls([{"params": params[:2]}, {"params": params[2:], "lr": 0.01}], lr=0.1)


def test_each_optimizer_has_its_own_state():
    """A new optimizer over a module starts from no state, as torch's, whatever the old one
    left (also of another kind); two optimizers used in turn each continue from their own."""
    ref, tt_model, x, y = _tanh_pair()
    results = []

    def loop(model, cls, dev, kw):
        adam = torch.optim.Adam if dev == "cpu" else ttd.optim.Adam
        sgd = torch.optim.SGD if dev == "cpu" else ttd.optim.SGD
        run = lambda o: (o.zero_grad(), F.mse_loss(model(x.to(dev) if dev == "tt" else x).to("cpu"), y).backward(),
                         o.step())
        first = sgd(model.parameters(), lr=0.05, momentum=0.9)
        for _ in range(3):
            run(first)
        fresh = adam(model.parameters(), lr=0.01)  # replaces it: no moments, step 1 next
        for _ in range(2):
            run(fresh)
        other = sgd(model.parameters(), lr=0.02, momentum=0.5)
        for _ in range(3):  # in turn: each continues from its own state
            run(fresh), run(other)
        results.append(({k: v.detach().clone() for k, v in model.state_dict().items()},
                        float(fresh.state_dict()["state"][0]["step"])))
    _side_by_side(ref, tt_model, (None, None, {}), loop)
    (want, want_step), (got, got_step) = results
    assert got_step == want_step == 5
    for k, v in want.items():
        torch.testing.assert_close(got[k], v, rtol=1e-5, atol=1e-6)


def test_momentum_set_to_zero_keeps_its_buffer_as_torchs():
    """param_groups' momentum set to 0 for some steps, then back: the momentum buffer waits, and
    resumes as torch's does (not restarted from the gradient)."""
    ref, tt_model, x, y = _tanh_pair()
    results = []

    def loop(model, cls, dev, kw):
        opt = cls(model.parameters(), lr=0.1, momentum=0.9, dampening=0.2)
        for m in (0.9, 0.9, 0.0, 0.0, 0.9, 0.9):
            opt.param_groups[0]["momentum"] = m
            opt.zero_grad()
            F.mse_loss(model(x.to(dev) if dev == "tt" else x).to("cpu"), y).backward()
            opt.step()
        results.append({k: v.detach().clone() for k, v in model.state_dict().items()})
    _side_by_side(ref, tt_model, (torch.optim.SGD, ttd.optim.SGD, {}), loop)
    for k, v in results[0].items():
        torch.testing.assert_close(results[1][k], v, rtol=1e-5, atol=1e-6)
