#!/usr/bin/env bash
# Two hosts in network namespaces joined by a veth pair, with an optional
# one-way delay (and loss) on each side applied by wirerate-delayline on
# NFQUEUE, because this kernel has no netem.
#
#   bench/netns.sh up [--delay-ms 75] [--loss 0.0001] [--mtu 1500] [--buf 268435456] [--rx-buf 4194304]
#                     [--initcwnd 100] [--rate 1gbit]
#   bench/netns.sh down
#
# Hosts: wr-a 10.201.0.1 and wr-b 10.201.0.2 (addresses exist only inside
# the namespaces). Needs root, iproute2 and iptables. `down` restores the
# global socket-buffer limits it raised and removes everything it made.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
state=/run/wirerate-bench
A=wr-a B=wr-b
delayline=${DELAYLINE:-$here/../target/release/wirerate-delayline}

up() {
  local delay=0 loss=0 mtu=1500 buf=$((256 << 20)) rxbuf="" initcwnd="" rate=""
  while [ $# -gt 0 ]; do
    case $1 in
      --delay-ms) delay=$2; shift 2 ;;
      --loss) loss=$2; shift 2 ;;
      --mtu) mtu=$2; shift 2 ;;
      --buf) buf=$2; shift 2 ;;
      --rx-buf) rxbuf=$2; shift 2 ;;
      --initcwnd) initcwnd=$2; shift 2 ;;
      --rate) rate=$2; shift 2 ;;
      *) echo "unknown option $1" >&2; exit 2 ;;
    esac
  done
  [ -d "$state" ] && { echo "already up; run '$0 down' first" >&2; exit 1; }
  mkdir -p "$state"
  sysctl -n net.core.rmem_max > "$state/rmem_max"
  sysctl -n net.core.wmem_max > "$state/wmem_max"
  ip netns add $A
  ip netns add $B
  ip link add wra0 type veth peer name wrb0
  ip link set wra0 netns $A
  ip link set wrb0 netns $B
  ip -n $A addr add 10.201.0.1/24 dev wra0
  ip -n $B addr add 10.201.0.2/24 dev wrb0
  for ns in $A $B; do
    ip -n $ns link set lo up
    dev=$([ $ns = $A ] && echo wra0 || echo wrb0)
    ip -n $ns link set $dev mtu "$mtu" up
    ip netns exec $ns sysctl -qw net.ipv4.tcp_rmem="4096 131072 $buf" net.ipv4.tcp_wmem="4096 131072 $buf"
    # As on a DTN (the agent's preflight checks it): a connection idle
    # between transfers keeps its window instead of starting slow again.
    ip netns exec $ns sysctl -qw net.ipv4.tcp_slow_start_after_idle=0
  done
  # A host setting, the route's initial congestion and receive windows
  # (segments; the kernel's default is 10): what a DTN's admin can set
  # for the routes to its peers to shorten TCP's ramp on long paths.
  if [ -n "$initcwnd" ]; then
    ip -n $A route change 10.201.0.0/24 dev wra0 proto kernel scope link src 10.201.0.1 \
      initcwnd "$initcwnd" initrwnd "$initcwnd"
    ip -n $B route change 10.201.0.0/24 dev wrb0 proto kernel scope link src 10.201.0.2 \
      initcwnd "$initcwnd" initrwnd "$initcwnd"
  fi
  # A link of this rate each way (tc tbf on each host's egress; this
  # kernel has no netem). Its queue holds 50 ms at the rate: a shallow
  # bottleneck buffer, as on a shared WAN port.
  if [ -n "$rate" ]; then
    ip -n $A link set wra0 txqueuelen 10000
    ip -n $B link set wrb0 txqueuelen 10000
    tc -n $A qdisc add dev wra0 root tbf rate "$rate" burst 256kb latency 50ms
    tc -n $B qdisc add dev wrb0 root tbf rate "$rate" burst 256kb latency 50ms
  fi
  # The receiving host alone (B), where the sender cannot see it.
  if [ -n "$rxbuf" ]; then
    ip netns exec $B sysctl -qw net.ipv4.tcp_rmem="4096 131072 $rxbuf" net.ipv4.tcp_wmem="4096 131072 $rxbuf"
  fi
  # Global on this kernel (EINVAL inside a namespace); restored by `down`.
  sysctl -qw net.core.rmem_max="$buf" net.core.wmem_max="$buf"
  if [ "$delay" != 0 ] || [ "$loss" != 0 ]; then
    [ -x "$delayline" ] || { echo "build it first: cargo build --release -p wirerate-delayline" >&2; exit 1; }
    # The kernel hands queued packets to the delay line over a netlink
    # socket; when its receive buffer (net.core.rmem_default, 208 KiB)
    # fills, the packet is dropped (user_dropped in nfnetlink_queue). Two
    # shared cores make that happen at a few Gbit/s, so the "lossless"
    # path lost ~1% of its packets. The sockets take the default at
    # creation: raise it only until both delay lines have bound.
    sysctl -n net.core.rmem_default > "$state/rmem_default"
    sysctl -qw net.core.rmem_default=$((64 << 20))
    for ns in $A $B; do
      dev=$([ $ns = $A ] && echo wra0 || echo wrb0)
      # Held on arrival: a packet held at the sender's OUTPUT hook still counts
      # against its socket (TCP small queues) and throttles the sender.
      ip netns exec $ns iptables -A INPUT -i $dev -j NFQUEUE --queue-num 0
      ip netns exec $ns "$delayline" --queue 0 --delay-ms "$delay" --loss "$loss" \
        2> "$state/delayline-$ns.log" &
      echo $! > "$state/delayline-$ns.pid"
    done
    for ns in $A $B; do
      for _ in $(seq 50); do
        ip netns exec $ns grep -q . /proc/net/netfilter/nfnetlink_queue && break
        sleep 0.1
      done
    done
    sysctl -qw net.core.rmem_default="$(cat "$state/rmem_default")"
  fi
  echo "up: $A 10.201.0.1 <-> $B 10.201.0.2, one-way delay ${delay} ms, loss $loss, mtu $mtu, tcp buffers up to $buf${rxbuf:+ ($B: $rxbuf)}${rate:+, capped at $rate}"
}

