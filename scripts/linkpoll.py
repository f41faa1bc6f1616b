#!/usr/bin/env python3
"""linkpoll.py SECONDS [IFACE] — how busy a link is, in 10 ms bins.

Samples IFACE's tx/rx byte counters (default e0, netbed host 0; run it with
`ip netns exec h0`) every 2 ms for SECONDS, then prints, over the span from
the first to the last busy bin, the mean tx rate and the share of bins at
full rate (>= 110 MB/s, a 1 Gbit/s link) and idle (< 20 MB/s). Start it,
then the all-reduce, within SECONDS.
"""
import sys
import time

secs = float(sys.argv[1])
iface = sys.argv[2] if len(sys.argv) > 2 else "e0"
tx = open(f"/sys/class/net/{iface}/statistics/tx_bytes")
rx = open(f"/sys/class/net/{iface}/statistics/rx_bytes")
rows = []
end = time.time() + secs
while time.time() < end:
    tx.seek(0)
    rx.seek(0)
    rows.append((time.time(), int(tx.read()), int(rx.read())))
    time.sleep(0.002)

W = 0.01
t0 = rows[0][0]
bins = {}
for (t, a, _), (t2, a2, _) in zip(rows, rows[1:]):
    b = bins.setdefault(int((t2 - t0) / W), [0, 0.0])
    b[0] += a2 - a
    b[1] += t2 - t
rate = {k: v[0] / v[1] for k, v in bins.items() if v[1] > 0}
busy = [k for k, r in rate.items() if r > 20e6]
if not busy:
    sys.exit("linkpoll: the link stayed idle")
span = range(min(busy), max(busy) + 1)
r = [rate.get(k, 0.0) for k in span]
print("span %.2f s  mean tx %.1f MB/s  full-rate bins %.0f %%  idle bins %.0f %%" % (
    len(r) * W, sum(r) / len(r) / 1e6, 100 * sum(x >= 110e6 for x in r) / len(r),
    100 * sum(x < 20e6 for x in r) / len(r)))
