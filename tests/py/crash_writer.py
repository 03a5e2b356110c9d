#!/usr/bin/python3
"""Writes until the server dies, logging what the NBD protocol says is durable.

usage: crash_writer.py URI LOG SEED          write until an error; log durable versions
       crash_writer.py URI LOG verify        check the export against LOG
       crash_writer.py URI LOG verify-or-eio    the same, but a block with a write sent after
                                             its durable version may fail to read (EIO) where
                                             that write was in flight on a member lost after
                                             the crash (md's partial parity log cannot rebuild
                                             it there; raidnbd marks it bad instead of
                                             returning garbage); what reads must still be right

Blocks are 64 KiB at 64 KiB-aligned offsets in the first 64 MiB (so they are overwritten
often). Version v of a block at offset o has the bytes random.Random(o * 2**32 + v)...
LOG (one JSON object per line, fsynced) records:
  {"w": [offset, version]}   a write was sent (it may or may not have reached the disk)
  {"d": [offset, version]}   that version is durable: its FLUSH (or its FUA write) was acknowledged
After a crash, every sector of a block that has a durable version must hold that version or
a later sent one (a write in flight may land partly: sector by sector).
"""
import json
import os
import random
import sys

import nbd

BLOCK = 65536
SPAN = 64 << 20
SECTOR = 512


def data(offset, version):
    return random.Random(offset * 2**32 + version).randbytes(BLOCK)


def write(uri, log_path, seed):
    rng = random.Random(seed)
    h = nbd.NBD()
    h.connect_uri(uri)
    span = min(SPAN, h.get_size()) // BLOCK
    versions = {}  # continue the numbering of earlier rounds
    if os.path.exists(log_path):
        for line in open(log_path):
            entry = json.loads(line)
            if "w" in entry:
                o, v = entry["w"]
                versions[o] = max(versions.get(o, 0), v)
    log = open(log_path, "a")
    pending = []  # completed writes not yet covered by a flush

    def note(kind, offset, version):
        log.write(json.dumps({kind: [offset, version]}) + "\n")

    try:
        while True:
            batch = []
            for _ in range(rng.randrange(1, 12)):
                offset = rng.randrange(span) * BLOCK
                if any(o == offset for o, _, _ in batch):
                    continue
                version = versions.get(offset, 0) + 1
                versions[offset] = version
                fua = rng.random() < 0.2
                note("w", offset, version)
                log.flush()
                cookie = h.aio_pwrite(nbd.Buffer.from_bytearray(bytearray(data(offset, version))), offset,
                                      flags=nbd.CMD_FLAG_FUA if fua else 0)
                batch.append((offset, version, (cookie, fua)))
            while h.aio_in_flight() > 0:
                h.poll(-1)
            for offset, version, (cookie, fua) in batch:
                h.aio_command_completed(cookie)  # raises if the write failed
                if fua:
                    note("d", offset, version)
                else:
                    pending.append((offset, version))
            if rng.random() < 0.5:
                h.flush()
                for offset, version in pending:
                    note("d", offset, version)
                pending = []
            log.flush()
            os.fsync(log.fileno())
    except nbd.Error:
        log.flush()
        os.fsync(log.fileno())


def read_sectors(h, offset, allow_errors):
    """The block's sectors (None where a read failed, if allowed), 4 KiB at a time after an error."""
    try:
        got = h.pread(BLOCK, offset)
        return [got[s:s + SECTOR] for s in range(0, BLOCK, SECTOR)]
    except nbd.Error:
        if not allow_errors:
            raise
    out = []
    for page in range(offset, offset + BLOCK, 4096):
        try:
            got = h.pread(4096, page)
            out.extend(got[s:s + SECTOR] for s in range(0, 4096, SECTOR))
        except nbd.Error:
            out.extend([None] * (4096 // SECTOR))
    return out


def verify(uri, log_path, eio_in_flight=False):
    sent, durable = {}, {}
    lines = open(log_path).readlines() if os.path.exists(log_path) else []
    for line in lines:
        entry = json.loads(line)
        if "w" in entry:
            o, v = entry["w"]
            sent[o] = max(sent.get(o, 0), v)
        else:
            o, v = entry["d"]
            durable[o] = max(durable.get(o, 0), v)
    h = nbd.NBD()
    h.connect_uri(uri)
    bad = errors = 0
    for offset, first in sorted(durable.items()):
        in_flight = sent[offset] > first
        try:
            got = read_sectors(h, offset, eio_in_flight and in_flight)
        except nbd.Error as e:
            bad += 1
            print(f"offset {offset}: durable version {first} does not read: {e}", file=sys.stderr)
            continue
        allowed = [data(offset, v) for v in range(first, sent[offset] + 1)]
        errors += sum(1 for g in got if g is None)
        for i, g in enumerate(got):
            s = i * SECTOR
            if g is not None and not any(g == a[s:s + SECTOR] for a in allowed):
                bad += 1
                print(f"offset {offset} sector {i}: not version {first}..{sent[offset]}", file=sys.stderr)
                break
    print(f"{len(durable)} durable blocks checked, {bad} lost; {errors} sectors with a write in flight read as errors")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    uri, log_path, what = sys.argv[1:4]
    if what in ("verify", "verify-or-eio"):
        verify(uri, log_path, eio_in_flight=what == "verify-or-eio")
    else:
        write(uri, log_path, int(what))
