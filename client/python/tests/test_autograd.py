"""Backward across the host/device boundary, against plain torch on the CPU."""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import ttd.torch as ttd


def _pair(seed=0):
    torch.manual_seed(seed)
    ref = torch.nn.Linear(784, 10)
    cm = ttd.compile(copy.deepcopy(ref).to("tt"))
    return ref, cm


def _grads_match(ref, cm):
    for name, p in ref.named_parameters():
        got = dict(cm.named_parameters())[name].grad
        assert got is not None, name
        torch.testing.assert_close(got, p.grad, rtol=1e-4, atol=1e-5)


def test_output_consumed_twice_on_the_cpu():
    """y = out.to("cpu") used by two losses: the card gets the summed gradient, as torch's."""
    ref, cm = _pair()
    x = torch.randn(4, 784)
    y = cm(x.to("tt")).to("cpu")
    (y.pow(2).mean() + y.sin().sum()).backward()
    r = ref(x)
    (r.pow(2).mean() + r.sin().sum()).backward()
    _grads_match(ref, cm)


def test_output_downloaded_twice():
    """out.to("cpu") called twice, both copies in the loss: gradients summed, as torch's."""
    ref, cm = _pair(1)
    x = torch.randn(4, 784)
    out = cm(x.to("tt"))
    a, b = out.to("cpu"), out.to("cpu")
    assert a is not b and torch.equal(a, b)
    (a.pow(2).mean() + 3 * b.sum()).backward()
    r = ref(x)
    (r.pow(2).mean() + 3 * r.sum()).backward()
    _grads_match(ref, cm)


def test_downloads_are_independent_copies():
    """An in-place change to one download leaves the next one's values as the card's."""
    _, cm = _pair(2)
    out = cm(torch.randn(2, 784).to("tt"))
    a = out.to("cpu")
    first = a.detach().clone()
    with torch.no_grad():
        a.mul_(0)
    assert torch.equal(out.to("cpu"), first)


def test_second_backward_through_a_released_run_says_so():
    """A second backward through the same graph raises, as torch's does without retain_graph."""
    _, cm = _pair(3)
    y = cm(torch.randn(2, 784).to("tt")).to("cpu")
    loss = y.pow(2).sum()
    loss.backward()
    with pytest.raises(RuntimeError, match="second time"):
        loss.backward()


def test_saved_tensor_hooks_leave_training_unchanged():
    """Under torch.autograd.graph.save_on_cpu (saved-tensor hooks hand backward other tensor
    objects than the ones saved), a card module gets the same .grad as without."""
    ref, cm = _pair(13)
    x = torch.randn(3, 784)
    with torch.autograd.graph.save_on_cpu():
        cm(x.to("tt")).to("cpu").pow(2).sum().backward()
    ref(x).pow(2).sum().backward()
    _grads_match(ref, cm)


