"""Tensors moved with .to("tt") / .to("cpu"), compared against plain torch."""
import gc
import weakref

import pytest
import torch

import ttd.torch as ttd
from ttd import _lib, convert


def test_round_trip_float32_is_exact():
    """.to("tt") then .to("cpu") gives back the same float32 values, bit for bit."""
    x = torch.randn(3, 5, 7)
    d = x.to("tt")
    assert torch.equal(d.to("cpu"), x)
    assert torch.equal(d.cpu(), x)


def test_bfloat16_upload_of_a_tensor_that_takes_a_gradient():
    """x.to("tt", dtype=torch.bfloat16) of an x that requires grad stays bfloat16 on the way
    back, and the gradient reaches x as float32 through the conversion."""
    x = torch.rand(2, 3, requires_grad=True)
    back = x.to("tt", dtype=torch.bfloat16).to("cpu")
    assert back.dtype == torch.bfloat16 and back.requires_grad
    assert torch.equal(back.detach(), x.detach().to(torch.bfloat16))
    (back.float() * 2).sum().backward()
    assert x.grad.dtype == torch.float32
    assert torch.equal(x.grad, torch.full((2, 3), 2.0))


def test_round_trip_int32_and_noncontiguous():
    """int32 and a non-contiguous view round-trip too."""
    x = torch.arange(24, dtype=torch.int32).reshape(4, 6)
    assert torch.equal(x.to("tt").to("cpu"), x)
    y = torch.randn(4, 6).t()
    assert torch.equal(y.to("tt").to("cpu"), y)


def test_views_with_a_sign_bit_and_large_tensors_round_trip():
    """A view whose negation torch keeps as a bit (torch._neg_view, a complex tensor's .imag
    after .conj()) goes with its values, not its memory's; a 16 MiB tensor comes back whole
    (downloaded through shared memory on the same host)."""
    x = torch.tensor([1.0, -2.0, 3.5])
    n = torch._neg_view(x)
    assert n.is_neg() and torch.equal(n.to("tt").to("cpu"), -x)
    z = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64).conj().imag
    assert torch.equal(z.to("tt").to("cpu"), torch.tensor([-2.0, 4.0]))
    big = torch.randn(4, 1 << 20)
    assert torch.equal(big.to("tt").to("cpu"), big)


def test_device_tensor_metadata():
    """A device tensor shows torch's shape and dtype, a tt:0 device and a repr without data."""
    d = torch.ones(2, 3).to("tt")
    assert isinstance(d, ttd.Tensor)
    assert d.shape == torch.Size([2, 3])
    assert d.dtype == torch.float32
    assert str(d.device) == "tt:0"
    assert d.device == "tt:0"
    r = repr(d)
    assert "tt:0" in r and "(2, 3)" in r
    assert len(d) == 2 and d.numel() == torch.numel(d) == 6 and d.dim() == 2 and d.size(1) == 3


def test_bfloat16_conversion_on_the_way():
    """.to("tt", dtype=torch.bfloat16) stores bfloat16, as torch's conversion rounds."""
    x = torch.randn(4, 4)
    d = x.to("tt", dtype=torch.bfloat16)
    assert d.dtype == torch.bfloat16
    assert torch.equal(d.to("cpu"), x.to(torch.bfloat16))


def test_unsupported_op_names_it_and_cpu():
    """An op on a device tensor raises naming the op and saying to move it to "cpu": no fallback."""
    d = torch.ones(2, 2).to("tt")
    with pytest.raises(RuntimeError, match=r"add.*\"cpu\""):
        d + 1
    with pytest.raises(RuntimeError, match=r"l1_loss.*\"cpu\""):
        torch.nn.functional.l1_loss(d, torch.ones(2, 2))


def test_other_devices_untouched():
    """Tensor.to on other devices and dtypes is torch's own."""
    x = torch.ones(2)
    assert x.to("cpu") is x
    assert x.to(torch.float64).dtype == torch.float64


def _data_ptr(host):
    """Where a libttclient host tensor's bytes are."""
    return _lib._L.tt_tensor_data(host._p)


