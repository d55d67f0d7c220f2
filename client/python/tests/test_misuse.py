"""Misuse: each raises the error that says what went wrong, never a crash."""
import os
import tempfile
import time

import pytest
import torch

import ttd.torch as ttd
from ttd import convert

from conftest import private_ttd_session


def test_device_tensor_given_to_a_cpu_op():
    """A device output given to a CPU op raises naming the op and "cpu"."""
    cm = ttd.compile(torch.nn.Linear(784, 10).to("tt"))
    out = cm(torch.randn(1, 784).to("tt"))
    with pytest.raises(RuntimeError, match=r"relu is not supported on a tt device tensor.*\.to\(\"cpu\"\)"):
        torch.relu(out)
    with pytest.raises(RuntimeError, match=r"cross_entropy.*\"cpu\""):
        torch.nn.functional.cross_entropy(out, torch.tensor([3]))


def test_module_moved_while_a_training_run_is_pending():
    """.to("cpu") with a training forward not yet backpropagated: libttclient's refusal surfaces."""
    cm = ttd.compile(torch.nn.Linear(784, 10).to("tt"))
    out = cm(torch.randn(1, 784).to("tt"))
    with pytest.raises(ttd.TTError, match=r"forward run\(s\) pending.*call loss.backward\(\).*before moving it.*FAILED_PRECONDITION"):
        cm.to("cpu")
    out.to("cpu").sum().backward()  # the run backpropagated: the move goes through
    cm.to("cpu")
    assert cm(torch.randn(1, 784)).shape == (1, 10)


def test_daemon_down_names_the_address_and_how_to_start_ttd():
    """ttd.connect where nothing listens: TTError naming the address and how to start ttd."""
    before = convert._client
    addr = "unix:" + os.path.join(tempfile.mkdtemp(prefix="ttd-none-"), "ttd.sock")
    with pytest.raises(ttd.TTError, match=r"nothing listens at " + addr + r": start ttd there.*ttd --listen"):
        ttd.connect(addr)
    assert convert._client is before  # the process's session is unchanged


@pytest.fixture
def private_ttd():
    with private_ttd_session() as state:
        yield state


def test_daemon_restarted_under_the_program(private_ttd):
    """ttd stopped and a new one started on the same socket: the next call raises TTError with
    libttclient's message, no crash."""
    cm = ttd.compile(torch.nn.Linear(784, 10).to("tt"))
    x = torch.randn(2, 784).to("tt")
    cm(x).to("cpu")
    private_ttd["restart"]()
    # gRPC may still be backing off from its attempts while no ttd listened (UNAVAILABLE,
    # "nothing listens"): the new ttd's answer comes once it reconnects.
    deadline = time.time() + 10
    while True:
        with pytest.raises(ttd.TTError) as e:
            cm(x).to("cpu")
        if e.value.code != 14 or time.time() > deadline:  # 14: UNAVAILABLE
            break
        time.sleep(0.05)
    assert "daemon restarted, tensors are gone" in str(e.value) and "reconnect" in str(e.value)


def test_feature_size_other_than_the_compiled_one():
    """Input [1, 783] to a module compiled at [1, 784]: an error naming the expected shape."""
    cm = ttd.compile(torch.nn.Linear(784, 10).to("tt"))
    cm(torch.randn(1, 784).to("tt"))
    with pytest.raises(ttd.TTError, match=r"is \[1, 783\] but the module was built for \[1, 784\].*INVALID_ARGUMENT"):
        cm(torch.randn(1, 783).to("tt"))
