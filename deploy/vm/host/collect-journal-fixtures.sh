#!/usr/bin/env bash
# Host half of the md-journal-fixtures scenario (deploy/vm/guest/md-journal-fixtures.sh):
#   collect-journal-fixtures.sh WORKDIR RESULTS OUTDIR
# Copies RESULTS/journal (device heads, journal logs, member data areas, write contents,
# --examine/--detail/sysfs/dmesg texts, commands) to OUTDIR after checking: every head image is
# 16 KiB with the md magic at byte 4096; the heads of the final state (after the last stop) and the
# guest's md5 of each disk's first 4 MiB equal the image files WORKDIR/d<K>.img; each array read
# back through md holds each write's content at its offset; every journal log decodes (meta blocks
# with magic 0x6433c509, crc32c checksums seeded with crc32c(~0, set_uuid), one page per payload
# checksum) and, in the state written while the array ran, the log from journal_tail holds the
# latest content of every written page and parity pages found on the members. Trims the images
# (see OUTDIR/README.md, which it writes along with OUTDIR/log-decoded.txt).
set -euo pipefail
[ $# -eq 3 ] || { echo "usage: $0 WORKDIR RESULTS OUTDIR" >&2; exit 2; }
WORKDIR=$1 RESULTS=$2 OUT=$3
FIX=$RESULTS/journal
die() { echo "collect-journal-fixtures: $*" >&2; exit 1; }
[ -s "$FIX/manifest.txt" ] || die "no $FIX/manifest.txt"
[ -s "$FIX/commands.txt" ] || die "no $FIX/commands.txt"
[ "$(wc -l < "$FIX/manifest.txt")" = 13 ] || die "$FIX/manifest.txt does not have 13 lines"

for bin in "$FIX"/*.head.bin; do
  [ "$(stat -c %s "$bin")" = 16384 ] || die "$bin is not 16384 bytes"
  magic=$(od -An -tx4 -j 4096 -N 4 --endian=little "$bin" | tr -d ' ')
  [ "$magic" = a92b4efc ] || die "$bin: magic $magic at 4096, not a92b4efc"
done
# O_DIRECT reads in the guest against the image files: the heads after the last stop, and the
# guest's md5 of each disk's first 4 MiB at the end.
while read -r array name disk dev; do
  cmp -s -n 16384 "$FIX/$array-recovered-stopped-$name.head.bin" "$WORKDIR/d$disk.img" \
    || die "$FIX/$array-recovered-stopped-$name.head.bin (guest $dev) differs from the first 16384 bytes of $WORKDIR/d$disk.img"
done < "$FIX/manifest.txt"
[ "$(wc -l < "$FIX/final-md5.txt")" = 13 ] || die "$FIX/final-md5.txt does not have 13 lines"
while read -r disk sum; do
  [ "$(head -c $((4096 * 1024)) "$WORKDIR/d$disk.img" | md5sum | cut -d' ' -f1)" = "$sum" ] \
    || die "d$disk.img: md5 of its first 4 MiB differs from the guest's"
done < "$FIX/final-md5.txt"
# The writes, read back through md (while running, after the writes): zeros with each write laid
# over them in order (w3 of j6 rewrites w1's page on purpose).
EXPECT=$(mktemp); trap 'rm -f "$EXPECT"' EXIT
for array in j6 j5 j4; do
  : > "$EXPECT"
  truncate -s "$(stat -c %s "$FIX/$array-written.md-head.bin")" "$EXPECT"
  writes=0
  while read -r line; do
    k=$(sed -n "s/.*# $array w\([0-9]*\): \([0-9]*\) bytes at array byte \([0-9]*\)\$/\1 \2 \3/p" <<<"$line")
    [ -n "$k" ] || continue
    read -r n len off <<<"$k"
    [ "$(stat -c %s "$FIX/$array-w$n.data")" = "$len" ] || die "$array-w$n.data is not $len bytes"
    dd if="$FIX/$array-w$n.data" of="$EXPECT" bs=4096 oflag=seek_bytes seek="$off" conv=notrunc status=none
    writes=$((writes + 1))
  done < "$FIX/commands.txt"
  [ "$writes" -gt 0 ] || die "no $array writes in $FIX/commands.txt"
  cmp "$EXPECT" "$FIX/$array-written.md-head.bin" || die "$array: md does not hold the $writes writes"
  grep -q '^mismatch_cnt after check: 0$' "$FIX/$array-recovered.check.txt" || die "$array: check after the replay found mismatches"
  grep -q '^sync_action: idle$' "$FIX/$array-recovered.right-after-assemble.txt" \
    && grep -q '^resync_start: none$' "$FIX/$array-recovered.right-after-assemble.txt" \
    || die "$array: a resync ran after the crash assembly"
  ! grep -q DIFFERENT "$FIX/$array-recovered.compare.txt" || die "$array: the replay did not restore everything"
done

mkdir -p "$OUT"
rm -f "$OUT"/*.bin "$OUT"/*.data "$OUT"/*.txt
# Decode and check the logs, then copy and trim (python: crc32c and the log walk).
/usr/bin/python3 - "$FIX" "$OUT" <<'PY'
import os, re, struct, sys

FIX, OUT = sys.argv[1], sys.argv[2]
B = 4096
ARRAYS = {  # name: (set UUID, members, RAID6?)
    "j6": ("72616964:6e626400:00000000:000000a6", 4, True),
    "j5": ("72616964:6e626400:00000000:000000a5", 3, False),
    "j4": ("72616964:6e626400:00000000:000000a4", 3, False),
}
STATES = ["created-running", "created", "assembled", "written", "stopped", "reassembled",
          "recovered", "recovered-stopped"]
MAGIC = 0x6433C509

def die(msg):
    sys.exit("collect-journal-fixtures: " + msg)

TABLE = []
for i in range(256):
    c = i
    for _ in range(8):
        c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
    TABLE.append(c)

def crc32c(seed, data):  # the kernel's crc32c_le: no inversion in or out
    c = seed
    for b in data:
        c = TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c

def read(name):
    with open(os.path.join(FIX, name), "rb") as f:
        return f.read()

def blocks(data):
    return [data[i:i + B] for i in range(0, len(data), B)]

def trimmed(data):  # cut after the last non-zero 4 KiB block
    d = data.rstrip(b"\0")
    return data[:(len(d) + B - 1) // B * B]

def sb_u64(head, off):
    return struct.unpack_from("<Q", head, 4096 + off)[0]

def meta_at(log, blk, seed):
    """The meta block at 4 KiB block blk of the log, decoded, or None (bad magic/version/checksum)."""
    p = log[blk * B:(blk + 1) * B]
    if len(p) < B:
        return None
    magic, csum, ver, z1, z2, msize, seq, pos = struct.unpack_from("<IIBBHIQQ", p, 0)
    if magic != MAGIC or ver != 1:
        return None
    z = bytearray(p)
    z[4:8] = bytes(4)
    if crc32c(seed, bytes(z)) != csum or msize > B:
        return None
    m = {"block": blk, "seq": seq, "position": pos, "meta_size": msize, "checksum": csum, "payloads": []}
    off, page = 32, blk + 1
    while off < msize:
        typ, flags, size = struct.unpack_from("<HHI", p, off)
        if typ in (0, 1):  # DATA, PARITY: size in sectors, one checksum per 4 KiB page
            loc = struct.unpack_from("<Q", p, off + 8)[0]
            n = size // 8
            sums = struct.unpack_from("<%dI" % n, p, off + 16)
            pages = list(range(page, page + n))
            ok = all(crc32c(seed, log[q * B:(q + 1) * B]) == s for q, s in zip(pages, sums))
            m["payloads"].append({"type": "DATA" if typ == 0 else "PARITY", "flags": flags, "size": size,
                                  "location": loc, "pages": pages, "sums": sums, "crc_ok": ok})
            page += n
            off += 16 + 4 * n
        elif typ == 2:  # FLUSH: size in bytes of the stripe list
            stripes = struct.unpack_from("<%dQ" % (size // 8), p, off + 8)
            m["payloads"].append({"type": "FLUSH", "flags": flags, "size": size, "stripes": stripes,
                                  "crc_ok": True, "pages": []})
            off += 8 + size
        else:
            m["payloads"].append({"type": "UNKNOWN(%d)" % typ, "flags": flags, "size": size,
                                  "crc_ok": False, "pages": []})
            break
    m["next"] = page
    return m

def chain(log, tail_blk, seed):
    """The kernel's walk from journal_tail: consecutive seq, position = its own sector."""
    out, blk, seq = [], tail_blk, None
    while True:
        m = meta_at(log, blk, seed)
        if m is None or m["position"] != blk * 8 or (seq is not None and m["seq"] != seq + 1):
            return out, blk
        out.append(m)
        seq, blk = m["seq"], m["next"]

writes_re = re.compile(r"# (j\d) w(\d+): (\d+) bytes at array byte (\d+)$")
WRITES = {a: [] for a in ARRAYS}
for line in open(os.path.join(FIX, "commands.txt")):
    mm = writes_re.search(line.rstrip("\n"))
    if mm:
        a, k, ln, off = mm.group(1), int(mm.group(2)), int(mm.group(3)), int(mm.group(4))
        WRITES[a].append((k, off, ln, read("%s-w%d.data" % (a, k))))

def which_write(a, sector, page):
    """Write K whose bytes at array sector are this page (several: the last)."""
    hit = None
    for k, off, ln, data in WRITES[a]:
        o = sector * 512 - off
        if 0 <= o and o + B <= ln and data[o:o + B] == page:
            hit = "w%d" % k
    return hit

for a in ARRAYS:
    for line in open(os.path.join(FIX, "%s-written.superblocks-after-writes.txt" % a)):
        if "resync_offset=%d" % (2**64 - 1) not in line:
            die("%s right after the writes: %s (the README says resync_offset stays clean)" % (a, line.strip()))
events = {}
for line in open(os.path.join(FIX, "superblocks.txt")):
    f = dict(kv.split("=", 1) for kv in line.split()[4:])
    if f["data_offset"] != "2048" or f["feature_map"] != "512" or f["resync_offset"] != str(2**64 - 1):
        die("superblocks.txt: %s (the README says data_offset 2048, feature_map 512, resync_offset clean)" % line.strip())
    events.setdefault(tuple(line.split()[:2]), set()).add(f["events"])
for (a, st), ev in events.items():
    if len(ev) != 1:
        die("%s %s: the devices' superblocks disagree on events: %s" % (a, st, sorted(ev)))

def summary(a, log, m):
    """One meta block in a line: payloads grouped per stripe (a PARITY closes its stripe)."""
    groups, cur = [], []
    for p in m["payloads"]:
        if p["type"] == "DATA":
            q = p["pages"][0]
            cur.append("D%d=%s" % (p["location"], which_write(a, p["location"], log[q * B:(q + 1) * B])))
        elif p["type"] == "PARITY":
            cur.append("%s%d" % ("PQ" if p["size"] == 16 else "P", p["location"]))
            groups.append("[" + " ".join(cur) + "]")
            cur = []
        else:
            cur.append(p["type"])
    if cur:
        groups.append("[" + " ".join(cur) + "]")
    head = "block %3d pos %4d seq %d meta_size %4d:" % (m["block"], m["position"], m["seq"], m["meta_size"])
    lines, line = [], head
    for g in groups or ["(no payload)"]:
        if len(line) + 1 + len(g) > 100:
            lines.append(line)
            line = "   "
        line += " " + g
    return lines + [line]

decoded, logs_table, summaries, data_blocks = [], [], [], []
CH = {}
for a, (uuid, nmem, raid6) in ARRAYS.items():
    seed = crc32c(0xFFFFFFFF, bytes.fromhex(uuid.replace(":", "")))
    written_log = read("%s-written-j.log.bin" % a)
    if any(written_log[-B:]):
        die("%s: the written log's last captured block is not zero (capture more blocks)" % a)
    md = read("%s-written.md-head.bin" % a)
    data = [read("%s-written-m%d.data.bin" % (a, i)) for i in range(nmem)]
    for st in STATES:
        log = read("%s-%s-j.log.bin" % (a, st))
        head = read("%s-%s-j.head.bin" % (a, st))
        tail = sb_u64(head, 152)
        if tail % 8:
            die("%s %s: journal_tail %d is not at a 4 KiB block" % (a, st, tail))
        found = [m for m in (meta_at(log, b, seed) for b in range(len(log) // B)) if m]
        ch, end = chain(log, tail // 8, seed)
        if not ch:
            die("%s %s: no valid meta block at journal_tail %d" % (a, st, tail))
        inchain = {m["block"] for m in ch}
        CH[(a, st)] = (tail, ch, found)
        decoded.append("== %s %s: journal_tail %d sectors (block %d); chain from the tail: %d meta blocks, "
                       "seq %d .. %d, ends at block %d" % (a, st, tail, tail // 8, len(ch), ch[0]["seq"],
                                                           ch[-1]["seq"], end))
        for m in found:
            where = "chain" if m["block"] in inchain else "before the tail" if m["block"] < tail // 8 else "other"
            decoded.append("block %d: meta seq=%d position=%d meta_size=%d checksum=%08x payloads=%d [%s]"
                           % (m["block"], m["seq"], m["position"], m["meta_size"], m["checksum"],
                              len(m["payloads"]), where))
            for p in m["payloads"]:
                if st != "written":  # the same blocks as the written log's (logs.txt); checked only
                    if not p["crc_ok"]:
                        die("%s %s: block %d: payload %s fails its checksum" % (a, st, m["block"], p))
                    continue
                if not p["crc_ok"]:
                    die("%s %s: block %d: payload %s fails its checksum" % (a, st, m["block"], p))
                if p["type"] == "DATA":
                    w = which_write(a, p["location"], log[p["pages"][0] * B:(p["pages"][0] + 1) * B])
                    decoded.append("  DATA   location=%-5d (array sector; byte %d) size=%d page block %d crc %08x  = %s"
                                   % (p["location"], p["location"] * 512, p["size"], p["pages"][0], p["sums"][0],
                                      w or "NO WRITE"))
                    if st == "written" and m["block"] in inchain and not w:
                        die("%s: DATA payload at sector %d is no write's content" % (a, p["location"]))
                elif p["type"] == "PARITY":
                    decoded.append("  PARITY location=%-5d (member sector from data_offset) size=%d page blocks %s crc %s"
                                   % (p["location"], p["size"], ",".join(map(str, p["pages"])),
                                      ",".join("%08x" % s for s in p["sums"])))
                else:
                    decoded.append("  %s size=%d flags=%d %s" % (p["type"], p["size"], p["flags"], p.get("stripes", "")))
        if st == "written":
            kinds = [p["type"] for m in ch for p in m["payloads"]]
            summaries.append("%s (journal_tail %d = block %d; blocks before it: %s)" % (
                a, tail, tail // 8, ", ".join("block %d seq %d meta_size %d" % (m["block"], m["seq"], m["meta_size"])
                                              for m in found if m["block"] < tail // 8)))
            summaries.append("chain: %d meta blocks, %d log blocks; payloads: %d DATA, %d PARITY, %d FLUSH" % (
                len(ch), end - tail // 8, kinds.count("DATA"), kinds.count("PARITY"), kinds.count("FLUSH")))
            for m in ch:
                summaries.extend(summary(a, log, m))
            summaries.append("")
            # Latest logged content per array sector and per stripe row, against md and the members.
            latest_data, latest_parity = {}, {}
            for m in ch:
                for p in m["payloads"]:
                    pages = [log[q * B:(q + 1) * B] for q in p["pages"]]
                    if p["type"] == "DATA":
                        latest_data[p["location"]] = pages[0]
                    elif p["type"] == "PARITY":
                        latest_parity[p["location"]] = pages
            written = set()
            for k, off, ln, _ in WRITES[a]:
                written.update(range(off // 512, (off + ln) // 512, 8))
            if set(latest_data) != written:
                die("%s: logged data sectors %s differ from the written ones %s"
                    % (a, sorted(latest_data), sorted(written)))
            for s, pg in latest_data.items():
                if md[s * 512:s * 512 + B] != pg:
                    die("%s: latest logged page of sector %d is not what md reads there" % (a, s))
            for s, pgs in latest_parity.items():
                row = [d[s * 512:s * 512 + B] for d in data]
                if len(pgs) != (2 if raid6 else 1):
                    die("%s: parity payload at %d has %d pages" % (a, s, len(pgs)))
                holders = [row.index(pg) if pg in row else None for pg in pgs]
                if None in holders:
                    die("%s: logged parity of stripe sector %d is on no member" % (a, s))
                decoded.append("  (parity of stripe sector %d found on member(s) %s)" % (s, holders))
            decoded.append("ok: %s written: %d data pages and %d parity payloads from the tail match md and the members"
                           % (a, len(latest_data), len(latest_parity)))
            keep = trimmed(log)
            with open(os.path.join(OUT, "%s-written-j.log.bin" % a), "wb") as f:
                f.write(keep)
            logs_table.append("%s written log %d blocks (A-written-j.log.bin)" % (a, len(keep) // B))
        else:
            # Store only what differs from the written state's log: the first F blocks are the same.
            w = blocks(written_log)
            s_ = blocks(log)
            nw = len(trimmed(written_log)) // B
            F = min(nw, next((i for i in range(len(s_)) if s_[i] != w[i]), len(s_)))
            rest = trimmed(log[F * B:])
            if STATES.index(st) < STATES.index("written") and rest:
                die("%s %s: the log is not a prefix of the written one" % (a, st))
            if STATES.index(st) > STATES.index("written") and F < nw:
                die("%s %s: block %d of the written log changed" % (a, st, F))
            if rest:
                with open(os.path.join(OUT, "%s-%s-j.log-rest.bin" % (a, st)), "wb") as f:
                    f.write(rest)
            logs_table.append("%s %s same_as_written_blocks=%d rest_blocks=%d" % (a, st, F, len(rest) // B))
        decoded.append("")
    # Data areas, sparse: the non-zero 4 KiB blocks only, listed in data-blocks.txt; the written
    # state, and the recovered one only where it differs.
    for i in range(nmem):
        rec = read("%s-recovered-m%d.data.bin" % (a, i))
        for st, img in [("written", data[i])] + ([("recovered", rec)] if rec != data[i] else []):
            name = "%s-%s-m%d.data.bin" % (a, st, i)
            bl = blocks(img)
            present = [b for b in range(len(bl)) if any(bl[b])]
            with open(os.path.join(OUT, name), "wb") as f:
                f.write(b"".join(bl[b] for b in present))
            ranges, start = [], None
            for j, b in enumerate(present):
                if start is None:
                    start = b
                if j + 1 == len(present) or present[j + 1] != b + 1:
                    ranges.append(str(start) if start == b else "%d-%d" % (start, b))
                    start = None
            data_blocks.append("%s %d %s" % (name, len(bl), " ".join(ranges)))
        if rec != data[i]:
            logs_table.append("%s recovered m%d data DIFFERS from written (kept)" % (a, i))
    # Heads: members created + written; the journal in every state. Trimmed.
    for name in os.listdir(FIX):
        mm = re.match(r"(j\d)-(.*)-(m\d|j)\.head\.bin$", name)
        if not mm or mm.group(1) != a:
            continue
        if mm.group(3) == "j" or mm.group(2) in ("created", "written"):
            with open(os.path.join(OUT, name), "wb") as f:
                f.write(trimmed(read(name)))

# What the README says md did, checked.
for line in open(os.path.join(FIX, "superblocks.txt")):
    a, st, name = line.split()[:3]
    f = dict(kv.split("=", 1) for kv in line.split()[4:])
    want = "0" if name == "j" else str(int(name[1:]) + 1)
    if f["dev_number"] != want:
        die("%s %s %s: dev_number %s, the README says %s" % (a, st, name, f["dev_number"], want))
for a in ARRAYS:
    mdadm_meta = CH[(a, "created")][2][0]
    if (mdadm_meta["block"], mdadm_meta["meta_size"]) != (0, 32) or CH[(a, "created")][0] != 8:
        die("%s: mdadm's empty meta block is not block 0, or the created tail is not 8" % a)
    # every start: one empty meta block right after the walked chain, seq = its last seq + 10001
    for start, before in (("created-running", None), ("assembled", "created"), ("reassembled", "stopped"),
                          ("recovered", "written")):
        prev = [mdadm_meta] if before is None else CH[(a, before)][1]
        tail, ch, _ = CH[(a, start)]
        m = ch[0]
        if (len(ch), m["meta_size"], m["block"], m["seq"]) != (1, 32, prev[-1]["next"], prev[-1]["seq"] + 10001):
            die("%s %s: the start's meta block is not the empty one after %s's chain with seq + 10001" % (a, start, before))
    # the stop after the writes: the tail moves to the last io_unit's meta block, not past it
    tail, ch, _ = CH[(a, "stopped")]
    if tail != CH[(a, "written")][1][-1]["position"]:
        die("%s: the stop put journal_tail at %d, not at the last meta block" % (a, tail))
    # "recovering 0 data-only stripes and N data-parity stripes": N = PARITY payloads replayed
    for st, replayed in (("reassembled", CH[(a, "stopped")][1]), ("recovered", CH[(a, "written")][1])):
        n = sum(p["type"] == "PARITY" for m in replayed for p in m["payloads"])
        want = "recovering 0 data-only stripes and %d data-parity stripes" % n
        if want not in open(os.path.join(FIX, "%s-%s.dmesg.txt" % (a, st))).read():
            die("%s %s: md did not print '%s'" % (a, st, want))
    if read("%s-reassembled-j.log.bin" % a) != read("%s-recovered-j.log.bin" % a):
        die("%s: the crash replay left another log than the re-assembly" % a)
    # the writes: one io_unit after the other, seq + 1 each
    w = CH[(a, "written")][1]
    for x, y in zip(w, w[1:]):
        if y["block"] != x["next"] or y["seq"] != x["seq"] + 1:
            die("%s: written chain not contiguous at block %d" % (a, y["block"]))

with open(os.path.join(OUT, "log-decoded.txt"), "w") as f:
    f.write("\n".join(decoded))
with open(os.path.join(OUT, "log-summary.txt"), "w") as f:
    f.write("\n".join(summaries))
with open(os.path.join(OUT, "data-blocks.txt"), "w") as f:
    f.write("\n".join(data_blocks) + "\n")
with open(os.path.join(OUT, "logs.txt"), "w") as f:
    f.write("\n".join(logs_table) + "\n")
PY
cp "$FIX"/*.data "$FIX"/*.txt "$OUT/"
rm -f "$OUT/dmesg.txt" "$OUT/rc"

MDADM_VERSION=$(head -n1 "$FIX/mdadm-version.txt")
KERNEL=$(cat "$FIX/kernel.txt")
{
  cat <<EOF
# md RAID4/5/6 write-journal (raid5-cache) fixtures (generated)

Generated by \`deploy/vm/run-all.sh --only md-journal-fixtures\` (guest script
\`deploy/vm/guest/md-journal-fixtures.sh\`, host half \`deploy/vm/host/collect-journal-fixtures.sh\`); do
not edit by hand: re-run that command to regenerate. Array UUIDs and write offsets are fixed; the
write contents are random (\`/dev/urandom\`), and member UUIDs, times, superblock checksums, mdadm's
first log sequence number (random) and so every meta block's seq and checksum change on every run;
the kernel's split of the writes into log io_units may change too.

- mdadm: \`$MDADM_VERSION\` (Debian 12 \`mdadm\` package, run inside the guest)
- kernel: Linux \`$KERNEL\` (Debian 12 \`linux-image-amd64\`, md driver in the guest, TCG VM)
- busybox: \`$(sed 's/ multi-call binary\.$//' "$FIX/busybox-version.txt")\` (its \`dd\` did the O_DIRECT reads and writes in the guest)
- devices: sparse raw image files attached as virtio disks (512-byte sectors, write cache on),
  zero before \`mdadm --create\`: members 16 MiB, journals 32 MiB (j6) and 16 MiB (j5, j4).

## Arrays

All with \`--write-journal\`, \`--assume-clean\`, journal mode write-through (md's default;
\`journal_mode\` in the sysfs texts), data_offset 2048 sectors on every device (members and
journal), superblock at byte 4096, bad-block log at sb + 16 sectors (empty).

- \`j6\`: RAID6, 4 members, left-symmetric, chunk 64 KiB, UUID \`72616964:6e626400:00000000:000000a6\`, md0.
- \`j5\`: RAID5, 3 members, left-symmetric, chunk 32 KiB, UUID \`72616964:6e626400:00000000:000000a5\`, md1.
- \`j4\`: RAID4, 3 members, chunk 32 KiB, UUID \`72616964:6e626400:00000000:000000a4\`, md2.

Member \`m<i>\` holds role \`i\` (mdadm gives roles in command-line order); \`j\` is the journal
device (role 0xfffd, "Device Role : Journal"). See the Manifest for the guest devices and
\`superblocks.txt\` for dev_number.

## Files

States, in the order they were taken (every array goes through all of them):

- \`created-running\`: right after \`mdadm --create\` (which starts the array); \`created\`: after
  the following \`mdadm --stop\`.
- \`assembled\`: after \`mdadm --assemble\`, running, before any write.
- \`written\`: array still running, after the writes below completed (O_DIRECT writes to md, so log,
  data and parity were on the devices) and md marked the array clean again: md sets it \`active\`
  at the first write (every superblock's events + 1) and \`clean\` 200 ms after the last (events - 1
  again), journal or not; \`<array>-written.array_state-after-writes.txt\` and
  \`-{before,after}-copy.txt\` hold \`md/array_state\` right after the writes and around the copy
  (the guest waited for \`clean\`, so that all superblocks agree; the host checked they do).
  \`journal_tail\` was checked unchanged since the assembly: the log of every write was still live.
- \`stopped\`: after \`mdadm --stop\` of the written array.
- \`reassembled\`: after \`mdadm --assemble\` of the stopped array (running, no write).
- \`recovered\`: a simulated crash (see the commands): every device's first 16 KiB set back to its
  \`written\` head (superblocks as they were while the array ran after the writes, with that state's
  \`journal_tail\`), the journal's log set back to the \`written\` log, pages of the members' data areas
  written by the writes overwritten with 0xee, then \`mdadm --assemble\` (md's journal recovery);
  taken while the array ran. \`recovered-stopped\`: after the following \`mdadm --stop\`.

Per file:

- \`<array>-<state>-j.head.bin\` (every state) and \`<array>-{created,written}-m<i>.head.bin\`: the
  device's bytes 0 .. 16384 (read with \`dd bs=4096 count=4 iflag=direct\`; the guest checked the
  rest up to data_offset is zero), cut after their last non-zero 4 KiB block (so 8 KiB: the
  superblock at 4096; the tests pad them back with zeros). \`journal_tail\` is the LE64 at superblock
  byte 152 (the recovery_offset slot; \`mdadm --examine\` does not print it, md's sysfs shows it as
  the journal's \`recovery_start\`). The members' heads of the other states are left out; their
  superblock fields are in \`superblocks.txt\` and their \`--examine\` texts stay.
- \`<array>-written-j.log.bin\`: the journal device from its data_offset (byte 1048576), as read
  in the written state, cut after its last non-zero 4 KiB block. Block \`b\` of it is log sector
  \`8 b\` (meta block \`position\`, \`journal_tail\`).
- \`<array>-<state>-j.log-rest.bin\` (other states): the log of that state is the first F blocks of
  \`<array>-written-j.log.bin\` followed by this file and zeros, F = \`same_as_written_blocks\` in
  \`logs.txt\` (no file: nothing but zeros after those F blocks). The log is never discarded or
  rewritten in place here; later states only add meta blocks after the written log.
- \`<array>-written-m<i>.data.bin\`: member \`i\`'s data area from its data_offset (byte 1048576),
  **sparse**: only its non-zero 4 KiB blocks, in order; \`data-blocks.txt\` has one line per file:
  its name, the number of 4 KiB blocks the guest read (80 for j6 = stripes 0..4, 32 for j5 and j4)
  and the data-area blocks the file holds, as ranges \`a-b\` (every other block of the range read is
  zero). After the replay every member's data area was byte for byte the same again
  (\`<array>-recovered.compare.txt\`; a \`<array>-recovered-m<i>.data.bin\` exists only if it
  differed, see \`logs.txt\`).
- \`<array>-w<K>.data\`: the exact bytes of write \`w<K>\`; the host checked that md read back (O_DIRECT,
  in the guest, the written state) holds each at its offset, later writes over earlier ones.
- \`<array>-<state>-<m<i>|j>.examine.txt\`: \`mdadm --examine\` of the device in that state.
- \`<array>-<state>.detail.txt\` and \`.sysfs.txt\`: \`mdadm --detail\`, md sysfs attributes
  (\`consistency_policy\`, \`journal_mode\`, \`array_state\`, per device \`slot\`, \`state\`, \`offset\`,
  \`size\`, \`recovery_start\`) and \`/proc/mdstat\` while the array ran.
- \`<array>-<state>.dmesg.txt\`: md's kernel lines of the command that led to the state
  (\`created\` = the create, \`created-stop\`, \`assembled\`, \`stopped\`, \`reassembled\`, \`recovered\`,
  \`recovered-stopped\`); \`dmesg-md.txt\`: all of them.
- \`<array>-recovered.right-after-assemble.txt\`: \`array_state\`, \`sync_action\`, \`resync_start\`
  read right after the crash assembly (no resync ran: the journal replay alone made the stripes
  consistent); \`<array>-recovered.check.txt\`: \`mismatch_cnt\` after \`echo check > sync_action\`;
  \`<array>-recovered.compare.txt\`: data areas and md's written region against the written state.
- \`superblocks.txt\`: per array, state and device the superblock fields the journal touches
  (feature_map 512 = JOURNAL, data_offset, data_size, journal_tail/recovery_offset, dev_number,
  events, resync_offset; 18446744073709551615 = clean); \`<array>-written.superblocks-after-writes.txt\`:
  the same fields read right after the writes, before md marked the array clean again (the events
  may differ between devices there: md was rewriting the superblocks meanwhile).
- \`journal-tails.txt\`: the journal superblock's \`journal_tail\` per state; \`logs.txt\`: how the
  stored logs were cut; \`log-decoded.txt\`: every valid meta block of every state's log, with
  the payloads of the written state (see below); \`log-summary.txt\`: the written chains as below.
- \`manifest.txt\`, \`commands.txt\`, \`final-md5.txt\` (the guest's md5 of each disk's first 4 MiB at
  the end, checked against the image files), \`mdadm-version.txt\`, \`kernel.txt\`, \`busybox-version.txt\`.

## What md did (the host checked each point against the images)

- mdadm gives the journal \`dev_number\` 0 (\`dev_roles[0]\` = 0xfffd) and the members 1 .. N
  (roles 0 .. N-1); every superblock has feature_map 512 (JOURNAL) and resync_offset MaxSector in
  every state, also in the superblocks read right after the writes
  (\`<array>-written.superblocks-after-writes.txt\`, while \`array_state\` was as in
  \`<array>-written.array_state-after-writes.txt\`).
- \`mdadm --create\` writes an empty meta block (meta_size 32, no payload) at log block 0 with a
  random seq and position 0.
- Every start of the array (create, each assembly) walks the log from \`journal_tail\` (replaying
  what it finds), then writes one empty meta block right after the last valid one, with seq = that
  one's seq + 10001, and points \`journal_tail\` at it: 8 after the create, 16 after the first
  assembly (blocks 1 and 2; no replay: "starting from clean shutdown").
- The writes: one io_unit after the other (meta block, then its pages), seq + 1 each; a write may
  be split over io_units and one io_unit may hold several stripes (see the chains below).
  \`journal_tail\` stayed put while the array ran (no reclaim ran).
- \`mdadm --stop\` moves \`journal_tail\` to the **last io_unit's meta block**, not past it; the next
  assembly therefore replays that io_unit ("recovering 0 data-only stripes and N data-parity
  stripes", N = its PARITY payloads, one per stripe) and then writes its empty meta block after it.
- The simulated crash (written heads, \`journal_tail\` 16, written log, 0xee pages): md replayed the
  whole chain (N = all its PARITY payloads: a stripe logged twice counts twice), left the same
  log as the re-assembly had (the same empty meta block: seq, position, checksum), no resync
  ran, every member's data area came out byte for byte as after the writes, \`check\` found 0
  mismatches. Nothing was discarded, nothing before the new meta block rewritten.

## The log (decoded by the host, \`log-decoded.txt\`)

A meta block (\`struct r5l_meta_block\`, 4 KiB) is: magic \`0x6433c509\` (LE32), checksum (LE32),
version 1 (u8), 3 zero bytes, meta_size (LE32, bytes of the block in use, 32 + payload
descriptors), seq (LE64), position (LE64, its own log sector), then payload descriptors: DATA (type
0) and PARITY (type 1) are type (LE16), flags (LE16), size (LE32, sectors: 8 per page), location
(LE64: DATA = array sector, PARITY = stripe sector = member sector from data_offset), then one LE32
crc32c per page; their pages follow the meta block in descriptor order, and the next meta block
follows the last page. Checksums are crc32c (Castagnoli, the kernel's \`crc32c_le\`: no inversion)
seeded with crc32c(0xffffffff, the 16 set_uuid bytes): the meta block's over its whole 4 KiB with
the checksum field zero, each page's over the page. The host checked every checksum below; "chain"
= the blocks md's recovery walks from \`journal_tail\` (seq + 1 each, position = own sector). In
write-through mode every stripe (md's 4 KiB stripe_head: one page per member) is logged with its
parity (PARITY carries P, for RAID6 P then Q, size 16). The written state's chain, one meta block a
line: \`[D<array sector>=w<K> ... P<stripe sector>]\` is one stripe's payloads in log order (\`PQ\`: a
RAID6 parity payload of two pages), \`w<K>\` the write whose bytes the logged page holds (the
latest, for a page written twice); \`log-decoded.txt\` lists every payload of every state with page
blocks and checksums, and where each logged P/Q page sits on the members.

\`\`\`
EOF
  cat "$OUT/log-summary.txt"
  cat <<EOF
\`\`\`

Journal tails and how the logs of the other states differ from the written one:

\`\`\`
EOF
  cat "$FIX/journal-tails.txt"
  echo
  cat "$OUT/logs.txt"
  echo
  for array in j6 j5 j4; do
    for st in created assembled reassembled recovered; do
      grep -h -E 'recovering|clean shutdown' "$FIX/$array-$st.dmesg.txt" | sed "s/^\[ *[0-9.]*\] /$array $st: /"
    done
  done
  cat <<EOF
\`\`\`

## Exact commands (in the guest, in this order)

Between the commands the guest read the images listed above. \`<array>-w<K>.bin\` = LEN bytes of
\`/dev/urandom\`, kept here as \`<array>-w<K>.data\`; the dd commands ran in /tmp, where they and
e.bin (64 KiB of 0xee) were.

\`\`\`
EOF
  cat "$FIX/commands.txt"
  cat <<EOF
\`\`\`

## Manifest (array, device, disk index, guest device)

| array | device | disk | guest device |
| --- | --- | --- | --- |
EOF
  while read -r array name disk dev; do echo "| $array | $name | d$disk | $dev |"; done < "$FIX/manifest.txt"
} > "$OUT/README.md"
echo "collect-journal-fixtures: $(ls "$OUT" | wc -l) files, $(du -sb "$OUT" | cut -f1) bytes -> $OUT"
