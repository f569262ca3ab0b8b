import sys,re,subprocess
# usage: ana.py pcap  -> timeline of receiver acks on the data connection (the busiest port)
lines=subprocess.run(['tcpdump','-nr',sys.argv[1],'-tt'],capture_output=True,text=True).stdout.splitlines()
from collections import Counter
ports=Counter(re.search(r'> [\d.]+\.(\d+):',l).group(1) for l in lines if '> ' in l)
port=ports.most_common(1)[0][0]
rows=[]
for l in lines:
    if '.%s:'%port not in l: continue
    t=float(l.split()[0]); a=re.search(r' ack (\d+)',l); d=re.search(r'dss ack (\d+)',l); w=re.search(r'win (\d+)',l)
    sack='sack' in l
    rows.append((t, int(a.group(1)) if a else None, int(d.group(1)) if d else None, int(w.group(1)) if w else None, sack, 'dss ack' in l))
t0=rows[0][0]
print('port',port,'acks',len(rows))
# gaps
prev=None; gaps=[]
for r in rows:
    if prev and r[0]-prev[0]>0.02: gaps.append((prev,r))
    prev=r
print('gaps>20ms:',len(gaps))
d0=rows[0][2] or 0; a0=rows[0][1] or 0
for p,r in gaps[:40]:
    print('%.4f -> %.4f gap %.0f ms | tcp ack %d->%d | dss ack %s->%s | win %s->%s sack %s'%(p[0]-t0,r[0]-t0,(r[0]-p[0])*1e3,p[1]-a0,r[1]-a0,(p[2] or 0)-d0,(r[2] or 0)-d0,p[3],r[3],r[4]))
nodss=sum(1 for r in rows if not r[5]); print('acks without dss ack:',nodss)
