"""Tensors moved with .to("tt") / .to("cpu"), compared against plain torch."""
import pytest
import torch

import ttd.torch as ttd


def test_round_trip_float32_is_exact():
    """.to("tt") then .to("cpu") gives back the same float32 values, bit for bit."""
    x = torch.randn(3, 5, 7)
    d = x.to("tt")
    assert torch.equal(d.to("cpu"), x)
    assert torch.equal(d.cpu(), x)


def test_round_trip_int32_and_noncontiguous():
    """int32 and a non-contiguous view round-trip too."""
    x = torch.arange(24, dtype=torch.int32).reshape(4, 6)
    assert torch.equal(x.to("tt").to("cpu"), x)
    y = torch.randn(4, 6).t()
    assert torch.equal(y.to("tt").to("cpu"), y)


def test_device_tensor_metadata():
    """A device tensor shows torch's shape and dtype, a tt:0 device and a repr without data."""
    d = torch.ones(2, 3).to("tt")
    assert isinstance(d, ttd.Tensor)
    assert d.shape == torch.Size([2, 3])
    assert d.dtype == torch.float32
    assert str(d.device) == "tt:0"
    assert d.device == "tt"
    r = repr(d)
    assert "tt:0" in r and "(2, 3)" in r


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
