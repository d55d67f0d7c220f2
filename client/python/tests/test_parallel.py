"""ttd.parallel.DistributedDataParallel: two torch.distributed (gloo) ranks over 127.0.0.1, started
as torchrun starts them (dp_worker.py), against one process training on the whole batch."""
import os
import subprocess
import sys
import tempfile

import pytest
import torch

import dp_worker
import ttd.torch as ttd
from conftest import can_make_network_namespace, run_ranks, same_network_namespace, start_ttd, stop_ttd

HERE = os.path.dirname(os.path.abspath(__file__))


def _spawn(scenario, addresses, devices=("tt", "tt"), timeout=60):
    """Runs dp_worker.py SCENARIO as ranks 0 and 1 (rank r on addresses[r], card devices[r]);
    each rank's saved results (None where a rank saved none) once both exited 0."""
    tmp = tempfile.mkdtemp(prefix="ttd-dp-")
    outs = [os.path.join(tmp, f"rank{rank}.pt") for rank in range(2)]
    ranks = run_ranks([sys.executable, os.path.join(HERE, "dp_worker.py"), scenario, os.path.join(tmp, "rank{}.pt")],
                      lambda rank: dict(TTD_ADDRESS=addresses[rank], DP_DEVICE=devices[rank]), timeout=timeout)
    for rank, (rc, log) in enumerate(ranks):
        assert rc == 0, f"rank {rank} exited {rc}:\n{log}"
    return [torch.load(o) if os.path.exists(o) else None for o in outs]


@pytest.fixture(scope="module")
def two_daemons():
    """Two private ttds on sockets of their own, each in a network namespace of its own when the
    test may make one (root): one per rank, as on two hosts."""
    tmp = tempfile.mkdtemp(prefix="ttd-dp-")
    procs, addresses = [], []
    isolating = can_make_network_namespace()
    for i in range(2):
        sock = os.path.join(tmp, f"ttd{i}.sock")
        proc = start_ttd(sock, subprocess.DEVNULL, isolated=True)
        assert proc is not None, "private ttd did not start"
        if isolating:
            assert not same_network_namespace(proc.pid), "ttd shares the test's network namespace"
        procs.append(proc)
        addresses.append(f"unix:{sock}")
    yield addresses
    for proc in procs:
        stop_ttd(proc)


def _single_process(opt_name, device="tt"):
    """One process, the whole global batch, the same steps: the parameters after."""
    m = ttd.compile(dp_worker.model()).to(device)
    dp_worker.train(m, device, opt_name, dp_worker.batches(dp_worker.STEPS))
    return m.state_dict()


def _assert_same(got, want, what):
    assert list(got) == list(want)
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-5, atol=1e-5 * want[k].abs().max().item(),
                                   msg=lambda m: f"{what} {k}: {m}")


@pytest.fixture(scope="module")
def trained(two_daemons):
    """train on two ranks, each with its own ttd."""
    return _spawn("train", two_daemons)


@pytest.mark.parametrize("opt_name", ["sgd", "adam"])
def test_two_ranks_train_as_one_process(trained, opt_name):
    """Global batch 16 on 2 ranks (8 each, rank 1 starting from other weights until the wrap's
    broadcast), 20 steps: both ranks end with the parameters of one process on batch 16."""
    want = _single_process(opt_name)
    for rank, res in enumerate(trained):
        _assert_same(res[opt_name], want, f"rank {rank} {opt_name}")


def test_no_sync_accumulates_then_averages(trained):
    """Two micro-batches per rank, the first under no_sync: the .grads equal one process's
    gradient of the four micro-batches concatenated (the global batch), after one all-reduce."""
    m = ttd.compile(dp_worker.model()).to("tt")
    want = dp_worker.accumulate(m, "tt", *dp_worker.batches(1)[0])
    for rank, res in enumerate(trained):
        assert res["no_sync_collectives"] == 1
        for k in want:
            torch.testing.assert_close(res["no_sync"][k], want[k], rtol=1e-5, atol=1e-7, msg=lambda m: f"{k}: {m}")


def test_a_card_per_rank_of_one_ttd(ttd_daemon):
    """One ttd with --devices 2 (the session's), rank r on tt:r, the module run before the wrap
    (the broadcast writes into the card): trains as one process does."""
    res = _spawn("train_built", [ttd_daemon, ttd_daemon], devices=("tt:0", "tt:1"))
    assert [r["device"] for r in res] == ["tt:0", "tt:1"]
    want = _single_process("sgd")
    for rank, r in enumerate(res):
        _assert_same(r["sgd"], want, f"rank {rank}")


def test_a_rank_that_exits_is_named(two_daemons):
    """Rank 1 leaves after one step: rank 0's next backward raises RankError naming rank 1,
    well within init_process_group's 10 s timeout, rather than hanging."""
    res = _spawn("exit", two_daemons)
    assert res[1] is None
    assert res[0]["error"] is not None, "rank 0 trained on without its peer"
    assert res[0]["lost"] == [1], res[0]["error"]
    assert "rank 1 of 2 exited or stopped answering" in res[0]["error"]
    assert res[0]["seconds"] < 10


def test_a_parameter_reached_on_some_ranks_only_raises_on_all(two_daemons):
    """Rank 0's loss reaches one head, rank 1's both: every rank's backward raises naming the
    other head, rather than the ranks' parameters drifting apart."""
    res = _spawn("heads", two_daemons)
    for rank, r in enumerate(res):
        assert r["error"] is not None, f"rank {rank} trained on"
        msg = r["error"] or ""
        assert "got a gradient on some ranks and not on others" in msg and "b.weight" in msg and "b.bias" in msg, msg
        assert "a.weight" not in msg and "body" not in msg, msg


def test_gradients_averaged_after_a_backward_that_raised(two_daemons):
    """A backward that raises on every rank (a run older than a step) does not stop the next
    backwards from averaging: the ranks end with the same parameters."""
    res = _spawn("recover", two_daemons)
    for r in res:
        assert "parameters were changed after its forward" in r["error"], r["error"]
    _assert_same(res[1]["sgd"], res[0]["sgd"], "rank 1 against rank 0")


def test_a_process_group_without_rank_0(two_daemons):
    """A process group of rank 1 alone: the wrap broadcasts from the group's first rank (global
    rank 1), and rank 1 trains as one process on its own does."""
    res = _spawn("subgroup", two_daemons)
    assert res[0] == {}  # rank 0 is in no group it wrapped with
    m = ttd.compile(dp_worker.model(seed=1)).to("tt")
    dp_worker.train(m, "tt", "sgd", dp_worker.batches(dp_worker.STEPS)[:2])
    _assert_same(res[1]["sgd"], m.state_dict(), "rank 1")


def test_wrapping_needs_a_process_group_and_a_compiled_module():
    m = ttd.compile(dp_worker.model())
    with pytest.raises(RuntimeError, match="init_process_group"):
        ttd.parallel.DistributedDataParallel(m)
    with pytest.raises(TypeError, match="ttd.compile"):
        ttd.parallel.DistributedDataParallel(dp_worker.model())
