#!/usr/bin/env bash
# partition.sh — three `peer run` processes (federated FedAvg, MLP) on
# network namespaces (../shared/bench/netbed.sh, 1 Gbit/s); AT seconds
# after they start, host h2 is cut off from the bridge for CUT seconds.
# Runs as root. Prints each host's failed rounds, notes and last round.
#
#   ROUNDS=300 AT=4 CUT=10 scripts/partition.sh
set -u
cd "$(dirname "$0")/.."
BENCH=${BENCH:-$(cd ../shared/bench && pwd)}
d=$(mktemp -d); b=$d/peer; n=3
go build -o "$b" ./cmd/peer
"$BENCH/netbed.sh" down $n >/dev/null 2>&1; "$BENCH/netbed.sh" up $n 1gbit
ids=(); for k in 0 1 2; do $b keygen --key $d/k$k >/dev/null 2>&1; ids+=("$($b id --key $d/k$k | head -1)"); done
for k in 0 1 2; do
  con=(); for j in 0 1 2; do [ $j != $k ] && con+=(--connect /ip4/10.77.0.$((j+1))/tcp/4001/p2p/${ids[$j]}); done
  ip netns exec h$k timeout 300 $b run --mdns=false --swarm part --key $d/k$k --listen /ip4/10.77.0.$((k+1))/tcp/4001 "${con[@]}" \
    --shard $k/3 --min-peers 3 --model mlp --limit 3000 --rounds ${ROUNDS:-300} --stall-timeout 2s --round-timeout 20s --wait 30s \
    --checkpoint $d/c$k --out $d/o$k > $d/log$k 2>&1 &
done
sleep ${AT:-4}; echo "cut h2 at $(date +%T)"; ip link set v2 down
sleep ${CUT:-10}; echo "restore h2 at $(date +%T)"; ip link set v2 up
wait
"$BENCH/netbed.sh" down $n >/dev/null 2>&1
for k in 0 1 2; do
  echo "== h$k: $(grep -c 'round failed' $d/log$k) failed rounds"
  grep -E "federated:|state fetched" $d/log$k | cut -c1-160 | head -4
  grep "^round" $d/log$k | tail -1
done
rm -rf "$d"
