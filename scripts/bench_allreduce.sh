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
# noise between runs). BFLAGS, with BASE, replaces FLAGS for the base's
# runs (BASE=HEAD BFLAGS=... compares two flag sets of one build).
# CPU=LO measures CPU time per all-reduce as well: every rank runs under
# /usr/bin/time, once with ITERS all-reduces and once with LO, and the
# difference of the ranks' summed user and system seconds, divided by
# ITERS − LO, is what one all-reduce costs all ranks together (start-up,
# connection set-up and Python's import of torch cancel out).
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

tm() { # rank-file: the /usr/bin/time prefix when CPU is set
  [ -n "${CPU:-}" ] && echo /usr/bin/time -f %U,%S -o "$1.time"
  return 0
}
cpusum() { # label iters files...: prints "cpu LABEL ITERS user U system S" summed over the files
  local label=$1 it=$2; shift 2
  cat "$@" | awk -F, -v l="$label" -v i="$it" '{u+=$1; s+=$2} END {printf "cpu %s %d user %.3f system %.3f\n", l, i, u, s}'
}

starling() { # [binary label iters]
  local b=${1:-$bin} label=${2:-starling} iters=${3:-$iters} port=$((42000 + RANDOM % 1000)) peers=() flags=${FLAGS:-}
  [ "$label" = base ] && flags=${BFLAGS-${FLAGS:-}}
  for k in $(seq 0 $((n-1))); do
    peers+=("/ip4/$(addr "$k")/tcp/$((port+k))/p2p/${ids[$k]}")
  done
  local list; list=$(IFS=,; echo "${peers[*]}")
  for k in $(seq 0 $((n-1))); do
    # shellcheck disable=SC2046
    onhost "$k" timeout 600 $(tm "$tmp/s$k") "$b" bench allreduce --key "$tmp/k$k" --listen "/ip4/$(addr "$k")/tcp/$((port+k))" \
      --peers "$list" --size-mb "$mb" --iters "$iters" --algo "$ALGO" --label "$label" $flags > "$tmp/s$k" 2>&1 &
  done
  wait
  [ -n "${CPU:-}" ] && cpusum "$label" "$iters" "$tmp"/s*.time
  grep -v '^warning: --insecure' "$tmp/s0" || true
  if ! grep -q "^$label " "$tmp/s0"; then # no result: what every rank said
    for k in $(seq 1 $((n-1))); do echo "--- rank $k:"; grep -v '^warning: --insecure' "$tmp/s$k" | tail -20; done >&2
  fi
}
gloo() { # [iters]
  local iters=${1:-$iters} port=$((29000 + RANDOM % 1000)) iface=()
  for k in $(seq 0 $((n-1))); do
    [ "$where" = netbed ] && iface=("e$k") || iface=(lo)
    # shellcheck disable=SC2046
    onhost "$k" timeout 600 $(tm "$tmp/g$k") /usr/bin/python3 "$BENCH/gloo_allreduce.py" "$k" "$n" "$(addr 0)" "$port" "$mb" "$iters" "${iface[@]}" > "$tmp/g$k" 2>&1 &
  done
  wait
  [ -n "${CPU:-}" ] && cpusum gloo "$iters" "$tmp"/g*.time
  cat "$tmp/g0"
}

: > "$tmp/results"
other=gloo
[ -n "${BASE:-}" ] && other=base
for r in $(seq 1 "$REPEAT"); do
  starling | tee -a "$tmp/results"
  if [ "$other" = base ]; then starling "$tmp/peer-base" base; else gloo; fi | tee -a "$tmp/results"
  if [ -n "${CPU:-}" ]; then
    starling "$bin" starling "$CPU" | grep '^cpu ' | tee -a "$tmp/results"
    if [ "$other" = base ]; then starling "$tmp/peer-base" base "$CPU"; else gloo "$CPU"; fi | grep '^cpu ' | tee -a "$tmp/results"
  fi
done
med() { grep "^$1 " "$tmp/results" | sed -E 's/.*busbw_MBps=([0-9.]+).*/\1/' | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
medt() { grep "^$1 " "$tmp/results" | sed -E 's/.*time_s=([0-9.]+).*/\1/' | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
s=$(med starling) g=$(med "$other") st=$(medt starling) gt=$(medt "$other")
echo "median of $REPEAT: $where n=$n ${rate:-} ${mb} MB: starling busbw ${s} MB/s (${st} s), $other${BASE:+ ($BASE)} ${g} MB/s (${gt} s), ratio $(awk -v a="$s" -v b="$g" 'BEGIN{printf "%.3f", a/b}')"
if [ -n "${CPU:-}" ]; then # the r-th run with ITERS against the r-th with LO
  cpu() { # label field(4: user, 6: system, 0: both)
    grep "^cpu $1 " "$tmp/results" | awk -v hi="$iters" -v lo="$CPU" -v f="$2" '
      { v = f ? $f : $5 + $7; if ($3 == hi) h[++nh] = v; else l[++nl] = v }
      END { for (r = 1; r <= nh && r <= nl; r++) print (h[r] - l[r]) / (hi - lo) }' |
      sort -g | awk '{a[NR]=$1} END {printf "%.3f", a[int((NR+1)/2)]}'
  }
  sc=$(cpu starling 0) gc=$(cpu "$other" 0)
  echo "median CPU-seconds per all-reduce, all ranks: starling $sc (user $(cpu starling 5), system $(cpu starling 7)), $other $gc (user $(cpu "$other" 5), system $(cpu "$other" 7)), ratio $(awk -v a="$sc" -v b="$gc" 'BEGIN{printf "%.2f", a/b}')"
fi
