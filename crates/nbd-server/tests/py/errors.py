"""Every error path through libnbd with strict mode off (so bad requests reach the server).
After each error the same connection must still work."""

import errno

import nbd

from nbdtest import EXPORT_SIZES, check, connect, expect_errno, extents, finish, pattern

MEM = EXPORT_SIZES["mem"]
TOP = 1 << 64


def still_usable(h):
    h.pwrite(b"\x5a" * 512, 0) if not h.is_read_only() else None
    assert len(h.pread(512, 0)) == 512


for structured in (True, False):
    mode = "structured" if structured else "simple"

    @check(f"{mode}: out-of-range requests: EINVAL for READ/TRIM/CACHE, ENOSPC for WRITE/WRITE_ZEROES")
    def _():
        h = connect("mem", strict=False, structured=structured)
        for offset, length in ((MEM, 512), (MEM - 512, 1024), (TOP - 512, 512), (TOP - 1, 1)):
            expect_errno(errno.EINVAL, h.pread, length, offset)
            still_usable(h)
            expect_errno(errno.ENOSPC, h.pwrite, b"\0" * length, offset)
            still_usable(h)
            expect_errno(errno.ENOSPC, h.zero, length, offset)
            expect_errno(errno.EINVAL, h.trim, length, offset)
            expect_errno(errno.EINVAL, h.cache, length, offset)
            still_usable(h)
        h.shutdown()

    @check(f"{mode}: read-only export refuses WRITE, TRIM, WRITE_ZEROES with EPERM")
    def _():
        h = connect("ro", strict=False, structured=structured)
        expect_errno(errno.EPERM, h.pwrite, b"x" * 512, 0)
        expect_errno(errno.EPERM, h.trim, 512, 0)
        expect_errno(errno.EPERM, h.zero, 512, 0)
        assert h.pread(512, 0) == pattern(9, 512)
        h.flush()
        h.shutdown()

    @check(f"{mode}: undocumented or unadvertised flags are EINVAL")
    def _():
        h = connect("mem", strict=False, structured=structured)
        expect_errno(errno.EINVAL, h.pwrite, b"x" * 512, 0, nbd.CMD_FLAG_NO_HOLE)
        expect_errno(errno.EINVAL, h.pread, 512, 0, nbd.CMD_FLAG_REQ_ONE)
        expect_errno(errno.EINVAL, h.trim, 512, 0, nbd.CMD_FLAG_DF)
        if not structured:
            expect_errno(errno.EINVAL, h.pread, 512, 0, nbd.CMD_FLAG_DF)
        still_usable(h)
        h.shutdown()

    @check(f"{mode}: device errors: EIO, ENOSPC, ENOTSUP (FAST_ZERO only, else EINVAL), EPERM")
    def _():
        h = connect("bad", strict=False, structured=structured)
        expect_errno(errno.EIO, h.pread, 4096, 64 << 10)
        expect_errno(errno.EIO, h.pwrite, b"y" * 4096, 64 << 10)
        expect_errno(errno.ENOSPC, h.pwrite, b"y" * 4096, 128 << 10)
        expect_errno(errno.ENOTSUP, h.zero, 4096, 192 << 10, nbd.CMD_FLAG_FAST_ZERO)
        expect_errno(errno.EINVAL, h.zero, 4096, 192 << 10)
        expect_errno(errno.EPERM, h.trim, 4096, 256 << 10)
        still_usable(h)
        h.shutdown()

    @check(f"{mode}: requests misaligned to the 4 KiB minimum block are EINVAL")
    def _():
        h = connect("aligned", strict=False, structured=structured)
        expect_errno(errno.EINVAL, h.pread, 4096, 512)
        expect_errno(errno.EINVAL, h.pread, 512, 4096)
        expect_errno(errno.EINVAL, h.pwrite, b"z" * 512, 4096)
        expect_errno(errno.EINVAL, h.zero, 4096, 100)
        assert len(h.pread(4096, 4096)) == 4096
        h.shutdown()

    # READ larger than 64 MiB: libnbd refuses it itself (its limit is 64 MiB too); the raw
    # tests send it (request_lengths_and_offsets_at_the_limits).


@check("structured READ error carries the failing offset (ERROR_OFFSET chunk)")
def _():
    h = connect("bad", strict=False)
    seen = []

    def cb(subbuf, off, status, err):
        seen.append((status, off, getattr(err, "value", err)))
        return 0

    expect_errno(errno.EIO, h.pread_structured, 128 << 10, 0, cb)
    assert (nbd.READ_ERROR, 64 << 10, errno.EIO) in seen, seen
    h.shutdown()


@check("BLOCK_STATUS: EINVAL without a negotiated context, past the end, or of length 0")
def _():
    h = connect("mem", strict=False, meta=False)
    expect_errno(errno.EINVAL, h.block_status, 4096, 0, lambda *a: 0)
    still_usable(h)
    h.shutdown()
    h = connect("mem", strict=False, structured=False)
    expect_errno(errno.EINVAL, h.block_status, 4096, 0, lambda *a: 0)
    still_usable(h)
    h.shutdown()
    h = connect("mem", strict=False)
    expect_errno(errno.EINVAL, h.block_status, 4096, MEM, lambda *a: 0)
    expect_errno(errno.EINVAL, h.block_status, 0, 0, lambda *a: 0)
    assert sum(length for length, _ in extents(h, 4096, 0)) == 4096
    h.shutdown()


@check("device error during BLOCK_STATUS is reported, not a broken reply")
def _():
    h = connect("bad", strict=False)
    expect_errno(errno.EIO, h.block_status, 8192, 64 << 10, lambda *a: 0)
    assert sum(length for length, _ in extents(h, 4096, 0)) == 4096
    h.shutdown()


finish()
