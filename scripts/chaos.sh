#!/usr/bin/env bash
# chaos.sh — issue #24's reliability suite on real `peer run` processes over
# loopback (127.0.0.1 only), with a markdown table of pass/fail and round
# times at the end (also written to $OUT/table.md).
#
#   scripts/chaos.sh                      # every scenario, short settings
#   N=8 DUR=300 EVERY=30 scripts/chaos.sh # the issue's churn settings
#   ONLY="churn-federated intruders" scripts/chaos.sh
#
# Scenarios (names for ONLY):
#   churn-federated churn-sync churn-async churn-gossip
#       N peers (4), for DUR seconds (40) kill -9 one of peers 1..N-1 every
#       EVERY seconds (10) and restart it at once with --resume. Pass: every
#       process's last incarnation exits 0, and (round modes) no round of
#       peer 0 takes more than max(2 × median, 1.5 × stall timeout) except
#       the rounds a kill falls in.
#   intruders   a 2-peer private swarm (--psk, --allow) and three intruders
#       that --connect to it: a wrong swarm key, an identity not allowlisted
#       (right key), and --insecure (plaintext). Pass: each intruder fails
#       to join and the swarm's metrics show 0 stream bytes from any of them.
#   badframes   a bare libp2p client writes malformed frames on a peer's
#       tensor and state protocols for 10 s while a 2-peer swarm trains.
#       Pass: the swarm finishes, and the target's RSS grows < 200 MB.
#   ckcrash     kill -9 a single peer at random moments (10 times) while it
#       writes checkpoints; each time `peer run --resume` must accept what
#       is on disk. Pass: 10 of 10 resumes.
#   partition   4 + 4 peers in network namespaces (root and `ip netns`
#       only; namespaces this script creates, 10.78.0.0/24): move peers
#       4..7 from one bridge to a second one for CUT seconds (60) once
#       training runs (each half still reaches its own peers), then heal.
#       PROUNDS rounds (1500). Pass: all 8 exit 0 with one final (round,
#       accuracy, loss), and consensus (all 8 report the same accuracy and
#       loss for a round, and for every round after it) is back within 30 s
#       of the heal, by the wall clock (progress lines are time-stamped as
#       they arrive). Skipped, with a message, when not root.
set -u
cd "$(dirname "$0")/.."
N=${N:-4}; DUR=${DUR:-40}; EVERY=${EVERY:-10}; STALL=${STALL:-2}; CUT=${CUT:-60}
ONLY=${ONLY:-"churn-federated churn-sync churn-async churn-gossip intruders badframes ckcrash partition"}
OUT=${OUT:-$(mktemp -d /tmp/chaos.XXXX)}
mkdir -p "$OUT"
B=$OUT/peer
[ -x "$B" ] || go build -o "$B" ./cmd/peer || exit 1
[ -x "$OUT/badframes" ] || go build -o "$OUT/badframes" ./scripts/chaos/badframes || exit 1
ROWS=()
waitround() { local j; for ((j=0;j<120;j++)); do grep -q '"round":[1-9]' "$1" 2>/dev/null && return; sleep 0.5; done; }
row() { ROWS+=("| $1 | $2 | $3 | $4 |"); echo "== $1: $2 ($3; $4)"; }

# port K: a free loopback port; key/addr of peer K in dir D.
freeport() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
mkid() { # D K → sets ID[K], PORT[K]
  "$B" keygen --key "$1/k$2" >/dev/null 2>&1
  ID[$2]=$("$B" id --key "$1/k$2" | head -1); PORT[$2]=$(freeport)
}
addr() { echo "/ip4/127.0.0.1/tcp/${PORT[$1]}/p2p/${ID[$1]}"; }

