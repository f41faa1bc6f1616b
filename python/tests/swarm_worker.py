"""One process of the end-to-end test (cmd/peer/serve_e2e_test.go): four
of these, ranks 0–3, each with its own `peer serve`, on loopback.

argv: RANK JSON-LIST-OF-JOIN-FLAGS. Prints one JSON line per check
({"check": name, "ok": bool, ...}) and a last line {"done": true}; rank 2
dies (os._exit) in the middle of an all-reduce call.
"""

import json
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import starling  # noqa: E402

rank = int(sys.argv[1])
args = json.loads(sys.argv[2])


def say(check, ok, **kw):
    kw.update(check=check, ok=bool(ok), rank=rank)
    print(json.dumps(kw), flush=True)


def expect_error(check, code, fn):
    try:
        fn()
    except starling.StarlingError as e:
        say(check, e.code == code, code=e.code, error=str(e))
        return
    say(check, False, error="no error")


c = starling.Client.start()
c.join(args, model="e2e")
say("join", len(c.info["members"]) == 4, members=len(c.info["members"]))

# Known tensors: rank r holds r+1; mean over 4 is 2.5, sum 10 (exact).
a = np.full((3, 4), rank + 1, dtype=np.float32)
b = np.arange(5, dtype=np.float64) * (rank + 1)
r = c.allreduce([a, b])
say("mean", (a == 2.5).all() and (b == np.arange(5) * 2.5).all() and len(r["group"]) == 4, a=a.ravel()[:3].tolist(), b=b.tolist())

a = np.full((3, 4), rank + 1, dtype=np.float32)
c.allreduce([a], rule="sum")
say("sum", (a == 10).all(), a=a.ravel()[:3].tolist())

a = np.full((3, 4), rank + 1, dtype=np.float32)
c.allreduce([a], codec="fp16")
say("fp16", (a == 2.5).all(), a=a.ravel()[:3].tolist())

# Bad input on this side: refused before any round.
expect_error("dtype", "usage", lambda: c.allreduce([np.arange(4, dtype=np.int64)]))

# A second client of the same peer serve.
expect_error("second-client", "busy", lambda: starling.Client(c.socket_path, connect_timeout=5))

# Rank 3's tensor has another shape: the others leave it out and go on.
shape = (2, 6) if rank == 3 else (3, 4)
a = np.full(shape, rank + 1, dtype=np.float32)
if rank == 3:
    expect_error("shape", "mismatch", lambda: c.allreduce([a], timeout_s=60))
    c.close()
    print(json.dumps({"done": True, "rank": rank}), flush=True)
    sys.exit(0)
r = c.allreduce([a], timeout_s=60)
say("shape", (a == 2).all() and len(r["group"]) == 3, a=a.ravel()[:3].tolist(), group=len(r["group"]))

# Rank 2 dies in the middle of a call: the request is out, no answer read.
a = np.full((3, 4), rank + 1, dtype=np.float32)
if rank == 2:
    print(json.dumps({"done": True, "rank": rank, "dying": True}), flush=True)
    a_, shapes, total = c._pack([a])
    body = json.dumps({"op": "allreduce", "src": 0, "dst": a_.half, "count": total, "shapes": shapes,
                       "weight": 1.0, "timeout_s": 60}).encode()
    c._sock.sendall(struct.pack(">I", len(body)) + body)
    os._exit(3)
r = c.allreduce([a], timeout_s=60)
# Whether rank 2's contribution made it in depends on when it died: the
# result is the mean of ranks 0, 1 (1.5) or of 0, 1, 2 (2).
first = float(a.ravel()[0])
say("died-mid-call", (a == first).all() and first in (1.5, 2.0), a=first, group=len(r["group"]))

a = np.full((3, 4), rank + 1, dtype=np.float32)
r = c.allreduce([a], timeout_s=60)
say("after-death", (a == 1.5).all() and len(r["group"]) == 2, a=float(a.ravel()[0]), group=len(r["group"]))

m = c.metrics()
sent = m["prometheus"].get("starling_node_stream_bytes_total", 0)
say("metrics", m["rounds_ok"] == 6 and m["allreduce_seconds"] > 0 and sent > 0, rounds_ok=m["rounds_ok"], stream_bytes=sent)
c.close()
print(json.dumps({"done": True, "rank": rank}), flush=True)
