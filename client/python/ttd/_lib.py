"""The one binding to libttclient (ctypes): every call into the C library goes through here.

Finds the library as $TTD_LIB, else the build tree's build/lib/libttclient.so (relative to
this package's source), else the installed libttclient.so.1. Errors become TTError carrying
tt_last_error's text. Objects here own one C reference each and release it when collected;
each keeps what it was made from (its client, its module) alive so frees happen in order."""
import ctypes
import os
from ctypes import POINTER, c_char_p, c_float, c_int, c_int64, c_uint64, c_void_p

FLOAT32, BFLOAT16, INT32 = 1, 2, 3
UNAVAILABLE = 14  # tt_status: no ttd answers
MAX_DIMS = 8


class TTError(RuntimeError):
    """A libttclient call failed; code is its tt_status (gRPC's canonical codes)."""

    def __init__(self, code, message):
        self.code, self.message = code, message
        if code == UNAVAILABLE and "start ttd" not in message:  # the at-connect message says it already
            message += (": ttd stopped answering; start it again (`ttd --listen ...`, or `sudo systemctl start ttd` "
                        "for the service): a ttd with --state-dir resumes the session, else ttd.connect() and "
                        "compile again")
        super().__init__(f"{message} ({_L.tt_status_name(code).decode()})")


def _find_library():
    env = os.environ.get("TTD_LIB")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    built = os.path.normpath(os.path.join(here, "..", "..", "..", "build", "lib", "libttclient.so"))
    if os.path.exists(built):
        return built
    return "libttclient.so.1"


class _SgdOptions(ctypes.Structure):
    _fields_ = [("lr", c_float), ("momentum", c_float), ("dampening", c_float), ("weight_decay", c_float),
                ("nesterov", c_int)]


class _AdamOptions(ctypes.Structure):
    _fields_ = [("lr", c_float), ("beta1", c_float), ("beta2", c_float), ("eps", c_float),
                ("weight_decay", c_float), ("decoupled", c_int)]


class _ConnectOptions(ctypes.Structure):
    _fields_ = [("client_name", c_char_p), ("disable_keepalive", c_int), ("call_timeout_ms", c_int64),
                ("quota_bytes", c_uint64), ("token", c_char_p), ("insecure", c_int), ("tls_ca_file", c_char_p),
                ("tls_cert_file", c_char_p), ("tls_key_file", c_char_p), ("tls_server_name", c_char_p),
                ("disable_shm", c_int), ("disable_spin", c_int), ("disable_malloc_tuning", c_int)]


_L = ctypes.CDLL(_find_library())
_P = c_void_p


def _sig(name, restype, *argtypes):
    f = getattr(_L, name)
    f.restype = restype
    f.argtypes = list(argtypes)


