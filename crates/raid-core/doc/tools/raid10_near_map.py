# Research aid for doc/md-reshape-raid10.md §8.1: prints where each array chunk of a raid10 near
# layout (2 copies) lives, as (device, row), for 3, 4 and 5 devices (__raid10_find_phys).
def phys(k, nc, rd):
    slot=k*nc; out=[]
    for n in range(nc):
        s=slot+n; out.append((s%rd, s//rd))
    return out
for k in range(8):
    print(k, phys(k,2,3), phys(k,2,4), phys(k,2,5))
