#!/usr/bin/python3
"""Reads ranges of an export one after another, timing each and checking it against a file.

usage: timed_reads.py URI EXPECTED_FILE OFFSET:LEN...

Prints one JSON object per read: {"offset", "len", "ms", "result"}, where result is "right",
"wrong" (bytes that differ from the file at that offset) or "error: ..." (the read failed).
"""
import json
import sys
import time

import nbd

uri, expected_path = sys.argv[1], sys.argv[2]
with open(expected_path, "rb") as f:
    expected = f.read()
h = nbd.NBD()
h.connect_uri(uri)
for arg in sys.argv[3:]:
    offset, length = (int(x) for x in arg.split(":"))
    start = time.monotonic()
    try:
        data = h.pread(length, offset)
        result = "right" if data == expected[offset:offset + length] else "wrong"
    except nbd.Error as e:
        result = f"error: {e}"
    ms = (time.monotonic() - start) * 1000
    print(json.dumps({"offset": offset, "len": length, "ms": round(ms, 1), "result": result}), flush=True)
