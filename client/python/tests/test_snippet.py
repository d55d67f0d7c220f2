"""The proposal's snippet (issue 17) as written, checked against the same module in plain torch."""
import copy

import torch

import ttd.torch as ttd


class MNISTLinear(torch.nn.Module):
    def __init__(self):
        super().__init__(); self.l1 = torch.nn.Linear(784, 10)

    def forward(self, x):
        return torch.nn.functional.softmax(self.l1(x), dim=-1)


def test_snippet_grads_and_sgd_match_torch():
    """backward reaches the card (.grad = torch's) and SGD steps there as torch.optim.SGD does."""
    torch.manual_seed(0)
    target = torch.rand(1, 10)
    cpu_input = torch.rand(1, 784)

    # --- the snippet ---
    input_tensor = cpu_input.to("tt")
    framework_model = MNISTLinear()
    reference = copy.deepcopy(framework_model)
    tt_model = ttd.compile(framework_model)
    tt_model.to("tt")
    loss = torch.nn.L1Loss()
    model_out = tt_model(input_tensor)
    model_out_cpu = model_out.to("cpu")
    loss_out_cpu = loss(model_out_cpu, target)
    loss_out_cpu.backward()
    grads = {n: p.grad for n, p in tt_model.named_parameters()}
    opt = ttd.optim.SGD(tt_model.parameters(), lr=0.1)
    opt.step(); opt.zero_grad()
    # --- end of the snippet ---

    ref_out = reference(cpu_input)
    ref_loss = torch.nn.L1Loss()(ref_out, target)
    ref_loss.backward()
    assert torch.allclose(model_out_cpu, ref_out, atol=1e-6)
    assert abs(loss_out_cpu.item() - ref_loss.item()) < 1e-6
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for name, p in reference.named_parameters():
        assert grads[name] is not None, name
        assert torch.allclose(grads[name], p.grad, atol=1e-5), name
    ref_opt.step()
    for name, p in reference.named_parameters():
        assert torch.allclose(dict(tt_model.named_parameters())[name].cpu(), p.detach(), atol=1e-5), name
        assert torch.count_nonzero(dict(tt_model.named_parameters())[name].grad) == 0, name


def test_module_to_tt_before_compile():
    """framework_model.to("tt") then compile puts the compiled module on the card."""
    m = MNISTLinear().to("tt")
    tt_model = ttd.compile(m)
    out = tt_model(torch.rand(2, 784).to("tt"))
    assert isinstance(out, ttd.Tensor) and str(out.device) == "tt:0" and out.shape == (2, 10)


def test_unsupported_op_fails_at_compile():
    """An op ttd.compile does not map fails at compile time naming the op, the node and the
    line of forward that made it."""
    class M(torch.nn.Module):
        def forward(self, x):
            return torch.sin(x)  # the line named
    import pytest
    with pytest.raises(NotImplementedError, match=r"sin.*node sin") as e:
        ttd.compile(M())
    assert "test_snippet.py" in str(e.value) and "the line named" in str(e.value), str(e.value)


def test_int64_indices_reach_an_embedding():
    """torch's int64 indices (what nn.Embedding takes) go to the card as int32."""
    emb = torch.nn.Embedding(10, 4)
    idx = torch.tensor([[1, 2, 9], [0, 3, 3]])
    m = ttd.compile(emb)
    m.to("tt")
    out = m(idx.to("tt")).to("cpu")
    assert torch.allclose(out, emb(idx).detach(), atol=1e-6)


class FunctionalMLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w1 = torch.nn.Parameter(torch.randn(16, 8) * 0.3)
        self.b1 = torch.nn.Parameter(torch.randn(16) * 0.1)
        self.l2 = torch.nn.Linear(16, 4)
        self.act = torch.nn.ReLU()

    def forward(self, x):
        h = torch.nn.functional.relu(torch.nn.functional.linear(x, self.w1, self.b1))
        return torch.softmax(self.l2(self.act(h)), dim=-1)


def _train_step(model, x, target, on_tt):
    out = model(x.to("tt")).to("cpu") if on_tt else model(x)
    loss = torch.nn.functional.mse_loss(out, target)
    loss.backward()
    return out, loss


def test_functional_forms_and_momentum_match_torch():
    """F.linear, F.relu, ReLU, torch.softmax: forward, .grad and two SGD+momentum steps as torch."""
    torch.manual_seed(1)
    ref = FunctionalMLP()
    tt_model = ttd.compile(copy.deepcopy(ref)).to("tt")
    opt = ttd.optim.SGD(tt_model.parameters(), lr=0.5, momentum=0.9, weight_decay=0.01, nesterov=True)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.5, momentum=0.9, weight_decay=0.01, nesterov=True)
    for _ in range(2):
        x, target = torch.randn(5, 8), torch.rand(5, 4)
        out, loss = _train_step(tt_model, x, target, True)
        ref_out, ref_loss = _train_step(ref, x, target, False)
        assert torch.allclose(out, ref_out, atol=1e-5)
        named = dict(tt_model.named_parameters())
        for n, p in ref.named_parameters():
            assert torch.allclose(named[n].grad, p.grad, atol=1e-5), n
        opt.step(); opt.zero_grad()
        ref_opt.step(); ref_opt.zero_grad()
    for n, p in ref.named_parameters():
        assert torch.allclose(dict(tt_model.named_parameters())[n].cpu(), p.detach(), atol=1e-5), n


def test_compiled_module_left_on_cpu_runs_on_cpu():
    """A compiled module not moved runs in process on CPU tensors and still backpropagates."""
    torch.manual_seed(2)
    ref = MNISTLinear()
    m = ttd.compile(copy.deepcopy(ref))
    x, target = torch.rand(3, 784), torch.rand(3, 10)
    out = m(x)
    assert not isinstance(out, ttd.Tensor) and out.shape == (3, 10)
    torch.nn.L1Loss()(out, target).backward()
    torch.nn.L1Loss()(ref(x), target).backward()
    for n, p in ref.named_parameters():
        assert torch.allclose(dict(m.named_parameters())[n].grad, p.grad, atol=1e-5), n


def test_no_grad_and_eval_keep_no_run():
    """Under torch.no_grad() or eval() a device output comes back as a plain tensor, no graph."""
    m = ttd.compile(MNISTLinear()).to("tt")
    x = torch.rand(1, 784).to("tt")
    with torch.no_grad():
        assert not m(x).to("cpu").requires_grad
    m.eval()
    assert not m(x).to("cpu").requires_grad
    m.train()
    assert m(x).to("cpu").requires_grad