# stats FILE: median, p95 and max of the gaps between progress lines'
# "seconds", and the count above LIMIT (env), skipping rounds in SKIP
# (a file of kill times in seconds since peer 0's start).
stats() {
  python3 - "$1" "${SKIP:-/dev/null}" "${LIMIT:-1e9}" <<'PY'
import json, sys
secs = []
for line in open(sys.argv[1]):
    if line.startswith("T "): line = line.split(" ", 2)[2]  # time-stamped (partition)
    try: d = json.loads(line)
    except Exception: continue
    if d.get("round", 0) > 0: secs.append(d["seconds"])
kills = [float(x) for x in open(sys.argv[2]).read().split()]
gaps = [(b - a, a, b) for a, b in zip(secs, secs[1:])]
if not gaps: print("n=0 median=- p95=- max=- over=0"); sys.exit()
g = sorted(x for x, _, _ in gaps); med = g[len(g)//2]
lim = max(2*med, float(sys.argv[3]))
over = [x for x, a, b in gaps if x > lim and not any(a - 1 <= k <= b for k in kills)]
print("n=%d median=%.3f p95=%.3f max=%.3f over=%d" % (len(g), med, g[int(len(g)*.95)], g[-1], len(over)))
PY
}

# stamp: prefix each line of stdin with the wall clock ("T <unix s> line").
stamp() { perl -MTime::HiRes=time -ne '$|=1; printf "T %.3f %s", time, $_'; }
stampnow() { perl -MTime::HiRes=time -e 'printf "%.3f\n", time'; }

# healtime D N: from the stamped progress of peers 0..N-1 in D and the
# time of the heal (D/heal), the first round after the heal that all N
# completed together (peers = N) and from which they all report the same
# (accuracy, loss) for every round they all report, and how long after
# the heal the last of them reported it.
healtime() {
  python3 - "$1" "$2" <<'PY'
import json, sys
from collections import defaultdict
d, n = sys.argv[1], int(sys.argv[2])
heal = float(open(d + "/heal").read())
seen, at, together = defaultdict(dict), defaultdict(dict), defaultdict(dict)
for k in range(n):
    for line in open("%s/p%d.json" % (d, k)):
        if not line.startswith("T "): continue
        _, t, js = line.split(" ", 2)
        try: e = json.loads(js)
        except Exception: continue
        if e.get("round", 0) > 0:
            seen[e["round"]][k] = (e["accuracy"], e["loss"]); at[e["round"]][k] = float(t)
            together[e["round"]][k] = e.get("peers") == n
rounds = sorted(r for r in seen if len(seen[r]) == n)
first = None
for r in reversed(rounds):
    if len(set(seen[r].values())) != 1: break
    if all(together[r].values()) and min(at[r].values()) > heal: first = r
if first is None: print("consensus: never"); sys.exit()
t = max(at[first].values()) - heal
print("consensus (one group of all, one model) from round %d, %.1f s after the heal; within=%s" % (first, t, "yes" if t <= 30 else "no"))
PY
}

churn() { # MODE-ARGS…
  local name=$1; shift
  local d=$OUT/$name; mkdir -p "$d"; declare -gA ID PORT PID; local k j
  for ((k=0;k<N;k++)); do mkid "$d" $k; done
  local base=(run --progress-json --mdns=false --swarm "chaos-$name" --model logreg --limit 3000 --optimizer sgd --lr 0.1
    --stall-timeout "${STALL}s" --wait 30s "$@")
  args() { local a=("${base[@]}" --listen "/ip4/127.0.0.1/tcp/${PORT[$1]}" --key "$d/k$1" --shard "$1/$N"
    --checkpoint "$d/c$1"); for ((j=0;j<N;j++)); do [ $j != $1 ] && a+=(--connect "$(addr $j)"); done; printf '%s\n' "${a[@]}"; }
  for ((k=0;k<N;k++)); do mapfile -t A < <(args $k); "$B" "${A[@]}" --min-peers $N >"$d/p$k.json" 2>"$d/p$k.log" & PID[$k]=$!; done
  local t0; t0=$(date +%s.%N); : >"$d/kills"
  # Churn starts once peer 0 reports progress (every peer is up).
  for ((j=0;j<120;j++)); do grep -q '"round":[1-9]' "$d/p0.json" 2>/dev/null && break; sleep 0.5; done
  local end=$(( $(date +%s) + DUR )) kills=0 restarts=0
  while [ "$(date +%s)" -lt $end ] && kill -0 ${PID[0]} 2>/dev/null; do
    sleep "$EVERY"; kill -0 ${PID[0]} 2>/dev/null || break
    k=$(( 1 + RANDOM % (N-1) ))
    kill -9 ${PID[$k]} 2>/dev/null && kills=$((kills+1)); wait ${PID[$k]} 2>/dev/null
    python3 -c "import time; print(time.time() - $t0)" >>"$d/kills"
    mapfile -t A < <(args $k)
    local res=(); [ -e "$d/c$k" ] && res=(--resume)
    "$B" "${A[@]}" "${res[@]}" --min-peers 1 >>"$d/p$k.json" 2>>"$d/p$k.log" & PID[$k]=$!; restarts=$((restarts+1))
  done
  local bad=0
  for ((k=0;k<N;k++)); do
    if ! timeout 180 tail --pid=${PID[$k]} -f /dev/null; then kill -9 ${PID[$k]}; fi
    wait ${PID[$k]} || { bad=$((bad+1)); echo "   peer $k exited with an error: $(tail -2 "$d/p$k.log" | cut -c1-200)"; }
  done
  local s; s=$(SKIP="$d/kills" LIMIT=$(python3 -c "print(1.5*$STALL)") stats "$d/p0.json")
  local verdict=pass
  [ $bad -gt 0 ] && verdict=FAIL
  case $name in churn-federated|churn-sync) [[ $s == *"over=0"* ]] || verdict=FAIL;; esac
  row "$name" $verdict "$kills kills, $bad bad exits" "peer 0 rounds (s): $s"
}

