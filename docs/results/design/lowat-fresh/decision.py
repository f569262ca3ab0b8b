#!/usr/bin/env python3
"""The pre-stated analysis (PLAN.md) and the decision rule's three criteria, read from the design
runner's report.md in DIR (default: this directory), both goodput windows. Prints markdown.

    python3 decision.py [DIR]
"""
import os, re, sys

d = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
S, L = "mptcp-static", "mptcp-static+lowat"
text = open(os.path.join(d, "report.md")).read()
head, eq = text.split("### Over the equal window", 1)
head = head.split("## Paired analysis", 1)[1]
eq = eq.split("\n## ", 1)[0]


def cells(line):
    return [c.strip() for c in line.strip().strip("|").split("|")]


def window(sec):
    w = {"summary": {}, "harmed": {}}
    for line in sec.splitlines():
        c = cells(line) if line.startswith("|") else None
        if c and c[0] in (S, L) and len(c) == 8:
            w["summary"][c[0]] = c
        if c and c[0] == L and len(c) == 7:
            w["vs"] = c
        m = re.match(r"Harmed points, (\S+): (.*)$", line)
        if m:
            w["harmed"][m.group(1)] = m.group(2).rstrip(".")
        m = re.search(r"kernel's own cost.*geometric mean ([0-9.]+) over (\d+) points; interval wholly below 0.95 at (\d+)", line)
        if m:
            w["1sf"] = m.groups()
    return w


def ratio(v):
    m = re.match(r"([0-9.]+) \[([0-9.]+), ([0-9.]+)\]", v)
    return tuple(float(x) for x in m.groups())


def names(v):
    n, _, rest = v.partition(":")
    return n.strip(), ", ".join(re.findall(r"p\d{3}", rest))


W = {"to the last byte": window(head), "equal window (1-10 s)": window(eq)}
print("| window | points | limit / static [95 % over points] | below (points) | above (points) | expected by chance, each way | sign test | harmed static / limit | mean >= 0.95 x best static / limit | median Ben low BDP (n) static / limit | mptcp-1sf / TCP: geo. mean, points below 0.95 |")
print("|---|---:|---|---|---|---:|---:|---|---|---|---|")
for name, w in W.items():
    v, s, l = w["vs"], w["summary"][S], w["summary"][L]
    bn, bp = names(v[3])
    an, ap = names(v[4])
    print(f"| {name} | {v[1]} | {v[2]} | {bn} ({bp or '-'}) | {an} ({ap or '-'}) | {v[5]} | {v[6]} | "
          f"{s[2]} / {l[2]} | {s[3]} / {l[3]} | {s[6]} / {l[6]} | {w['1sf'][0]}, {w['1sf'][2]} of {w['1sf'][1]} |")
print()
for name, w in W.items():
    for p in (S, L):
        print(f"- harmed, {name}, {p}: {w['harmed'].get(p, 'none')}")
print()
lb = ratio(W["to the last byte"]["vs"][2])
ew = ratio(W["equal window (1-10 s)"]["vs"][2])
hs = int(W["to the last byte"]["summary"][S][2].split()[0])
hl = int(W["to the last byte"]["summary"][L][2].split()[0])
hse = int(W["equal window (1-10 s)"]["summary"][S][2].split()[0])
hle = int(W["equal window (1-10 s)"]["summary"][L][2].split()[0])
ok = lambda b: "met" if b else "missed"
c1 = lb[0] >= 1 and lb[2] >= 1
c2 = ew[2] >= 1
c3 = hl <= hs
print("| criterion | rows | verdict |")
print("|---|---|---|")
print(f"| limit / static to the last byte >= 1, interval not wholly below 1 | {lb[0]:.3f} [{lb[1]:.3f}, {lb[2]:.3f}] | {ok(c1)} |")
print(f"| equal-window ratio's interval not wholly below 1 | {ew[0]:.3f} [{ew[1]:.3f}, {ew[2]:.3f}] | {ok(c2)} |")
print(f"| limit harmed at no more points than static (to the last byte; equal window {hle} vs {hse}) | limit {hl}, static {hs} | {ok(c3)} |")
print(f"\nAll three: {'met' if c1 and c2 and c3 else 'not all met'}.")
