#!/usr/bin/env bash
# lowcomm.sh — low-communication training on charlm: N `peer run`
# processes on loopback (127.0.0.1), the same inner steps (tokens) per peer
# for each strategy: sync data-parallel, DiLoCo, Streaming DiLoCo in fp32
# and with fp4 outer gradients. Prints one row per strategy: validation
# bits per char (mean over the peers), tensor bytes sent per peer (mean of
# summary.json's tensor_bytes_sent), wall seconds, the seconds a peer spent
# in all-reduces and the part of them that blocked its training (from its
# --trace: the "allreduce" spans, and the "wait" spans of an overlap row;
# means over the peers), and bytes against sync's.
#
#   STEPS=600 H=100 F=4 N=4 scripts/lowcomm.sh
#   ONLY="sync sdlc-fp4" scripts/lowcomm.sh   # a subset, by row name
#
# Rows: sync (data-parallel, an all-reduce of gradients every step),
# sdlc-fp4 / sdlc-fp32 (streaming-diloco:h=H,fragments=F, α = 0.5, outer
# gradients in fp4 or fp32), diloco (federated DiLoCo, which all-reduces
# [local model | global model | outer momentum] in fp32 every H steps),
# sdlc-fp4-a0, -a75, -a90 (α = 0, 0.75, 0.9), sdlc-fp4-overlap and
# sdlc-fp32-overlap (overlap τ = TAU, default H/F/2),
# diloco-fp4 (streaming-diloco with one fragment and α = 0: DiLoCo that
# sends fp4 outer gradients), demo (--mode sync --strategy demo[:$DEMO],
# DeMo's sparse DCT coefficients of each peer's momentum and a sign step,
# at --lr $DEMO_LR when set, else the model's), async-diloco and
# async-diloco-fp4 (DiLoCo with the outer step one outer step late, its
# all-reduce overlapping all H inner steps of the next one; ASYNC adds
# strategy parameters, e.g. ASYNC=momentum=0.5; SD_EXTRA likewise for the
# streaming-diloco rows, e.g. SD_EXTRA=lr=1).
# solo: each peer trains alone (--mode federated, DiLoCo in a group of one:
# --min-peers 1 and no peers to connect to), evaluating after each of the
# STEPS/H rounds as the DiLoCo rows do: the compute-only wall time that
# the others' is compared with (communication time = wall − solo's).
#
# PEER_TIMEOUT=S stops a peer process after S seconds (default 1800); long
# runs need more.
#
# NETBED=RATE (root, ../shared/bench/netbed.sh) runs peer k in network
# namespace hk at 10.77.0.(k+1), its link limited to RATE (e.g. 1gbit,
# 100mbit) both ways, instead of on loopback.
set -u
cd "$(dirname "$0")/.."
N=${N:-4}; STEPS=${STEPS:-600}; H=${H:-100}; F=${F:-4}
MODEL=${MODEL:-charlm:layers=2,width=64,heads=2,ctx=64}
EXTRA=${EXTRA:-}
PEER_TIMEOUT=${PEER_TIMEOUT:-1800}   # seconds a peer process may run
d=$(mktemp -d); b=$d/peer
[ -n "${KEEP:-}" ] || trap 'rm -rf "$d"' EXIT; echo "# work dir $d"
go build -o "$b" ./cmd/peer || exit 1
ids=(); for k in $(seq 0 $((N-1))); do "$b" keygen --key "$d/k$k" >/dev/null 2>&1; ids+=("$("$b" id --key "$d/k$k" | head -1)"); done
base=$((20000 + RANDOM % 20000))
addr() { if [ -n "${NETBED:-}" ]; then echo "10.77.0.$(($1+1))"; else echo 127.0.0.1; fi; }
onhost() { local k=$1; shift; if [ -n "${NETBED:-}" ]; then ip netns exec "h$k" "$@"; else "$@"; fi; }
if [ -n "${NETBED:-}" ]; then
  bed=${BENCH:-$(cd ../shared/bench && pwd)}/netbed.sh
  "$bed" down "$N" >/dev/null 2>&1 || true
  "$bed" up "$N" "$NETBED" || exit 1
  trap '"$bed" down "$N" >/dev/null 2>&1; [ -n "${KEEP:-}" ] || rm -rf "$d"' EXIT
fi