intruders() {
  local d=$OUT/intruders; mkdir -p "$d"; declare -gA ID PORT; local k
  for k in 0 1 2 3 4; do mkid "$d" $k; done
  "$B" keygen --psk --out "$d/psk" >/dev/null 2>&1; "$B" keygen --psk --out "$d/psk2" >/dev/null 2>&1
  local mport; mport=$(freeport)
  local com=(run --progress-json --mdns=false --swarm chaos-intr --model logreg --limit 3000 --optimizer sgd --lr 0.1 --rounds 100000
    --stall-timeout "${STALL}s" --wait 30s --local-epochs 8)
  local allow=(--allow "${ID[0]}" --allow "${ID[1]}" --allow "${ID[3]}")
  "$B" "${com[@]}" --psk "$d/psk" "${allow[@]}" --listen "/ip4/127.0.0.1/tcp/${PORT[0]}" --key "$d/k0" --shard 0/2 --min-peers 2 \
    --connect "$(addr 1)" --metrics-addr "127.0.0.1:$mport" --linger 5s >"$d/p0.json" 2>"$d/p0.log" & local p0=$!
  "$B" "${com[@]}" --psk "$d/psk" "${allow[@]}" --listen "/ip4/127.0.0.1/tcp/${PORT[1]}" --key "$d/k1" --shard 1/2 --min-peers 2 \
    --connect "$(addr 0)" >"$d/p1.json" 2>"$d/p1.log" & local p1=$!
  waitround "$d/p0.json"
  local intr=(run --mdns=false --swarm chaos-intr --model logreg --limit 3000 --rounds 5 --min-peers 2 --wait 8s --connect "$(addr 0)" --connect "$(addr 1)")
  "$B" "${intr[@]}" --psk "$d/psk2" --key "$d/k2" --listen "/ip4/127.0.0.1/tcp/${PORT[2]}" >"$d/wrongpsk.log" 2>&1 & local i2=$!
  "$B" "${intr[@]}" --psk "$d/psk" --key "$d/k4" --listen "/ip4/127.0.0.1/tcp/${PORT[4]}" >"$d/notallowed.log" 2>&1 & local i4=$!
  "$B" "${intr[@]}" --insecure --key "$d/k3" --listen "/ip4/127.0.0.1/tcp/${PORT[3]}" >"$d/plaintext.log" 2>&1 & local i3=$!
  local joined=0
  for p in $i2 $i4 $i3; do wait $p && joined=$((joined+1)); done
  curl -s "127.0.0.1:$mport/metrics" >"$d/metrics" || true
  kill -INT $p0 $p1   # enough: stop the swarm (a clean stop exits 0)
  local bytes; bytes=$(python3 - "$d/metrics" "${ID[2]}" "${ID[3]}" "${ID[4]}" <<'PY'
import sys, re
ids = sys.argv[2:]; tot = 0.0
for line in open(sys.argv[1]):
    if line.startswith("starling_node_stream_bytes_total") and any(i in line for i in ids):
        tot += float(line.rsplit(" ", 1)[1])
print(int(tot))
PY
)
  wait $p0; local e0=$?; wait $p1; local e1=$?
  local verdict=pass
  grep -q '^starling_node_stream_bytes_total' "$d/metrics" || { verdict=FAIL; bytes="no metrics"; }
  [ $joined -eq 0 ] && [ "$bytes" = 0 ] || verdict=FAIL
  row intruders $verdict "$joined of 3 intruders ran; swarm exits $e0 $e1" \
    "stream bytes from intruders: $bytes; intruders' last words: $(for f in wrongpsk notallowed plaintext; do echo -n "$f: …$(tail -1 "$d/$f.log" | rev | cut -c1-60 | rev); "; done)"
}

