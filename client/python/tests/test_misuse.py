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


def test_unsupported_dtype_and_non_tensor_input():
    """A dtype a tt device does not hold is a TypeError naming it and the ones it holds; an input
    that is no tensor is a TypeError saying what it is and what the module takes."""
    with pytest.raises(TypeError, match=r"holds float32, bfloat16 or int32, not torch.float16"):
        torch.ones(2).to("tt").to(torch.float16)
    for device, want in (("tt", r"tensors on 'tt' \(t.to\('tt'\)\)"), ("cpu", "CPU tensors")):
        m = ttd.compile(torch.nn.Linear(4, 2)).to(device)
        with pytest.raises(TypeError, match=rf"input 0 is int 3, not a tensor: this compiled module takes {want}"):
            m(3)


class _MatmulOverBatches(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(2, 4, 5))

    def forward(self, x):
        return torch.matmul(x, self.w)  # the line the error names


def test_op_refused_at_the_input_shape_names_the_node_and_line():
    """An op ttd refuses only once the shapes are known (a batched matmul whose batch dims
    broadcast) names the node and the line of forward at the first call."""
    m = ttd.compile(_MatmulOverBatches()).to("tt")
    with pytest.raises(ttd.TTError, match=r"node matmul, at .*test_misuse.py:\d+ in forward: return torch.matmul"
                                          r".*batch dims of .* differ.*\(3, 2, 3, 4\)"):
        m(torch.randn(3, 2, 3, 4).to("tt"))


class _VectorDot(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.v = torch.nn.Parameter(torch.randn(4))

    def forward(self, x):
        return (x.sum(0) @ self.v).reshape(1, 1)


def test_dot_of_two_vectors_names_the_node():
    """A matmul of two 1-D tensors (a 0-dim result, which ttd has none of) says what to write."""
    m = ttd.compile(_VectorDot()).to("tt")
    with pytest.raises(NotImplementedError, match=r"matmul of inputs of 1 and 1 dims \(node matmul.*\(a \* b\).sum"):
        m(torch.randn(3, 4).to("tt"))


def test_daemon_gone_says_how_to_start_it():
    """A call after ttd died says how to start it again."""
    with private_ttd_session() as state:
        m = ttd.compile(torch.nn.Linear(4, 2)).to("tt")
        x = torch.randn(3, 4)
        m(x.to("tt"))
        state["proc"].kill()
        state["proc"].wait()
        with pytest.raises(ttd.TTError, match=r"start it again \(`ttd --listen \.\.\.`.*\(UNAVAILABLE\)"):
            m(x.to("tt"))
        state["restart"]()
