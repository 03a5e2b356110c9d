#!/usr/bin/python3
"""Writes and verifies data on an NBD export with python3-libnbd, keeping a model.

usage: workload.py URI STATE_FILE write SEED COUNT   # COUNT random writes (4K..256K), flush every 16
       workload.py URI STATE_FILE verify              # every block in the model reads back

The model (STATE_FILE, JSON) maps offset -> [length, seed]; the bytes of a block are
random.Random(seed).randbytes(length). Writes never overlap earlier blocks partially:
a new block replaces the model entries it overlaps. Requests run pipelined (aio).
"""
import json
import os
import random
import sys

import nbd

BLOCK_ALIGN = 4096


def load(path):
    if os.path.exists(path):
        with open(path) as f:
            return {int(k): v for k, v in json.load(f).items()}
    return {}


def save(path, model):
    with open(path + ".tmp", "w") as f:
        json.dump(model, f)
    os.replace(path + ".tmp", path)


def data(length, seed):
    return random.Random(seed).randbytes(length)


def main():
    uri, state, mode = sys.argv[1:4]
    h = nbd.NBD()
    h.connect_uri(uri)
    size = h.get_size()
    model = load(state)
    if mode == "write":
        seed, count = int(sys.argv[4]), int(sys.argv[5])
        rng = random.Random(seed)
        batch = []  # (offset, length) of writes possibly still in flight
        for i in range(count):
            length = rng.choice([4096, 8192, 65536, 262144])
            offset = rng.randrange(0, (size - length) // BLOCK_ALIGN) * BLOCK_ALIGN
            if any(o < offset + length and offset < o + l for o, l in batch):
                while h.aio_in_flight() > 0:  # keep overlapping writes ordered
                    h.poll(-1)
                batch = []
            batch.append((offset, length))
            for k in [k for k, (l, _) in model.items() if k < offset + length and offset < k + l]:
                del model[k]
            block_seed = rng.getrandbits(48)
            model[offset] = [length, block_seed]
            buf = nbd.Buffer.from_bytearray(bytearray(data(length, block_seed)))
            h.aio_pwrite(buf, offset)
            if i % 16 == 15:
                while h.aio_in_flight() > 0:
                    h.poll(-1)
                batch = []
                h.flush()
        while h.aio_in_flight() > 0:
            h.poll(-1)
        h.flush()
        save(state, model)
        print(f"wrote {count} blocks, model holds {len(model)}")
    elif mode == "verify":
        bad = 0
        for offset, (length, block_seed) in sorted(model.items()):
            got = h.pread(length, offset)
            if got != data(length, block_seed):
                bad += 1
                print(f"MISMATCH at {offset} length {length}", file=sys.stderr)
        print(f"verified {len(model)} blocks, {bad} bad")
        sys.exit(1 if bad else 0)
    h.shutdown()


if __name__ == "__main__":
    main()
