"""Every transmission command and flag through libnbd, with structured and simple replies,
on the memory device and the file device."""

import nbd

from nbdtest import EXPORT_SIZES, check, connect, extents, finish, pattern

HOLE, ZERO = 1, 2


def read_chunks(h, count, offset, flags=0):
    """pread_structured; returns (data, [(status, offset, length)])."""
    chunks = []

    def cb(subbuf, off, status, err):
        chunks.append((status, off, len(subbuf)))
        return 0

    data = h.pread_structured(count, offset, cb, flags)
    return data, chunks


for name in ("mem", "file", "shm"):
    size = EXPORT_SIZES[name]

    @check(f"{name}: WRITE then READ at several offsets and sizes, FUA, FLUSH")
    def _():
        h = connect(name)
        for i, (offset, length) in enumerate([(0, 512), (4096, 4096), (1 << 20, 1 << 20), (size - 8192, 8192),
                                              (12345, 777), (3 << 20, 4 << 20)]):
            data = pattern(i + 10, length)
            h.pwrite(data, offset, nbd.CMD_FLAG_FUA if i % 2 else 0)
            assert h.pread(length, offset) == data, (offset, length)
        h.flush()
        h.shutdown()
        # FUA is accepted on any command once SEND_FUA is advertised (libnbd only lets it
        # through with strict mode off).
        h = connect(name, strict=False)
        h.flush(nbd.CMD_FLAG_FUA)
        h.pread(512, 0, nbd.CMD_FLAG_FUA)
        h.shutdown()

    @check(f"{name}: TRIM and WRITE_ZEROES (plain, NO_HOLE, FAST_ZERO, FUA) read back as zero")
    def _():
        h = connect(name)
        base = 8 << 20
        for flags in (0, nbd.CMD_FLAG_NO_HOLE, nbd.CMD_FLAG_FAST_ZERO, nbd.CMD_FLAG_FUA | nbd.CMD_FLAG_NO_HOLE):
            h.pwrite(pattern(flags + 1, 1 << 20), base)
            h.zero(1 << 20, base, flags)
            assert h.pread(1 << 20, base) == bytes(1 << 20), flags
        h.pwrite(pattern(7, 1 << 20), base)
        h.trim(1 << 20, base, nbd.CMD_FLAG_FUA)
        h.trim(512, base)
        # After TRIM the contents are unspecified; both devices zero or punch, so check it is readable.
        assert len(h.pread(1 << 20, base)) == 1 << 20
        h.shutdown()

    @check(f"{name}: BLOCK_STATUS reports data and holes, REQ_ONE gives one extent")
    def _():
        h = connect(name)
        base = 4 << 20
        h.trim(2 << 20, base)
        h.pwrite(pattern(5, 1 << 20), base)
        found = extents(h, 2 << 20, base)
        assert sum(length for length, _ in found) == 2 << 20, found
        assert found[0] == (1 << 20, 0), found
        assert all(flags == HOLE | ZERO for _, flags in found[1:]), found
        one = extents(h, 2 << 20, base, nbd.CMD_FLAG_REQ_ONE)
        assert len(one) == 1 and one[0][0] <= 2 << 20, one
        tail = extents(h, 4096, size - 4096)
        assert sum(length for length, _ in tail) == 4096
        h.shutdown()

    @check(f"{name}: CACHE is accepted")
    def _():
        h = connect(name)
        h.cache(1 << 20, 0)
        h.cache(4096, size - 4096)
        h.shutdown()

    @check(f"{name}: zero-length READ, WRITE, TRIM, WRITE_ZEROES succeed")
    def _():
        h = connect(name, strict=False)
        assert h.pread(0, 4096) == b""
        h.pwrite(b"", 4096)
        h.trim(0, 4096)
        h.zero(0, 4096)
        h.shutdown()


@check("structured READ: OFFSET_DATA for data, OFFSET_HOLE for unallocated memory")
def _():
    h = connect("mem")
    base = 20 << 20
    h.trim(1 << 20, base)
    h.pwrite(pattern(11, 65536), base)
    data, chunks = read_chunks(h, 1 << 20, base)
    assert data == pattern(11, 65536) + bytes((1 << 20) - 65536)
    assert (nbd.READ_DATA, base, 65536) in chunks, chunks
    assert any(status == nbd.READ_HOLE for status, _, _ in chunks), chunks
    assert sum(length for _, _, length in chunks) == 1 << 20
    h.shutdown()


@check("DF: exactly one content chunk even across data and holes")
def _():
    h = connect("mem")
    base = 24 << 20
    h.trim(1 << 20, base)
    h.pwrite(pattern(12, 4096), base + 65536)
    data, chunks = read_chunks(h, 1 << 20, base, nbd.CMD_FLAG_DF)
    assert chunks == [(nbd.READ_DATA, base, 1 << 20)], chunks
    assert data[65536:65536 + 4096] == pattern(12, 4096)
    assert data[:65536] == bytes(65536)
    h.shutdown()


@check("simple replies: READ of data and holes, every command")
def _():
    h = connect("mem", structured=False)
    base = 28 << 20
    h.trim(1 << 20, base)
    h.pwrite(pattern(13, 4096), base + 8192, nbd.CMD_FLAG_FUA)
    data = h.pread(1 << 20, base)
    assert data[8192:8192 + 4096] == pattern(13, 4096)
    assert data[:8192] == bytes(8192) and data[12288:] == bytes((1 << 20) - 12288)
    h.zero(4096, base + 8192, nbd.CMD_FLAG_NO_HOLE)
    assert h.pread(4096, base + 8192) == bytes(4096)
    h.flush()
    h.cache(4096, base)
    h.shutdown()


@check("large requests: 48 MiB WRITE and READ (64 MiB advertised), and reads split across device pieces")
def _():
    h = connect("mem")
    data = pattern(21, 48 << 20)
    h.pwrite(data, 8 << 20)
    assert h.pread(48 << 20, 8 << 20) == data
    h.shutdown()
    # 'aligned' has a 64 KiB device payload limit: the server splits a 1 MiB request.
    h = connect("aligned")
    data = pattern(22, 1 << 20)
    h.pwrite(data, 0)
    assert h.pread(1 << 20, 0) == data
    assert h.pread(8192, 4096) == data[4096:4096 + 8192]
    h.shutdown()


@check("data persists across connections and after DISC")
def _():
    h = connect("file")
    h.pwrite(pattern(30, 65536), 65536)
    h.shutdown()
    h = connect("file", structured=False)
    assert h.pread(65536, 65536) == pattern(30, 65536)
    h.shutdown()


finish()
