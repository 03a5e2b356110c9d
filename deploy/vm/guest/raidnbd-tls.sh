#!/bin/sh
# The kernel NBD client over TLS: nbd-client with certificates against raidnbd --tls require.
# Credentials are made on the host for this boot (crates/nbd-server/tests/make-pki.sh: valid two
# days, never committed) and reach the guest as a tar written on disk vda.
#  1. raidnbd serves a RAID5 of four 32 MiB tmpfs files with --tls require; nbd-client without
#     TLS is refused (no device);
#  2. nbd-client -cacertfile/-certfile/-keyfile -C 2 attaches /dev/nbd0 over TLS: mkfs.ext4,
#     files, fsck clean; digest;
#  3. --tls-verify-peer --tls-peer client1.test: the client certificate is required and named;
#     files and digest read back over the verified connection; a client that shows a certificate
#     from another CA is refused;
#  4. the guest kernel has the tls module (modprobe tls), so raidnbd hands the sessions to
#     kernel TLS (logged): a RAID0 of two tmpfs files over TLS takes the kernel client's
#     whole-device O_DIRECT overwrite into the member files in place and answers a digest from
#     the member files (the export's in-place byte counters grow, fetched from --metrics); digests right,
#     also after a new server;
#  5. members over TLS: two `raidnbd serve --tls require` member servers (linear arrays of tmpfs
#     files) and an array server of a RAID1 over their nbds:// URIs: every member connection
#     runs on kernel TLS (logged tls="kernel"), an O_DIRECT overwrite of the whole array reads
#     back right, and `raidnbd check` over the same members finds both copies equal.
# rig-status: enabled
# rig-needs: raidnbd
# rig-disks: 1M
# rig-host-pre: rm -rf {workdir}/pki && sh {repo}/crates/nbd-server/tests/make-pki.sh {workdir}/pki && tar -C {workdir}/pki -cf - . | dd of={workdir}/d0.img conv=notrunc status=none
# rig-timeout: 600
. /guest/lib.sh
S=/shm
M=/mnt
P=/pki
rig_debug() {
  echo "-- raidnbd log:"; tail -n 40 "$RAIDNBD_LOG" 2>/dev/null
}
tls_attach() { # DIR CONNECTIONS: nbd-client over TLS with DIR's CA and client certificate
  run nbd-client 127.0.0.1 "$RAIDNBD_PORT" /dev/nbd0 -N "$RAIDNBD_EXPORT" -b 4096 -C "$2" \
    -cacertfile "$1/ca-cert.pem" -certfile "$1/client-cert.pem" -keyfile "$1/client-key.pem" -tlshostname localhost
  n=0
  while [ "$(cat /sys/block/nbd0/size)" = 0 ]; do
    n=$((n + 1)); [ "$n" -le 50 ] || fail "/dev/nbd0 has size 0 after nbd-client"
    sleep 0.2
  done
  expect_eq "$(established_to "$RAIDNBD_PORT")" "$2" "TLS connections to 127.0.0.1:$RAIDNBD_PORT"
}

step "credentials from the host, tmpfs members, raidnbd create --level 5"
run modprobe nbd nbds_max=4
run modprobe tls
run modprobe gcm
run modprobe ctr
run modprobe ghash_generic
modprobe aesni_intel || echo "no aesni_intel: the generic AES code serves kernel TLS"
mkdir -p "$S" "$M" "$P"
run tar -x -f "$(disk 0)" -C "$P"
[ -s "$P/pki/server-cert.pem" ] && [ -s "$P/pki/client-key.pem" ] || fail "no credentials on $(disk 0)"
run mount -t tmpfs -o size=160M tmpfs "$S"
for i in 0 1 2 3; do run truncate -s 32M "$S/m$i.img"; done
run raidnbd create --level 5 --chunk 64K "$S/m0.img" "$S/m1.img" "$S/m2.img" "$S/m3.img"

step "serve --tls require: a plaintext client is refused"
raidnbd_serve --tls require --tls-certificates "$P/pki" "$S/m0.img" "$S/m1.img" "$S/m2.img" "$S/m3.img"
if nbd-client 127.0.0.1 "$RAIDNBD_PORT" /dev/nbd0 -N "$RAIDNBD_EXPORT" -b 4096 >/tmp/plain.out 2>&1; then
  cat /tmp/plain.out; fail "plaintext nbd-client attached to a server that requires TLS"
fi
echo "ok: plaintext nbd-client refused: $(tail -n 1 /tmp/plain.out)"
expect_eq "$(cat /sys/block/nbd0/size)" 0 "size of /dev/nbd0 after the refused client"

step "nbd-client over TLS (-C 2): mkfs.ext4, files, fsck"
tls_attach "$P/pki" 2
raidnbd_last_log | contains "kernel TLS available" || fail "raidnbd did not find kernel TLS (modprobe tls)"
mkfs_ext4 /dev/nbd0
run mount -t ext4 /dev/nbd0 "$M"
fill_tree "$M/t1" 12 512 /tmp/t1.md5
run umount "$M"
fsck_clean /dev/nbd0
D1=$(dev_digest /dev/nbd0)
nbd_detach /dev/nbd0
raidnbd_stop

step "--tls-verify-peer --tls-peer client1.test: files and digest over a verified connection"
raidnbd_serve --tls require --tls-certificates "$P/pki" --tls-verify-peer --tls-peer client1.test \
  "$S/m0.img" "$S/m1.img" "$S/m2.img" "$S/m3.img"
