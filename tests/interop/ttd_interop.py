#!/usr/bin/python3
"""Talks to a running ttd from a different gRPC implementation (Python grpcio) to show the
wire contract in proto/ttd/v1/ttd.proto is plain gRPC: messages come from
`protoc --python_out`, calls go through grpc's generic API (no generated stubs).

usage: PYTHONPATH=build/py ttd_interop.py unix:/path/to/ttd.sock
The daemon must have been started with --devices 2 and hold no tensors.
Prints one line per check, then `interop ok`; exits non-zero on the first failure.
"""
import array
import math
import struct
import sys

import grpc

from ttd.v1 import ttd_pb2 as pb

SERVICE = "/ttd.v1.Device/"
CALL_TIMEOUT_S = 30
CONNECT_TIMEOUT_S = 10
MIB = 1 << 20
# ~3 MiB of float32, deliberately not a multiple of the chunk size so the last chunk is short.
N_FLOATS = 3 * MIB // 4 + 123


class CheckFailed(Exception):
    pass


def check(cond, message):
    if not cond:
        raise CheckFailed(message)


def ok(line):
    print("ok   " + line, flush=True)


class Device:
    """The ttd.v1.Device service through grpc's generic multi-callables."""

    def __init__(self, channel):
        def unary(name, req, resp):
            return channel.unary_unary(SERVICE + name, request_serializer=req.SerializeToString,
                                       response_deserializer=resp.FromString)

        self.OpenSession = unary("OpenSession", pb.OpenSessionRequest, pb.OpenSessionResponse)
        self.KeepAlive = unary("KeepAlive", pb.KeepAliveRequest, pb.KeepAliveResponse)
        self.CloseSession = unary("CloseSession", pb.CloseSessionRequest, pb.CloseSessionResponse)
        self.ListDevices = unary("ListDevices", pb.ListDevicesRequest, pb.ListDevicesResponse)
        self.Allocate = unary("Allocate", pb.AllocateRequest, pb.AllocateResponse)
        self.Move = unary("Move", pb.MoveRequest, pb.MoveResponse)
        self.Free = unary("Free", pb.FreeRequest, pb.FreeResponse)
        self.Upload = channel.stream_unary(SERVICE + "Upload", request_serializer=pb.UploadRequest.SerializeToString,
                                           response_deserializer=pb.UploadResponse.FromString)
        self.Download = channel.unary_stream(SERVICE + "Download",
                                             request_serializer=pb.DownloadRequest.SerializeToString,
                                             response_deserializer=pb.DownloadResponse.FromString)
        # Sends whatever bytes it is given: for requests no protobuf library would produce.
        self.AllocateRaw = channel.unary_unary(SERVICE + "Allocate", request_serializer=lambda b: b,
                                               response_deserializer=lambda b: b)


def expect_error(what, code, fn):
    """Runs fn (which must make the call and consume any stream) and asserts it fails with code."""
    try:
        result = fn()
    except grpc.RpcError as e:
        check(e.code() == code, "%s: expected %s, got %s: %s" % (what, code.name, e.code().name, e.details()))
        check(e.details(), "%s: %s carries no message saying what to fix" % (what, code.name))
        return e.details()
    raise CheckFailed("%s: expected %s, but the call succeeded with %r" % (what, code.name, result))


def call(what, fn):
    """Runs fn and turns an RPC error into a check failure naming the call."""
    try:
        return fn()
    except grpc.RpcError as e:
        raise CheckFailed("%s failed: %s: %s" % (what, e.code().name, e.details()))


def used_bytes(dev):
    """{(device name, location): used_bytes} from a session-less ListDevices."""
    resp = call("ListDevices", lambda: dev.ListDevices(pb.ListDevicesRequest(), timeout=CALL_TIMEOUT_S))
    return {(d.name, m.location): m.used_bytes for d in resp.devices for m in d.memories}


def upload(dev, md, spec, payload, source_dtype=pb.DTYPE_UNSPECIFIED):
    """Client-streams payload in 1 MiB chunks; the header rides only in the first message."""

    def requests():
        for i, off in enumerate(range(0, len(payload), MIB)):
            req = pb.UploadRequest(data=payload[off:off + MIB])
            if i == 0:
                req.header.spec.CopyFrom(spec)
                req.header.source_dtype = source_dtype
            yield req

    return dev.Upload(requests(), metadata=md, timeout=CALL_TIMEOUT_S)


