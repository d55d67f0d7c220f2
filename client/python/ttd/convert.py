"""Between torch and libttclient: the process's client, dtypes, the "tt" device object, and
host tensors either way (torch's memory lent to libttclient, libttclient's copied into torch's).
Below every other module of the package but _lib."""
import atexit

import torch

from . import _lib


TTError = _lib.TTError
_DTYPES = {torch.float32: _lib.FLOAT32, torch.bfloat16: _lib.BFLOAT16, torch.int32: _lib.INT32}
_TORCH_DTYPES = {v: k for k, v in _DTYPES.items()}
_client = None


def connect(target=None, token=None, tls_ca=None, insecure=False, tls_cert=None, tls_key=None,
            tls_server_name=None, client_name=None, timeout=None, quota_bytes=0, keepalive=True, shm=True):
    """Connects (or reconnects) the process's session (tt_connect with tt_connect_options).

    target: "unix:/path" or "host:port"; None means $TTD_ADDRESS, then the default sockets.
    token: the tenant's bearer token (None: $TTD_TOKEN). TCP uses TLS unless insecure=True;
    tls_ca, tls_cert, tls_key: PEM files (None: $TTD_TLS_CA, $TTD_TLS_CERT, $TTD_TLS_KEY);
    tls_server_name: the name to check in the server's certificate. timeout: seconds of each
    unary call (None: 60). quota_bytes: device memory asked for (0: the most ttd allows).
    keepalive=False: no background renewal; shm=False: no same-host shared memory.
    Raises TTError (UNAVAILABLE naming the addresses tried) when no ttd answers."""
    global _client
    opts = {"token": token, "insecure": int(bool(insecure)), "tls_ca_file": tls_ca, "tls_cert_file": tls_cert,
            "tls_key_file": tls_key, "tls_server_name": tls_server_name, "client_name": client_name,
            "call_timeout_ms": 0 if timeout is None else max(1, int(timeout * 1000)),
            "quota_bytes": int(quota_bytes), "disable_keepalive": int(not keepalive), "disable_shm": int(not shm)}
    # libttclient's UNAVAILABLE already names the addresses tried and how to start ttd there
    client = _lib.Client(target, {k: v for k, v in opts.items() if v is not None})
    _client = client
    return _client


def _close():
    """At exit: the session is closed (its tensors freed at once) rather than left to its lease."""
    global _client
    if _client is not None:
        _client.close()
        _client = None


atexit.register(_close)


def _get_client():
    return _client if _client is not None else connect()


def _is_tt(device):
    """Whether device (a string, a Device, or anything else) names a tt device."""
    if isinstance(device, Device):
        return True
    return isinstance(device, str) and (device == "tt" or device.startswith(("tt:", "tt/")))


def _device_name(device):
    """The name libttclient takes for device: a Device or torch.device as its string."""
    return device if isinstance(device, str) else str(device)


def _dtype_of(dtype):
    """libttclient's dtype of a torch dtype; TypeError naming the ones a tt device holds."""
    tt = _DTYPES.get(dtype)
    if tt is None:
        raise TypeError(f"a tt device holds float32, bfloat16 or int32, not {dtype}: convert it first (e.g. .float())")
    return tt


class Device:
    """A "tt" device as torch 1.13 cannot name one: prints as tt:0 ("tt" is tt:0). Equal to a
    Device of the same name and to that name's string, and hashed as that string; like
    torch.device("cuda") and torch.device("cuda:0"), "tt" itself is another name."""

    def __init__(self, name):
        name = str(name)
        head, sep, rest = name.partition("/")
        if head == "tt":
            head = "tt:0"
        self.name = head + sep + rest
        self.type = "tt"
        self.index = int(head.split(":")[1])

    def __str__(self):
        return self.name

    def __repr__(self):
        return f"device(type='tt', index={self.index})"

    def __eq__(self, other):
        return self.name == (other.name if isinstance(other, Device) else other)

    def __hash__(self):
        return hash(self.name)


def _host_source(t):
    """(a torch tensor holding t's values that libttclient can lend, its tt dtype): t itself
    when it is a contiguous CPU tensor of a tt dtype (no copy: libttclient keeps it alive as
    long as it holds the host tensor over it), else a contiguous CPU copy. torch's int64
    indices (torch.long, what Embedding takes) become int32 when they fit."""
    dtype = _DTYPES.get(t.dtype)
    if dtype is not None and type(t) is torch.Tensor and not t.requires_grad and t.is_cpu and t.layout is torch.strided \
            and t.is_contiguous() and not t.is_neg():
        return t, dtype  # the common case, checked once
    if t.layout is not torch.strided:
        raise TypeError(f"a {t.layout} tensor cannot go to a tt device, which holds dense tensors: convert it with "
                        f".to_dense() first")
    if t.dtype == torch.int64:
        if t.numel() and (t.min() < -2**31 or t.max() >= 2**31):
            raise ValueError("an int64 tensor with values outside int32's range cannot go to a tt device, "
                             "which holds int32 indices")
        t = t.to(torch.int32)
    dtype = _dtype_of(t.dtype)
    return t.detach().cpu().resolve_neg().contiguous(), dtype  # t itself, or a copy of its values


def _host_from_torch(t):
    """A libttclient host tensor of a torch tensor's values (_host_source's)."""
    src, dtype = _host_source(t)
    return _lib.Tensor.borrow(_get_client(), src, src.data_ptr(), dtype, src.shape)


def _device_from_torch(t, device):
    """A libttclient tensor on `device` holding a torch tensor's values (_host_source's), with
    no host tensor object between."""
    src, dtype = _host_source(t)
    return _lib.Tensor.borrowed_to(_get_client(), src, src.data_ptr(), dtype, src.shape, device)


def _torch_from_tt(t):
    """A CPU torch tensor holding a libttclient tensor's values, host or device (tt_read: a
    device tensor's download lands in the torch tensor's memory)."""
    return _read_into(t, torch.empty(t.shape, dtype=_TORCH_DTYPES[t.dtype]))


def _read_into(t, out):
    """out, a contiguous CPU tensor of t's shape and dtype, with t's values written over its
    memory (no torch op: autograd sees no write)."""
    nbytes = out.numel() * out.element_size()
    if nbytes:
        t.read_into(out.data_ptr(), nbytes)
    return out
