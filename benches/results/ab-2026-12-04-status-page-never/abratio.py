import sys,re,statistics
d=sys.argv[1]
def get(side,r):
    u,s=map(int,open(f"{d}/{side}-r{r}.cpu_ticks").read().split())
    ops=None
    for l in open(f"{d}/{side}-r{r}.txt"):
        f=l.split()
        if f and f[0]=="all" and f[1]=="cycle": ops=int(f[2])
    return (u+s)*10000/ops, u*10000/ops, ops
rs=[]
for r in range(1,8):
    a=get('a',r); b=get('b',r)
    rs.append((b[0]/a[0], b[1]/a[1], b[2]/a[2]))
    print(f"round {r}: cpu/op a {a[0]:.1f} b {b[0]:.1f} (b/a {b[0]/a[0]:.3f}); user/op b/a {b[1]/a[1]:.3f}; ops b/a {b[2]/a[2]:.3f}")
print("median per-round ratios: cpu/op %.3f, user/op %.3f, ops %.3f"%tuple(statistics.median(x[i] for x in rs) for i in range(3)))