def download(dev, md, handle, target_dtype=pb.DTYPE_UNSPECIFIED):
    """Server-streams a tensor back; returns (tensor info of the first message, bytes)."""
    info, total, parts = None, None, []
    for i, resp in enumerate(dev.Download(pb.DownloadRequest(handle=handle, target_dtype=target_dtype),
                                          metadata=md, timeout=CALL_TIMEOUT_S)):
        if i == 0:
            check(resp.HasField("tensor"), "Download: first message carries no tensor info")
            info, total = resp.tensor, resp.total_bytes
        parts.append(resp.data)
    check(info is not None, "Download of 0x%016x: the stream ended without a message" % handle)
    data = b"".join(parts)
    check(len(data) == total, "Download of 0x%016x: total_bytes says %d, the stream carried %d" %
          (handle, total, len(data)))
    return info, data


def test_float32_payload():
    """Deterministic float32 values with varied exponents and signs, none NaN/inf/subnormal."""
    x = 0x2545F491
    values = array.array("f")
    for i in range(N_FLOATS):
        x = (x * 1103515245 + 12345) & 0x7FFFFFFF
        mant = 1.0 + (x & 0xFFFFFF) / float(1 << 24)
        values.append((-mant if x & 0x1000000 else mant) * 2.0 ** ((x >> 25) % 40 - 20))
    if sys.byteorder != "little":
        values.byteswap()
    return values.tobytes()


def bf16_half_ulp(v):
    """Half the spacing of bfloat16 values (8 significant bits) in the binade of v."""
    _, e = math.frexp(v)  # v = m * 2**e, 0.5 <= |m| < 1
    return 2.0 ** (e - 8) / 2