badframes() {
  local d=$OUT/frames; mkdir -p "$d"; declare -gA ID PORT; local k
  for k in 0 1; do mkid "$d" $k; done
  local com=(run --progress-json --mdns=false --swarm chaos-bad --model logreg --limit 3000 --optimizer sgd --lr 0.1 --rounds 100
    --stall-timeout "${STALL}s" --wait 30s --local-epochs 8 --min-peers 2)
  "$B" "${com[@]}" --listen "/ip4/127.0.0.1/tcp/${PORT[0]}" --key "$d/k0" --shard 0/2 --connect "$(addr 1)" >"$d/p0.json" 2>"$d/p0.log" & local p0=$!
  "$B" "${com[@]}" --listen "/ip4/127.0.0.1/tcp/${PORT[1]}" --key "$d/k1" --shard 1/2 --connect "$(addr 0)" >"$d/p1.json" 2>"$d/p1.log" & local p1=$!
  waitround "$d/p0.json"
  local rss0; rss0=$(ps -o rss= -p $p0 2>/dev/null || echo 0)
  local res; res=$("$OUT/badframes" -to "$(addr 0)" -for 10s 2>&1 | tail -1)
  local rss1; rss1=$(ps -o rss= -p $p0 2>/dev/null || echo 0)
  wait $p0; local e0=$?; wait $p1; local e1=$?
  local grow=$(( (rss1 - rss0) / 1024 ))
  local verdict=pass
  [ $e0 -eq 0 ] && [ $e1 -eq 0 ] && [ $grow -lt 200 ] || verdict=FAIL
  row badframes $verdict "exits $e0 $e1; RSS ${rss0} → ${rss1} kB" "client: $res; rejected: $(grep -c 'rejected a tensor frame' "$d/p0.log") warn lines"
}

ckcrash() {
  local d=$OUT/ckcrash; mkdir -p "$d"; local ok=0 i
  local com=(run --mdns=false --swarm chaos-ck --model mlp --limit 3000 --rounds 100000 --local-steps 3 --min-peers 1
    --listen /ip4/127.0.0.1/tcp/0 --checkpoint "$d/c")
  "$B" "${com[@]}" --key "$d/k" >"$d/first.log" 2>&1 & local p=$!
  for ((i=0;i<120;i++)); do [ -e "$d/c" ] && break; sleep 0.5; done
  sleep 1; kill -9 $p; wait $p 2>/dev/null
  for i in 1 2 3 4 5 6 7 8 9 10; do
    "$B" "${com[@]}" --key "$d/k" --resume >"$d/r$i.log" 2>&1 & p=$!
    sleep "$(python3 -c "import random; print(1.5 + random.random()*2)")"
    if kill -9 $p 2>/dev/null; then ok=$((ok+1)); else
      echo "   resume $i ended by itself: $(tail -1 "$d/r$i.log" | cut -c1-160)"; fi
    wait $p 2>/dev/null
  done
  local verdict=pass; [ $ok -eq 10 ] || verdict=FAIL
  row ckcrash $verdict "$ok of 10 resumes after kill -9 accepted the checkpoint" "-"
}

