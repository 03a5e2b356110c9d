#!/bin/bash
# Server CPU time per unit of work, single vs raid0 4x64K on /dev/shm (unthrottled).
# CPU seconds consumed by the raidnbd serve process are far less sensitive to other load
# on the machine than wall-clock throughput.
set -e
B=${RAIDNBD:-raidnbd}
D=/dev/shm/cpucost; rm -rf $D; mkdir -p $D; cd $D
ticks=$(getconf CLK_TCK)
cpu() { awk -v t=$ticks '{print ($14+$15)/t}' /proc/$1/stat; }
run() { # name port members...
  local name=$1 port=$2; shift 2
  $B serve --listen 127.0.0.1:$port --export x "$@" 2>$D/$name.log & local pid=$!
  for i in $(seq 100); do (echo > /dev/tcp/127.0.0.1/$port) 2>/dev/null && break; sleep 0.1; done
  fio --name=fill --ioengine=nbd --uri=nbd://127.0.0.1:$port/x --rw=write --bs=1M --iodepth=8 --output-format=json --output=$D/fill.json >/dev/null 2>&1
  for w in "read 1M 8 4G" "write 1M 8 4G" "randread 4k 32 400M" "randwrite 4k 32 400M"; do
    set -- $w
    c0=$(cpu $pid); t0=$(date +%s.%N)
    fio --name=w --ioengine=nbd --uri=nbd://127.0.0.1:$port/x --rw=$1 --bs=$2 --iodepth=$3 --io_size=$4 --norandommap --output-format=json --output=$D/w.json >/dev/null 2>&1
    c1=$(cpu $pid); t1=$(date +%s.%N)
    python3 - "$name" "$1" "$2" "$c0" "$c1" "$t0" "$t1" <<'PY'
import json,sys
name,rw,bs,c0,c1,t0,t1=sys.argv[1:]
j=json.load(open('/dev/shm/cpucost/w.json'))['jobs'][0]
side=j['write' if 'write' in rw else 'read']
mb=side['io_bytes']/1e6; ios=side['total_ios']; cpu=float(c1)-float(c0)
print(f"{name:8} {rw:9} {bs:3}  {mb:7.0f} MB {ios:8d} IOs  server CPU {cpu:6.2f} s = {cpu*1e6/mb:7.1f} us/MB {cpu*1e6/ios:6.1f} us/IO  ({side['bw_bytes']/1e6:6.0f} MB/s wall)")
PY
  done
  kill $pid; wait $pid 2>/dev/null || true
}
$B create --level linear --size 1G s0.img >/dev/null
$B create --level 0 --chunk 64K --size 1G r0.img r1.img r2.img r3.img >/dev/null
for round in 1 2; do
  run single 18801 s0.img
  run raid0 18802 r0.img r1.img r2.img r3.img
done
rm -rf $D
