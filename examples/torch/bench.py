"""All-reduce timing from Python through `peer serve` (run it with
launch.py). Each rank times --iters all-reduces of --size-mb MB of
float32 (rank r contributes r+1, the sum is checked exactly), between two
barriers, as `peer bench allreduce` does; rank 0 prints the line of `peer
bench allreduce` (algbw, busbw = algbw·2(n−1)/n) and --small-kb latency.

    python3 examples/torch/launch.py -n 4 --script examples/torch/bench.py -- --size-mb 64
"""

import argparse
import json
import os
import sys
import time

import numpy as np

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "..", "python"))
import starling  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--size-mb", type=float, default=64)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--small-kb", type=float, default=4)
    ap.add_argument("--small-iters", type=int, default=200)
    ap.add_argument("--torch", action="store_true", help="pass torch tensors instead of numpy arrays")
    ap.add_argument("--zero-copy", action="store_true", help="all-reduce an array in the shared memory (Client.shared): no copies")
    ap.add_argument("join", nargs="*")
    a = ap.parse_args()
    c = starling.Client.start()
    c.join(a.join, model="bench")
    n = int(a.size_mb * 1e6) // 4
    x = np.full(n, a.rank + 1, dtype=np.float32)
    if a.torch:
        import torch
        x = torch.from_numpy(x)
    want = a.world * (a.world + 1) / 2
    bar = np.zeros(1, dtype=np.float32)

    def one(t):
        t[:] = a.rank + 1
        c.allreduce([t], rule="sum")

    if a.zero_copy:
        x = c.shared(n)
        x[:] = a.rank + 1
        c.allreduce_shared(n, rule="sum")  # warm-up
        c.allreduce([bar], rule="sum")  # bar went through the shared memory's start
        x = c.shared(n)
        x[0] = a.rank + 1
        t0 = time.perf_counter()
        for _ in range(a.iters):
            out = c.allreduce_shared(n, rule="sum")  # src stays: the sum stays put
        c.allreduce([bar], rule="sum")
        per = (time.perf_counter() - t0) / a.iters
        ok = bool((out[1:] == want).all())  # out[0] held the barrier since
    else:
        one(x)  # warm-up
        c.allreduce([bar], rule="sum")
        t0 = time.perf_counter()
        for _ in range(a.iters):
            c.allreduce([x], rule="mean")  # in place: the mean of equal values stays put
        c.allreduce([bar], rule="sum")
        per = (time.perf_counter() - t0) / a.iters
        one(x)
        ok = bool((np.asarray(x) == want).all())
    s = np.full(max(1, int(a.small_kb * 1000) // 4), a.rank + 1, dtype=np.float32)
    for _ in range(5):
        c.allreduce([s], rule="mean")
    c.allreduce([bar], rule="sum")
    t0 = time.perf_counter()
    for _ in range(a.small_iters):
        c.allreduce([s], rule="mean")
    small = (time.perf_counter() - t0) / a.small_iters
    m = c.metrics()
    c.close()
    algbw = 4 * n / per / 1e6
    busbw = algbw * 2 * (a.world - 1) / a.world
    if a.rank == 0:
        print("python-serve world=%d bytes=%d time_s=%.4f algbw_MBps=%.1f busbw_MBps=%.1f" % (a.world, 4 * n, per, algbw, busbw))
        print(json.dumps({"rank": a.rank, "ok": ok, "time_s": per, "busbw_MBps": busbw,
                          "small_bytes": 4 * len(s), "small_latency_ms": small * 1e3,
                          "allreduce_seconds_in_serve": m["allreduce_seconds"]}))
    if not ok:
        sys.exit("rank %d: wrong sum" % a.rank)


if __name__ == "__main__":
    main()
