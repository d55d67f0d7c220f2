"""Starts a real ttd (TTD_BIN, default build/bin/ttd of this repository) on a temporary Unix
socket with two simulated cards and --admin off for the test session, points TTD_ADDRESS at it, stops it after."""
import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))
sys.path.insert(0, os.path.join(REPO, "client", "python"))


CLONE_NEWNET = 0x40000000


def _own_network_namespace():
    """In the child before exec: a network namespace of its own, as on another host (root only;
    otherwise it shares this one)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.unshare(CLONE_NEWNET)


def same_network_namespace(pid):
    return os.readlink(f"/proc/{pid}/ns/net") == os.readlink("/proc/self/ns/net")


def can_make_network_namespace():
    """Whether a child of this process may unshare its network namespace (root with the
    privilege; not in an unprivileged container)."""
    probe = subprocess.run([sys.executable, "-c", "import ctypes, sys; "
                            f"sys.exit(ctypes.CDLL(None).unshare({CLONE_NEWNET}) != 0)"])
    return probe.returncode == 0


def start_ttd(sock, log, extra=(), isolated=False):
    """A ttd (TTD_BIN) serving unix:sock with --admin off and the extra arguments, its output to
    the file log; None if it exited or did not make its socket within 10 s (then it is killed).
    isolated: in a network namespace of its own when this process may make one (root)."""
    binary = os.environ.get("TTD_BIN", os.path.join(REPO, "build", "bin", "ttd"))
    if not os.path.exists(binary):
        pytest.exit(f"no ttd at {binary}: run `make all` or set TTD_BIN", returncode=2)
    proc = subprocess.Popen([binary, "--listen", f"unix:{sock}", "--admin", "off", "--log-level", "warn",
                             "--devices", "2", *extra],
                            stdout=log, stderr=subprocess.STDOUT,
                            preexec_fn=_own_network_namespace if isolated else None)
    deadline = time.time() + 10
    while not os.path.exists(sock):
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            proc.wait()
            return None
        time.sleep(0.02)
    return proc


def stop_ttd(proc):
    """SIGTERM, then SIGKILL if it has not stopped within 15 s."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def run_ranks(argv, env_of_rank, world=2, timeout=60):
    """argv started once per rank as torchrun starts a program (RANK, LOCAL_RANK, WORLD_SIZE,
    MASTER_ADDR=127.0.0.1 and a free MASTER_PORT), plus env_of_rank(rank); waits for all of them
    (killed past timeout) and returns each one's (exit status, output)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), **env_of_rank(rank))
        procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    try:
        outs = [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return [(p.returncode, out) for p, out in zip(procs, outs)]


@pytest.fixture(scope="session", autouse=True)
def ttd_daemon():
    tmp = tempfile.mkdtemp(prefix="ttd-pytest-")
    sock = os.path.join(tmp, "ttd.sock")
    log = open(os.path.join(tmp, "ttd.log"), "w")
    proc = start_ttd(sock, log)
    if proc is None:
        pytest.exit(f"ttd did not start: see {log.name}", returncode=2)
    os.environ["TTD_ADDRESS"] = f"unix:{sock}"
    yield f"unix:{sock}"
    stop_ttd(proc)
    log.close()


@contextlib.contextmanager
def private_ttd_session(extra=()):
    """A ttd of the caller's own on a fresh socket, with the extra arguments, the process's
    session pointed at it; the shared session is put back after. Yields a dict: "proc", "sock",
    "dir" (its folder) and "restart" (a graceful stop, then a new ttd on the same socket)."""
    from ttd import convert
    import ttd.torch as ttd

    tmp = tempfile.mkdtemp(prefix="ttd-private-")
    sock = os.path.join(tmp, "ttd.sock")
    extra = tuple(a.replace("{dir}", tmp) for a in extra)
    state = {"proc": start_ttd(sock, subprocess.DEVNULL, extra), "sock": sock, "dir": tmp}
    assert state["proc"] is not None, "private ttd did not start"

    def restart():
        stop_ttd(state["proc"])
        state["proc"] = start_ttd(sock, subprocess.DEVNULL, extra)
        assert state["proc"] is not None, "private ttd did not start again"

    state["restart"] = restart
    before = convert._client
    ttd.connect(f"unix:{sock}")
    try:
        yield state
    finally:
        convert._client.close()
        convert._client = before
        stop_ttd(state["proc"])
