#!/usr/bin/env bash
# natbed.sh up | down | run CMD...
# Two peers behind NAT and a relay on a "public" segment, all in network
# namespaces of their own (prefix nat-, or $NATBED_PREFIX), nothing attached
# to the root namespace, so no packet can leave the test bed:
#
#   nat-relay 11.79.0.1 ─┐
#                        ├─ bridge in nat-pub (the "internet", 11.79.0.0/24)
#   nat-ra wan 11.79.0.2 ┤    nat-ra: masquerading router, lan 192.168.1.1
#   nat-rb wan 11.79.0.3 ┘    nat-rb: masquerading router, lan 192.168.2.1
#   nat-a 192.168.1.2 (behind nat-ra), nat-b 192.168.2.2 (behind nat-rb)
#
# The public segment uses addresses libp2p takes for public (manet.IsPublicAddr:
# hole punching only uses public observed addresses); they exist only inside
# these namespaces. The routers masquerade (nft) what goes out on wan, accept
# only replies coming in (ct state established,related) and drop the rest
# silently, like a home router: unsolicited dials to a peer behind a NAT fail.
#
# `run CMD...` brings the bed up, runs CMD, and tears it down on exit.
# `peers [FLAGS...]` brings it up and runs real `peer run` processes: the
# relay (--relay-service) and a and b behind their NATs (--relay), b
# dialling a only at its relayed address; FLAGS (default: a 5-step sync
# job) go to all three. It prints each peer's last progress line and the
# hole punches libp2p logged (with NATBED_DEBUG=1: libp2p's debug logs on a
# and b, heavy enough to slow them); logs stay in $OUT (a temporary folder).
set -euo pipefail
P=${NATBED_PREFIX:-nat-}

down() {
  for n in a b ra rb relay pub; do ip netns del "$P$n" 2>/dev/null || true; done
}

# link NS1 IF1 NS2 IF2: a veth pair between two namespaces.
link() { ip -n "$1" link add "$2" type veth peer name "$4" netns "$3"; }

up() {
  command -v nft >/dev/null || { echo "natbed: nft (nftables) is missing" >&2; exit 2; }
  down
  for n in pub relay ra rb a b; do
    ip netns add "$P$n"
    ip -n "$P$n" link set lo up
  done
  ip -n "${P}pub" link add name br0 type bridge
  ip -n "${P}pub" link set br0 up
  for n in relay ra rb; do
    link "${P}pub" "p-$n" "$P$n" wan
    ip -n "${P}pub" link set "p-$n" master br0
    ip -n "${P}pub" link set "p-$n" up
    ip -n "$P$n" link set wan up
  done
  ip -n "${P}relay" addr add 11.79.0.1/24 dev wan
  ip -n "${P}ra" addr add 11.79.0.2/24 dev wan
  ip -n "${P}rb" addr add 11.79.0.3/24 dev wan
  local k=1
  for s in a b; do
    link "${P}r$s" lan "$P$s" eth0
    ip -n "${P}r$s" addr add 192.168.$k.1/24 dev lan
    ip -n "${P}r$s" link set lan up
    ip -n "$P$s" addr add 192.168.$k.2/24 dev eth0
    ip -n "$P$s" link set eth0 up
    ip -n "$P$s" route add default via 192.168.$k.1
    ip netns exec "${P}r$s" sysctl -qw net.ipv4.ip_forward=1
    ip netns exec "${P}r$s" nft -f - <<'EOF'
table ip nat {
  chain masq { type nat hook postrouting priority srcnat; oifname "wan" masquerade; }
}
table inet filter {
  chain forward_lan {
    type filter hook forward priority filter; policy drop;
    ct state established,related accept
    iifname "lan" oifname "wan" accept
  }
  chain input_wan {
    type filter hook input priority filter; policy drop;
    ct state established,related accept
    iifname { "lo", "lan" } accept
  }
}
EOF
    k=$((k+1))
  done
}

case ${1:-} in
up) up ;;
down) down ;;
run)
  shift
  trap down EXIT
  up
  "$@"
  ;;
peers)
  shift
  flags=("$@")
  [ ${#flags[@]} -gt 0 ] || flags=(--mode sync --steps 5 --model logreg --limit 2000 --eval-every 5)
  OUT=${OUT:-$(mktemp -d /tmp/natbed.XXXX)}
  B=$OUT/peer
  (cd "$(dirname "$0")/.." && go build -o "$B" ./cmd/peer)
  trap down EXIT
  up
  for k in relay a b; do "$B" keygen --key "$OUT/k$k" >/dev/null 2>&1; done
  R=$("$B" id --key "$OUT/krelay" | head -1); A=$("$B" id --key "$OUT/ka" | head -1)
  RA=/ip4/11.79.0.1/tcp/4001/p2p/$R
  common=(--min-peers 3 --listen /ip4/0.0.0.0/tcp/4001 --linger 5s "${flags[@]}")
  cd "$OUT"
  ip netns exec "${P}relay" "$B" run --key krelay --relay-service "${common[@]}" >relay.log 2>&1 &
  pids=($!)
  sleep 1
  lvl=warn; [ "${NATBED_DEBUG:-}" = 1 ] && lvl=debug
  GOLOG_LOG_LEVEL=$lvl ip netns exec "${P}a" "$B" run --key ka --relay "$RA" --connect "$RA" "${common[@]}" >a.log 2>&1 &
  pids+=($!)
  GOLOG_LOG_LEVEL=$lvl ip netns exec "${P}b" "$B" run --key kb --relay "$RA" --connect "$RA" \
    --connect "$RA/p2p-circuit/p2p/$A" "${common[@]}" >b.log 2>&1 &
  pids+=($!)
  rc=0
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  for k in relay a b; do echo "$k: $(grep -a '^step' $k.log | tail -1)"; done
  grep -ah 'hole punch successful\|NO_RESERVATION' a.log b.log | cut -c1-200 || true
  echo "logs in $OUT"
  exit $rc
  ;;
*) echo "usage: natbed.sh up | down | run CMD... | peers [FLAGS...]" >&2; exit 2 ;;
esac