_sig("tt_connect", c_int, c_char_p, _P, POINTER(_P))
_sig("tt_disconnect", None, _P)
_sig("tt_errcode", c_int, _P)
_sig("tt_status_name", c_char_p, c_int)
_sig("tt_last_error", c_char_p, _P)
_sig("tt_tensor_from_host", _P, _P, c_void_p, c_int, POINTER(c_int64), c_int)
_sig("tt_tensor_wrap_host", _P, _P, c_void_p, c_int, POINTER(c_int64), c_int, _P, c_void_p)
_sig("tt_tensor_free", None, _P)
_sig("tt_to", _P, _P, c_char_p)
_sig("tt_to_dtype", _P, _P, c_char_p, c_int)
_sig("tt_copy_", c_int, _P, _P)
_sig("tt_read", c_int, _P, c_void_p, c_uint64)
_sig("tt_tensor_client", _P, _P)
_sig("tt_tensor_dtype", c_int, _P)
_sig("tt_tensor_ndim", c_int, _P)
_sig("tt_tensor_shape", POINTER(c_int64), _P)
_sig("tt_tensor_nbytes", c_uint64, _P)
_sig("tt_tensor_device", c_char_p, _P)
_sig("tt_tensor_is_host", c_int, _P)
_sig("tt_tensor_data", c_void_p, _P)
_sig("tt_graph_create", _P, _P, c_uint64)
_sig("tt_graph_free", None, _P)
_sig("tt_graph_input", c_int, _P, c_char_p, c_int, POINTER(c_int64), c_int)
_sig("tt_graph_param_from", c_int, _P, c_char_p, _P)
_sig("tt_graph_op", c_int, _P, c_char_p, POINTER(c_int), c_int, c_char_p)
_sig("tt_graph_output", c_int, _P, c_int)
_sig("tt_graph_shape", c_int, _P, c_int, POINTER(c_int64), POINTER(c_int))
_sig("tt_compile", _P, _P, _P)
_sig("tt_module_free", None, _P)
_sig("tt_module_to", c_int, _P, c_char_p)
_sig("tt_module_device", c_char_p, _P)
_sig("tt_module_param_count", c_int, _P)
_sig("tt_module_param_name", c_char_p, _P, c_int)
_sig("tt_module_output_count", c_int, _P)
_sig("tt_module_param", _P, _P, c_char_p)
_sig("tt_forward", c_int, _P, POINTER(_P), c_int, POINTER(_P))
_sig("tt_module_train", None, _P, c_int)
_sig("tt_backward_grads", c_int, POINTER(_P), POINTER(_P), c_int, c_int)
_sig("tt_release_run", c_int, _P)
_sig("tt_tensor_set_requires_grad", c_int, _P, c_int)
_sig("tt_tensor_grad", _P, _P)
_sig("tt_tensor_clear_grad", None, _P)
_sig("tt_param_grad", _P, _P, c_char_p)
_sig("tt_sgd_options_init", None, POINTER(_SgdOptions))
_sig("tt_sgd_opts", _P, _P, POINTER(_SgdOptions))
_sig("tt_step", c_int, _P)
_sig("tt_zero_grad", c_int, _P)
_sig("tt_optimizer_free", None, _P)
_sig("tt_adam_options_init", None, POINTER(_AdamOptions))
_sig("tt_adam_opts", _P, _P, POINTER(_AdamOptions))
_sig("tt_optimizer_lr", c_float, _P)
_sig("tt_optimizer_set_lr", c_int, _P, c_float)
_sig("tt_optimizer_save", c_int, _P, c_char_p)
_sig("tt_optimizer_load", c_int, _P, c_char_p)
_sig("tt_connect_options_init", None, POINTER(_ConnectOptions))
_sig("tt_module_save", c_int, _P, c_char_p)
_sig("tt_module_load", c_int, _P, c_char_p)
_sig("tt_safetensors_save", c_int, _P, c_char_p, POINTER(c_char_p), POINTER(_P), c_int)
_sig("tt_safetensors_save_metadata", c_int, _P, c_char_p, POINTER(c_char_p), POINTER(_P), c_int, POINTER(c_char_p),
     c_int)


def _b(s):
    return None if s is None else s.encode()


class Client:
    """A session with ttd (tt_connect)."""

    def __init__(self, target=None, options=None):
        """options: None, or a dict of tt_connect_options fields (strings for the char * ones)."""
        opts = None
        if options:
            opts = _ConnectOptions()
            _L.tt_connect_options_init(ctypes.byref(opts))
            self._opt_strings = []  # kept alive for the call
            for k, v in options.items():
                if isinstance(v, str):
                    v = v.encode()
                    self._opt_strings.append(v)
                setattr(opts, k, v)
            opts = ctypes.byref(opts)
        p = _P()
        st = _L.tt_connect(_b(target), opts, ctypes.byref(p))
        if st != 0:
            msg = _L.tt_last_error(p).decode() if p else "out of memory"
            _L.tt_disconnect(p)
            raise TTError(st, msg)
        self._p = p.value

    def error(self):
        return TTError(_L.tt_errcode(self._p), _L.tt_last_error(self._p).decode())

    def check(self, status):
        if status != 0:
            raise self.error()

    def checked(self, ptr):
        if not ptr:
            raise self.error()
        return ptr

    def close(self):
        """Closes the session (tt_disconnect); tensors still held keep the client's memory until
        they are freed."""
        if getattr(self, "_p", None) and _L is not None:
            _L.tt_disconnect(self._p)
            self._p = None

    def __del__(self):
        self.close()


# ctypes array types of up to MAX_DIMS elements, made once: making one (c_int64 * n) at
# every call costs more than the call's other arguments together.
_ARRAY_TYPES = {t: [t * max(n, 1) for n in range(MAX_DIMS + 1)] for t in (c_int64, _P)}


def _array_type(ctype, n):
    """ctype * n (one element at least)."""
    return _ARRAY_TYPES[ctype][n] if n <= MAX_DIMS else ctype * n


