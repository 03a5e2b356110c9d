"""Multi-connection consistency (CAN_MULTI_CONN): writes on several connections, a FLUSH
on one of them, reads on others; a write acknowledged on one connection is visible on
every other."""

import threading

import nbd

from nbdtest import check, connect, finish, pattern

BLOCK = 65536


@check("4 connections write disjoint regions concurrently; flush on one; read back on others")
def _():
    conns = [connect("file") for _ in range(4)]
    assert all(h.can_multi_conn() for h in conns)
    errors = []

    def writer(k):
        try:
            h = conns[k]
            cookies = [h.aio_pwrite(nbd.Buffer.from_bytearray(bytearray(pattern(k * 32 + i, BLOCK))),
                                    (k * 32 + i) * BLOCK) for i in range(32)]
            while h.aio_in_flight() > 0:
                h.poll(-1)
            for c in cookies:
                assert h.aio_command_completed(c)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    # All write replies were received; one FLUSH anywhere covers them all.
    conns[2].flush()
    for k in range(4):
        reader = conns[(k + 1) % 4]
        for i in range(32):
            assert reader.pread(BLOCK, (k * 32 + i) * BLOCK) == pattern(k * 32 + i, BLOCK), (k, i)
    for h in conns:
        h.shutdown()


@check("a completed write on one connection is visible on another immediately")
def _():
    a, b = connect("mem"), connect("mem", structured=False)
    for i in range(50):
        data = pattern(i, 4096)
        a.pwrite(data, 40 << 20)
        assert b.pread(4096, 40 << 20) == data
        b.zero(4096, 40 << 20)
        assert a.pread(4096, 40 << 20) == bytes(4096)
    a.shutdown()
    b.shutdown()


finish()