down() {
  # Packets the delay line never saw: the kernel dropped them (queue full,
  # or the netlink buffer full). Said out loud, since the path should
  # lose only what --loss asks for.
  for ns in $A $B; do
    ip netns exec $ns cat /proc/net/netfilter/nfnetlink_queue 2>/dev/null | while read -r q _ _ _ _ qdrop udrop _; do
      [ "$qdrop" = 0 ] && [ "$udrop" = 0 ] || echo "warning: $ns queue $q: kernel dropped $qdrop (queue full) + $udrop (delay line too slow) packets" >&2
    done
  done
  for f in "$state"/delayline-*.pid; do
    [ -f "$f" ] || continue
    pid=$(cat "$f")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  done
  ip netns del $A 2>/dev/null || true
  ip netns del $B 2>/dev/null || true
  if [ -f "$state/rmem_default" ]; then
    sysctl -qw net.core.rmem_default="$(cat "$state/rmem_default")"
  fi
  if [ -f "$state/rmem_max" ]; then
    sysctl -qw net.core.rmem_max="$(cat "$state/rmem_max")" net.core.wmem_max="$(cat "$state/wmem_max")"
  fi
  rm -rf "$state"
}

case ${1:-} in
  up) shift; up "$@" ;;
  down) down ;;
  *) echo "usage: $0 up [--delay-ms MS] [--loss P] [--mtu N] [--buf BYTES] [--rx-buf BYTES] [--initcwnd N] [--rate RATE] | down" >&2; exit 2 ;;
esac
