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
*) echo "usage: natbed.sh up | down | run CMD..." >&2; exit 2 ;;
esac
