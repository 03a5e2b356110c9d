"""A TLS client that reads its replies slowly: NBD over TLS by hand (Python's ssl), with a
small receive buffer, one large READ, a pause before reading, then small reads. The server's
last TLS records are sealed while the socket is full; they must still arrive (the server
flushes every batch of replies) instead of waiting for a reply the client never asks for.

usage: slow_tls_reader.py PORT EXPORT CA_CERT READ_BYTES FILL_BYTE
Exits non-zero if the bytes stop coming for 20 s or any is not FILL_BYTE."""

import socket
import ssl
import struct
import sys
import time

port, export, ca, want, fill = int(sys.argv[1]), sys.argv[2].encode(), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
IHAVEOPT = 0x49484156454F5054
OPT_STARTTLS, OPT_GO, REP_ACK = 5, 7, 1
STALL_S = 20


def exact(sock, n):
    out = bytearray()
    deadline = time.monotonic() + STALL_S
    while len(out) < n:
        sock.settimeout(max(0.1, deadline - time.monotonic()))
        try:
            piece = sock.recv(min(n - len(out), 16384))
        except (socket.timeout, TimeoutError):
            sys.exit(f"stalled: {len(out)} of {n} bytes came in {STALL_S} s")
        if not piece:
            sys.exit(f"connection closed after {len(out)} of {n} bytes")
        out += piece
        deadline = time.monotonic() + STALL_S
    return bytes(out)


def option(sock, opt, data):
    sock.sendall(struct.pack(">QII", IHAVEOPT, opt, len(data)) + data)
    while True:
        _, got, kind, length = struct.unpack(">QIII", exact(sock, 20))
        body = exact(sock, length)
        assert got == opt, (got, opt)
        if kind == REP_ACK:
            return
        if kind & 0x80000000:
            sys.exit(f"option {opt} refused: {kind:#x} {body!r}")


raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
raw.connect(("127.0.0.1", port))
magic, opts, flags = struct.unpack(">QQH", exact(raw, 18))
assert opts == IHAVEOPT, hex(opts)
raw.sendall(struct.pack(">I", 3))  # FIXED_NEWSTYLE | NO_ZEROES
option(raw, OPT_STARTTLS, b"")
context = ssl.create_default_context(cafile=ca)
context.check_hostname = False
tls = context.wrap_socket(raw, server_hostname="localhost")
option(tls, OPT_GO, struct.pack(">I", len(export)) + export + struct.pack(">H", 0))

tls.sendall(struct.pack(">IHHQQI", 0x25609513, 0, 0, 1, 0, want))  # READ of `want` bytes at 0
time.sleep(0.5)  # the server fills the socket meanwhile
reply_magic, error, cookie = struct.unpack(">IIQ", exact(tls, 16))
assert (reply_magic, error, cookie) == (0x67446698, 0, 1), (hex(reply_magic), error, cookie)
expected = bytes([fill]) * 65536
left = want
while left:
    piece = exact(tls, min(left, 65536))
    assert piece == expected[: len(piece)], f"wrong bytes {want - left}..{want - left + len(piece)}"
    left -= len(piece)
print("read", want, "bytes")
