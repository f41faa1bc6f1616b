#!/usr/bin/env bash
# bench_allreduce.sh — Starling's all-reduce against Gloo's, in the same run.
#
#   scripts/bench_allreduce.sh netbed N RATE MB ITERS   # N network namespaces, links limited to RATE
#   scripts/bench_allreduce.sh loopback N MB ITERS      # N processes on 127.0.0.1
#
# Runs as root (netbed needs ip netns and tc). Needs Debian's python3-torch
# for the Gloo baseline and ../shared/bench (BENCH overrides the folder).
# Each configuration runs Starling and Gloo alternately REPEAT times (3)
# and prints every result line, then the medians and their ratio.
# FLAGS adds flags to every `peer bench allreduce` (for example --insecure,
# which compares plaintext with plaintext: Gloo has no transport security).
# BASE=REV compares with Starling built from git revision REV instead of
# Gloo (an A/B of two commits in one run, for changes smaller than the
# noise between runs).
set -euo pipefail
cd "$(dirname "$0")/.."
BENCH=${BENCH:-$(cd ../shared/bench && pwd)}
REPEAT=${REPEAT:-3}
ALGO=${ALGO:-auto}
where=$1; shift
if [ "$where" = netbed ]; then n=$1 rate=$2 mb=$3 iters=$4; else n=$1 mb=$2 iters=$3; fi

tmp=$(mktemp -d)
bin=$tmp/peer
go build -o "$bin" ./cmd/peer
if [ -n "${BASE:-}" ]; then
  git worktree add -q --detach "$tmp/base" "$BASE"
  (cd "$tmp/base" && go build -o "$tmp/peer-base" ./cmd/peer)
  git worktree remove --force "$tmp/base"
fi
ids=()
for k in $(seq 0 $((n-1))); do
  "$bin" keygen --key "$tmp/k$k" >/dev/null 2>&1
  ids+=("$("$bin" id --key "$tmp/k$k" | head -1)")
done

addr() { # host k's IP address
  if [ "$where" = netbed ]; then echo "10.77.0.$(($1+1))"; else echo 127.0.0.1; fi
}
onhost() { # run a command on host k
  local k=$1; shift
  if [ "$where" = netbed ]; then ip netns exec "h$k" "$@"; else "$@"; fi
}
cleanup() {
  [ "$where" = netbed ] && "$BENCH/netbed.sh" down "$n" >/dev/null 2>&1 || true
  rm -rf "$tmp"
}
trap cleanup EXIT
if [ "$where" = netbed ]; then
  "$BENCH/netbed.sh" down "$n" >/dev/null 2>&1 || true
  "$BENCH/netbed.sh" up "$n" "$rate"
fi

starling() { # [binary label]
  local b=${1:-$bin} label=${2:-starling} port=$((42000 + RANDOM % 1000)) peers=()
  for k in $(seq 0 $((n-1))); do
    peers+=("/ip4/$(addr "$k")/tcp/$((port+k))/p2p/${ids[$k]}")
  done
  local list; list=$(IFS=,; echo "${peers[*]}")
  for k in $(seq 0 $((n-1))); do
    onhost "$k" timeout 600 "$b" bench allreduce --key "$tmp/k$k" --listen "/ip4/$(addr "$k")/tcp/$((port+k))" \
      --peers "$list" --size-mb "$mb" --iters "$iters" --algo "$ALGO" --label "$label" ${FLAGS:-} > "$tmp/s$k" 2>&1 &
  done
  wait
  grep -v '^warning: --insecure' "$tmp/s0" || true
  if ! grep -q "^$label " "$tmp/s0"; then # no result: what every rank said
    for k in $(seq 1 $((n-1))); do echo "--- rank $k:"; grep -v '^warning: --insecure' "$tmp/s$k" | tail -20; done >&2
  fi
}
gloo() {
  local port=$((29000 + RANDOM % 1000)) iface=()
  for k in $(seq 0 $((n-1))); do
    [ "$where" = netbed ] && iface=("e$k") || iface=(lo)
    onhost "$k" timeout 600 /usr/bin/python3 "$BENCH/gloo_allreduce.py" "$k" "$n" "$(addr 0)" "$port" "$mb" "$iters" "${iface[@]}" > "$tmp/g$k" 2>&1 &
  done
  wait
  cat "$tmp/g0"
}

: > "$tmp/results"
other=gloo
[ -n "${BASE:-}" ] && other=base
for r in $(seq 1 "$REPEAT"); do
  starling | tee -a "$tmp/results"
  if [ "$other" = base ]; then starling "$tmp/peer-base" base; else gloo; fi | tee -a "$tmp/results"
done
med() { grep "^$1 " "$tmp/results" | sed -E 's/.*busbw_MBps=([0-9.]+).*/\1/' | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
medt() { grep "^$1 " "$tmp/results" | sed -E 's/.*time_s=([0-9.]+).*/\1/' | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
s=$(med starling) g=$(med "$other") st=$(medt starling) gt=$(medt "$other")
echo "median of $REPEAT: $where n=$n ${rate:-} ${mb} MB: starling busbw ${s} MB/s (${st} s), $other${BASE:+ ($BASE)} ${g} MB/s (${gt} s), ratio $(awk -v a="$s" -v b="$g" 'BEGIN{printf "%.3f", a/b}')"
