#!/usr/bin/python3
"""Writes the seed corpus of the fuzz harnesses: tests/fuzz/corpus/HARNESS/seed-NAME.

  PYTHONPATH=build/py tests/fuzz/make_corpus.py tests/fuzz/corpus   (make fuzz-corpus)

Seeds are valid inputs of each harness's format (see the comment at the top of
tests/fuzz/fuzz_HARNESS.c), messages packed from proto/ttd/v1/ttd.proto, and a few edge
cases. Files named crash-* are regression inputs of bugs the fuzzer found: this script
leaves them alone. Handles are the harnesses' deterministic ones (fuzz_random.h): the
input's session is 0x13, its shared-memory segment (64 KiB) 0x14, and what its calls
create counts up from 0x15."""

import hashlib
import os
import re
import struct
import sys

from ttd.v1 import ttd_pb2 as pb

F32, BF16, I32 = pb.DTYPE_FLOAT32, pb.DTYPE_BFLOAT16, pb.DTYPE_INT32
SESSION = 0x13
SEGMENT = 0x14  # the session's shared-memory segment
FIRST = 0x15  # the first handle an input's calls create

HERE = os.path.dirname(os.path.abspath(__file__))


def method_order():
    """Method names in the order of daemon/methods/table.c (the rpc harness's selector)."""
    with open(os.path.join(HERE, "..", "..", "daemon", "methods/table.c")) as f:
        text = f.read()
    table = text[text.index("ttd_methods[] = {"):]
    return re.findall(r'(?:UNARY|HEAVY|DEVICE_WORK)\("(\w+)"|/ttd\.v1\.Device/(\w+)"', table)


METHODS = ["".join(m) for m in method_order()]

# Selector >> 5 of the rpc harness: which session metadata a call carries.
MD_SESSION, MD_LATEST, MD_NONE, MD_BAD_ID, MD_OTHER_INSTANCE = 0, 4, 5, 6, 7


def call(method, message=b"", md=MD_SESSION):
    body = message if isinstance(message, bytes) else message.SerializeToString()
    return bytes([md << 5 | METHODS.index(method)]) + struct.pack("<H", len(body)) + body


def spec(dtype, shape, device="", location=0):
    return pb.TensorSpec(dtype=dtype, shape=shape, device=device, location=location)


def floats(values):
    return struct.pack("<%df" % len(values), *values)


def value(name, dtype, shape):
    return pb.ValueSpec(name=name, dtype=dtype, shape=shape)


def node(name, op, inputs, **attrs):
    n = pb.Node(name=name, op=op, inputs=inputs)
    for key, v in attrs.items():
        a = n.attrs.add(name=key)
        if isinstance(v, list):
            a.ints.values.extend(v)
        elif isinstance(v, float):
            a.f = v
        else:
            a.i = v
    return n


def graph(inputs=(), params=(), nodes=(), outputs=()):
    return pb.Graph(inputs=list(inputs), parameters=list(params), nodes=list(nodes), outputs=list(outputs))


def shm(offset, length, segment=SEGMENT):
    return pb.ShmRange(segment=segment, offset=offset, length=length)


def inline(dtype, shape, data):
    return pb.InlineTensor(spec=spec(dtype, shape), data=data)


# ---- rpc: sequences of calls ----

def mlp_graph():
    return graph([value("x", F32, [4, 3]), value("t", F32, [4, 2])], [value("w", F32, [2, 3]), value("b", F32, [2])],
                 [node("y", "linear", ["x", "w", "b"]), node("a", "relu", ["y"]), node("loss", "mse_loss", ["a", "t"])],
                 ["loss"])


