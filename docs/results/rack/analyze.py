# Bootstrap table of docs/results/rack/report.md: python3 analyze.py bench/trials.jsonl
import json, random, statistics as st, sys
random.seed(1)
recs=[json.loads(l) for l in open(sys.argv[1])]
cells={}
order=[]
for r in recs:
    if r['status']!='ok': continue
    k=(r['configuration'],r['cell'])
    if k not in cells: cells[k]={'fct':[], 'trial_med':[], 'load':[]}; order.append(k)
    cells[k]['fct']+=r['fct_all_ms']; cells[k]['trial_med'].append(r['fct_ms']); cells[k]['load'].append(r['loadavg_1m'])
def med(x): return st.median(x)
def boot_ratio(a,b,n=2000):
    out=[]
    for _ in range(n):
        ra=[random.choice(a) for _ in a]; rb=[random.choice(b) for _ in b]
        out.append(med(ra)/med(rb))
    out.sort(); return out[int(0.025*n)], out[int(0.975*n)]
cfgs=[]
for c,_ in order:
    if c not in cfgs: cfgs.append(c)
print("| configuration | procedure | flows | median ms | IQR | trial medians (min-max) | median / TCP | 95% CI (bootstrap) |")
print("|---|---|---:|---:|---|---|---:|---|")
for c in cfgs:
    base=cells.get((c,'tcp'))
    for (cc,cell) in order:
        if cc!=c: continue
        d=cells[(cc,cell)]; f=sorted(d['fct'])
        q1=f[len(f)//4]; q3=f[(3*len(f))//4]
        lo,hi=boot_ratio(d['fct'],base['fct']) if base and cell!='tcp' else (1,1)
        print(f"| {c} | {cell} | {len(f)} | {med(f):.2f} | {q1:.2f}-{q3:.2f} | {min(d['trial_med']):.2f}-{max(d['trial_med']):.2f} | {med(f)/med(base['fct']):.3f} | {lo:.3f}-{hi:.3f} |")
# bimodality for 1MB / 1MB-bg
for c in ('1MB','1MB-bg','10MB','10MB-bg'):
    base=cells.get((c,'tcp'))
    if not base: continue
    m=med(base['fct'])
    for (cc,cell) in order:
        if cc==c and 'nat' in cell:
            f=cells[(cc,cell)]['fct']
            print(c, cell, f"{sum(1 for x in f if x<0.75*m)}/{len(f)} flows faster than 0.75 x TCP median")
loads=[x for d in cells.values() for x in d['load']]
print("load", min(loads), st.median(loads), max(loads))