def _shape_array(shape):
    return _array_type(c_int64, len(shape))(*shape)


def _ptr_array(ptrs):
    """A C array of the tt_ pointers ptrs (one element at least)."""
    return _array_type(_P, len(ptrs))(*ptrs)


# Borrowed host memory (Tensor.borrow): the Python object owning it, by the key libttclient
# hands back to _release_borrowed when it drops a borrowed tensor's last reference. That can
# happen inside any call that frees a tensor, on any thread, after the Tensor object is gone
# (a loss keeps its inputs), so the callback only drops the entry, under the GIL ctypes takes.
_borrowed = {}
_borrow_keys = iter(range(1, 2**63))


@ctypes.CFUNCTYPE(None, c_void_p)
def _release_borrowed(key, borrowed=_borrowed):
    borrowed.pop(key, None)


# Never freed: libttclient may call it until the process ends, even while modules are torn down.
ctypes.pythonapi.Py_IncRef(ctypes.py_object(_release_borrowed))
_release_borrowed_ptr = ctypes.cast(_release_borrowed, c_void_p)


def _wrap_borrowed(client, owner, data_ptr, dtype, shape):
    """tt_tensor_wrap_host over owner's memory at data_ptr, owner kept until libttclient
    releases it: the tt_tensor pointer, one reference for the caller."""
    key = next(_borrow_keys)
    _borrowed[key] = owner
    p = None
    try:
        p = _L.tt_tensor_wrap_host(client._p, data_ptr, dtype, _shape_array(shape), len(shape), _release_borrowed_ptr,
                                   key)
    finally:
        if not p:  # refused: libttclient never calls release
            del _borrowed[key]
    return client.checked(p)


class Tensor:
    """One reference to a tt_tensor (host or device)."""

    def __init__(self, client, ptr, keep=None, shape=None, dtype=None):
        self.client = client
        self._p = client.checked(ptr)
        self._keep = keep  # what must outlive this tensor (e.g. the module of a run)
        if shape is not None:  # known where the tensor is made: no call asks libttclient
            self._shape = tuple(shape)
        if dtype is not None:
            self._dtype = dtype

    @classmethod
    def from_host(cls, client, data_ptr, dtype, shape):
        """A host tensor holding a copy of numel * size bytes at data_ptr (tt_tensor_from_host)."""
        return cls(client, _L.tt_tensor_from_host(client._p, c_void_p(data_ptr), dtype, _shape_array(shape),
                                                  len(shape)))

    @classmethod
    def borrow(cls, client, owner, data_ptr, dtype, shape):
        """A host tensor over the numel * size bytes at data_ptr, not a copy (tt_tensor_wrap_host):
        owner, the object whose memory that is (a contiguous CPU torch tensor), stays alive
        until libttclient drops the tensor's last reference, which may outlive this object.
        The memory is read, never written."""
        return cls(client, _wrap_borrowed(client, owner, data_ptr, dtype, shape), shape=shape, dtype=dtype)

    @classmethod
    def borrowed_to(cls, client, owner, data_ptr, dtype, shape, device):
        """borrow(...).to(device) with no Python object for the host tensor, which goes at
        once: the device tensor of the numel * size bytes at data_ptr."""
        host = _wrap_borrowed(client, owner, data_ptr, dtype, shape)
        try:
            return cls(client, _L.tt_to(host, device.encode()), shape=shape, dtype=dtype)
        finally:
            _L.tt_tensor_free(host)

    def to(self, device, dtype=None):
        """tt_to / tt_to_dtype: the same shape, on `device` (and of `dtype`)."""
        if dtype is None or dtype == self.dtype:
            return Tensor(self.client, _L.tt_to(self._p, device.encode()), self._keep, self.shape, self.dtype)
        return Tensor(self.client, _L.tt_to_dtype(self._p, device.encode(), dtype), self._keep, self.shape, dtype)

    def copy_(self, src):
        """torch's self.copy_(src) (tt_copy_): src's values written into this tensor's memory,
        host or device either side, after any work queued on either (a .grad's Backward)."""
        self.client.check(_L.tt_copy_(self._p, src._p))

    @property
    def shape(self):
        shape = self.__dict__.get("_shape")
        if shape is None:  # a tensor's shape never changes: asked once
            n = _L.tt_tensor_ndim(self._p)
            s = _L.tt_tensor_shape(self._p)
            shape = self._shape = tuple(s[i] for i in range(n))
        return shape

    @property
    def dtype(self):
        dtype = self.__dict__.get("_dtype")
        if dtype is None:
            dtype = self._dtype = _L.tt_tensor_dtype(self._p)
        return dtype

    @property
    def device(self):
        return _L.tt_tensor_device(self._p).decode()

    @property
    def is_host(self):
        return bool(_L.tt_tensor_is_host(self._p))

    @property
    def nbytes(self):
        return _L.tt_tensor_nbytes(self._p)

    def read_into(self, dst_ptr, nbytes):
        """tt_read: this tensor's values (host or device) into the nbytes at dst_ptr, its size."""
        self.client.check(_L.tt_read(self._p, dst_ptr, nbytes))

    def set_requires_grad(self):
        """tt_tensor_set_requires_grad: a Backward of a forward this tensor feeds fills its .grad."""
        self.client.check(_L.tt_tensor_set_requires_grad(self._p, 1))

    def take_grad(self):
        """This tensor's .grad (tt_tensor_grad), which it then drops; None when it has none."""
        p = _L.tt_tensor_grad(self._p)
        if not p:
            return None
        _L.tt_tensor_clear_grad(self._p)
        return Tensor(self.client, p, self._keep, self.shape, FLOAT32)  # gradients are float32

    def release_run(self):
        """tt_release_run: the activations of the training forward that made this output go."""
        self.client.check(_L.tt_release_run(self._p))

    def __del__(self):
        if getattr(self, "_p", None) and _L is not None:
            _L.tt_tensor_free(self._p)
            self._p = None