partition() {
  if [ "$(id -u)" != 0 ] || ! command -v ip >/dev/null; then
    row partition skipped "needs root and ip netns" "-"; return
  fi
  local d=$OUT/partition; mkdir -p "$d"; declare -gA ID; local k j n=8 br=chaosbr0 br2=chaosbr1
  cleanup_ns() { for ((k=0;k<n;k++)); do ip netns del chaos$k 2>/dev/null; ip link del chv$k 2>/dev/null; done; ip link del $br 2>/dev/null; ip link del $br2 2>/dev/null; }
  cleanup_ns
  { ip link add $br type bridge && ip link set $br up && ip link add $br2 type bridge && ip link set $br2 up; } ||
    { row partition skipped "cannot create a bridge" "-"; return; }
  for ((k=0;k<n;k++)); do
    ip netns add chaos$k; ip link add chv$k type veth peer name eth0 netns chaos$k
    ip link set chv$k master $br up
    ip -n chaos$k addr add 10.78.0.$((k+1))/24 dev eth0; ip -n chaos$k link set eth0 up; ip -n chaos$k link set lo up
    "$B" keygen --key "$d/k$k" >/dev/null 2>&1; ID[$k]=$("$B" id --key "$d/k$k" | head -1)
  done
  local pids=()
  for ((k=0;k<n;k++)); do
    local con=(); for ((j=0;j<n;j++)); do [ $j != $k ] && con+=(--connect "/ip4/10.78.0.$((j+1))/tcp/4001/p2p/${ID[$j]}"); done
    ip netns exec chaos$k timeout 600 "$B" run --progress-json --mdns=false --swarm chaos-part --key "$d/k$k" --listen /ip4/10.78.0.$((k+1))/tcp/4001 \
      "${con[@]}" --shard $k/$n --min-peers $n --model logreg --limit 3000 --optimizer sgd --lr 0.1 --rounds ${PROUNDS:-1500} \
      --local-epochs 4 --stall-timeout "${STALL}s" --round-timeout 20s --wait 60s --checkpoint "$d/c$k" 2>"$d/p$k.log" \
      > >(stamp >"$d/p$k.json") &
    pids+=($!)
  done
  waitround "$d/p0.json"; sleep 2
  stampnow >"$d/cut"
  for ((k=4;k<n;k++)); do ip link set chv$k master $br2; done   # the halves lose each other
  sleep "$CUT"
  for ((k=4;k<n;k++)); do ip link set chv$k master $br; done
  stampnow >"$d/heal"
  local bad=0; for p in "${pids[@]}"; do wait $p || bad=$((bad+1)); done
  # One final state: every peer's last evaluation (same test set) agrees.
  local same; same=$(for ((k=0;k<n;k++)); do tail -1 "$d/p$k.json" | sed 's/^T [0-9.]* //' | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["round"], d["accuracy"], d["loss"])'; done | sort -u | wc -l)
  cleanup_ns
  local heal; heal=$(healtime "$d" $n)
  local verdict=pass; [ $bad -eq 0 ] && [ "$same" = 1 ] && [[ $heal == *"within=yes"* ]] || verdict=FAIL
  row partition $verdict "4 + 4 cut ${CUT}s after round 1; $bad bad exits; $same distinct final (round, accuracy, loss)" \
    "$heal; peer 0 rounds (s): $(LIMIT=$(python3 -c "print(1.5*$STALL)") stats "$d/p0.json")"
}

for s in $ONLY; do
  case $s in
    churn-federated) churn churn-federated --rounds ${ROUNDS:-$((DUR*4))} --local-epochs 8 --round-timeout 20s;;
    churn-sync) churn churn-sync --mode sync --steps ${STEPS:-3000} --slowdown 4;;
    churn-async) churn churn-async --mode async --steps 0 --duration "$((DUR+10))s" --slowdown 20 --eval-every 50 --linger 2s;;
    churn-gossip) churn churn-gossip --mode gossip --steps 0 --duration "$((DUR+10))s" --slowdown 20 --eval-every 50 --linger 2s;;
    intruders) intruders;;
    badframes) badframes;;
    ckcrash) ckcrash;;
    partition) partition;;
    *) echo "unknown scenario $s"; exit 2;;
  esac
done
{
  echo "| scenario | verdict | what happened | measurements |"
  echo "| --- | --- | --- | --- |"
  printf '%s\n' "${ROWS[@]}"
} | tee "$OUT/table.md"
echo "logs and table in $OUT"
# A failed scenario fails the script (CI runs a fast subset).
! printf '%s\n' "${ROWS[@]}" | grep -q '^| [^|]* | FAIL |'
