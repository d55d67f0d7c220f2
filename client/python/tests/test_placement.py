"""Where a tensor or module lives: "tt:N", "tt:N/l1", moves between them with no host trip,
and one compiled module serving other batch sizes with the same parameters. The test ttd
has two cards (conftest)."""
import copy

import pytest
import torch
import torch.nn.functional as F

import ttd.torch as ttd


@pytest.mark.parametrize("where", ["tt:0/l1", "tt:1", "tt:1/l1"])
def test_places_and_moves_between_them(where):
    """A tensor on another card or in L1 names its place, and moves there and back exactly."""
    x = torch.randn(5, 6)
    d = x.to(where)
    assert str(d.device) == where
    back = d.to("tt:0")
    assert str(back.device) == "tt:0"
    assert torch.equal(back.to("cpu"), x) and torch.equal(d.cpu(), x)


def test_module_on_the_second_card_trains_as_torch():
    """model.to("tt:1"): the run, its gradients and the step happen on card 1."""
    torch.manual_seed(0)
    ref = torch.nn.Linear(6, 3)
    cm = ttd.compile(copy.deepcopy(ref)).to("tt:1")
    opt, ref_opt = ttd.optim.SGD(cm.parameters(), lr=0.1), torch.optim.SGD(ref.parameters(), lr=0.1)
    x, t = torch.randn(4, 6), torch.randn(4, 3)
    for _ in range(3):
        out = cm(x.to("tt:1"))
        assert str(out.device) == "tt:1"
        F.mse_loss(out.to("cpu"), t).backward()
        opt.step(), opt.zero_grad()
        F.mse_loss(ref(x), t).backward()
        ref_opt.step(), ref_opt.zero_grad()
    for name, p in cm.named_parameters():
        assert str(p.device) == "tt:1"
        torch.testing.assert_close(p.data, dict(ref.named_parameters())[name].data, rtol=1e-5, atol=1e-6)


def test_train_at_64_predict_one_with_the_same_module():
    """Training at batch 64, predicting a single sample, and a last partial batch of 10 use
    one module and one set of parameters, matching torch throughout."""
    torch.manual_seed(1)
    ref = torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.ReLU(), torch.nn.Linear(32, 5))
    cm = ttd.compile(copy.deepcopy(ref)).to("tt")
    opt, ref_opt = ttd.optim.SGD(cm.parameters(), lr=0.05), torch.optim.SGD(ref.parameters(), lr=0.05)
    params = list(cm.parameters())
    for n in (64, 64, 10, 64):
        x, y = torch.randn(n, 20), torch.randint(0, 5, (n,))
        F.cross_entropy(cm(x.to("tt")).to("cpu"), y).backward()
        opt.step(), opt.zero_grad()
        F.cross_entropy(ref(x), y).backward()
        ref_opt.step(), ref_opt.zero_grad()
        one = torch.randn(1, 20)
        cm.eval(), ref.eval()
        with torch.no_grad():
            got = cm(one.to("tt")).to("cpu")
            assert got.shape == (1, 5)
            torch.testing.assert_close(got, ref(one), rtol=1e-4, atol=1e-5)
        cm.train(), ref.train()
    assert list(cm.parameters()) == params
    for name, p in cm.named_parameters():
        torch.testing.assert_close(p.data, dict(ref.named_parameters())[name].data, rtol=1e-4, atol=1e-5)