def test_contiguous_tensors_go_to_libttclient_without_a_copy():
    """A contiguous float32, bfloat16 or int32 CPU tensor is lent to libttclient: the host
    tensor's data is the torch tensor's memory. A non-contiguous one, or one converted first
    (int64 indices to int32, float64 with dtype=torch.float32), goes as a copy; float64 alone
    is refused. The values arrive on the card either way."""
    for x in [torch.randn(64, 784), torch.randn(5, 3).to(torch.bfloat16), torch.arange(12, dtype=torch.int32)]:
        h = convert._host_from_torch(x)
        assert _data_ptr(h) == x.data_ptr()
        assert torch.equal(convert._torch_from_tt(h.to("tt")), x)
    for x in [torch.randn(6, 4).t(), torch.randn(3, 8)[:, ::2], torch.arange(7)]:
        src = x if x.dtype != torch.int64 else x.int()
        h = convert._host_from_torch(x)
        assert _data_ptr(h) != x.data_ptr()
        assert torch.equal(convert._torch_from_tt(h.to("tt")), src)
    y = torch.randn(4, 4, dtype=torch.float64)
    with pytest.raises(TypeError, match="float64"):
        convert._host_from_torch(y)
    d = y.to("tt", dtype=torch.float32)  # converted by torch, a copy
    assert torch.equal(d.to("cpu"), y.float())


def test_lent_tensor_lives_while_libttclient_holds_it():
    """The torch tensor stays alive as long as libttclient holds the host tensor over it, past
    the last Python reference to either: here through a training run on "cpu" that keeps its
    input for the input's gradient, until the run's outputs go."""
    client = convert._get_client()
    g = _lib.Graph(client)
    g.output(g.op("relu", [g.input("x", _lib.FLOAT32, (256, 784))]))
    m = _lib.Module(g)
    x = torch.randn(256, 784)
    alive = weakref.ref(x)
    gc.collect()
    held = len(_lib._borrowed)
    h = _lib.Tensor.borrow(client, x, x.data_ptr(), _lib.FLOAT32, tuple(x.shape))
    h.set_requires_grad()
    outs = m.forward([h])
    del x, h
    gc.collect()
    assert alive() is not None and len(_lib._borrowed) == held + 1
    del outs
    gc.collect()
    assert alive() is None
    assert len(_lib._borrowed) == held


def test_lent_tensor_uploads_after_python_lets_go():
    """A host tensor made by .to("tt")'s path keeps its torch tensor alive: deleting the torch
    tensor and collecting leaves the host tensor's values intact for an upload."""
    x = torch.randn(256, 784)
    expected = x.clone()
    h = convert._host_from_torch(x)
    del x
    gc.collect()
    junk = [torch.full((256, 784), 3.0) for _ in range(8)]
    assert torch.equal(convert._torch_from_tt(h.to("tt")), expected)
    del junk


def test_device_objects_serve_as_device_names():
    """A device tensor's and a compiled parameter's device print and compare alike (tt:0, hashed
    as they compare) and move tensors as a device string does, torch.device("cpu") included."""
    m = ttd.compile(torch.nn.Linear(4, 2)).to("tt")
    pd, x = next(m.parameters()).device, torch.randn(3, 4)
    xd = x.to("tt")
    assert str(pd) == str(xd.device) == "tt:0" and pd == xd.device and len({pd, xd.device, "tt:0"}) == 1
    for d in (x.to(pd), x.to(xd.device), x.to(device=xd.device), xd.to(xd.device), xd.to(pd)):
        assert isinstance(d, ttd.Tensor) and torch.equal(d.to(torch.device("cpu")), x)
    with torch.no_grad():
        assert torch.equal(m.to(torch.device("cpu"))(x), m.to(pd)(x.to(pd)).cpu())
    assert torch.equal(next(m.parameters()).to(torch.device("cpu")), m.state_dict()["weight"])


def test_sparse_tensor_says_to_make_it_dense():
    """A sparse tensor's .to("tt") raises naming its layout and .to_dense()."""
    sparse = torch.eye(3).to_sparse()
    with pytest.raises(TypeError, match=r"torch.sparse_coo tensor cannot go to a tt device.*\.to_dense\(\)"):
        sparse.to("tt")
    assert torch.equal(sparse.to_dense().to("tt").to("cpu"), torch.eye(3))