def main(target):
    channel = grpc.insecure_channel(target)
    try:
        grpc.channel_ready_future(channel).result(timeout=CONNECT_TIMEOUT_S)
    except grpc.FutureTimeoutError:
        raise CheckFailed("could not connect to %s within %d s" % (target, CONNECT_TIMEOUT_S))
    dev = Device(channel)
    L1, DRAM = pb.MEMORY_LOCATION_L1, pb.MEMORY_LOCATION_DRAM

    # ListDevices needs no session.
    devices = call("ListDevices", lambda: dev.ListDevices(pb.ListDevicesRequest(), timeout=CALL_TIMEOUT_S))
    names = [d.name for d in devices.devices]
    check(names == ["tt:0", "tt:1"], "ListDevices: expected devices ['tt:0', 'tt:1'], got %r" % names)
    for d in devices.devices:
        caps = {m.location: m.capacity_bytes for m in d.memories}
        for loc in (DRAM, L1):
            check(caps.get(loc, 0) > 0, "ListDevices: %s has no %s capacity (memories: %s)" %
                  (d.name, pb.MemoryLocation.Name(loc), caps))
        used = {pb.MemoryLocation.Name(m.location): m.used_bytes for m in d.memories}
        check(all(u == 0 for u in used.values()), "ListDevices: fresh daemon has bytes in use on %s: %s" %
              (d.name, used))
    check(devices.instance_id, "ListDevices: empty instance_id")
    ok("ListDevices without a session: tt:0, tt:1 with DRAM and L1 capacity, nothing in use")

    # OpenSession: version 1 is accepted, another version is refused.
    opened = call("OpenSession", lambda: dev.OpenSession(
        pb.OpenSessionRequest(client_name="python-grpcio interop", protocol_version=pb.PROTOCOL_VERSION_CURRENT),
        timeout=CALL_TIMEOUT_S))
    check(opened.session_id != 0, "OpenSession: session_id is 0")
    check(opened.protocol_version == pb.PROTOCOL_VERSION_CURRENT,
          "OpenSession: daemon answered protocol_version %d, expected 1" % opened.protocol_version)
    check(opened.instance_id == devices.instance_id, "OpenSession: instance_id %r differs from ListDevices' %r" %
          (opened.instance_id, devices.instance_id))
    check(opened.lease_ms > 0, "OpenSession: lease_ms is 0")
    ok("OpenSession protocol_version 1 -> session %016x, lease %d ms" % (opened.session_id, opened.lease_ms))
    details = expect_error("OpenSession protocol_version 99", grpc.StatusCode.FAILED_PRECONDITION,
                           lambda: dev.OpenSession(pb.OpenSessionRequest(client_name="python-grpcio interop",
                                                                         protocol_version=99),
                                                   timeout=CALL_TIMEOUT_S))
    check("99" in details, "OpenSession protocol_version 99: message does not name the version sent: %r" % details)
    ok("OpenSession protocol_version 99 -> FAILED_PRECONDITION (%s)" % details)

    md = (("ttd-session", "%016x" % opened.session_id), ("ttd-instance", opened.instance_id))
    call("KeepAlive", lambda: dev.KeepAlive(pb.KeepAliveRequest(), metadata=md, timeout=CALL_TIMEOUT_S))
    ok("KeepAlive with ttd-session/ttd-instance metadata")

    # Session metadata: missing, malformed, or naming another daemon instance.
    spec_small = pb.TensorSpec(dtype=pb.DTYPE_FLOAT32, shape=[4], device="tt:0")
    expect_error("Allocate without ttd-session metadata", grpc.StatusCode.INVALID_ARGUMENT,
                 lambda: dev.Allocate(pb.AllocateRequest(spec=spec_small), timeout=CALL_TIMEOUT_S))
    ok("Allocate without session metadata -> INVALID_ARGUMENT")
    expect_error("Allocate with ttd-session 'not-hex'", grpc.StatusCode.INVALID_ARGUMENT,
                 lambda: dev.Allocate(pb.AllocateRequest(spec=spec_small), metadata=(("ttd-session", "not-hex"),),
                                      timeout=CALL_TIMEOUT_S))
    ok("Allocate with malformed ttd-session -> INVALID_ARGUMENT")
    other_instance = "0" * 16 if opened.instance_id != "0" * 16 else "1" * 16
    expect_error("Allocate with a stale ttd-instance", grpc.StatusCode.FAILED_PRECONDITION,
                 lambda: dev.Allocate(pb.AllocateRequest(spec=spec_small),
                                      metadata=(md[0], ("ttd-instance", other_instance)), timeout=CALL_TIMEOUT_S))
    ok("Allocate with another daemon's ttd-instance -> FAILED_PRECONDITION")

    # Upload ~3 MiB of float32 in 1 MiB chunks, Download it back byte for byte.
    payload = test_float32_payload()
    spec = pb.TensorSpec(dtype=pb.DTYPE_FLOAT32, shape=[N_FLOATS], device="tt:0")
    up = call("Upload float32", lambda: upload(dev, md, spec, payload))
    check(up.tensor.handle != 0, "Upload float32: handle is 0")
    check(up.tensor.nbytes == len(payload), "Upload float32: nbytes %d, expected %d" % (up.tensor.nbytes, len(payload)))
    check(up.bytes_received == len(payload), "Upload float32: bytes_received %d, expected %d" %
          (up.bytes_received, len(payload)))
    check(up.tensor.spec.dtype == pb.DTYPE_FLOAT32 and list(up.tensor.spec.shape) == [N_FLOATS],
          "Upload float32: tensor spec is %s" % up.tensor.spec)
    h_f32 = up.tensor.handle
    ok("Upload %d bytes float32 in %d chunks -> handle 0x%016x" % (len(payload), -(-len(payload) // MIB), h_f32))
    info, back = call("Download float32", lambda: download(dev, md, h_f32))
    check(info.handle == h_f32, "Download: tensor info names handle 0x%016x, asked 0x%016x" % (info.handle, h_f32))
    check(back == payload, "Download float32: %d bytes back differ from the %d uploaded (first difference at %s)" %
          (len(back), len(payload), next((i for i, (a, b) in enumerate(zip(back, payload)) if a != b), "the end")))
    ok("Download float32: %d bytes identical" % len(back))
    check(used_bytes(dev)[("tt:0", DRAM)] >= len(payload), "ListDevices: tt:0 DRAM used_bytes below the upload")

    # float32 bytes into a bfloat16 tensor, read back as float32: rounded to the nearest bfloat16.
    spec_bf16 = pb.TensorSpec(dtype=pb.DTYPE_BFLOAT16, shape=[N_FLOATS], device="tt:0")
    up_bf = call("Upload float32 into bfloat16", lambda: upload(dev, md, spec_bf16, payload, pb.DTYPE_FLOAT32))
    check(up_bf.tensor.nbytes == 2 * N_FLOATS, "Upload into bfloat16: nbytes %d, expected %d" %
          (up_bf.tensor.nbytes, 2 * N_FLOATS))
    check(up_bf.bytes_received == len(payload), "Upload into bfloat16: bytes_received %d, expected %d" %
          (up_bf.bytes_received, len(payload)))
    h_bf16 = up_bf.tensor.handle
    info, back = call("Download bfloat16 as float32", lambda: download(dev, md, h_bf16, pb.DTYPE_FLOAT32))
    check(len(back) == len(payload), "Download bfloat16 as float32: %d bytes, expected %d" % (len(back), len(payload)))
    sent, got = struct.unpack("<%df" % N_FLOATS, payload), struct.unpack("<%df" % N_FLOATS, back)
    raw_got = struct.unpack("<%dI" % N_FLOATS, back)
    for i in range(N_FLOATS):
        check(raw_got[i] & 0xFFFF == 0, "Download bfloat16 as float32: element %d = %r (0x%08x) is not a bfloat16 "
              "value" % (i, got[i], raw_got[i]))
        check(abs(got[i] - sent[i]) <= bf16_half_ulp(sent[i]),
              "Download bfloat16 as float32: element %d sent %r got %r, off by more than half a bfloat16 ulp (%r)" %
              (i, sent[i], got[i], bf16_half_ulp(sent[i])))
    ok("Upload float32 into bfloat16, Download as float32: %d values within half a bfloat16 ulp" % N_FLOATS)

    # Move to tt:1 / L1, read identical bytes there.
    moved = call("Move to tt:1 L1", lambda: dev.Move(pb.MoveRequest(handle=h_f32, device="tt:1", location=L1),
                                                     metadata=md, timeout=CALL_TIMEOUT_S))
    h_l1 = moved.tensor.handle
    check(h_l1 not in (0, h_f32), "Move: new handle 0x%016x (source 0x%016x)" % (h_l1, h_f32))
    check(moved.tensor.spec.device == "tt:1" and moved.tensor.spec.location == L1,
          "Move: tensor is on %r %s, expected tt:1 L1" %
          (moved.tensor.spec.device, pb.MemoryLocation.Name(moved.tensor.spec.location)))
    check(used_bytes(dev)[("tt:1", L1)] >= len(payload), "ListDevices: tt:1 L1 used_bytes below the moved tensor")
    _, back = call("Download from tt:1 L1", lambda: download(dev, md, h_l1))
    check(back == payload, "Download after Move to tt:1 L1: bytes differ from the upload")
    ok("Move to tt:1 L1 -> handle 0x%016x, Download identical" % h_l1)

    # Free both; the freed handle is then unknown.
    freed = call("Free", lambda: dev.Free(pb.FreeRequest(handles=[h_f32, h_l1]), metadata=md,
                                          timeout=CALL_TIMEOUT_S))
    check(freed.tensors_freed == 2 and freed.bytes_freed == 2 * len(payload),
          "Free: freed %d tensors / %d bytes, expected 2 / %d" %
          (freed.tensors_freed, freed.bytes_freed, 2 * len(payload)))
    ok("Free both float32 tensors: %d bytes" % freed.bytes_freed)
    expect_error("Download of a freed handle", grpc.StatusCode.NOT_FOUND, lambda: download(dev, md, h_f32))
    ok("Download of the freed handle -> NOT_FOUND")

    # Bytes that are no protobuf message: refused, and the daemon goes on serving.
    details = expect_error("Allocate with request bytes ff ff ff", grpc.StatusCode.INVALID_ARGUMENT,
                           lambda: dev.AllocateRaw(b"\xff\xff\xff", metadata=md, timeout=CALL_TIMEOUT_S))
    ok("Allocate with garbage request bytes -> INVALID_ARGUMENT (%s)" % details)
    after = call("ListDevices after garbage", lambda: dev.ListDevices(pb.ListDevicesRequest(), timeout=CALL_TIMEOUT_S))
    check(len(after.devices) == 2, "ListDevices after garbage: %d devices" % len(after.devices))
    ok("daemon still answers ListDevices after garbage")

    # CloseSession frees what is left (the bfloat16 tensor) and every device is empty again.
    closed = call("CloseSession", lambda: dev.CloseSession(pb.CloseSessionRequest(), metadata=md,
                                                           timeout=CALL_TIMEOUT_S))
    check(closed.tensors_freed == 1 and closed.bytes_freed == 2 * N_FLOATS,
          "CloseSession: freed %d tensors / %d bytes, expected 1 / %d" %
          (closed.tensors_freed, closed.bytes_freed, 2 * N_FLOATS))
    ok("CloseSession: tensors_freed %d, bytes_freed %d" % (closed.tensors_freed, closed.bytes_freed))
    used = used_bytes(dev)
    check(len(used) >= 4 and all(u == 0 for u in used.values()),
          "ListDevices after CloseSession: bytes still in use: %s" %
          {"%s %s" % (n, pb.MemoryLocation.Name(l)): u for (n, l), u in used.items()})
    ok("ListDevices after CloseSession: used_bytes 0 on tt:0 and tt:1")
    channel.close()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: %s TARGET   (e.g. unix:/tmp/x/ttd.sock)" % sys.argv[0])
    try:
        main(sys.argv[1])
    except CheckFailed as e:
        print("FAIL " + str(e), flush=True)
        sys.exit(1)
    print("interop ok", flush=True)
