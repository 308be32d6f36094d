import os, threading, time, sys
def loop(path, n, out):
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    os.pwrite(fd, b"\0" * (1 << 20), 0); os.fsync(fd)
    buf = b"x" * 4096
    lat = []
    for i in range(n):
        t = time.perf_counter()
        os.pwrite(fd, buf, (i % 256) * 4096)
        os.fdatasync(fd)
        lat.append(time.perf_counter() - t)
    os.close(fd)
    out.append(lat)
def run(k, n=1500):
    out = []
    ts = [threading.Thread(target=loop, args=(f"/tmp/fs2-{j}", n, out)) for j in range(k)]
    t0 = time.perf_counter()
    for t in ts: t.start()
    for t in ts: t.join()
    el = time.perf_counter() - t0
    lat = sorted(x for l in out for x in l)
    print(f"{k} concurrent: {k*n/el:.0f} syncs/s total, p50 {lat[len(lat)//2]*1e6:.0f} us, p99 {lat[int(len(lat)*.99)]*1e6:.0f} us")
for r in range(2):
    for k in (1, 2, 3):
        run(k)