def backward(outputs, grads, retain_graph):
    """tt_backward_grads: outputs[i] (device or host outputs of training forwards) get the
    gradients grads[i], contiguous float32 CPU torch tensors of their shapes, lent to
    libttclient (no Python object for their host tensors); each run reached runs its
    Backward once."""
    n = len(outputs)
    client = outputs[0].client
    hosts = []
    try:
        for g in grads:
            hosts.append(_wrap_borrowed(client, g, g.data_ptr(), FLOAT32, g.shape))
        client.check(_L.tt_backward_grads(_ptr_array([t._p for t in outputs]), _ptr_array(hosts), n,
                                          1 if retain_graph else 0))
    finally:
        for h in hosts:
            _L.tt_tensor_free(h)


def safetensors_save(client, path, named, metadata=None):
    """tt_safetensors_save_metadata of [(name, host Tensor)] and {key: value} strings."""
    names = (c_char_p * max(len(named), 1))(*[n.encode() for n, _ in named])
    ts = (_P * max(len(named), 1))(*[t._p for _, t in named])
    pairs = [s.encode() for kv in (metadata or {}).items() for s in kv]
    meta = (c_char_p * max(len(pairs), 1))(*pairs)
    client.check(_L.tt_safetensors_save_metadata(client._p, path.encode(), names, ts, len(named), meta,
                                                 len(pairs) // 2))


class Graph:
    """A graph being built (tt_graph_*); values are ints, a failed one raises at once."""

    def __init__(self, client, seed=0):
        self.client = client
        self._p = client.checked(_L.tt_graph_create(client._p, seed))

    def _v(self, v):
        if v < 0:
            raise self.client.error()
        return v

    def input(self, name, dtype, shape):
        return self._v(_L.tt_graph_input(self._p, name.encode(), dtype, _shape_array(shape), len(shape)))

    def param_from(self, name, tensor):
        return self._v(_L.tt_graph_param_from(self._p, name.encode(), tensor._p))

    def op(self, op, inputs, attrs=None):
        arr = (c_int * max(len(inputs), 1))(*inputs)
        return self._v(_L.tt_graph_op(self._p, op.encode(), arr, len(inputs), _b(attrs)))

    def output(self, value):
        if _L.tt_graph_output(self._p, value) != 0:
            raise self.client.error()

    def shape(self, value):
        """The inferred shape of a value (tt_graph_shape)."""
        dims, nd = (c_int64 * 8)(), c_int()
        if _L.tt_graph_shape(self._p, value, dims, ctypes.byref(nd)) != 0:
            raise self.client.error()
        return tuple(dims[:nd.value])

    def __del__(self):
        if getattr(self, "_p", None) and _L is not None:
            _L.tt_graph_free(self._p)
            self._p = None


class Module:
    """A compiled module (tt_compile), starting on "cpu"."""

    _OUT_SPECS_MAX = 256  # input signatures whose outputs' shapes and dtypes are remembered

    def __init__(self, graph):
        self.client = graph.client
        self._p = self.client.checked(_L.tt_compile(self.client._p, graph._p))
        self._n_out = _L.tt_module_output_count(self._p)
        self._out_specs = {}  # (shape, dtype) of each input -> (shape, dtype) of each output

    def to(self, device):
        self.client.check(_L.tt_module_to(self._p, device.encode()))

    @property
    def device(self):
        return _L.tt_module_device(self._p).decode()

    def param_names(self):
        return [_L.tt_module_param_name(self._p, i).decode() for i in range(_L.tt_module_param_count(self._p))]

    def param(self, name):
        return Tensor(self.client, _L.tt_module_param(self._p, name.encode()), self)

    def param_grad(self, name):
        """The .grad of a parameter where the module is; None before the first backward."""
        p = _L.tt_param_grad(self._p, name.encode())
        if not p:
            err = self.client.error()
            if err.code == 9:  # FAILED_PRECONDITION: no backward yet
                return None
            raise err
        return Tensor(self.client, p, self)

    def train(self, training):
        _L.tt_module_train(self._p, 1 if training else 0)

    def save(self, path):
        """tt_module_save: the parameters, wherever they are, to a safetensors file."""
        self.client.check(_L.tt_module_save(self._p, path.encode()))

    def load(self, path):
        """tt_module_load: every parameter from a safetensors file, where the module is."""
        self.client.check(_L.tt_module_load(self._p, path.encode()))

    def forward(self, inputs):
        """tt_forward: the output tensors. Their shapes and dtypes follow from the inputs' (the
        program is specialised per input shape), so they are asked once per input signature."""
        n_out = self._n_out
        outs = _array_type(_P, n_out)()
        self.client.check(_L.tt_forward(self._p, _ptr_array([t._p for t in inputs]), len(inputs), outs))
        key = tuple([(t.shape, t.dtype) for t in inputs])
        specs = self._out_specs.get(key)
        if specs is not None:
            return [Tensor(self.client, outs[i], self, *specs[i]) for i in range(n_out)]
        res = [Tensor(self.client, outs[i], self) for i in range(n_out)]
        if len(self._out_specs) >= self._OUT_SPECS_MAX:
            self._out_specs.clear()
        self._out_specs[key] = [(t.shape, t.dtype) for t in res]
        return res

    def __del__(self):
        if getattr(self, "_p", None) and _L is not None:
            _L.tt_module_free(self._p)
            self._p = None


class Optimizer:
    """tt_sgd_opts over all of a module's parameters, stepping where the module is."""

    def __init__(self, module, ptr):
        self.module = module
        self._p = module.client.checked(ptr)

    @classmethod
    def sgd(cls, module, lr, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False):
        o = _SgdOptions()
        _L.tt_sgd_options_init(ctypes.byref(o))
        o.lr, o.momentum, o.dampening, o.weight_decay, o.nesterov = lr, momentum, dampening, weight_decay, int(nesterov)
        return cls(module, _L.tt_sgd_opts(module._p, ctypes.byref(o)))

    @classmethod
    def adam(cls, module, lr, beta1, beta2, eps, weight_decay, decoupled):
        o = _AdamOptions()
        _L.tt_adam_options_init(ctypes.byref(o))
        o.lr, o.beta1, o.beta2, o.eps, o.weight_decay, o.decoupled = lr, beta1, beta2, eps, weight_decay, int(decoupled)
        return cls(module, _L.tt_adam_opts(module._p, ctypes.byref(o)))

    @property
    def lr(self):
        return _L.tt_optimizer_lr(self._p)

    def set_lr(self, lr):
        self.module.client.check(_L.tt_optimizer_set_lr(self._p, lr))

    def save(self, path):
        self.module.client.check(_L.tt_optimizer_save(self._p, path.encode()))

    def load(self, path):
        self.module.client.check(_L.tt_optimizer_load(self._p, path.encode()))

    def step(self):
        self.module.client.check(_L.tt_step(self._p))

    def zero_grad(self):
        self.module.client.check(_L.tt_zero_grad(self._p))

    def __del__(self):
        if getattr(self, "_p", None) and _L is not None:
            _L.tt_optimizer_free(self._p)
            self._p = None
