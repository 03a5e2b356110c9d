#!/usr/bin/python3
"""Ways to land 1 MiB messages from a loopback TCP socket in a tmpfs file, one receiver
thread, measured in this process: CPU per MiB (user + sys) and throughput.

  copy        recv into a buffer, then pwrite into the file (two copies, what NBD servers do)
  splice      splice socket -> pipe -> file
  mmap        recv straight into a shared, pre-populated mapping of the file (one copy)
  copy-lowat  copy, with SO_RCVLOWAT = 1 MiB (the receiver is woken once per message)
  mmap-lowat  mmap, with SO_RCVLOWAT = 1 MiB

The sender's CPU per MiB is reported too: on loopback it depends on the receiver (a receiver
woken for every segment makes the sender deliver and acknowledge in small steps).

Usage: /usr/bin/python3 crates/nbd-server/bench/recv-paths.py [ROUNDS]   (modes alternate)
Writes /dev/shm/recv-paths.img (256 MiB) and removes it.
"""
import fcntl, mmap, os, resource, socket, sys, time

MIB = 1 << 20
MESSAGES = 4000
FILE_MIB = 256
PATH = "/dev/shm/recv-paths.img"
F_SETPIPE_SZ = 1031


def run(mode):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    pid = os.fork()
    if pid == 0:
        s = socket.create_connection(("127.0.0.1", port))
        data = os.urandom(MIB)
        for _ in range(MESSAGES):
            s.sendall(data)
        s.close()
        os._exit(0)
    conn, _ = listener.accept()
    fd = os.open(PATH, os.O_RDWR | os.O_CREAT, 0o600)
    os.ftruncate(fd, FILE_MIB * MIB)
    os.pwrite(fd, b"\1" * (FILE_MIB * MIB), 0)
    mapping = mmap.mmap(fd, FILE_MIB * MIB, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE)
    view = memoryview(mapping)
    buf = bytearray(MIB)
    bview = memoryview(buf)
    pipe_r, pipe_w = os.pipe()
    fcntl.fcntl(pipe_w, F_SETPIPE_SZ, MIB)
    if mode.endswith("-lowat"):
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, MIB)
    before, t0 = resource.getrusage(resource.RUSAGE_SELF), time.time()
    for i in range(MESSAGES):
        at, got = (i % FILE_MIB) * MIB, 0
        if mode.startswith("copy"):
            while got < MIB:
                got += conn.recv_into(bview[got:])
            os.pwrite(fd, buf, at)
        elif mode.startswith("mmap"):
            while got < MIB:
                got += conn.recv_into(view[at + got:at + MIB])
        else:
            while got < MIB:
                n = os.splice(conn.fileno(), pipe_w, MIB - got)
                moved = 0
                while moved < n:
                    moved += os.splice(pipe_r, fd, n - moved, offset_dst=at + got + moved)
                got += n
    after, seconds = resource.getrusage(resource.RUSAGE_SELF), time.time() - t0
    _, _, sender = os.wait4(pid, 0)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    sender_cpu = sender.ru_utime + sender.ru_stime
    print(f"{mode:<10} {MESSAGES * MIB / seconds / 1e9:5.2f} GB/s  receiver {cpu / MESSAGES * 1e6:6.1f} us CPU per MiB"
          f"  sender {sender_cpu / MESSAGES * 1e6:6.1f}")
    view.release()
    mapping.close()
    for f in (fd, pipe_r, pipe_w):
        os.close(f)
    conn.close()
    listener.close()
    os.unlink(PATH)


for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 2):
    for mode in ("copy", "splice", "mmap", "copy-lowat", "mmap-lowat"):
        run(mode)
