"""Parity: MNISTLinear, an MLP, LeNet-5 and a transformer block trained 20 steps through ttd
on the card match the same modules trained in plain PyTorch on the CPU, loss by loss and
parameter by parameter (relative 1e-4), with SGD, SGD with momentum, Adam and AdamW."""
import pytest
import torch

from training import OPTIMIZERS, MLP, LeNet5, MNISTLinear, TransformerBlock, assert_trains_as_torch, cross_entropy, l1

BATCH = 8


def _labels(*shape):
    return torch.randint(0, 10, shape)


def _transformer_data(vocab):
    """4 sequences of 8: tokens (int64 indices into the embedding) or vectors of 32 in, a class
    per position out."""
    x = torch.randint(0, vocab, (4, 8)) if vocab else torch.randn(4, 8, 32)
    return x, _labels(4, 8)


# name: (the model, its inputs and targets, the loss)
MODELS = {
    "mnist_linear": (MNISTLinear, lambda: (torch.rand(BATCH, 784), torch.rand(BATCH, 10)), l1),
    "mlp": (lambda: MLP(False), lambda: (torch.randn(BATCH, 32), _labels(BATCH)), cross_entropy),
    "mlp_softmax": (lambda: MLP(True), lambda: (torch.randn(BATCH, 32), _labels(BATCH)), cross_entropy),
    "lenet5_relu_maxpool": (lambda: LeNet5(False), lambda: (torch.rand(BATCH, 1, 28, 28), _labels(BATCH)),
                            cross_entropy),
    "lenet5_tanh_avgpool": (lambda: LeNet5(True), lambda: (torch.rand(BATCH, 1, 28, 28), _labels(BATCH)),
                            cross_entropy),
    "transformer_pre_ln_2_heads_embedding": (lambda: TransformerBlock(True, vocab=50),
                                             lambda: _transformer_data(50), cross_entropy),
    "transformer_post_ln_1_head": (lambda: TransformerBlock(False, heads=1), lambda: _transformer_data(None),
                                   cross_entropy),
}


# Adam and AdamW at OPTIMIZERS' lr 1e-2 take LeNet-5 from loss 2.3 to 0.3 on these 8 images in
# 20 steps, a chaotic ride: torch against itself, with its initial weights moved by one ulp,
# ends up to 3e-2 apart. At torch's default lr 1e-3 the same perturbation stays below 1e-7.
ADAM_LR = {"lenet5_relu_maxpool": 1e-3, "lenet5_tanh_avgpool": 1e-3}


def _setup(model_name):
    """The model (seed 0), its inputs and targets (seed 1), and the loss."""
    make_model, make_data, loss_fn = MODELS[model_name]
    torch.manual_seed(0)
    model = make_model()
    torch.manual_seed(1)
    x, y = make_data()
    return model, x, y, loss_fn


@pytest.mark.parametrize("opt_name", ["sgd", "sgd_momentum", "adam", "adamw"])
@pytest.mark.parametrize("model_name", list(MODELS))
def test_trains_as_torch(model_name, opt_name):
    """20 steps through ttd match torch.optim on the CPU: each loss and every parameter."""
    model, x, y, loss_fn = _setup(model_name)
    opts = None
    if opt_name in ("adam", "adamw") and model_name in ADAM_LR:
        opts = dict(OPTIMIZERS[opt_name][2], lr=ADAM_LR[model_name])
    assert_trains_as_torch(model, x, y, loss_fn, opt_name, opts=opts)


@pytest.mark.parametrize("opt_name", ["sgd_nesterov", "adam_wd"])
@pytest.mark.parametrize("model_name", ["mnist_linear", "mlp"])
def test_trains_as_torch_other_settings(model_name, opt_name):
    """Nesterov momentum, and Adam with L2 weight decay, match torch too."""
    model, x, y, loss_fn = _setup(model_name)
    assert_trains_as_torch(model, x, y, loss_fn, opt_name)
