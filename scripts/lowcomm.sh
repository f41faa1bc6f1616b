#!/usr/bin/env bash
# lowcomm.sh — low-communication training on charlm: N `peer run`
# processes on loopback (127.0.0.1), the same inner steps (tokens) per peer
# for each strategy: sync data-parallel, DiLoCo, Streaming DiLoCo in fp32
# and with fp4 outer gradients, DeMo, async DiLoCo. It runs
# `peer experiment lowcomm` (see its --help for the rows and the columns:
# validation bits per char, tensor bytes sent per peer, wall seconds, the
# seconds a peer spent in all-reduces and the part that blocked its
# training, each row against sync), with these settings from the
# environment:
#
#   STEPS=600 H=100 F=4 N=4 scripts/lowcomm.sh
#   ONLY="sync sdlc-fp4" scripts/lowcomm.sh   # a subset, by row name
#
# MODEL (peer run --model), TAU (overlap rows' τ, default H/F/2),
# SD_EXTRA, ASYNC, DEMO (parameters added to the streaming-diloco,
# async-diloco and demo strategies, e.g. SD_EXTRA=lr=1), DEMO_LR (the demo
# row's --lr), EXTRA (flags for every peer), PEER_TIMEOUT=S (stop a peer
# process after S seconds, default 1800), KEEP=1 (keep the work folder),
# JSON=FILE (also write the rows as JSON).
#
# NETBED=RATE (root, ../shared/bench/netbed.sh) runs peer k in network
# namespace hk at 10.77.0.(k+1), its link limited to RATE (e.g. 1gbit,
# 100mbit) both ways, instead of on loopback.
set -u
cd "$(dirname "$0")/.."
N=${N:-4}; STEPS=${STEPS:-600}; H=${H:-100}; F=${F:-4}
MODEL=${MODEL:-charlm:layers=2,width=64,heads=2,ctx=64}
d=$(mktemp -d); b=$d/peer
[ -n "${KEEP:-}" ] || trap 'rm -rf "$d"' EXIT; echo "# work dir $d"
go build -o "$b" ./cmd/peer || exit 1
netns=()
if [ -n "${NETBED:-}" ]; then
  bed=${BENCH:-$(cd ../shared/bench && pwd)}/netbed.sh
  "$bed" down "$N" >/dev/null 2>&1 || true
  "$bed" up "$N" "$NETBED" || exit 1
  trap '"$bed" down "$N" >/dev/null 2>&1; [ -n "${KEEP:-}" ] || rm -rf "$d"' EXIT
  netns=(--netns)
fi
echo "# $(git rev-parse --short HEAD)${NETBED:+, netbed $NETBED}"
only=${ONLY:-}
"$b" experiment lowcomm --peers "$N" --steps "$STEPS" --h "$H" --fragments "$F" --model "$MODEL" \
  ${TAU:+--tau "$TAU"} --sd-extra "${SD_EXTRA:-}" --async "${ASYNC:-}" --demo "${DEMO:-}" --demo-lr "${DEMO_LR:-}" \
  --extra "${EXTRA:-}" --rows "${only// /,}" --peer-timeout "${PEER_TIMEOUT:-1800}s" --work "$d/rows" \
  ${JSON:+--json "$JSON"} "${netns[@]}"