# run NAME ARGS…: N peers with ARGS; prints the row.
run() {
  local name=$1; shift
  if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then return; fi
  local port=$((base)) MINP=$N; base=$((base + N))
  [ "$name" = solo ] && MINP=1
  local start=$(date +%s.%N)
  for k in $(seq 0 $((N-1))); do
    local con=()
    for j in $(seq 0 $((N-1))); do [ "$j" != "$k" ] && con+=(--connect "/ip4/$(addr "$j")/tcp/$((port+j))/p2p/${ids[$j]}"); done
    [ "$name" = solo ] && con=()
    onhost "$k" timeout "$PEER_TIMEOUT" "$b" run --mdns=false --swarm "lowcomm-$name" --key "$d/k$k" --listen "/ip4/$(addr "$k")/tcp/$((port+k))" "${con[@]}" \
      --shard "$k/$N" --min-peers "$MINP" --model "$MODEL" --stall-timeout 20s --wait 60s --linger 2s \
      --out "$d/$name/o$k" --trace "$d/$name/trace$k.json" $EXTRA "$@" > "$d/$name.log$k" 2>&1 &
  done
  wait
  local wall; wall=$(echo "$(date +%s.%N) - $start" | bc)
  python3 - "$d/$name" "$N" "$name" "$wall" <<'EOF'
import json, sys, os
d, n, name, wall = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
bits, sent, errs, comm, exposed = [], [], [], [], []
for k in range(n):
    # The peer's trace: Net "allreduce" spans are its communication; what
    # blocked training is the Train "wait" spans (overlap) or, without
    # overlap, the all-reduce itself (the training loop runs it inline).
    try:
        txt = open(os.path.join(d, f"trace{k}.json")).read().rstrip()
        evs = json.loads(txt if txt.endswith("]") else txt + "]")
        ar = sum(e["dur"] for e in evs if e.get("cat") == "net" and e.get("name") == "allreduce") / 1e6
        wt = sum(e["dur"] for e in evs if e.get("cat") == "train" and e.get("name") == "wait") / 1e6
        comm.append(ar); exposed.append(wt if "overlap" in name else ar)
    except Exception:
        pass
    try:
        s = json.load(open(os.path.join(d, f"o{k}", "summary.json")))
    except Exception as e:
        errs.append(str(e)); continue
    if s.get("error"): errs.append(s["error"])
    bits.append(s.get("val_bits_per_char", float("nan")))
    sent.append(s.get("tensor_bytes_sent", 0))
b = sum(bits) / max(len(bits), 1); m = sum(sent) / max(len(sent), 1)
c = sum(comm) / max(len(comm), 1); x = sum(exposed) / max(len(exposed), 1)
print(f"{name}\t{b:.4f}\t{m:.0f}\t{wall:.0f}\t{c:.1f}\t{x:.1f}\t{'; '.join(errs)[:200]}", flush=True)
with open(os.path.join(os.path.dirname(d), "rows"), "a") as f:
    f.write(f"{name}\t{b}\t{m}\t{wall}\n")
EOF
}

echo "# $N peers, $MODEL, $STEPS inner steps a peer, H=$H, F=$F${NETBED:+, netbed $NETBED}; $(date -u +%FT%TZ) $(git rev-parse --short HEAD)"
printf "row\tval_bits_per_char\tbytes_per_peer\twall_s\tallreduce_s\texposed_s\terrors\n"
R=$((STEPS / H)); TAU=${TAU:-$((H / F / 2))}
SD="streaming-diloco:h=$H,fragments=$F${SD_EXTRA:+,$SD_EXTRA}"
run solo --mode federated --strategy "diloco:h=$H" --rounds $R
run sync --mode sync --steps "$STEPS" --eval-every "$STEPS"
run sdlc-fp4 --mode federated --strategy "$SD" --rounds $R --compress fp4
run sdlc-fp32 --mode federated --strategy "$SD" --rounds $R
run diloco --mode federated --strategy "diloco:h=$H" --rounds $R
run sdlc-fp4-a0 --mode federated --strategy "$SD,alpha=0" --rounds $R --compress fp4
run sdlc-fp4-a75 --mode federated --strategy "$SD,alpha=0.75" --rounds $R --compress fp4
run sdlc-fp4-a90 --mode federated --strategy "$SD,alpha=0.9" --rounds $R --compress fp4
run sdlc-fp4-overlap --mode federated --strategy "$SD,overlap=$TAU" --rounds $R --compress fp4
run sdlc-fp32-overlap --mode federated --strategy "$SD,overlap=$TAU" --rounds $R
run demo --mode sync --strategy "demo${DEMO:+:$DEMO}" --steps "$STEPS" --eval-every "$STEPS" ${DEMO_LR:+--lr "$DEMO_LR"}
run diloco-fp4 --mode federated --strategy "streaming-diloco:h=$H,fragments=1,alpha=0" --rounds $R --compress fp4
run async-diloco --mode federated --strategy "async-diloco:h=$H${ASYNC:+,$ASYNC}" --rounds $R
run async-diloco-fp4 --mode federated --strategy "async-diloco:h=$H${ASYNC:+,$ASYNC}" --rounds $R --compress fp4
if [ -s "$d/rows" ]; then
  python3 - "$d/rows" <<'EOF'
import sys
rows = [l.split("\t") for l in open(sys.argv[1]).read().splitlines()]
base = {r[0]: r for r in rows}.get("sync")
if base:
    print("# against sync: bytes × fewer, val loss change")
    for r in rows:
        b = float(r[2]); print(f"{r[0]}\t{float(base[2]) / b if b else float('inf'):.1f}x\t{100 * (float(r[1]) / float(base[1]) - 1):+.2f}%")
EOF
fi
