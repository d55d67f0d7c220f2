"""Models and a training loop shared by the optimizer and parity suites: the same module
trained through ttd on the card and in plain PyTorch on the CPU, step by step."""
import copy
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

import ttd.torch as ttd


class MNISTLinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(784, 10)

    def forward(self, x):
        return F.softmax(self.l1(x), dim=-1)


class MLP(nn.Module):
    def __init__(self, softmax):
        super().__init__()
        self.l1, self.relu, self.l2 = nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10)
        self.softmax = softmax

    def forward(self, x):
        y = self.l2(self.relu(self.l1(x)))
        return F.softmax(y, dim=-1) if self.softmax else y


class LeNet5(nn.Module):
    """LeNet-5 on 1x28x28 images: classic (tanh, average pooling) or modern (ReLU, max pooling)."""

    def __init__(self, classic):
        super().__init__()
        act, pool = (nn.Tanh, nn.AvgPool2d) if classic else (nn.ReLU, nn.MaxPool2d)
        self.features = nn.Sequential(nn.Conv2d(1, 6, 5, padding=2), act(), pool(2),
                                      nn.Conv2d(6, 16, 5), act(), pool(2))
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(400, 120), act(), nn.Linear(120, 84), act(),
                                        nn.Linear(84, 10))

    def forward(self, x):
        return self.classifier(self.features(x))


class TransformerBlock(nn.Module):
    """One transformer block over [batch, seq, d_model]: self-attention of Linear projections
    (heads split with view and transpose, scores divided by the Python float sqrt(head dim)),
    a GELU MLP, residual adds; pre-LayerNorm (GPT-2's order) or post-LayerNorm (the original
    one's). With vocab, an Embedding of int indices in front; a Linear head to `classes`."""

    def __init__(self, pre_norm, vocab=None, seq=8, d_model=32, heads=2, classes=10):
        super().__init__()
        self.pre_norm, self.seq, self.d, self.heads = pre_norm, seq, d_model, heads
        self.emb = nn.Embedding(vocab, d_model) if vocab else None
        # no key bias: softmax over the keys ignores it (a shift of each row of scores), so its
        # gradient is float32 rounding noise, which Adam's normalised step turns into ±lr moves
        self.q, self.k, self.v = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model, bias=False), \
            nn.Linear(d_model, d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.fc1, self.fc2 = nn.Linear(d_model, 4 * d_model), nn.Linear(4 * d_model, d_model)
        self.head = nn.Linear(d_model, classes)

    def _heads(self, t):
        return t.view(-1, self.seq, self.heads, self.d // self.heads).transpose(1, 2)

    def attention(self, x):
        q, k, v = self._heads(self.q(x)), self._heads(self.k(x)), self._heads(self.v(x))
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d // self.heads)
        att = torch.matmul(F.softmax(scores, dim=-1), v)
        return self.proj(att.transpose(1, 2).reshape(-1, self.seq, self.d))

    def mlp(self, x):
        return self.fc2(F.gelu(self.fc1(x)))

    def forward(self, x):
        if self.emb is not None:
            x = self.emb(x)
        if self.pre_norm:
            x = x + self.attention(self.ln1(x))
            x = x + self.mlp(self.ln2(x))
        else:
            x = self.ln1(x + self.attention(x))
            x = self.ln2(x + self.mlp(x))
        return self.head(x)


def l1(out, y):
    return F.l1_loss(out, y)


def cross_entropy(out, y):
    """Cross-entropy over the last dim, for [batch, classes] and [batch, seq, classes] alike."""
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


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


def train(model, opt, x, y, loss_fn, steps, device, lr_at=None):
    """steps of forward, loss on the CPU, backward, step and zero_grad; the losses. On "tt",
    x goes to the card each step. lr_at: {step: lr} set before that step."""
    losses = []
    for step in range(steps):
        if lr_at and step in lr_at:
            opt.param_groups[0]["lr"] = lr_at[step]
        out = model(x.to(device) if device == "tt" else x)
        loss = loss_fn(out.to("cpu"), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def assert_trains_as_torch(ref, x, y, loss_fn, opt_name, steps=20, lr_at=None, opts=None):
    """ref trained `steps` steps in plain torch on the CPU and a ttd.compile'd copy of it on the
    card give the same loss at every step and the same parameters after, relative 1e-4.
    opts: the optimizer's settings in place of OPTIMIZERS[opt_name]'s."""
    tt_model = ttd.compile(copy.deepcopy(ref)).to("tt")
    torch_cls, ttd_cls, kw = OPTIMIZERS[opt_name]
    kw = opts if opts is not None else kw
    ref_losses = train(ref, torch_cls(ref.parameters(), **kw), x, y, loss_fn, steps, "cpu", lr_at)
    tt_losses = train(tt_model, ttd_cls(tt_model.parameters(), **kw), x, y, loss_fn, steps, "tt", lr_at)
    torch.testing.assert_close(torch.tensor(tt_losses), torch.tensor(ref_losses), rtol=1e-4, atol=1e-6)
    got, want = tt_model.state_dict(), ref.state_dict()
    assert list(got) == list(want)
    for k in want:  # relative 1e-4 of the tensor's scale: Adam moves near-zero entries by ~lr whatever
        # their gradient's rounding, so an entry-wise rtol alone cannot hold there
        atol = 1e-4 * want[k].abs().max().item()
        torch.testing.assert_close(got[k], want[k], rtol=1e-4, atol=atol, msg=lambda m: f"{k}: {m}")
