#!/usr/bin/python3
"""Byte-granular I/O from clients that negotiate no block sizes, checked against a model.

usage: byte_io.py URI SEED [CONNECTIONS] [OPS]

Each of CONNECTIONS threads (own libnbd handle, set_request_block_size(False), strict mode
off) owns one region of the export; the regions start and end at odd byte offsets, so the
edge sectors of neighbouring regions are shared and written by two connections at once. Each
thread runs OPS random reads and writes of 1 byte to 2 MiB at any offset inside its region
(a third of them touching a region edge) and checks every read against its model. At the
end one connection reads the whole export and compares it with all models; then a 48 MiB
write and read of fresh bytes (payloads over 32 MiB).
"""
import random
import sys
import threading

import nbd

uri, seed = sys.argv[1], int(sys.argv[2])
connections = int(sys.argv[3]) if len(sys.argv) > 3 else 4
ops = int(sys.argv[4]) if len(sys.argv) > 4 else 150
MAX_OP = 2 << 20


def connect():
    h = nbd.NBD()
    h.set_request_block_size(False)
    h.set_strict_mode(0)
    h.connect_uri(uri)
    assert h.get_block_size(nbd.SIZE_MINIMUM) == 1, h.get_block_size(nbd.SIZE_MINIMUM)
    return h


first = connect()
size = first.get_size()
span = (size - 4096) // connections
regions = [(1001 + i * span, 1001 + (i + 1) * span) for i in range(connections)]
# What the export holds before: the models start from it.
before = bytearray()
at = 0
while at < size:
    n = min(32 << 20, size - at)
    before += first.pread(n, at)
    at += n
models = [bytearray(before[lo:hi]) for lo, hi in regions]
failures = []


def worker(index):
    try:
        lo, hi = regions[index]
        model = models[index]
        rng = random.Random(seed * 1000 + index)
        h = connect()
        for step in range(ops):
            length = rng.choice([1, 2, 3, 511, 512, 513, 4095, 4097, rng.randint(1, MAX_OP)])
            length = min(length, hi - lo)
            if rng.random() < 0.33:
                offset = lo if rng.random() < 0.5 else hi - length  # at a shared edge
            else:
                offset = rng.randint(lo, hi - length)
            rel = offset - lo
            if rng.random() < 0.6:
                data = rng.randbytes(length)
                h.pwrite(data, offset, nbd.CMD_FLAG_FUA if rng.random() < 0.1 else 0)
                model[rel:rel + length] = data
            else:
                got = h.pread(length, offset)
                if got != model[rel:rel + length]:
                    bad = next(i for i in range(length) if got[i] != model[rel + i])
                    raise AssertionError(f"connection {index} step {step}: read {offset}+{length} differs at byte {offset + bad}")
        h.flush()
        h.shutdown()
    except Exception as e:  # reported by the main thread
        failures.append(f"connection {index}: {e!r}")


threads = [threading.Thread(target=worker, args=(i,)) for i in range(connections)]
for t in threads:
    t.start()
for t in threads:
    t.join()
assert not failures, failures

expected = bytearray(before)
for (lo, hi), model in zip(regions, models):
    expected[lo:hi] = model
at = 0
while at < size:
    n = min(32 << 20, size - at)
    got = first.pread(n, at)
    if got != expected[at:at + n]:
        bad = next(i for i in range(n) if got[i] != expected[at + i])
        raise AssertionError(f"whole-export read: byte {at + bad} differs from the models")
    at += n

# Payloads over 32 MiB, at an odd offset.
if size > (48 << 20) + 4096:
    big = random.Random(seed).randbytes(48 << 20)
    first.pwrite(big, 777)
    assert first.pread(48 << 20, 777) == big, "48 MiB write and read"
first.shutdown()
print(f"byte_io ok: {connections} connections x {ops} ops on {size} bytes")
