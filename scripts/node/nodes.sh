# shellcheck shell=bash
# shellcheck disable=SC2034  # the N_* names below are the sourcing scripts'
# The cluster's nodes, sourced by up.sh and down.sh after common.sh. Node 0 is the host itself. Node 1, the agent
# (make cluster-up NODES=2, as k3d's agent node), is a second real node in its own network namespace, linked to the
# host by a veth pair, with its own containerd, kubelet (own root, cgroup root and pod-log directories, so neither
# kubelet cleans up the other's pods), kube-proxy, kube-router and pod range. Pod traffic between the nodes is
# routed, never masqueraded, so NetworkPolicies see pod addresses. Both share the VM's disk and CPUs.

AGENT_NAME=$CLUSTER_NAME-agent
AGENT_NETNS=$CLUSTER_NAME-agent
AGENT_LINK=$CLUSTER_NAME-agent  # the host's end of the link; the agent's end is its eth0
AGENT_CGROUP=$CLUSTER_NAME-agent
# Stopped in this order by cluster-down, before node 0's: the kubelet first, so nothing restarts a container.
AGENT_PROCESSES=(agent-kubelet agent-policy agent-proxy agent-containerd)

in_agent() { nsenter --net="/run/netns/$AGENT_NETNS" "$@"; }

# pod_range K: node K's pod range, the K-th /24 of NODE_POD_CIDR (kube-proxy's cluster range).
pod_range() {
  python3 -c "import ipaddress,sys; print(list(ipaddress.ip_network(sys.argv[1]).subnets(new_prefix=24))[int(sys.argv[2])])" \
    "$NODE_POD_CIDR" "$1"
}

# node K: node K's name, address, directories, process-name prefix, the command prefix that runs a command in its
# network namespace (N_IN, an array) and its cgroup root, as N_* variables.
node() {
  if [ "$1" -eq 0 ]; then
    N_NAME=$NODE_NAME N_IP=$NODE_IP N_ROOT=$NODE_ROOT N_RUN=$NODE_RUN N_PREFIX='' N_CGROUP=/
    N_IN=()
  else
    N_NAME=$AGENT_NAME N_IP=$NODE_AGENT_IP N_ROOT=$NODE_ROOT/agent N_RUN=$NODE_RUN/agent N_PREFIX=agent-
    N_CGROUP=/$AGENT_CGROUP
    N_IN=(nsenter "--net=/run/netns/$AGENT_NETNS")
  fi
  N_RANGE=$(pod_range "$1")
}

# rate_bits RATE: tc's rate (such as 1gbit or 100mbit) in bits per second.
rate_bits() {
  local number=${1%%[a-z]*}
  case ${1#"$number"} in
    bit) echo "$number" ;;
    kbit) echo $((number * 1000)) ;;
    mbit) echo $((number * 1000000)) ;;
    gbit) echo $((number * 1000000000)) ;;
  esac
}

# link_rate: each direction of the agent's link limited to NODE_LINK_RATE with tbf, as the bench's network namespaces
# are (a bucket of one millisecond at the rate, at least 64 KiB); unlimited when it is empty.
link_rate() {
  local end device burst
  for end in host agent; do
    device=$AGENT_LINK
    [ "$end" = host ] || device=eth0
    local run=()
    [ "$end" = host ] || run=(in_agent)
    if [ -z "$NODE_LINK_RATE" ]; then
      "${run[@]}" tc qdisc del dev "$device" root 2>/dev/null || true
      continue
    fi
    burst=$(($(rate_bits "$NODE_LINK_RATE") / 8 / 1000))
    [ "$burst" -ge 65536 ] || burst=65536
    "${run[@]}" tc qdisc replace dev "$device" root tbf rate "$NODE_LINK_RATE" burst "$burst" latency 100ms
  done
}

# agent_network: the agent's namespace and link, the route to its pods, and its bridge's CNI configuration.
agent_network() {
  [ -e "/run/netns/$AGENT_NETNS" ] || ip netns add "$AGENT_NETNS"
  if ! ip link show "$AGENT_LINK" >/dev/null 2>&1; then
    ip link add "$AGENT_LINK" type veth peer name eth0 netns "$AGENT_NETNS"
    ip addr add "$NODE_AGENT_GATEWAY/30" dev "$AGENT_LINK"
    ip link set "$AGENT_LINK" up
    in_agent ip link set lo up
    in_agent ip addr add "$NODE_AGENT_IP/30" dev eth0
    in_agent ip link set eth0 up
    in_agent ip route add default via "$NODE_AGENT_GATEWAY"
  fi
  ip route replace "$(pod_range 1)" via "$NODE_AGENT_IP"
  in_agent sysctl -qw net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1
  link_rate
}

# agent_cgroup: the agent kubelet's cgroup root in every hierarchy (cpuset's needs its CPUs and memory nodes first).
agent_cgroup() {
  local hierarchy
  for hierarchy in /sys/fs/cgroup/*/; do
    [ -d "$hierarchy$AGENT_CGROUP" ] || mkdir "$hierarchy$AGENT_CGROUP"
  done
  if [ -f /sys/fs/cgroup/cpuset/cpuset.cpus ]; then
    cat /sys/fs/cgroup/cpuset/cpuset.cpus >"/sys/fs/cgroup/cpuset/$AGENT_CGROUP/cpuset.cpus"
    cat /sys/fs/cgroup/cpuset/cpuset.mems >"/sys/fs/cgroup/cpuset/$AGENT_CGROUP/cpuset.mems"
  fi
}

# agent_pki: the agent kubelet's serving and client certificate, and kubeconfigs that reach the API server at NODE_IP.
agent_pki() {
  cert agent-kubelet "system:node:$AGENT_NAME" system:nodes "DNS:$AGENT_NAME,IP:$NODE_AGENT_IP"
  kubeconfig agent-kubelet agent-kubelet "$NODE_IP"
  kubeconfig agent-proxy proxy "$NODE_IP"
  kubeconfig agent-policy policy "$NODE_IP"
}

# down_agent: the agent's processes and containers stopped, its cgroups and network namespace (its link, bridge and
# rules with it) removed. Its mounts go with node 0's, under NODE_ROOT and NODE_RUN.
down_agent() {
  local socket=$NODE_RUN/agent/containerd.sock task name
  stop agent-kubelet
  if [ -S "$socket" ] && running agent-containerd; then
    for task in $(ctr --address "$socket" -n k8s.io tasks ls -q 2>/dev/null); do
      ctr --address "$socket" -n k8s.io tasks kill -s SIGKILL "$task" >/dev/null 2>&1 || true
    done
  fi
  for name in "${AGENT_PROCESSES[@]}"; do stop "$name"; done
  pkill -9 -f "containerd-shim-runc-v2 .*-address $socket" 2>/dev/null || true
  if [ -e "/run/netns/$AGENT_NETNS" ]; then ip netns delete "$AGENT_NETNS"; fi
  if ip link show "$AGENT_LINK" >/dev/null 2>&1; then ip link delete "$AGENT_LINK" 2>/dev/null || true; fi
  for name in /sys/fs/cgroup/*/"$AGENT_CGROUP"; do
    [ -d "$name" ] && find "$name" -depth -type d -exec rmdir {} + 2>/dev/null || true
  done
}
