#!/usr/bin/env bash
# make cluster-down: stops the local node's processes and every container they ran, removes its mounts, network
# namespaces, bridge, iptables rules and state (the volume's data too, as k3d cluster delete does), and its kube
# context. The built parts stay in NODE_CACHE, so the next cluster-up builds nothing. Safe after a crash.
set -euo pipefail

cd "$(dirname "$0")/../.."
# shellcheck source=/dev/null
source scripts/node/common.sh  # the settings, checked, and the node's names
# shellcheck source=/dev/null
source scripts/node/nodes.sh  # the agent's names, and down_agent

as_root cluster-down "stops root's containers and mounts" || exit 1

stop() {
  local pid tries=20
  pid=$(pid_of "$1") || return 0
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    kill "$pid"
    while kill -0 "$pid" 2>/dev/null && [ "$tries" -gt 0 ]; do sleep 0.5; tries=$((tries - 1)); done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$NODE_RUN/$1.pid"
}

# make agent-down: the agent alone, as a machine that loses its power: its processes, containers and link stop, and
# the API server keeps its Node and pods, which nothing confirms gone (docs/cluster.md, "A lost node").
if [[ ${1:-} == --agent ]]; then
  down_agent
  echo "the node $AGENT_NAME is down; the API server still lists it and its pods: make status says what to do"
  echo "(make cluster-up NODES=2 brings it back)"
  exit 0
fi

# The agent first (make cluster-up NODES=2), then node 0: the kubelet first, so nothing restarts a container while the
# containers go.
down_agent
stop kubelet
if [ -S "$NODE_RUN/containerd.sock" ] && running containerd; then
  for task in $(ctr --address "$NODE_RUN/containerd.sock" -n k8s.io tasks ls -q 2>/dev/null); do
    ctr --address "$NODE_RUN/containerd.sock" -n k8s.io tasks kill -s SIGKILL "$task" >/dev/null 2>&1 || true
  done
fi
for name in "${NODE_PROCESSES[@]}"; do stop "$name"; done
# A shim outlives containerd: end those of this node's containerd (their containers were killed above).
pkill -9 -f "containerd-shim-runc-v2 .*-address $NODE_RUN/containerd.sock" 2>/dev/null || true

# Mounts the containers and the kubelet left, deepest first.
{ grep -E " ($NODE_ROOT|$NODE_RUN)[/ ]" /proc/mounts || true; } | awk '{print $2}' | sort -r | while read -r mount; do
  umount -l "$mount" 2>/dev/null || true
done
# The network namespaces the CNI made for the pods (containerd names them cni-<uuid>), whose bridge is ours.
# `ip netns` makes /run/netns a bind mount of itself: one made after the CNI's namespace hides that mount below it,
# so when the namespace's own unmount cannot see it, the bind goes first (it refuses while others' namespaces are on it).
for netns in /run/netns/cni-*; do
  [ -e "$netns" ] || continue
  for _ in 1 2 3; do
    rm -f "$netns" 2>/dev/null && break
    umount "$netns" 2>/dev/null || umount /run/netns 2>/dev/null || true
  done
done
ip link show "$NODE_BRIDGE" >/dev/null 2>&1 && ip link delete "$NODE_BRIDGE"
if [[ $(ip -o addr show dev lo) == *" $NODE_IP/32 "* ]]; then ip addr del "$NODE_IP/32" dev lo; fi
if [ -x "$K8S_BIN/kube-proxy" ]; then
  "$K8S_BIN/kube-proxy" --cleanup >/dev/null 2>&1 || true
fi
if [ -x "$BIN/kube-router-$NODE_KUBE_ROUTER_VERSION" ]; then
  "$BIN/kube-router-$NODE_KUBE_ROUTER_VERSION" --cleanup-config >/dev/null 2>&1 || true
fi
# What kube-proxy's cleanup leaves: the CNI's masquerade chains and the kubelet's own KUBE- chains.
rules=$(iptables-save)
# DISTML-MASQ is the pods' masquerade (up.sh's pod_network).
if [[ $rules == *CNI-* || $rules == *KUBE-* || $rules == *DISTML-* ]]; then
  grep -vE -- "CNI-|KUBE-|DISTML-" <<<"$rules" | iptables-restore
fi
# kube-router's policy sets, once no rule refers to them.
for set in $(ipset list -n 2>/dev/null); do
  [[ $set != KUBE-* && $set != kube-router-* ]] || ipset destroy "$set" 2>/dev/null || true
done

left=$(grep -cE " ($NODE_ROOT|$NODE_RUN)[/ ]" /proc/mounts || true)
if [ "$left" -ne 0 ]; then
  echo "error: $left mounts under $NODE_ROOT are still busy (grep $NODE_ROOT /proc/mounts); stop what uses them and run cluster-down again" >&2
  exit 1
fi
rm -rf "$NODE_ROOT" "$NODE_RUN"

config=${KUBECONFIG:-$HOME/.kube/config}
config=${config%%:*}
if [ -f "$config" ]; then
  kubectl config --kubeconfig "$config" delete-context "$NODE_CONTEXT" >/dev/null 2>&1 || true
  kubectl config --kubeconfig "$config" delete-cluster "$NODE_CONTEXT" >/dev/null 2>&1 || true
  kubectl config --kubeconfig "$config" delete-user "$NODE_CONTEXT-admin" >/dev/null 2>&1 || true
fi
echo "cluster $NODE_CONTEXT removed: no process, mount or state left (the built parts stay in $NODE_CACHE)"
