#!/usr/bin/python3
"""Writes until the server dies, logging what the NBD protocol says is durable.

usage: crash_writer.py URI LOG SEED          write until an error; log durable versions
       crash_writer.py URI LOG verify        check the export against LOG
       crash_writer.py URI LOG verify-settled   the same, for blocks with no write sent after
                                             their durable version (a member lost after the
                                             crash: a write in flight then may be lost whole,
                                             as with md's partial parity log)

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


def verify(uri, log_path, settled_only=False):
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
    bad = skipped = 0
    for offset, first in sorted(durable.items()):
        if settled_only and sent[offset] > first:
            skipped += 1
            continue
        got = h.pread(BLOCK, offset)
        allowed = [data(offset, v) for v in range(first, sent[offset] + 1)]
        for s in range(0, BLOCK, SECTOR):
            if not any(got[s:s + SECTOR] == a[s:s + SECTOR] for a in allowed):
                bad += 1
                print(f"offset {offset} sector {s // SECTOR}: not version {first}..{sent[offset]}", file=sys.stderr)
                break
    print(f"{len(durable) - skipped} durable blocks checked, {bad} lost ({skipped} with a later write in flight: not checked)")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    uri, log_path, what = sys.argv[1:4]
    if what in ("verify", "verify-settled"):
        verify(uri, log_path, settled_only=what == "verify-settled")
    else:
        write(uri, log_path, int(what))
