"""Pipelining through libnbd's aio API: hundreds of requests in flight on one connection,
mixed reads, writes, zeroes, flushes and block status, all verified."""

import random

import nbd

from nbdtest import check, connect, finish, pattern

BLOCK = 4096


def wait_all(h, cookies):
    while h.aio_in_flight() > 0:
        h.poll(-1)
    for c in cookies:
        assert h.aio_command_completed(c), c


@check("512 writes then 512 reads in flight at once, 4 KiB each, random order")
def _():
    h = connect("mem")
    order = list(range(512))
    random.Random(1).shuffle(order)
    cookies = [h.aio_pwrite(nbd.Buffer.from_bytearray(bytearray(pattern(i, BLOCK))), i * BLOCK) for i in order]
    peak = h.aio_in_flight()
    assert peak >= 128, peak
    wait_all(h, cookies)
    bufs = {i: nbd.Buffer(BLOCK) for i in order}
    cookies = [h.aio_pread(bufs[i], i * BLOCK) for i in order]
    assert h.aio_in_flight() >= 128
    wait_all(h, cookies)
    for i in order:
        assert bufs[i].to_bytearray() == pattern(i, BLOCK), i
    h.shutdown()


@check("mixed pipeline: writes, FUA writes, zeroes, reads, flushes, block status, 256 deep")
def _():
    h = connect("mem")
    base = 8 << 20
    rng = random.Random(2)
    expected = {}
    cookies = []
    for round_ in range(4):
        for i in range(64):
            slot = rng.randrange(256)
            offset = base + slot * BLOCK
            kind = rng.randrange(3)
            if kind == 0:
                data = pattern(round_ * 64 + i, BLOCK)
                cookies.append(h.aio_pwrite(nbd.Buffer.from_bytearray(bytearray(data)), offset,
                                            flags=nbd.CMD_FLAG_FUA if i % 5 == 0 else 0))
                expected[slot] = data
            elif kind == 1:
                cookies.append(h.aio_zero(BLOCK, offset))
                expected[slot] = bytes(BLOCK)
            else:
                cookies.append(h.aio_block_status(BLOCK * 4, offset, lambda *a: 0))
        cookies.append(h.aio_flush())
        # Requests in one round may be reordered by the server, so wait per round.
        wait_all(h, cookies)
        cookies = []
    for slot, data in expected.items():
        assert h.pread(BLOCK, base + slot * BLOCK) == data, slot
    h.shutdown()


@check("large pipelined I/O: 64 x 1 MiB writes and reads in flight")
def _():
    h = connect("mem")
    size = 1 << 20
    cookies = [h.aio_pwrite(nbd.Buffer.from_bytearray(bytearray(pattern(100 + i, size))), i * size) for i in range(64)]
    wait_all(h, cookies)
    bufs = [nbd.Buffer(size) for _ in range(64)]
    cookies = [h.aio_pread(bufs[i], i * size) for i in range(64)]
    wait_all(h, cookies)
    for i in range(64):
        assert bufs[i].to_bytearray() == pattern(100 + i, size), i
    h.shutdown()


finish()
