#!/usr/bin/env bash
# make cluster-up: a single-node Kubernetes as local processes, in the shape of Kubernetes' own
# hack/local-up-cluster.sh, for a machine with no Docker engine: etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, containerd (Debian's, with runc and the CNI bridge plugins), kubelet, kube-proxy and CoreDNS, then
# the local-path StorageClass k3d has and the training operator, from images built here (build.sh). Secured as a
# real cluster: TLS on every connection, Node,RBAC authorization, service-account tokens, PodSecurity admission.
# Adds the kube context node-CLUSTER_NAME and leaves the current context alone. Idempotent: a second run finds
# the processes up and only checks them.
set -euo pipefail

cd "$(dirname "$0")/../.."
# shellcheck source=/dev/null
source scripts/node/common.sh  # the settings, checked, and the node's names
# shellcheck source=/dev/null
source scripts/node/nodes.sh  # node 0 and the agent: their names, places and network
# shellcheck source=/dev/null
source scripts/cluster/install-engines.sh

# Every problem at once, each in one line with its fix: not root, a missing tool, a port another process holds.
preflight() {
  local problems=0 tool owner port owner_port
  as_root cluster-up "runs containers and sets up networking" || problems=1
  for tool in go containerd runc ctr iptables ipset conntrack openssl buildah kubectl ss ${AGENT:+nsenter tc}; do
    if ! command -v "$tool" >/dev/null; then
      echo "error: $tool is not installed: $(install_hint "$tool")" >&2
      problems=1
    fi
  done
  if [[ -n ${SERVE:-} && ! -x $PY ]]; then
    echo "error: SERVE=1 reads KServe's manifest with the project's Python ($PY): run make install first, or make cluster-up SERVE=1, which does" >&2
    problems=1
  fi
  if [[ -n ${KATIB:-} ]] && ! compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null; then
    echo "error: KATIB=1 makes Katib's database image from Debian's PostgreSQL: apt-get install postgresql" >&2
    problems=1
  fi
  if [ ! -x "$NODE_CNI_BIN/bridge" ]; then
    echo "error: the CNI plugins are not in $NODE_CNI_BIN: apt-get install containernetworking-plugins, or set NODE_CNI_BIN" >&2
    problems=1
  fi
  if command -v ss >/dev/null; then
    for owner_port in apiserver:"$NODE_API_PORT" etcd:2379 etcd:2380 kubelet:10250 proxy:10256 \
      controller-manager:10257 scheduler:10259 policy:20244; do
      owner=${owner_port%%:*} port=${owner_port#*:}
      if ! running "$owner" && port_taken "$port"; then
        echo "error: port $port is taken by another process ($(port_owner "$port")): stop it, or run make cluster-down" >&2
        problems=1
      fi
    done
  fi
  [ "$problems" -eq 0 ] || exit 1
}

network() {
  # Pods reach the node at NODE_IP: an address on lo (this kernel has no dummy links), which no other host sees.
  # (a test, not grep -q in a pipe: under pipefail an early grep exit fails the pipe)
  [[ $(ip -o addr show dev lo) == *" $NODE_IP/32 "* ]] || ip addr add "$NODE_IP/32" dev lo
  modprobe br_netfilter 2>/dev/null || true
  sysctl -qw net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1
}

# pod_network K: node K's bridge (its CNI configuration, on node K's pod range) and its masquerade: pods reach
# addresses outside the cluster's pod range as their node, and the other node's pods as themselves.
pod_network() {
  node "$1"
  mkdir -p "$N_ROOT/cni"
  cat >"$N_ROOT/cni/10-distml.conflist" <<EOF
{"cniVersion": "1.0.0", "name": "distml", "plugins": [
  {"type": "bridge", "bridge": "$NODE_BRIDGE", "isGateway": true, "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "$N_RANGE"}]], "routes": [{"dst": "0.0.0.0/0"}],
            "dataDir": "$N_ROOT/cni/ipam"}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}
EOF
  "${N_IN[@]}" iptables -t nat -N DISTML-MASQ 2>/dev/null || true
  "${N_IN[@]}" iptables -t nat -F DISTML-MASQ
  "${N_IN[@]}" iptables -t nat -A DISTML-MASQ -d "$NODE_POD_CIDR" -j RETURN
  "${N_IN[@]}" iptables -t nat -A DISTML-MASQ -j MASQUERADE
  "${N_IN[@]}" iptables -t nat -C POSTROUTING -s "$N_RANGE" -j DISTML-MASQ 2>/dev/null ||
    "${N_IN[@]}" iptables -t nat -A POSTROUTING -s "$N_RANGE" -j DISTML-MASQ
}

start_etcd() {
  running etcd && return
  launch etcd "$BIN/etcd-$NODE_ETCD_VERSION" --name "$CLUSTER_NAME" --data-dir "$NODE_ROOT/etcd" \
    --listen-client-urls https://127.0.0.1:2379 --advertise-client-urls https://127.0.0.1:2379 \
    --listen-peer-urls http://127.0.0.1:2380 --listen-metrics-urls http://127.0.0.1:2381 \
    --cert-file "$PKI/etcd.crt" --key-file "$PKI/etcd.key" --client-cert-auth --trusted-ca-file "$PKI/ca.crt"
  wait_for "etcd" curl -sf http://127.0.0.1:2381/health
}

# Aggregated APIs (Kueue's visibility API) are reached at their endpoints, as Kueue's own e2e clusters run the API
# server (hack/testing/kind-cluster.yaml): through the Service's ClusterIP from this host process, their discovery went
# stale and every namespace deletion hung (NamespaceDeletionDiscoveryFailure). Webhooks are called the same way.
start_apiserver() {
  running apiserver && return
  launch apiserver "$K8S_BIN/kube-apiserver" --etcd-servers https://127.0.0.1:2379 \
    --etcd-cafile "$PKI/ca.crt" --etcd-certfile "$PKI/apiserver-etcd.crt" --etcd-keyfile "$PKI/apiserver-etcd.key" \
    --bind-address 0.0.0.0 --secure-port "$NODE_API_PORT" --advertise-address "$NODE_IP" \
    --tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" --client-ca-file "$PKI/ca.crt" \
    --kubelet-client-certificate "$PKI/apiserver-kubelet.crt" --kubelet-client-key "$PKI/apiserver-kubelet.key" \
    --kubelet-certificate-authority "$PKI/ca.crt" --kubelet-preferred-address-types InternalIP \
    --service-account-key-file "$PKI/sa.pub" --service-account-signing-key-file "$PKI/sa.key" \
    --service-account-issuer https://kubernetes.default.svc --api-audiences https://kubernetes.default.svc \
    --service-cluster-ip-range "$NODE_SERVICE_CIDR" --authorization-mode Node,RBAC --allow-privileged=true \
    --enable-admission-plugins NodeRestriction,PodSecurity \
    --requestheader-client-ca-file "$PKI/front-proxy-ca.crt" --requestheader-allowed-names front-proxy-client \
    --requestheader-username-headers X-Remote-User --requestheader-group-headers X-Remote-Group \
    --requestheader-extra-headers-prefix X-Remote-Extra- \
    --proxy-client-cert-file "$PKI/front-proxy-client.crt" --proxy-client-key-file "$PKI/front-proxy-client.key" \
    --enable-aggregator-routing=true
  wait_for "kube-apiserver" kubectl --kubeconfig "$NODE_ROOT/admin.kubeconfig" get --raw /readyz
}

start_controllers() {
  running controller-manager || launch controller-manager "$K8S_BIN/kube-controller-manager" \
    --kubeconfig "$NODE_ROOT/controller-manager.kubeconfig" \
    --authentication-kubeconfig "$NODE_ROOT/controller-manager.kubeconfig" \
    --authorization-kubeconfig "$NODE_ROOT/controller-manager.kubeconfig" \
    --service-account-private-key-file "$PKI/sa.key" --root-ca-file "$PKI/ca.crt" \
    --cluster-signing-cert-file "$PKI/ca.crt" --cluster-signing-key-file "$PKI/ca.key" \
    --use-service-account-credentials --leader-elect=false --bind-address 127.0.0.1 \
    --service-cluster-ip-range "$NODE_SERVICE_CIDR"
  running scheduler || launch scheduler "$K8S_BIN/kube-scheduler" --kubeconfig "$NODE_ROOT/scheduler.kubeconfig" \
    --authentication-kubeconfig "$NODE_ROOT/scheduler.kubeconfig" \
    --authorization-kubeconfig "$NODE_ROOT/scheduler.kubeconfig" --leader-elect=false --bind-address 127.0.0.1
}

start_containerd() {
  node "$1"
  running "${N_PREFIX}containerd" && return
  mkdir -p "$N_ROOT/containerd" "$N_RUN"
  cat >"$N_ROOT/containerd.toml" <<EOF
version = 2
root = "$N_ROOT/containerd"
state = "$N_RUN/containerd"
[grpc]
  address = "$N_RUN/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.k8s.io/pause:$NODE_PAUSE_VERSION"
  # The kubelet asks for negative OOM scores, which need CAP_SYS_RESOURCE; these VMs withhold it from root.
  restrict_oom_score_adj = true
  # The pods' network namespaces under the node's own state directory, not /run/netns: once anything on the host runs
  # "ip netns", /run/netns is a shared bind of itself, each namespace mounted there is mounted twice, and removing a
  # sandbox fails ("unlinkat /run/netns/cni-...: device or resource busy"), leaving its pod's status unknown.
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$NODE_CNI_BIN"
    conf_dir = "$N_ROOT/cni"
EOF
  launch "${N_PREFIX}containerd" "${N_IN[@]}" containerd --config "$N_ROOT/containerd.toml"
  wait_for "${N_PREFIX}containerd" ctr --address "$N_RUN/containerd.sock" version
}

import_images() {
  local archive
  node "$1"
  for archive in "$NODE_CACHE"/images/*.tar; do
    ctr --address "$N_RUN/containerd.sock" -n k8s.io images import "$archive" >/dev/null
  done
}

start_kubelet() {
  node "$1"
  running "${N_PREFIX}kubelet" && return
  mkdir -p "$N_ROOT/kubelet" "$N_ROOT/pod-logs"
  cat >"$N_ROOT/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization: {mode: Webhook}
tlsCertFile: $PKI/${N_PREFIX}kubelet.crt
tlsPrivateKeyFile: $PKI/${N_PREFIX}kubelet.key
containerRuntimeEndpoint: unix://$N_RUN/containerd.sock
# cgroup v1 is deprecated from 1.35 (KEP-5573); these VMs have it, and cgroupfs is how containerd runs runc here.
failCgroupV1: false
cgroupDriver: cgroupfs
# Each node's pods under its own cgroup and log directory: a kubelet removes what it finds there and does not own.
cgroupRoot: $N_CGROUP
podLogsDir: $N_ROOT/pod-logs
clusterDNS: [$NODE_IP]
clusterDomain: cluster.local
resolvConf: ""
failSwapOn: false
# A test VM's disk is shared: evict on nothing but real exhaustion, and never collect the imported images.
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
maxPods: 60
EOF
  launch "${N_PREFIX}kubelet" "${N_IN[@]}" "$K8S_BIN/kubelet" --config "$N_ROOT/kubelet.yaml" \
    --kubeconfig "$NODE_ROOT/${N_PREFIX}kubelet.kubeconfig" --hostname-override "$N_NAME" --node-ip "$N_IP" \
    --root-dir "$N_ROOT/kubelet"
  wait_for "the node $N_NAME to be Ready" kube wait --for=condition=Ready "node/$N_NAME" --timeout=5s
}

start_proxy() {
  node "$1"
  running "${N_PREFIX}proxy" && return
  cat >"$N_ROOT/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $NODE_ROOT/${N_PREFIX}proxy.kubeconfig}
hostnameOverride: $N_NAME
mode: iptables
clusterCIDR: $NODE_POD_CIDR
# A VM's conntrack table is the host's to size.
conntrack: {maxPerCore: 0}
EOF
  launch "${N_PREFIX}proxy" "${N_IN[@]}" "$K8S_BIN/kube-proxy" --config "$N_ROOT/kube-proxy.yaml"
}

# NetworkPolicies are enforced by kube-router's firewall alone, in the iptables kube-proxy uses: on the bridge's
# forwarded traffic (br_netfilter above) and on what the other node routes in.
start_policy() {
  node "$1"
  running "${N_PREFIX}policy" && return
  launch "${N_PREFIX}policy" "${N_IN[@]}" "$BIN/kube-router-$NODE_KUBE_ROUTER_VERSION" \
    --kubeconfig "$NODE_ROOT/${N_PREFIX}policy.kubeconfig" --run-firewall=true --run-router=false \
    --run-service-proxy=false --enable-cni=false --enable-ipv6=false --hostname-override "$N_NAME" \
    --service-cluster-ip-range "$NODE_SERVICE_CIDR" --metrics-port 0
}

start_dns() {
  running coredns && return
  cat >"$NODE_ROOT/Corefile" <<EOF
.:53 {
    bind $NODE_IP
    errors
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        endpoint https://127.0.0.1:$NODE_API_PORT
        kubeconfig $NODE_ROOT/coredns.kubeconfig $NODE_CONTEXT
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }
    cache 5
}
EOF
  kube apply -f scripts/node/node-rbac.yaml >/dev/null
  launch coredns "$BIN/coredns-$NODE_COREDNS_VERSION" -conf "$NODE_ROOT/Corefile"
}

install_storage() {
  local provisioner manifest
  provisioner=$(module_dir github.com/rancher/local-path-provisioner "$LOCAL_PATH_PROVISIONER_VERSION")
  mkdir -p "$NODE_ROOT/storage" "$NODE_ROOT/shared"
  # The nodes share the VM's disk: NODE_ROOT/shared is one folder to both (scripts/cluster/render-local-path.sh, as
  # k3d-up NODES=2 renders it). Rendered whole before anything is applied.
  manifest=$(scripts/cluster/render-local-path.sh "$provisioner/deploy/local-path-storage.yaml" "$NODE_ROOT/storage" \
    "$NODE_ROOT/shared")
  kube apply -f - <<<"$manifest" >/dev/null
  kube -n local-path-storage rollout status deployment/local-path-provisioner --timeout=120s
}

# The engine ENGINE names (and Kueue with KUEUE=1), as k3d-up installs it, from the pinned modules' own manifests;
# a second cluster-up with another engine adds it.
# upstream MODULE VERSION REPOSITORY COMMIT PATH: where an engine's install.sh reads its upstream's PATH: the pinned
# module's files in the Go module cache.
upstream() {
  echo "$(module_dir "$1" "$2")/$5"
}

install_engines() {
  engines=$(mktemp -d)/engines
  render_engines "$engines"
  install_engine "$engine" "${KUEUE:-}" >/dev/null
  rm -rf "$(dirname "$engines")"
}

# KATIB=1: Katib as k3d-up KATIB=1 installs it, from the same module, with the node's own PostgreSQL image.
node_katib() {
  local katib
  katib=$(mktemp -d)/katib
  render_katib "$katib"
  install_katib "$katib"
  rm -rf "$(dirname "$katib")"
}

# SERVE=1: KServe and Argo Workflows as k3d-up SERVE=1 installs them, from the pinned modules' own files. The
# certificate of KServe's webhooks, which cert-manager makes on k3d, is made here, signed by a CA of the node's.
install_serving() {
  local script argo_module argo
  script=$(kserve_install_script)
  install_kserve "$script" node_kserve_core
  argo_module=$(module_dir github.com/argoproj/argo-workflows/v4 "$NODE_ARGO_WORKFLOWS_VERSION")
  argo=$(mktemp -d)/argo-workflows
  cp -R k8s/engines/argo-workflows "$argo"
  sed -i -e "s|github.com/argoproj/argo-workflows.git/\(.*\)?ref=ARGO_WORKFLOWS_COMMIT\$|$(realpath --relative-to "$argo" "$argo_module")/\1|" \
    -e "s|newTag: $ARGO_WORKFLOWS_VERSION\$|newTag: $NODE_ARGO_WORKFLOWS_VERSION|" "$argo/kustomization.yaml"
  cat >>"$argo/kustomization.yaml" <<'EOF_PATCH'

patches:
  - target: {kind: Deployment, name: argo-server}
    patch: |-
      - {op: replace, path: /spec/replicas, value: 0}
EOF_PATCH
  install_argo "$argo"
  rm -rf "$(dirname "$argo")"
}

# node_kserve_core: KServe's core manifest (stdin to stdout) as the node runs it: without cert-manager's objects, with
# the serving certificate its Certificate names and the CA in its webhooks' caBundle (scripts/node/webhook_certs.py);
# and its controller's image, built here, used as present (the one pull policy there that forces a pull).
node_kserve_core() {
  local manifest ref secret dns
  manifest=$(cat)
  read -r ref secret dns <<<"$("$PY" -m scripts.node.webhook_certs names <<<"$manifest")"
  [ -n "$dns" ] || { echo "error: KServe's core manifest names no cert-manager Certificate; check KSERVE_VERSION" >&2; exit 1; }
  ca webhook-ca "$CLUSTER_NAME-webhook-ca"
  cert webhook "${dns%%,*}" "" "DNS:${dns//,/,DNS:}" webhook-ca
  echo "  $ref: the serving certificate for $dns in the Secret $secret, signed by the node's webhook CA" >&2
  "$PY" -m scripts.node.webhook_certs inject --ca "$PKI/webhook-ca.crt" --cert "$PKI/webhook.crt" \
    --key "$PKI/webhook.key" <<<"$manifest" | sed 's/imagePullPolicy: Always$/imagePullPolicy: IfNotPresent/'
}

# After a crash or a reboot (no node process alive, its state left behind), start clean: the old containers, mounts
# and rules would otherwise stand in the new node's way. A node with some processes alive only gets the missing ones.
recover() {
  local name
  for name in "${NODE_PROCESSES[@]}"; do running "$name" && return; done
  if [ -d "$NODE_ROOT" ] || [ -d "$NODE_RUN" ]; then
    echo "no process of the node $NODE_CONTEXT is alive but its state is left: removing it first (make cluster-down)"
    scripts/node/down.sh
  fi
}

engine=${ENGINE:-tfjob}
PY=${PY:-.venv/bin/python}  # make cluster-up passes the venv's (make install)
case ${NODES:-1} in
  1) AGENT= ;;
  2) AGENT=1 ;;
  *) echo "error: NODES=${NODES} is not 1 or 2: the local cluster has the host's node and at most one agent" >&2; exit 1 ;;
esac
check_engine "$engine"
preflight
recover
scripts/node/build.sh
echo "starting the node $NODE_NAME (logs in $NODE_ROOT/logs)"
make_pki
network
pod_network 0
start_etcd
start_apiserver
start_controllers
start_containerd 0
import_images 0
start_kubelet 0
start_proxy 0
start_dns
start_policy 0
if [[ -n $AGENT ]]; then
  echo "starting the node $AGENT_NAME in the network namespace $AGENT_NETNS (link rate: ${NODE_LINK_RATE:-unlimited})"
  agent_pki
  agent_network
  agent_cgroup
  pod_network 1
  start_containerd 1
  import_images 1
  start_kubelet 1
  start_proxy 1
  start_policy 1
  # The add-ons' controllers go to node 0, as on a cluster whose system pods have nodes of their own: a lost agent
  # (make agent-down) takes workloads with it, not the controllers that recover them.
  kube cordon "$AGENT_NAME" >/dev/null
  trap 'kube uncordon "$AGENT_NAME" >/dev/null 2>&1 || true' EXIT
fi
install_storage
install_engines
[[ -z ${SERVE:-} ]] || install_serving
[[ -z ${KATIB:-} ]] || node_katib
[[ -z $AGENT ]] || kube uncordon "$AGENT_NAME" >/dev/null
add_context
echo "cluster ready: kubectl --context $NODE_CONTEXT; the cluster commands: make submit KUBE_CONTEXT=$NODE_CONTEXT"
