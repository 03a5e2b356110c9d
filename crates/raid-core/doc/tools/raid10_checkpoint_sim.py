# Research aid for doc/md-reshape-raid10.md §3.3: simulates the kernel's raid10 reshape checkpoint rule
# (Linux 6.1 raid10.c reshape_request) over near layouts and prints any case where a copy would
# overwrite old data a restart from the recorded reshape_position still needs (empty lists: none).
# precise check: kernel algorithm (flush-then-proceed), near layout fc=1
def phys(s, cs, nc, rd):
    ch = s//cs; off = s%cs
    ch *= nc
    st, dev = divmod(ch, rd)
    out=[]; addr = st*cs+off
    for n in range(nc):
        out.append((dev, addr)); dev+=1
        if dev>=rd: dev=0; addr+=cs
    return out
def last_dev(s, cs, nc, rd):
    c = ((s | (cs-1)) + 1)//cs*nc
    return -(-c//rd)*cs
def first_dev(s, cs, nc, rd):
    return (s//cs)*nc//rd*cs
def run(nc,O,N,cs,step,D,Dc=40):
    size_old=(Dc*O//nc)*cs; size_new=(Dc*N//nc)*cs
    fwd = N>O
    # map of old needed: for each device, set of old-layout dev addrs holding array sectors >= safe (fwd) 
    # precompute old location per array sector
    size = size_old if fwd else size_new
    oldloc = {}
    for s in range(0, max(size_old,size_new) if not fwd else size_old):
        for d,a in phys(s,cs,nc,O): oldloc.setdefault((d,a),s)
    flushes=0; viol=0
    if fwd:
        p=0; safe=0
        while p<size:
            nxt=last_dev(p,cs,nc,N); sf=first_dev(safe,cs,nc,O)
            if nxt > sf + D: safe=p; flushes+=1
            last = p | (cs-1)
            if p+step <= last: last = p+step-1
            for s in range(p,last+1):
                for d,a in phys(s,cs,nc,N):
                    pa = a - D  # relative to old data_offset
                    if (d,pa) in oldloc and oldloc[(d,pa)] >= safe and oldloc[(d,pa)]!=s:
                        viol+=1
            p = last+1
    else:
        p=size; safe=p
        while p>0:
            nxt=first_dev(p-1,cs,nc,N); sf=last_dev(safe-1,cs,nc,O)
            if nxt + D < sf: safe=p; flushes+=1
            last=p-1
            sn = last & ~(cs-1)
            if sn + step < last: sn = last+1-step
            for s in range(sn,last+1):
                for d,a in phys(s,cs,nc,N):
                    pa = a + D
                    if (d,pa) in oldloc and oldloc[(d,pa)] < safe and oldloc[(d,pa)]!=s:
                        viol+=1
            p = sn
    return flushes, viol
import itertools
res=[]
for nc in (2,3):
  for O in range(nc,8):
    for N in range(nc,8):
      if N==O: continue
      for cs,step in ((8,8),(8,4)):
        f,v = run(nc,O,N,cs,step,cs)
        if v: res.append((nc,O,N,cs,step,f,v))
print(res)
res=[]
for nc in (2,3,4):
  for O in range(nc,11):
    for N in range(nc,11):
      if N==O: continue
      for cs,step in ((16,4),(16,16)):
        f,v = run(nc,O,N,cs,step,cs,Dc=24)
        if v: res.append((nc,O,N,cs,step,f,v))
print('ext', res)
