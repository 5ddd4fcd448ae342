#!/usr/bin/env bash
# make link-rate: the agent node's link (make cluster-up NODES=2) limited to NODE_LINK_RATE each way, now, as cluster-up
# sets it (nodes.sh's link_rate: tbf, a bucket of one millisecond at the rate); unlimited when it is empty. make
# bench-cluster sets each of its rates so, between jobs. Prints each end's root qdisc.
set -euo pipefail

cd "$(dirname "$0")/../.."
# shellcheck source=/dev/null
source scripts/node/common.sh  # the settings, checked, and the node's names
# shellcheck source=/dev/null
source scripts/node/nodes.sh  # the agent's link, and link_rate

as_root link-rate "shapes the agent's link with tc" || exit 1
if ! ip link show "$AGENT_LINK" >/dev/null 2>&1; then
  echo "error: no agent node here (no link $AGENT_LINK): make cluster-up NODES=2 adds it" >&2
  exit 1
fi
link_rate
echo "the link to $AGENT_NAME: ${NODE_LINK_RATE:-unlimited} each way"
tc qdisc show dev "$AGENT_LINK" root
in_agent tc qdisc show dev eth0 root
