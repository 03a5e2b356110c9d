"""Shared helpers for the python3-libnbd conformance scripts.

Every script takes the server's TCP port as its only argument, runs its checks, prints one
line per check and finishes with 'N passed, M failed'. It exits non-zero if any check
failed. The Rust tests in tests/it/python.rs start the server and run these scripts with
/usr/bin/python3 (Debian package python3-libnbd).
"""

import errno
import sys
import traceback

try:
    import nbd
except ImportError:
    sys.exit("python3 module 'nbd' missing: install the Debian package python3-libnbd")

PORT = int(sys.argv[1])
HOST = "127.0.0.1"
EXPORT_SIZES = {"mem": 64 << 20, "ro": 1 << 20, "bad": 1 << 20, "aligned": 1 << 20, "file": 16 << 20, "shm": 16 << 20}

_passed = 0
_failed = 0


def check(name):
    """Decorator: run the function as one named check, recording pass/fail."""

    def wrap(fn):
        global _passed, _failed
        try:
            fn()
        except Exception:  # noqa: BLE001 - every failure is reported
            _failed += 1
            print(f"FAIL {name}")
            traceback.print_exc(file=sys.stdout)
        else:
            _passed += 1
            print(f"ok   {name}")
        return fn

    return wrap


def finish():
    print(f"{_passed} passed, {_failed} failed")
    sys.exit(1 if _failed else 0)


def uri(name):
    return f"nbd://{HOST}:{PORT}/{name}"


def handle(strict=True, structured=True, meta=True, opt_mode=False):
    h = nbd.NBD()
    if not strict:
        h.set_strict_mode(0)
    h.set_request_structured_replies(structured)
    if meta:
        h.add_meta_context("base:allocation")
    if opt_mode:
        h.set_opt_mode(True)
    return h


def connect(name="mem", **kwargs):
    h = handle(**kwargs)
    h.connect_uri(uri(name))
    return h


def expect_errno(expected, fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except nbd.Error as e:
        assert e.errnum == expected, f"expected {errno.errorcode[expected]}, got {e.errnum} ({e})"
        return
    raise AssertionError(f"expected {errno.errorcode[expected]}, but the request succeeded")


def pattern(seed, length):
    """Deterministic, position-dependent bytes (distinct per seed)."""
    block = bytes((seed * 131 + i * 7 + (i >> 8)) & 0xFF for i in range(4096))
    return (block * (length // 4096 + 1))[:length]


def extents(h, count, offset, flags=0):
    """BLOCK_STATUS as a list of (length, flags) for base:allocation."""
    found = []

    def cb(metacontext, off, entries, err):
        assert metacontext == "base:allocation", metacontext
        found.extend(zip(entries[0::2], entries[1::2]))
        return 0

    h.block_status(count, offset, cb, flags)
    return found