if nbd-client 127.0.0.1 "$RAIDNBD_PORT" /dev/nbd0 -N "$RAIDNBD_EXPORT" -b 4096 -cacertfile "$P/foreign-client/ca-cert.pem" \
  -certfile "$P/foreign-client/client-cert.pem" -keyfile "$P/foreign-client/client-key.pem" -tlshostname localhost \
  >/tmp/foreign.out 2>&1; then
  cat /tmp/foreign.out; fail "a client certificate from another CA was accepted"
fi
echo "ok: foreign client certificate refused: $(tail -n 1 /tmp/foreign.out)"
raidnbd_last_log | contains "TLS handshake failed" || fail "the refused handshake is not logged"
tls_attach "$P/pki" 1
drop_caches
expect_eq "$(dev_digest /dev/nbd0)" "$D1" "digest over the verified connection"
run mount -t ext4 -o ro /dev/nbd0 "$M"
verify_tree "$M/t1" /tmp/t1.md5
run umount "$M"
fsck_clean /dev/nbd0
nbd_detach /dev/nbd0
raidnbd_stop

step "kernel TLS keeps the in-place paths: RAID0 of two tmpfs files, O_DIRECT overwrite, digest"
for f in r0 r1; do run truncate -s 24M "$S/$f.img"; done
run raidnbd create --level 0 --chunk 64K "$S/r0.img" "$S/r1.img"
raidnbd_serve --metrics 127.0.0.1:9109 --tls require --tls-certificates "$P/pki" "$S/r0.img" "$S/r1.img"
tls_attach "$P/pki" 1
SIZE=$(size_bytes /dev/nbd0)
run dd if=/dev/urandom of=/tmp/pattern bs=1M count=$((SIZE / 1048576 + 1)) status=none
before_w=$(in_place_bytes write)
fill_dev /dev/nbd0 /tmp/pattern
expect_grew "$before_w" "$(in_place_bytes write)" $((SIZE / 2)) "O_DIRECT overwrite over kernel TLS"
before_r=$(in_place_bytes)
D2=$(dev_digest /dev/nbd0)
expect_grew "$before_r" "$(in_place_bytes)" "$SIZE" "digest over kernel TLS"
expect_eq "$D2" "$(head -c "$SIZE" /tmp/pattern | md5sum | cut -d' ' -f1)" "digest of the overwritten device"
nbd_detach /dev/nbd0
raidnbd_stop
raidnbd_serve --tls require --tls-certificates "$P/pki" "$S/r0.img" "$S/r1.img"
tls_attach "$P/pki" 1
expect_eq "$(dev_digest /dev/nbd0)" "$D2" "digest after a new server"
nbd_detach /dev/nbd0
raidnbd_stop

step "members over kernel TLS: a RAID1 of two nbds:// members, whole-array overwrite, digests"
kmember_serve() { # N: serve /shm/kN.img over TLS as nbds://localhost:1082N/
  raidnbd serve --listen "127.0.0.1:1082$1" --control "/run/kmember$1.sock" --tls require \
    --tls-certificates "$P/pki" "$S/k$1.img" >> "/tmp/kmember$1.log" 2>&1 &
  eval "KMEMBER_PID_$1=$!"
  wait_listen "1082$1"
}
for n in 1 2; do
  run truncate -s 24M "$S/k$n.img"
  run raidnbd create --level linear "$S/k$n.img"
  kmember_serve "$n"
done
KURIS="nbds://localhost:10821/?tls-certificates=$P/pki nbds://localhost:10822/?tls-certificates=$P/pki"
# shellcheck disable=SC2086
run raidnbd create --level 1 $KURIS
# shellcheck disable=SC2086
raidnbd_serve --member-timeout 20 $KURIS
raidnbd_last_log | grep "NBD member connected" > /tmp/kconnected.txt
expect_eq "$(grep -c 'tls="kernel"' /tmp/kconnected.txt)" "$(grep -c . /tmp/kconnected.txt)" "member connections on kernel TLS"
[ "$(grep -c . /tmp/kconnected.txt)" -ge 2 ] || fail "fewer than two member connections logged"
nbd_attach "$RAIDNBD_PORT" /dev/nbd0 "$RAIDNBD_EXPORT" 1
SIZE=$(size_bytes /dev/nbd0)
run dd if=/dev/urandom of=/tmp/kpattern bs=1M count=$((SIZE / 1048576 + 1)) status=none
fill_dev /dev/nbd0 /tmp/kpattern
drop_caches
D3=$(head -c "$SIZE" /tmp/kpattern | md5sum | cut -d' ' -f1)
expect_eq "$(dev_digest /dev/nbd0)" "$D3" "digest of the array over kernel-TLS members"
nbd_detach /dev/nbd0
raidnbd_stop
# Both copies hold the same bytes: raidnbd check over the same nbds:// members (kernel TLS too).
# shellcheck disable=SC2086
run raidnbd check --json $KURIS > /tmp/kcheck.json
tr -d ' \n' < /tmp/kcheck.json | contains '"mismatch_cnt":0[,}]' || fail "the two copies differ: $(cat /tmp/kcheck.json)"
for n in 1 2; do eval "kill \$KMEMBER_PID_$n"; done