def test_cpu_layer_upstream_of_the_card_trains():
    """A CPU nn.Linear feeding x.to("tt") into a compiled module: its .grad equals torch's."""
    torch.manual_seed(4)
    pre_ref, post_ref = torch.nn.Linear(32, 784), torch.nn.Linear(784, 10)
    pre = copy.deepcopy(pre_ref)
    cm = ttd.compile(copy.deepcopy(post_ref).to("tt"))
    x = torch.randn(4, 32)
    cm(pre(x).to("tt")).to("cpu").pow(2).mean().backward()
    post_ref(pre_ref(x)).pow(2).mean().backward()
    _grads_match(post_ref, cm)
    assert pre.weight.grad is not None, "no gradient reached the CPU layer upstream of the card"
    torch.testing.assert_close(pre.weight.grad, pre_ref.weight.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(pre.bias.grad, pre_ref.bias.grad, rtol=1e-4, atol=1e-5)


def _assert_same_grads(pairs):
    """Every (torch parameter, its twin: a torch parameter or a compiled module's) .grad equal."""
    for ref, got in pairs:
        assert got.grad is not None, "no gradient reached it"
        torch.testing.assert_close(got.grad, ref.grad, rtol=1e-4, atol=1e-5)


def _twins(ref_module, cm):
    got = dict(cm.named_parameters())
    return [(p, got[n]) for n, p in ref_module.named_parameters()]


def test_retain_graph_second_backward_as_torchs():
    """backward(retain_graph=True) then backward(): the gradients add up as torch's; a third
    raises torch's own error for a freed graph."""
    ref, cm = _pair(5)
    x = torch.randn(3, 784)
    loss = cm(x.to("tt")).to("cpu").pow(2).sum()
    loss.backward(retain_graph=True)
    loss.backward()
    r = ref(x).pow(2).sum()
    r.backward(retain_graph=True)
    r.backward()
    _grads_match(ref, cm)
    with pytest.raises(RuntimeError, match="second time"):
        loss.backward()


def test_card_module_between_two_cpu_modules():
    """CPU Linear -> card module -> CPU Linear -> loss: all three train as in torch."""
    torch.manual_seed(6)
    pre_ref, mid_ref, post_ref = torch.nn.Linear(8, 16), torch.nn.Linear(16, 12), torch.nn.Linear(12, 3)
    pre, post = copy.deepcopy(pre_ref), copy.deepcopy(post_ref)
    mid = ttd.compile(copy.deepcopy(mid_ref)).to("tt")
    x, t = torch.randn(5, 8), torch.randn(5, 3)
    F.mse_loss(post(mid(pre(x).to("tt")).to("cpu")), t).backward()
    F.mse_loss(post_ref(mid_ref(pre_ref(x))), t).backward()
    _assert_same_grads(list(zip(pre_ref.parameters(), pre.parameters())) + _twins(mid_ref, mid) +
                       list(zip(post_ref.parameters(), post.parameters())))


def test_two_card_modules_in_a_chain():
    """x.to("tt") -> module A -> module B on the card (no host trip between them) -> loss:
    both train as in torch, and a CPU leaf x that requires grad gets its gradient."""
    torch.manual_seed(7)
    a_ref, b_ref = torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.Tanh()), torch.nn.Linear(10, 4)
    a, b = ttd.compile(copy.deepcopy(a_ref)).to("tt"), ttd.compile(copy.deepcopy(b_ref)).to("tt")
    x = torch.randn(3, 6, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    h = a(x.to("tt"))
    assert h.device == "tt:0"
    F.l1_loss(b(h).to("cpu"), torch.zeros(3, 4)).backward()
    F.l1_loss(b_ref(a_ref(x_ref)), torch.zeros(3, 4)).backward()
    _assert_same_grads(_twins(a_ref, a) + _twins(b_ref, b) + [(x_ref, x)])


def test_device_tensor_fed_to_two_modules():
    """One device input used by two modules: its CPU source gets the summed gradient."""
    torch.manual_seed(8)
    r1, r2 = torch.nn.Linear(4, 2), torch.nn.Linear(4, 3)
    m1, m2 = ttd.compile(copy.deepcopy(r1)).to("tt"), ttd.compile(copy.deepcopy(r2)).to("tt")
    x = torch.randn(2, 4, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    xd = x.to("tt")
    (m1(xd).to("cpu").sum() + m2(xd).to("cpu").pow(2).sum()).backward()
    (r1(x_ref).sum() + r2(x_ref).pow(2).sum()).backward()
    _assert_same_grads(_twins(r1, m1) + _twins(r2, m2) + [(x_ref, x)])


class _TwoHeads(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body, self.h1, self.h2 = torch.nn.Linear(6, 8), torch.nn.Linear(8, 2), torch.nn.Linear(8, 3)

    def forward(self, x):
        z = torch.relu(self.body(x))
        return self.h1(z), self.h2(z)


@pytest.mark.parametrize("device", ["tt", "cpu"])
def test_two_outputs_of_one_run_in_one_loss(device):
    """Both outputs of one forward in one loss: one backward of the run, gradients as torch's;
    and only one of them used: the other sends nothing."""
    torch.manual_seed(9)
    ref = _TwoHeads()
    cm = ttd.compile(copy.deepcopy(ref)).to(device)
    x = torch.randn(4, 6)
    y1, y2 = cm(x.to(device))
    (y1.to("cpu").sum() * 2 + y2.to("cpu").pow(2).mean()).backward()
    r1, r2 = ref(x)
    (r1.sum() * 2 + r2.pow(2).mean()).backward()
    _assert_same_grads(_twins(ref, cm))
    cm.zero_grad()
    ref.zero_grad()
    _, y2 = cm(x.to(device))
    y2.to("cpu").sum().backward()
    ref(x)[1].sum().backward()
    _assert_same_grads(_twins(ref, cm))


def test_upstream_gradient_through_a_module_on_cpu():
    """A compiled module left on "cpu" passes its input gradient upstream as well."""
    torch.manual_seed(10)
    pre_ref, post_ref = torch.nn.Linear(5, 7), torch.nn.Linear(7, 2)
    pre, post = copy.deepcopy(pre_ref), ttd.compile(copy.deepcopy(post_ref))
    x = torch.randn(3, 5)
    post(pre(x)).pow(2).sum().backward()
    post_ref(pre_ref(x)).pow(2).sum().backward()
    _assert_same_grads(list(zip(pre_ref.parameters(), pre.parameters())) + _twins(post_ref, post))


def test_bfloat16_upload_passes_a_float_gradient_back():
    """x.to("tt", dtype=torch.bfloat16) of a float32 x that requires grad: x.grad is float32,
    and is d sum(x W^T + b) / dx = 1 W, whatever x's rounding, with W as the linear's bfloat16
    product reads it (rounded to bfloat16), not as the float32 parameter holds it."""
    torch.manual_seed(11)
    ref = torch.nn.Linear(4, 2)
    cm = ttd.compile(copy.deepcopy(ref)).to("tt")
    x = torch.randn(2, 4, requires_grad=True)
    cm(x.to("tt", dtype=torch.bfloat16)).to("cpu").sum().backward()
    assert x.grad is not None and x.grad.dtype == torch.float32
    w_read = ref.weight.detach().bfloat16().float()
    torch.testing.assert_close(x.grad, torch.ones(2, 2) @ w_read, rtol=1e-6, atol=1e-7)
    assert not torch.equal(w_read, ref.weight.detach())


def test_bfloat16_module_trains_on_the_card():
    """A module made bfloat16 (.to(torch.bfloat16)) compiles with bfloat16 parameters: its
    linears compute bfloat16 products on the card, its output and gradients are float32, SGD
    keeps the parameters bfloat16 (state_dict), and 10 steps follow float32 training from the
    same start within bfloat16's rounding."""
    torch.manual_seed(5)
    m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).to(torch.bfloat16)
    ref = copy.deepcopy(m).float()
    cm = ttd.compile(m).to("tt")
    opt, ref_opt = ttd.optim.SGD(cm.parameters(), lr=0.1), torch.optim.SGD(ref.parameters(), lr=0.1)
    x, t = torch.randn(32, 8), torch.randint(0, 4, (32,))
    for step in range(10):
        out = cm(x.to("tt")).to("cpu")
        assert out.dtype == torch.float32
        loss = F.cross_entropy(out, t)
        loss.backward()
        if step == 0:
            assert all(p.grad.dtype == torch.float32 for p in cm.parameters())
        opt.step()
        opt.zero_grad()
        ref_loss = F.cross_entropy(ref(x), t)
        ref_loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        assert abs(loss.item() - ref_loss.item()) <= 1e-3 * ref_loss.item(), (step, loss.item(), ref_loss.item())
    state = cm.state_dict()
    assert {v.dtype for v in state.values()} == {torch.bfloat16}
    for name, p in ref.named_parameters():
        torch.testing.assert_close(state[name].float(), p.detach(), rtol=2e-2, atol=2e-2)


def test_runs_live_as_long_as_torchs_graph():
    """A run's activations go when torch frees its graph: after a backward without
    retain_graph the module can move even with every loss still referenced; a retained graph
    keeps its run pending until the loss is dropped."""
    _, cm = _pair(12)
    x = torch.randn(2, 784)
    losses = []
    for _ in range(3):
        losses.append(cm(x.to("tt")).to("cpu").sum())
        losses[-1].backward()
    cm.to("cpu").to("tt")
    kept = cm(x.to("tt")).to("cpu").sum()
    kept.backward(retain_graph=True)
    with pytest.raises(ttd.TTError, match=r"forward run\(s\) pending"):
        cm.to("cpu")
    del kept
    cm.to("cpu")


@pytest.mark.parametrize("batch", [2, 40])  # an output of 1024 elements, and of 20480 (past _SMALL_OUTPUT)
def test_output_anchors_small_and_large_train_as_torch(batch):
    """A run's small output has an anchor of its own memory, a large one -0.0 expanded: both
    download the card's values, twice independently, and pass torch's gradient back."""
    torch.manual_seed(3)
    ref = torch.nn.Linear(8, 512)
    cm = ttd.compile(copy.deepcopy(ref).to("tt"))
    x = torch.randn(batch, 8)
    out = cm(x.to("tt"))
    a = out.to("cpu")
    with torch.no_grad():
        b = out.to("cpu").mul_(0)  # an in-place change to one download only
    torch.testing.assert_close(a, ref(x), rtol=1e-5, atol=1e-5)
    assert not torch.equal(a, b)
    (a * a).sum().backward()
    r = ref(x)
    (r * r).sum().backward()
    _grads_match(ref, cm)


def test_download_in_the_graph_keeps_every_bit():
    """A download that joins torch's graph carries the card's values bit for bit (-0.0, inf,
    NaN, denormals included) and passes the gradient back."""
    x = torch.tensor([[-0.0, 0.0, float("inf"), float("-inf"), float("nan"), 1e-45, -3.5]], requires_grad=True)
    y = x.to("tt").to("cpu")
    assert y.requires_grad
    assert torch.equal(y.detach().view(torch.int32), x.detach().view(torch.int32))
    (y * torch.arange(7.0)).sum().backward()  # NaN loss, finite gradient
    assert torch.equal(x.grad, torch.arange(7.0).unsqueeze(0))


def test_autograd_grad_and_create_graph_through_a_module_raise():
    """torch.autograd.grad (which leaves parameters' .grad alone) and create_graph=True (double
    backward) through a compiled module raise saying what to do, before any .grad changes."""
    c = ttd.compile(nn.Linear(6, 1)).to("tt")
    x = torch.randn(8, 6, requires_grad=True)
    out = c(x.to("tt")).cpu().sum()
    with pytest.raises(RuntimeError, match=r"torch.autograd.grad .* not supported.*call loss.backward\(\)"):
        torch.autograd.grad(out, x, retain_graph=True)
    with pytest.raises(RuntimeError, match=r"create_graph=True .* not supported.*on the CPU"):
        torch.autograd.grad(out, x, create_graph=True)
    assert next(c.parameters()).grad is None


def test_eval_module_passes_gradients_to_its_inputs():
    """A frozen network in eval() between a trainable CPU layer and the loss passes the
    gradient through as torch's does; with dropout it raises saying what to do."""
    torch.manual_seed(0)
    gen, net = nn.Linear(4, 6), nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 2)).eval()
    for p in net.parameters():
        p.requires_grad_(False)
    c = ttd.compile(copy.deepcopy(net)).to("tt").eval()
    x = torch.randn(3, 4)
    c(gen(x).to("tt")).cpu().square().sum().backward()
    got = gen.weight.grad.clone()
    gen.weight.grad = None
    net(gen(x)).square().sum().backward()
    torch.testing.assert_close(got, gen.weight.grad, rtol=1e-5, atol=1e-6)
    d = ttd.compile(nn.Sequential(nn.Linear(6, 2), nn.Dropout(0.5))).to("tt").eval()
    with pytest.raises(RuntimeError, match=r"in eval\(\) and has dropout.*call .train\(\).*torch.no_grad\(\)"):
        d(gen(x).to("tt"))
    with torch.no_grad():
        d(gen(x).to("tt"))
    assert not c(x.new_ones(3, 6).to("tt")).cpu().requires_grad  # no input takes a gradient: no run


def test_backward_of_a_forward_older_than_a_step_raises():
    """A forward, then a step (after another run's backward), then the first forward's backward
    raises as torch's does ("modified by an inplace operation"), on the card and on the CPU."""
    for device in ("tt", "cpu"):
        _, cm = _pair(3)
        cm.to(device)
        opt = ttd.optim.SGD(cm.parameters(), lr=0.1)
        x = torch.randn(2, 784)
        first = cm(x.to(device) if device == "tt" else x).to("cpu").sum()
        cm(x.to(device) if device == "tt" else x).to("cpu").sum().backward()
        opt.step()
        with pytest.raises(RuntimeError, match="parameters were changed after its forward"):
            first.backward()