def rpc_seeds():
    s = {}
    s["session-calls"] = b"".join([
        call("OpenSession", pb.OpenSessionRequest(client_name="fuzz", protocol_version=1)),  # session 0x17 (keys 0x15, 0x16)
        call("KeepAlive", pb.KeepAliveRequest(), MD_LATEST),
        call("ListDevices", pb.ListDevicesRequest(), MD_NONE),
        call("ListSessions", pb.ListSessionsRequest()),
        call("KillSession", pb.KillSessionRequest(session_id=0x17)),
        call("KeepAlive", pb.KeepAliveRequest(), MD_LATEST),
        call("CloseSession", pb.CloseSessionRequest()),
        call("KeepAlive", pb.KeepAliveRequest()),
    ])
    s["open-session-quota-and-version"] = b"".join([
        call("OpenSession", pb.OpenSessionRequest(client_name="q\x01\"\\", protocol_version=1, quota_bytes=4096)),
        call("Allocate", pb.AllocateRequest(spec=spec(F32, [32, 33])), MD_LATEST),
        call("OpenSession", pb.OpenSessionRequest(protocol_version=2)),
    ])
    s["allocate-move-download-free"] = b"".join([
        call("Allocate", pb.AllocateRequest(spec=spec(F32, [4, 4]))),  # FIRST
        call("Download", pb.DownloadRequest(handle=FIRST, chunk_bytes=20)),
        call("Move", pb.MoveRequest(handle=FIRST, device="tt:1", location=pb.MEMORY_LOCATION_L1)),  # FIRST + 1
        call("Move", pb.MoveRequest(handle=FIRST + 1, free_source=True)),  # FIRST + 2, frees FIRST + 1
        call("Download", pb.DownloadRequest(handle=FIRST + 2, target_dtype=BF16)),
        call("Free", pb.FreeRequest(handles=[FIRST, FIRST + 2])),
        call("Free", pb.FreeRequest(handles=[FIRST])),
    ])
    s["upload-convert-download"] = b"".join([
        call("Upload", pb.UploadRequest(header=pb.UploadHeader(spec=spec(BF16, [2, 3], "tt:1"), source_dtype=F32),
                                        data=floats([1, -2, 3.5, 0, 1e30, -1e-30]))),  # FIRST
        call("Download", pb.DownloadRequest(handle=FIRST, target_dtype=F32, chunk_bytes=8)),
        call("Upload", pb.UploadRequest(header=pb.UploadHeader(handle=FIRST), data=b"\x01\x02" * 6)),
        call("Free", pb.FreeRequest(handles=[FIRST, FIRST])),
    ])
    s["train-mlp"] = b"".join([
        call("Allocate", pb.AllocateRequest(spec=spec(F32, [2, 3]))),  # w: FIRST
        call("Allocate", pb.AllocateRequest(spec=spec(F32, [2]))),  # b: FIRST + 1
        call("Compile", pb.CompileRequest(graph=mlp_graph())),  # program: FIRST + 2
        call("Execute", pb.ExecuteRequest(
            program=FIRST + 2, parameters=[FIRST, FIRST + 1], keep_for_backward=True,
            inline_inputs=[inline(F32, [4, 3], floats(range(12))), inline(F32, [4, 2], floats([1] * 8))],
            output_mode=pb.OUTPUT_MODE_HANDLES_AND_INLINE)),  # loss: FIRST + 3, run: FIRST + 4
        call("Backward", pb.BackwardRequest(
            run=FIRST + 4, inline_output_grads=[inline(F32, [], floats([1]))], input_grads=True, keep_run=True,
            after=pb.ParameterWork(step=pb.OptimizerStepRequest(sgd=pb.SgdOptions(lr=0.1, momentum=0.9))))),
        call("ZeroGrad", pb.ZeroGradRequest(parameters=[FIRST, FIRST + 1])),
        call("OptimizerStep", pb.OptimizerStepRequest(
            parameters=[FIRST, FIRST + 1], adam=pb.AdamOptions(lr=0.01, beta1=0.9, beta2=0.999, eps=1e-8))),
        call("Execute", pb.ExecuteRequest(
            program=FIRST + 2, inputs=[0, 0], parameters=[FIRST, FIRST + 1], free=[FIRST + 3],
            inline_inputs=[inline(F32, [4, 3], floats([0.5] * 12)), inline(F32, [4, 2], floats([2] * 8))],
            before=pb.ParameterWork(zero_grad=pb.ZeroGradRequest(parameters=[FIRST])))),
        call("ReleaseRun", pb.ReleaseRunRequest(run=FIRST + 4)),
        call("ReleaseRun", pb.ReleaseRunRequest(run=FIRST + 4)),
    ])
    state = pb.OptimizerStateRequest
    s["optimizer-state"] = b"".join([
        call("Allocate", pb.AllocateRequest(spec=spec(F32, [2, 3]))),  # parameter: FIRST
        call("Allocate", pb.AllocateRequest(spec=spec(F32, [2, 3]))),  # a buffer: FIRST + 1
        call("Allocate", pb.AllocateRequest(spec=spec(F32, [3, 2]))),  # a wrong shape: FIRST + 2
        call("OptimizerState", state(parameters=[FIRST, FIRST])),
        call("OptimizerState", state(set=[pb.ParameterState(parameter=FIRST, step=3, buffers=[FIRST + 1, FIRST + 1])])),
        call("OptimizerState", state(parameters=[FIRST])),  # two copies: FIRST + 3, FIRST + 4
        call("OptimizerState", state(set=[pb.ParameterState(parameter=FIRST, buffers=[FIRST + 2])])),
        call("OptimizerState", state(set=[pb.ParameterState(parameter=FIRST + 1, from_parameter=FIRST)])),
        call("OptimizerState", state(set=[pb.ParameterState(parameter=FIRST, step=-1)])),
        call("OptimizerState", state(parameters=[FIRST], set=[pb.ParameterState(parameter=FIRST)])),
        call("Free", pb.FreeRequest(handles=[FIRST + 3, FIRST + 4])),
    ])
    s["execute-by-handle"] = b"".join([
        call("Allocate", pb.AllocateRequest(spec=spec(F32, [2, 2]))),  # FIRST
        call("Compile", pb.CompileRequest(graph=graph([value("x", F32, [2, 2])], [], [node("r", "relu", ["x"])],
                                                      ["r"]))),  # FIRST + 1
        call("Compile", pb.CompileRequest(graph=graph([value("x", F32, [2, 2])], [], [node("r", "relu", ["x"])],
                                                      ["r"]))),  # cached: FIRST + 2
        call("Execute", pb.ExecuteRequest(program=FIRST + 1, inputs=[FIRST])),  # FIRST + 3
        call("Execute", pb.ExecuteRequest(program=FIRST + 2, inputs=[FIRST + 3], keep_for_backward=True,
                                          output_mode=pb.OUTPUT_MODE_INLINE)),
        call("Backward", pb.BackwardRequest(run=FIRST + 4, output_grads=[FIRST], input_grads=True)),
        call("Execute", pb.ExecuteRequest(program=FIRST + 1, inputs=[FIRST, FIRST])),
        call("Execute", pb.ExecuteRequest(program=FIRST, inputs=[FIRST])),
    ])
    relu = graph([value("x", F32, [2, 2])], [], [node("r", "relu", ["x"])], ["r"])
    s["shared-memory"] = b"".join([
        call("Allocate", pb.AllocateRequest(spec=spec(F32, [4, 4]))),  # FIRST
        call("Upload", pb.UploadRequest(header=pb.UploadHeader(spec=spec(F32, [2, 2]), shm=shm(0, 16)))),  # FIRST + 1
        call("Download", pb.DownloadRequest(handle=FIRST + 1, shm=shm(100, 16))),
        call("Download", pb.DownloadRequest(handle=FIRST, shm=shm(65536 - 64, 64))),
        call("Compile", pb.CompileRequest(graph=relu)),  # FIRST + 2
        call("Execute", pb.ExecuteRequest(program=FIRST + 2, inline_inputs=[
            pb.InlineTensor(spec=spec(F32, [2, 2]), shm=shm(8, 16))], output_mode=pb.OUTPUT_MODE_INLINE)),
        call("Upload", pb.UploadRequest(header=pb.UploadHeader(handle=FIRST, shm=shm(65536 - 32, 64)))),
        call("Download", pb.DownloadRequest(handle=FIRST, shm=shm((1 << 64) - 8, 64))),
        call("Upload", pb.UploadRequest(header=pb.UploadHeader(handle=FIRST, shm=shm(0, 64)), data=b"\0")),
    ])
    s["bad-metadata"] = b"".join([
        call("Allocate", pb.AllocateRequest(spec=spec(F32, [1])), MD_NONE),
        call("Allocate", pb.AllocateRequest(spec=spec(F32, [1])), MD_BAD_ID),
        call("Allocate", pb.AllocateRequest(spec=spec(F32, [1])), MD_OTHER_INSTANCE),
        call("ListDevices", b"\xff\xff"),
        call("Allocate", b"\x0a\x05\x08"),
    ])
    s["bad-specs"] = b"".join([
        call("Allocate", pb.AllocateRequest(spec=spec(F32, [1 << 31, 1 << 31, 4]))),
        call("Allocate", pb.AllocateRequest(spec=spec(F32, [-1, 2]))),
        call("Allocate", pb.AllocateRequest(spec=spec(F32, [1] * 9))),
        call("Allocate", pb.AllocateRequest(spec=spec(7, [1]))),
        call("Allocate", pb.AllocateRequest(spec=spec(I32, [2], "tt:7"))),
        call("Allocate", pb.AllocateRequest(spec=spec(I32, [2], "tt:1", 9))),
        call("Allocate", pb.AllocateRequest(spec=spec(F32, [1 << 20]))),
        call("Allocate", pb.AllocateRequest()),
    ])
    ending = ("CloseSession", "KillSession")  # last: they end the session the others use
    every = [call(m) for m in METHODS if m not in ending] + [call(m) for m in ending]
    s["every-method-empty-a"] = b"".join(every[:len(every) // 2])
    s["every-method-empty-b"] = b"".join(every[len(every) // 2:])
    return s


# ---- upload: one stream ----

def message(req, slice_bytes=0):
    body = req if isinstance(req, bytes) else req.SerializeToString()
    return bytes([slice_bytes]) + struct.pack("<H", len(body)) + body


END, ABORT, QUOTA = 1, 0, 2


def upload_seeds():
    header = pb.UploadHeader
    s = {}
    s["new-one-message"] = bytes([END]) + message(
        pb.UploadRequest(header=header(spec=spec(F32, [2, 3])), data=floats(range(6))))
    s["handle-chunked"] = bytes([END]) + message(pb.UploadRequest(header=header(handle=FIRST))) + b"".join(
        message(pb.UploadRequest(data=bytes(range(n))), 7) for n in (32, 32, 16))
    s["float32-into-bfloat16-split-elements"] = bytes([END]) + message(
        pb.UploadRequest(header=header(handle=FIRST + 1, source_dtype=F32))) + b"".join(
        message(pb.UploadRequest(data=floats(range(9))[i:i + 5]), 3) for i in range(0, 36, 5))
    s["bfloat16-into-bfloat16"] = bytes([END]) + message(
        pb.UploadRequest(header=header(handle=FIRST + 1), data=b"\x80\x3f" * 9), 1)
    s["ends-short"] = bytes([END]) + message(pb.UploadRequest(header=header(spec=spec(I32, [4], "tt:1",
                                                                                      pb.MEMORY_LOCATION_L1)),
                                                              data=b"\0" * 12))
    s["broken-off"] = bytes([ABORT]) + message(pb.UploadRequest(header=header(spec=spec(F32, [8])),
                                                                data=b"\0" * 16))
    s["past-the-end"] = bytes([END]) + message(pb.UploadRequest(header=header(handle=FIRST), data=b"\0" * 80)) + \
        message(pb.UploadRequest(data=b"\0"))
    s["header-twice"] = bytes([END]) + message(pb.UploadRequest(header=header(handle=FIRST))) + \
        message(pb.UploadRequest(header=header(handle=FIRST)))
    s["data-before-header"] = bytes([END]) + message(pb.UploadRequest(data=b"\0" * 8))
    s["quota-exact"] = bytes([END | QUOTA]) + message(
        pb.UploadRequest(header=header(spec=spec(F32, [30, 32])), data=b"\0" * 3840), 200)
    s["quota-over"] = bytes([END | QUOTA]) + message(pb.UploadRequest(header=header(spec=spec(F32, [33, 32]))))
    s["unknown-and-unconvertible"] = bytes([END]) + message(
        pb.UploadRequest(header=header(handle=FIRST, source_dtype=I32))) + message(
        b"\x18\x05" + pb.UploadRequest(header=header(spec=spec(F32, [1]))).SerializeToString())
    s["no-target"] = bytes([END]) + message(pb.UploadRequest(header=header(source_dtype=F32)))
    s["empty-stream"] = bytes([END])
    s["shm-range-unknown-segment"] = bytes([END]) + message(pb.UploadRequest(
        header=header(handle=FIRST, shm=shm(0, 80, segment=9))))
    s["shm-into-handle"] = bytes([END]) + message(pb.UploadRequest(header=header(handle=FIRST, shm=shm(4, 80))))
    s["shm-convert-new"] = bytes([END]) + message(pb.UploadRequest(
        header=header(spec=spec(BF16, [3, 5], "tt:1"), source_dtype=F32, shm=shm(60, 60))), 5)
    s["shm-past-segment-end"] = bytes([END]) + message(pb.UploadRequest(
        header=header(handle=FIRST, shm=shm(65536 - 79, 80))))
    s["shm-and-data"] = bytes([END]) + message(pb.UploadRequest(header=header(handle=FIRST, shm=shm(0, 80)))) + \
        message(pb.UploadRequest(data=b"\1"))
    return s


# ---- compile: a flags byte and a CompileRequest ----

RUN, BACKWARD, INT_SMALL, INT_ANY = 1, 2, 4, 8


def compile_seed(flags, g):
    return bytes([flags]) + pb.CompileRequest(graph=g).SerializeToString()


def compile_seeds():
    FB = RUN | BACKWARD
    s = {}
    s["mlp"] = compile_seed(FB, mlp_graph())
    s["matmul-transposed"] = compile_seed(FB, graph(
        [value("a", F32, [2, 3, 4])], [value("b", BF16, [5, 4])],
        [node("m", "matmul", ["a", "b"], transpose_b=1), node("t", "transpose", ["m"], dim0=0, dim1=2),
         node("s", "sum", ["t"], axes=[0, -1], keepdim=1)], ["s", "m"]))
    s["lenet-like"] = compile_seed(FB | INT_SMALL, graph(
        [value("img", F32, [2, 1, 8, 8]), value("labels", I32, [2])],
        [value("k", F32, [3, 1, 3, 3]), value("kb", F32, [3]), value("w", F32, [4, 45]), value("wb", F32, [4])],
        [node("c", "conv2d", ["img", "k", "kb"], stride=1, padding=1), node("p", "max_pool2d", ["c"], kernel=2),
         node("q", "avg_pool2d", ["p"], kernel=[2, 2], stride=[1, 1], padding=[1, 0]),
         node("f", "flatten", ["q"]), node("l", "linear", ["f", "w", "wb"]),
         node("loss", "cross_entropy", ["l", "labels"])], ["loss"]))
    s["attention-bits"] = compile_seed(FB, graph(
        [value("x", F32, [2, 4, 6])], [value("g", F32, [6]), value("bta", F32, [6])],
        [node("n", "layer_norm", ["x", "g", "bta"], eps=1e-5), node("p", "permute", ["n"], perm=[0, 2, 1]),
         node("a", "matmul", ["n", "p"]), node("sm", "softmax", ["a"], axis=-1),
         node("ls", "log_softmax", ["a"]), node("d", "dropout", ["sm"], p=0.25, seed=7),
         node("g2", "gelu", ["d"]), node("o", "add", ["g2", "ls"])], ["o"]))
    s["embedding"] = compile_seed(FB | INT_SMALL, graph(
        [value("ids", I32, [3, 2])], [value("table", F32, [5, 4])],
        [node("e", "embedding", ["ids", "table"]), node("r", "reshape", ["e"], shape=[-1, 4]),
         node("m", "mean", ["r"])], ["m"]))
    s["embedding-bad-ids"] = compile_seed(FB | INT_ANY, graph(
        [value("ids", I32, [4])], [value("table", F32, [3, 2])], [node("e", "embedding", ["ids", "table"])], ["e"]))
    s["cross-entropy-bad-labels"] = compile_seed(FB | INT_ANY, graph(
        [value("z", F32, [3, 4]), value("y", I32, [3])], [], [node("l", "cross_entropy", ["z", "y"])], ["l"]))
    s["elementwise-broadcast"] = compile_seed(FB, graph(
        [value("x", F32, [3, 1, 4]), value("y", BF16, [2, 1])], [value("w", F32, [4])],
        [node("a", "mul", ["x", "y"]), node("b", "div", ["a", "w"]), node("c", "sub", ["b", "x"]),
         node("d", "exp", ["c"]), node("e", "log", ["d"]), node("f", "tanh", ["e"]), node("g", "sigmoid", ["f"]),
         node("h", "l1_loss", ["g", "g"])], ["h", "b"]))
    s["int-reshape"] = compile_seed(RUN, graph([value("i", I32, [2, 3])], [], [node("r", "reshape", ["i"], shape=[3, 2])],
                                               ["r", "i"]))
    s["scalar-and-empty"] = compile_seed(FB, graph(
        [value("s", F32, []), value("z", F32, [0, 3])], [], [node("a", "relu", ["s"]), node("b", "sum", ["z"], axes=1)],
        ["a", "b"]))
    s["cycle"] = compile_seed(RUN, graph([value("x", F32, [2])], [],
                                         [node("a", "add", ["x", "b"]), node("b", "relu", ["a"])], ["b"]))
    s["self-reference"] = compile_seed(RUN, graph([], [], [node("a", "relu", ["a"])], ["a"]))
    s["duplicate-names"] = compile_seed(RUN, graph([value("x", F32, [2]), value("x", F32, [2])], [], [], ["x"]))
    s["unknown-op-and-attr"] = compile_seed(RUN, graph([value("x", F32, [2])], [],
                                                       [node("a", "frobnicate", ["x"]), node("b", "relu", ["x"], k=1)],
                                                       ["a"]))
    s["bad-attrs"] = compile_seed(RUN, graph(
        [value("x", F32, [1, 1, 4, 4])], [],
        [node("p", "max_pool2d", ["x"], kernel=[2, 2], padding=[3, 3]), node("q", "transpose", ["x"], dim0=9),
         node("r", "reshape", ["x"], shape=[-1, -1]), node("f", "flatten", ["x"], start_dim=-9)], ["p"]))
    s["axes-past-2p32"] = compile_seed(RUN, graph(
        [value("x", F32, [2, 3])], [], [node("t", "transpose", ["x"], dim0=1 << 32, dim1=1),
                                        node("s", "sum", ["x"], axes=[(1 << 32) + 1])], ["t", "s"]))
    s["no-outputs"] = compile_seed(RUN, graph([value("x", F32, [2])]))
    s["huge-shapes"] = compile_seed(RUN, graph(
        [value("a", F32, [1 << 31, 1]), value("b", F32, [1, 1 << 31])], [], [node("m", "matmul", ["a", "b"])], ["m"]))
    return s


# ---- config and tokens: text ----

def config_seeds():
    with open(os.path.join(HERE, "..", "..", "scripts", "ttd.conf"), "rb") as f:
        sample = f.read()
    s = {"sample-file": b"\0" + sample}
    s["every-type"] = b"\0" + b"\n".join([
        b"listen = unix:/tmp/x.sock", b"listen=127.0.0.1:1", b"threads = 8", b"devices=2", b"dram = 2GiB",
        b"l1 = 1536K", b"lease = 1.5s", b"drain-timeout = 250ms", b"insecure = yes", b"shm = 0",
        b"quota = 4G # a comment", b"tokens = /etc/ttd/tokens", b"tls-client-ca = ca.pem", b"  ", b"# only"])
    s["bad-values"] = b"\0" + b"threads = 0x10\n"
    s["no-equals"] = b"\0" + b"threads 4\n"
    s["nested-config"] = b"\0" + b"config = /etc/ttd/ttd.conf\n"
    s["size-overflow"] = b"\0" + b"18446744073709551615T"
    s["duration-edge"] = b"\0" + b"9e15ms"
    s["flags"] = b"\x01" + b"\n".join([b"--listen", b"unix:/tmp/a", b"--threads=3", b"--insecure", b"--dram", b"1G",
                                       b"--listen=0.0.0.0:5"])
    s["flags-bad"] = b"\x01" + b"\n".join([b"--threads", b"--unknown", b"x"])
    s["flags-help"] = b"\x01" + b"--help"
    return s


def token_line(name, token, extra=b""):
    return name + b" sha256:" + hashlib.sha256(token).hexdigest().encode() + extra


def tokens_seeds():
    file = b"\n".join([b"# tenants", token_line(b"alice", b"tok-a", b" admin quota=4G"),
                       token_line(b"bob", b"tok-b", b"\tquota=512M"), b"", token_line(b"c.d_e-1", b"tok-c")])
    s = {"admin-match": b"Bearer tok-a\n" + file}
    s["quota-match"] = b"bearer tok-b\n" + file
    s["no-match"] = b"Bearer nope\n" + file
    s["other-scheme"] = b"Basic dG9rLWE=\n" + file
    s["no-header"] = b"\n" + file
    s["duplicate-tenant"] = b"Bearer tok-a\n" + file + b"\n" + token_line(b"alice", b"tok-z")
    s["duplicate-digest"] = b"Bearer tok-a\n" + file + b"\n" + token_line(b"zed", b"tok-a")
    s["bad-digest"] = b"Bearer x\nname sha256:12\n"
    s["bad-name"] = b"Bearer x\n" + token_line(b"a/b", b"x")
    s["bad-option"] = b"Bearer x\n" + token_line(b"a", b"x", b" root")
    s["zero-quota"] = b"Bearer x\n" + token_line(b"a", b"x", b" quota=0")
    s["long-name"] = b"Bearer x\n" + token_line(b"n" * 64, b"x")
    return s


# ---- h2_frames: a client's HTTP/2 bytes as the relay reads them ----

H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def h2_frame(kind, stream, payload=b"", flags=0, length=None):
    n = len(payload) if length is None else length
    return struct.pack(">I", n)[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def h2_frames_seeds():
    headers = b"\x83\x86\x00\x05:path\x1a/ttd.v1.Device/ListDevices"
    opening = H2_PREFACE + h2_frame(4, 0) + h2_frame(1, 1, headers, 4)
    s = {"call": b"\x01\x07" + opening + h2_frame(0, 1, b"\0\0\0\0\0", 1) + h2_frame(6, 0, b"\0" * 8)}
    s["reset-flood"] = b"\x01\xff" + H2_PREFACE + b"".join(
        h2_frame(1, 2 * i + 1, headers, 4) + h2_frame(3, 2 * i + 1, b"\0\0\0\x08") for i in range(210))
    s["resets-over-time"] = b"\x15\x10" + H2_PREFACE + b"".join(h2_frame(3, 2 * i + 1, b"\0\0\0\x08") for i in range(300))
    s["oversized"] = b"\x01\x03" + opening + h2_frame(0, 1, b"", 0, 0x400000)
    s["largest"] = b"\x01\x20" + opening + h2_frame(0, 1, b"x" * 64, 0, 0x3fffff)
    s["bad-preface"] = b"\x01\x00GET / HTTP/1.1\r\nHost: x\r\n\r\n"
    s["no-preface"] = b"\x00\x02" + h2_frame(4, 0) + h2_frame(3, 1, b"\0\0\0\x08")
    return s


# ---- admin_http: raw HTTP requests; shm_socket: side-socket messages ----

def http(*lines, body=b""):
    return b"".join(l + b"\r\n" for l in lines) + b"\r\n" + body


def admin_http_seeds():
    """/readyz reads ready when the input's length is even (see fuzz_admin_http.c)."""
    get = lambda path, *h: http(b"GET " + path + b" HTTP/1.1", b"Host: ttd", *h)
    s = {"healthz": get(b"/healthz")}
    s["metrics"] = get(b"/metrics", b"Accept: text/plain")
    ready = get(b"/readyz")
    s["readyz-ready" if len(ready) % 2 == 0 else "readyz-draining"] = ready
    other = get(b"/readyz", b"X: 1")
    s["readyz-ready" if len(other) % 2 == 0 else "readyz-draining"] = other
    s["head-metrics"] = http(b"HEAD /metrics HTTP/1.1", b"Host: ttd")
    s["unknown-path"] = get(b"/sessions")
    s["query-and-fragment"] = get(b"/metrics?name=ttd_sessions&x=%00#top")
    s["absolute-uri"] = get(b"http://127.0.0.1:9090/healthz")
    s["escaped-path"] = get(b"/%68ealthz/../metrics")
    s["post-with-body"] = http(b"POST /metrics HTTP/1.1", b"Content-Length: 5", body=b"hello")
    s["put-chunked"] = http(b"PUT /healthz HTTP/1.1", b"Transfer-Encoding: chunked", body=b"3\r\nabc\r\n0\r\n\r\n")
    s["delete"] = http(b"DELETE /sessions/0000000000000013 HTTP/1.1")
    s["method-not-allowed"] = http(b"OPTIONS * HTTP/1.1") + http(b"PATCH /metrics HTTP/1.1")
    s["pipelined-every-route"] = b"".join(get(p) for p in (b"/healthz", b"/readyz", b"/metrics", b"/sessions", b"/"))
    s["http10-keep-alive"] = http(b"GET /healthz HTTP/1.0", b"Connection: keep-alive") + http(b"GET /metrics HTTP/1.0")
    s["close-then-more"] = get(b"/healthz", b"Connection: close") + get(b"/metrics")
    s["header-cap"] = get(b"/healthz", b"X-Big: " + b"a" * 9000)
    s["header-lines-cap"] = get(b"/metrics", *[b"X-%d: %s" % (i, b"b" * 60) for i in range(140)])
    s["body-cap"] = http(b"POST /healthz HTTP/1.1", b"Content-Length: 5000", body=b"c" * 5000)
    s["body-cap-chunked"] = http(b"POST /healthz HTTP/1.1", b"Transfer-Encoding: chunked",
                                 body=b"1388\r\n" + b"d" * 5000 + b"\r\n0\r\n\r\n")
    s["content-length-bad"] = http(b"GET /healthz HTTP/1.1", b"Content-Length: -1") + \
        http(b"GET /healthz HTTP/1.1", b"Content-Length: 99999999999999999999")
    s["continuation-line"] = get(b"/healthz", b"X-A: one", b" two")
    s["expect-continue"] = http(b"POST /metrics HTTP/1.1", b"Expect: 100-continue", b"Content-Length: 3", body=b"xyz")
    s["bad-request-line"] = b"GET\r\n\r\n" + b"GET /healthz HTTP/9.9\r\n\r\n"
    s["incomplete"] = b"GET /metrics HTTP/1.1\r\nHost: tt"
    s["no-crlf"] = b"GET /healthz HTTP/1.1\nHost: x\n\n"
    s["nul-in-path"] = get(b"/healthz\0/metrics")
    return s


SHM_MAGIC = 0x31535454
SHM_REGISTER, SHM_RELEASE = 1, 2
# Flag bits of a shm_socket message besides the descriptor count, bits 0-2 (see the top of
# fuzz_shm_socket.c).
PIPE, UNSEALED, SIZE_PLUS, SIZE_HALF, SIZE_ZERO, SESSION_FILL = 8, 16, 1 << 5, 2 << 5, 3 << 5, 0x80


def shm_request(op, segment=0, size=0, magic=SHM_MAGIC, session=SESSION, key=(0, 0)):
    return struct.pack("<IIQQQQQ", magic, op, session, segment, size, *key)


def shm_message(flags, body):
    return bytes([flags]) + struct.pack("<H", len(body)) + body


def shm_socket_seeds():
    def register(size=4096, flags=0, fds=1):
        return shm_message(SESSION_FILL | fds | flags, shm_request(SHM_REGISTER, size=size))

    def release(segment):
        return shm_message(SESSION_FILL, shm_request(SHM_RELEASE, segment))

    s = {"register-release": register() + release(FIRST) + release(SEGMENT) + release(FIRST)}
    s["register-twice"] = register(65536) + register(1, fds=4) + release(FIRST + 1)
    s["register-no-fd"] = shm_message(SESSION_FILL, shm_request(SHM_REGISTER, size=4096))
    s["register-pipe"] = register(flags=PIPE)
    s["register-unsealed"] = register(flags=UNSEALED)
    s["register-larger-than-memfd"] = register(8192, SIZE_HALF)
    s["register-zero"] = register(0) + register(4096, SIZE_ZERO)
    s["register-past-session-cap"] = register(64 << 30, SIZE_PLUS) + register(1 << 40)
    s["register-too-many-fds"] = register(fds=7)
    s["release-unknown"] = release(0) + release(0xFFFFFFFFFFFFFFFF) + release(SEGMENT) + release(SEGMENT)
    s["unknown-op"] = shm_message(SESSION_FILL, shm_request(3)) + shm_message(SESSION_FILL | 1, shm_request(0))
    s["bad-magic"] = shm_message(1, shm_request(SHM_REGISTER, size=4096, magic=0x31535455))
    s["wrong-key"] = shm_message(1, shm_request(SHM_REGISTER, size=4096, key=(1, 2)))
    s["unknown-session"] = shm_message(1, shm_request(SHM_RELEASE, SEGMENT, session=0x99))
    s["short"] = shm_message(SESSION_FILL | 1, shm_request(SHM_REGISTER, size=4096)[:47]) + \
        shm_message(SESSION_FILL, b"\x54")
    s["long"] = shm_message(SESSION_FILL | 2, shm_request(SHM_REGISTER, size=4096) + b"\0" * 16)
    s["empty-then-more"] = shm_message(0, b"") + register()
    return s


# ---- call_lane: records written over a session's call lane (see the top of fuzz_call_lane.c) ----
LANE_IDLE, LANE_POSTED, LANE_TAKEN, LANE_ANSWERED = 0, 1, 2, 3
RING, SET_METHOD, FIT = 4, 8, 0x80
EXECUTE, LIST_DEVICES, UNKNOWN = 0, 5, 7


def lane_header(request_len=0, seq=1, timeout_ms=10000, method=b"", auth=b"", auth_len=None):
    head = struct.pack("<IIIIQq64sI1024s", 0, 0, 0, request_len, seq, timeout_ms, method,
                       len(auth) if auth_len is None else auth_len, auth)
    return head + b"\0" * (2168 - len(head))  # sizeof(ttd_lane_header): the answer fields zero


def lane_record(flags, header, request=b"", method=EXECUTE):
    body = header + request
    return bytes([flags | (method << 4)]) + struct.pack("<H", len(body)) + body


def call_lane_seeds():
    execute = b"\x09\x34\x12\0\0\0\0\0\0"  # ExecuteRequest{program: 0x1234}
    post = LANE_POSTED | RING | SET_METHOD | FIT
    s = {"execute": lane_record(post, lane_header(seq=1), execute)}
    s["execute-twice"] = lane_record(post, lane_header(seq=1), execute) + lane_record(post, lane_header(seq=2), execute)
    s["not-device-work"] = lane_record(post, lane_header(), b"", LIST_DEVICES) + \
        lane_record(post, lane_header(seq=2), b"", UNKNOWN)
    s["request-len-past-room"] = lane_record(LANE_POSTED | RING | SET_METHOD, lane_header(request_len=0xFFFFFFFF))
    s["authorization-past-room"] = lane_record(LANE_POSTED | RING | SET_METHOD, lane_header(auth_len=5000), execute)
    s["negative-timeout"] = lane_record(post, lane_header(timeout_ms=-1), execute)
    s["authorization"] = lane_record(post, lane_header(auth=b"Bearer ttd_abc"), execute)
    s["taken-rung"] = lane_record(LANE_TAKEN | RING | SET_METHOD | FIT, lane_header(), execute) + \
        lane_record(LANE_ANSWERED | RING, lane_header()) + lane_record(post, lane_header(seq=3), execute)
    s["posted-unrung-then-rung"] = lane_record(LANE_POSTED | SET_METHOD | FIT, lane_header(seq=7), execute) + \
        lane_record(post, lane_header(seq=8), execute)
    s["method-unterminated"] = lane_record(LANE_POSTED | RING | FIT, lane_header(method=b"A" * 64), execute)
    s["short-header"] = lane_record(LANE_POSTED | RING | SET_METHOD, lane_header()[:40])
    return s


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "corpus")
    sets = {"rpc": rpc_seeds(), "upload": upload_seeds(), "compile": compile_seeds(), "config": config_seeds(),
            "tokens": tokens_seeds(), "admin_http": admin_http_seeds(), "shm_socket": shm_socket_seeds(),
            "h2_frames": h2_frames_seeds(), "call_lane": call_lane_seeds()}
    for harness, seeds in sets.items():
        folder = os.path.join(out, harness)
        os.makedirs(folder, exist_ok=True)
        for old in os.listdir(folder):
            if old.startswith("seed-"):
                os.remove(os.path.join(folder, old))
        for name, data in seeds.items():
            with open(os.path.join(folder, "seed-" + name), "wb") as f:
                f.write(data)
        print("%s: %d seeds" % (folder, len(seeds)))


if __name__ == "__main__":
    main()
