#!/usr/bin/env bash
# bench_serve.sh — all-reduce issued from Python through `peer serve`
# against `peer bench allreduce` (the Go path), in the same run.
#
#   scripts/bench_serve.sh N MB ITERS      # N processes on 127.0.0.1
#
# Each repeat (REPEAT, default 3) runs, one after the other: the Go bench
# at MB and at 4 KB (SMALL_ITERS all-reduces), then examples/torch/bench.py
# through launch.py (the same sizes, from numpy arrays; TORCH=1 passes torch
# tensors, ZERO_COPY=1 all-reduces Client.shared memory in place). It
# prints every result line, then the medians: busbw of each and their
# ratio, and the 4 KB latency of each. Needs python3 with numpy
# (/usr/bin/python3 on Debian: python3-numpy).
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-4} mb=${2:-64} iters=${3:-5}
REPEAT=${REPEAT:-3}
SMALL_ITERS=${SMALL_ITERS:-200}
PY=${PY:-/usr/bin/python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
bin=$tmp/peer
go build -o "$bin" ./cmd/peer
ids=()
for k in $(seq 0 $((n-1))); do
  "$bin" keygen --key "$tmp/k$k" >/dev/null 2>&1
  ids+=("$("$bin" id --key "$tmp/k$k" | head -1)")
done
gobench() { # MB ITERS LABEL
  local port=$((42000 + RANDOM % 1000)) peers=()
  for k in $(seq 0 $((n-1))); do peers+=("/ip4/127.0.0.1/tcp/$((port+k))/p2p/${ids[$k]}"); done
  local list; list=$(IFS=,; echo "${peers[*]}")
  for k in $(seq 0 $((n-1))); do
    timeout 600 "$bin" bench allreduce --key "$tmp/k$k" --listen "/ip4/127.0.0.1/tcp/$((port+k))" \
      --peers "$list" --size-mb "$1" --iters "$2" --warmup 5 --label "$3" > "$tmp/s$k" 2>&1 &
  done
  wait
  grep "^$3 " "$tmp/s0" || { cat "$tmp"/s*; return 1; }
}
out=$tmp/lines
for r in $(seq 1 "$REPEAT"); do
  gobench "$mb" "$iters" go | tee -a "$out"
  gobench 0.004 "$SMALL_ITERS" go-small | tee -a "$out"
  STARLING_PEER=$bin timeout 900 "$PY" examples/torch/launch.py -n "$n" --script examples/torch/bench.py -- \
    --size-mb "$mb" --iters "$iters" --small-kb 4 --small-iters "$SMALL_ITERS" ${TORCH:+--torch} ${ZERO_COPY:+--zero-copy} | tee -a "$out"
done
"$PY" - "$out" <<'PYEOF'
import json, re, statistics, sys
go, gos, py, pys = [], [], [], []
for l in open(sys.argv[1]):
    m = re.match(r"(\S+) world=\d+ bytes=\d+ time_s=(\S+) algbw_MBps=\S+ busbw_MBps=(\S+)", l)
    if m:
        {"go": go, "go-small": gos, "python-serve": py}[m.group(1)].append((float(m.group(2)), float(m.group(3))))
    elif l.startswith("{"):
        pys.append(json.loads(l)["small_latency_ms"])
med = statistics.median
gb, pb = med(b for _, b in go), med(b for _, b in py)
gl, pl = med(t for t, _ in gos) * 1e3, med(pys)
print("median busbw: go %.1f MB/s, python via serve %.1f MB/s, ratio %.3f" % (gb, pb, pb / gb))
print("median 4 KB all-reduce: go %.3f ms, python via serve %.3f ms, added %.3f ms" % (gl, pl, pl - gl))
PYEOF
