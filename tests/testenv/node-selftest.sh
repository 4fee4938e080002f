#!/usr/bin/env bash
# Checks of a testenv node's footprint on the host.
#
#   node-selftest.sh snapshot FILE   record the host's iptables rules, links,
#                                    mounts, node processes and sysctls
#   node-selftest.sh guard DIR       while DIR's node runs: pod traffic cannot
#                                    leave the machine (the guard chains come
#                                    first, nothing masquerades the pod range
#                                    to the outside, cluster DNS forwards
#                                    nothing), and a second node is refused
#   node-selftest.sh clean FILE      after `testenv down`: the host is as the
#                                    snapshot FILE recorded it
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export PATH="$PATH:/usr/sbin:/sbin"
SYSCTLS=(net.ipv4.ip_forward net.bridge.bridge-nf-call-iptables net.ipv4.conf.all.route_localnet
  vm.overcommit_memory kernel.panic kernel.panic_on_oops)

state() {
  echo "# iptables"
  for t in filter nat mangle raw; do
    iptables-save -t "$t" 2>/dev/null | grep -E '^-A|^:' | grep -vE '^:(INPUT|OUTPUT|FORWARD|PREROUTING|POSTROUTING) ' |
      sed "s/^/$t /" || true
  done
  echo "# links"
  ip -o link show | awk -F': ' '{print $2}' | sed 's/@.*//' | sort
  echo "# mounts"
  awk '{print $5}' /proc/self/mountinfo | sort
  echo "# processes"
  # Zombies (state Z) hold nothing; a reparented one waits for its reaper.
  ps -eo stat=,comm= | awk '$1 !~ /^Z/ {print $2}' \
    | grep -E '^(containerd|containerd-shim|kubelet|kube-proxy|kube-scheduler|kube-controller|coredns|pause|docker-registry)' | sort || true
  echo "# netns"
  ls /var/run/netns 2>/dev/null | sort || true
  echo "# sysctls"
  for s in "${SYSCTLS[@]}"; do echo "$s=$(sysctl -n "$s" 2>/dev/null || echo absent)"; done
}

fail() { echo "node-selftest: $*" >&2; exit 1; }

case ${1:-} in
  snapshot)
    state > "$2"
    ;;
  guard)
    DIR=$2
    rules=$(iptables-save -t mangle)
    for hook in "FORWARD -j KMS-TESTENV-FWD" "POSTROUTING -j KMS-TESTENV-OUT"; do
      first=$(iptables -t mangle -S "${hook%% *}" | grep '^-A' | head -1)
      [ "$first" = "-A $hook" ] || fail "the guard is not first in mangle ${hook%% *}: $first"
    done
    grep -q -- '-A KMS-TESTENV-FWD -s 10.88.0.0/16 -j DROP' <<<"$rules" || fail "no drop of pod traffic leaving the bridge"
    grep -q -- '-A KMS-TESTENV-OUT -d 10.0.0.0/24 -j DROP' <<<"$rules" || fail "no drop of unrewritten Service traffic"
    grep -q -- '-A KMS-TESTENV-OUT -d 10.88.0.0/16 ! -o cni0 -j DROP' <<<"$rules" || fail "no guard of host traffic to pods"
    if iptables-save -t nat | grep -E -- '-s 10.88.0.0/16' | grep -q MASQUERADE; then
      fail "the pod range is masqueraded"
    fi
    K=$("$HERE/testenv" path kubectl)
    corefile=$(KUBECONFIG=$DIR/kubeconfig "$K" -n kube-system get configmap coredns -o jsonpath='{.data.Corefile}')
    grep -qE '^\s*(forward|proxy)\b' <<<"$corefile" && fail "cluster DNS forwards queries"
    # One node per machine.
    other=$(mktemp -d)
    if out=$("$HERE/testenv" up "$other" --node 2>&1); then
      "$HERE/testenv" down "$other" >/dev/null 2>&1 || true
      fail "a second node started"
    fi
    "$HERE/testenv" down "$other" >/dev/null 2>&1 || true
    rm -rf "$other"
    grep -q "already runs on this machine" <<<"$out" || fail "the second node was refused without saying why: $out"
    echo "node-selftest: guard in place, cluster DNS forwards nothing, a second node is refused"
    ;;
  clean)
    after=$(mktemp)
    # A process in the middle of exiting gets up to 10 s.
    for _ in $(seq 50); do
      state > "$after"
      diff -q "$2" "$after" >/dev/null && break
      sleep 0.2
    done
    if ! diff -u "$2" "$after"; then
      fail "the host differs from before the node (see the diff above)"
    fi
    rm -f "$after"
    echo "node-selftest: the host is as before the node"
    ;;
  *)
    sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
