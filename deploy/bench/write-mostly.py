#!/usr/bin/python3
"""RAID1 of a local member and a distant one: do reads stay at local speed?

The distant member is a file served by `nbdkit file` with the delay filter (DELAY per read
and write, default 2ms) on 127.0.0.1; the local one a file on /var/tmp. Arrays, each served
by `raidnbd serve` and measured with fio's nbd engine, rounds interleaved:

  local        the local member alone (md linear of one): the baseline
  wm           RAID1 local + distant, the distant one marked --write-mostly
  balanced     RAID1 local + distant, unmarked (copies chosen by measured latency)
  distant      the distant member alone: what reading it would cost

Prints a table (median of ROUNDS, ratio to local) and writes it to OUT/results.md.

Usage: deploy/bench/write-mostly.py [--raidnbd PATH] [--delay 2ms] [--rounds 3]
       [--runtime 8] [--size 256M] [--local-dir /var/tmp] [--out DIR]
"""

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

WORKLOADS = [
    ("RND4K Q1 read", ["--rw=randread", "--bs=4k", "--iodepth=1"]),
    ("RND4K Q32 read", ["--rw=randread", "--bs=4k", "--iodepth=32"]),
    ("SEQ1M Q8 read", ["--rw=read", "--bs=1m", "--iodepth=8"]),
    ("SEQ1M Q8 write", ["--rw=write", "--bs=1m", "--iodepth=8"]),
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, proc, what):
    deadline = time.time() + 30
    while time.time() < deadline:
        if proc.poll() is not None:
            sys.exit(f"{what} exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    sys.exit(f"{what} did not listen on {port}")


def run(cmd):
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed: {out.stderr.strip()}")
    return out.stdout


class Served:
    def __init__(self, raidnbd, members, log):
        self.port = free_port()
        self.log = open(log, "w")
        self.proc = subprocess.Popen(
            [raidnbd, "serve", "--listen", f"127.0.0.1:{self.port}", "--export", "b", *members],
            stdout=subprocess.DEVNULL, stderr=self.log)
        wait_port(self.port, self.proc, "raidnbd serve")
        self.uri = f"nbd://127.0.0.1:{self.port}/b"

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        if self.proc.wait(timeout=120) != 0:
            sys.exit(f"raidnbd serve exited with {self.proc.returncode}")


def fio(uri, size, runtime, extra):
    cmd = ["fio", "--name=b", "--ioengine=nbd", f"--uri={uri}", f"--size={size}", "--direct=1",
           "--time_based", f"--runtime={runtime}", "--ramp_time=1", "--output-format=json", *extra]
    out = run(cmd)
    job = json.loads(out[out.index("{"):])["jobs"][0]  # fio may print notes before the JSON
    side = job["read"] if job["read"]["io_bytes"] > 0 else job["write"]
    return side["bw_bytes"] / 1e6


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--raidnbd", default=shutil.which("raidnbd") or "target/release/raidnbd")
    p.add_argument("--delay", default="2ms")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--runtime", type=int, default=8)
    p.add_argument("--size", default="256M")
    p.add_argument("--out", default="write-mostly-results")
    p.add_argument("--local-dir", default="/var/tmp", help="where the local members and nbdkit's files go")
    a = p.parse_args()
    for tool in ("fio", "nbdkit"):
        if not shutil.which(tool):
            sys.exit(f"{tool} is needed: apt install {tool}")
    raidnbd = os.path.abspath(a.raidnbd)
    work = tempfile.mkdtemp(prefix="raidnbd-wm-", dir=a.local_dir)
    peers = []
    try:
        files = {n: os.path.join(work, f"{n}.img") for n in
                 ("local", "wm-local", "wm-far", "bal-local", "bal-far", "distant")}
        far = {}
        for name in ("wm-far", "bal-far", "distant"):
            port = free_port()
            run(["truncate", "-s", a.size, files[name]])
            proc = subprocess.Popen(
                ["nbdkit", "-f", "-i", "127.0.0.1", "-p", str(port), "--filter=delay", "file", files[name],
                 f"rdelay={a.delay}", f"wdelay={a.delay}"], stderr=subprocess.DEVNULL)
            peers.append(proc)
            wait_port(port, proc, "nbdkit")
            far[name] = f"nbd://127.0.0.1:{port}/"
        arrays = {
            "local": ["--level", "linear", "--size", a.size, files["local"]],
            "wm": ["--level", "1", "--size", a.size, "--write-mostly", far["wm-far"], files["wm-local"], far["wm-far"]],
            "balanced": ["--level", "1", "--size", a.size, files["bal-local"], far["bal-far"]],
            "distant": ["--level", "linear", far["distant"]],
        }
        for args in arrays.values():
            run([raidnbd, "create", *args])
        # The members as serve takes them.
        members = {
            "local": [files["local"]],
            "wm": [files["wm-local"], far["wm-far"]],
            "balanced": [files["bal-local"], far["bal-far"]],
            "distant": [far["distant"]],
        }
        # Fill every array once so reads see written data.
        for name, m in members.items():
            s = Served(raidnbd, m, os.path.join(work, f"fill-{name}.log"))
            run(["fio", "--name=fill", "--ioengine=nbd", f"--uri={s.uri}", "--rw=write", "--bs=1m",
                 "--iodepth=8", f"--size={a.size}", "--output-format=json"])
            s.stop()
        results = {(n, w): [] for n in members for w, _ in WORKLOADS}
        for rnd in range(a.rounds):
            for name, m in members.items():
                s = Served(raidnbd, m, os.path.join(work, f"serve-{name}.log"))
                for wname, extra in WORKLOADS:
                    mb = fio(s.uri, a.size, a.runtime, extra)
                    results[(name, wname)].append(mb)
                    print(f"round {rnd + 1} {name:9} {wname:15} {mb:9.1f} MB/s", file=sys.stderr)
                s.stop()
        lines = [
            "# RAID1 of a local member and a distant one",
            "",
            f"Distant member: `nbdkit file` with the delay filter, {a.delay} per read and write, on 127.0.0.1.",
            f"Local member: a file in {a.local_dir}. Members {a.size}; fio {a.runtime} s per run,",
            f"1 s ramp; median of {a.rounds} rounds, arrays interleaved; MB/s and the ratio to `local`.",
            "",
            "Command: `deploy/bench/write-mostly.py " + " ".join(sys.argv[1:]) + "`",
            "",
            "| workload | local | wm (write-mostly) | balanced (by latency) | distant |",
            "|---|---|---|---|---|",
        ]
        for wname, _ in WORKLOADS:
            base = statistics.median(results[("local", wname)])
            cells = []
            for name in members:
                v = statistics.median(results[(name, wname)])
                cells.append(f"{v:.1f}" + ("" if name == "local" else f" ({v / base:.2f}×)"))
            lines.append(f"| {wname} | " + " | ".join(cells) + " |")
        lines += ["", "Every round:", ""]
        for (name, wname), vals in results.items():
            lines.append(f"- {name} {wname}: " + ", ".join(f"{v:.1f}" for v in vals))
        text = "\n".join(lines) + "\n"
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "results.md"), "w") as f:
            f.write(text)
        print(text)
    finally:
        for proc in peers:
            proc.kill()
            proc.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
