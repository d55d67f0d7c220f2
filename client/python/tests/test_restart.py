"""Training across `systemctl restart ttd`: a ttd with --state-dir saves every session at a
graceful stop and reads it back at start; libttclient resumes the session by itself, so a
PyTorch training loop only pauses, and finishes with the losses and parameters, bit for bit,
of a loop that was never interrupted."""
import copy
import pytest
import torch

import ttd.torch as ttd

from conftest import private_ttd_session
from training import MLP

STEPS = 8


@pytest.fixture
def saving_ttd():
    """A ttd of this test's own that saves its state at a graceful stop."""
    with private_ttd_session(("--state-dir", "{dir}/state")) as state:
        yield state


def _train(model, x, y, restart_before=(), restart_inside=(), restart=None):
    """STEPS of forward on the card, cross-entropy on the CPU, backward, Adam on the card.
    restart_before: steps before which ttd restarts; restart_inside: steps at which it restarts
    between the forward and the backward (the run waits on the card for its gradient)."""
    tt_model = ttd.compile(model).to("tt")
    opt = ttd.optim.Adam(tt_model.parameters(), lr=1e-2)
    losses = []
    for step in range(STEPS):
        if step in restart_before:
            restart()
        out = tt_model(x.to("tt"))
        if step in restart_inside:
            restart()
        loss = torch.nn.functional.cross_entropy(out.to("cpu"), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, {k: v.clone() for k, v in tt_model.state_dict().items()}


def test_training_loop_survives_restarts(saving_ttd):
    torch.manual_seed(0)
    ref = MLP(softmax=False)
    x, y = torch.randn(16, 32), torch.randint(0, 10, (16,))
    want_losses, want_params = _train(copy.deepcopy(ref), x, y)
    got_losses, got_params = _train(copy.deepcopy(ref), x, y, restart_before=(2,), restart_inside=(5,),
                                    restart=saving_ttd["restart"])
    assert got_losses == want_losses
    for name, value in want_params.items():
        assert torch.equal(got_params[name], value), name
