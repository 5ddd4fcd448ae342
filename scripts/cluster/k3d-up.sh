#!/usr/bin/env bash
# Creates the project's k3d cluster and installs the engine that runs the job (make k3d-up ENGINE=...):
#   tfjob     the Kubeflow training operator TRAINING_OPERATOR_VERSION (TFJob), its standalone overlay at the
#             commit TRAINING_OPERATOR_COMMIT
#   jobset    JobSet JOBSET_VERSION (k8s/engines/jobset: its release's kustomization at the commit JOBSET_COMMIT,
#             into jobset-system)
#   trainjob  Kubeflow Trainer KUBEFLOW_TRAINER_VERSION (k8s/engines/trainjob: its manager overlay's pieces at the
#             commit KUBEFLOW_TRAINER_COMMIT, with that JobSet; then its runtimes at that commit)
# SERVE=1 adds cert-manager, KServe and Argo Workflows (install_serving below); KUEUE=1 adds Kueue KUEUE_VERSION
# (k8s/engines/kueue, at the commit KUEUE_COMMIT) for gang admission of a JobSet or TrainJob (docs/cluster.md); KATIB=1
# adds Katib KATIB_VERSION (k8s/engines/katib) for make tune-cluster (docs/tuning.md). NODES=2 adds an agent node and
# the StorageClass local-path-shared, whose volumes every node mounts (install_shared_storage below; docs/cluster.md).
# The versions, commits, checksums and the Kubernetes minors their CI tests are pinned in the settings file: nothing
# is installed from a moving tag or an unchecked download (docs/security.md).
# Idempotent: a second run finds the cluster and the engine in place, changes nothing and succeeds.
set -euo pipefail

cd "$(dirname "$0")/../.."
# shellcheck source=/dev/null
source scripts/common/settings.sh
load_settings  # the environment wins over the files
check_settings  # every value in its safe character set, before any of them reaches a command

# shellcheck source=/dev/null
source scripts/cluster/install-engines.sh

engine=${ENGINE:-tfjob}
check_engine "$engine"
# upstream MODULE VERSION REPOSITORY COMMIT PATH: where an engine's install.sh reads its upstream's PATH: kustomize's
# remote reference to the repository at the pinned commit.
upstream() {
  echo "$3/$5?ref=$4"
}
context="k3d-${CLUSTER_NAME}"
# NODES=2: k3d's agent node beside the server, and one host folder at the same path in both (SHARED_PATH).
case ${NODES:-1} in
  1) agent= ;;
  2) agent=1 ;;
  *) echo "error: NODES=${NODES} is not 1 or 2: the k3d cluster has its server node and at most one agent (NODES=2)" >&2; exit 2 ;;
esac
SHARED_PATH=/var/lib/distml-shared
# k3d-down.sh names the same folder.
[[ -z $agent ]] || shared_dir=${K3D_SHARED_DIR:-$HOME/.local/share/distml/k3d-$CLUSTER_NAME-shared}
# Where k3s keeps local-path's volumes (its --default-local-storage-path), which the class keeps under NODES=2.
K3S_STORAGE_PATH=/var/lib/rancher/k3s/storage

missing=0
require() {
  local tool=$1 hint=$2
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "error: $tool is not installed. $hint" >&2
    missing=1
  fi
}
require docker "Install Docker Engine (Linux) or Docker Desktop: https://docs.docker.com/get-docker/"
require k3d "Install k3d v5: https://k3d.io/stable/#installation (or: brew install k3d)"
require kubectl "Install kubectl: https://kubernetes.io/docs/tasks/tools/"
# kubectl fetches the operator's and Trainer's kustomizations from GitHub with git.
require git "Install git: https://git-scm.com/downloads"
if [ "$missing" -ne 0 ]; then
  exit 1
fi
if ! docker info >/dev/null 2>&1; then
  echo "error: docker is installed but its daemon does not answer. Start Docker (Desktop), or add this user to the docker group." >&2
  exit 1
fi

# Whether both node containers (k3d names them k3d-NAME-server-0, k3d-NAME-agent-0) mount the shared folder.
shared_on_both_nodes() {
  local node mounts
  for node in "k3d-$CLUSTER_NAME-server-0" "k3d-$CLUSTER_NAME-agent-0"; do
    mounts=$(docker inspect --format '{{range .Mounts}}{{.Destination}} {{end}}' "$node" 2>/dev/null) || return 1
    [[ " $mounts " == *" $SHARED_PATH "* ]] || return 1
  done
}

if k3d cluster get "$CLUSTER_NAME" >/dev/null 2>&1; then
  if [[ -n $agent ]] && ! shared_on_both_nodes; then
    echo "error: cluster $CLUSTER_NAME exists without NODES=2's agent node and shared folder, which k3d cannot add to a cluster: make k3d-down, then make k3d-up NODES=2" >&2
    exit 1
  fi
  # "SERVERS" reads running/total, e.g. 0/1 after a reboot.
  servers=$(k3d cluster list "$CLUSTER_NAME" --no-headers | awk '{print $2}')
  if [ "${servers%%/*}" = "0" ]; then
    echo "cluster $CLUSTER_NAME exists but is stopped; starting it"
    k3d cluster start "$CLUSTER_NAME" --wait
  else
    echo "cluster $CLUSTER_NAME is already running"
  fi
  k3d kubeconfig merge "$CLUSTER_NAME" --kubeconfig-merge-default --kubeconfig-switch-context=false >/dev/null
else
  # The cluster's context joins the kubeconfig, but the current context stays the user's: every command here and in
  # make submit, status, delete, logs and fetch-model names its context (KUBE_CONTEXT, default k3d-CLUSTER_NAME).
  create=(k3d cluster create "$CLUSTER_NAME" --image "$K3S_IMAGE" --wait --kubeconfig-update-default
    --kubeconfig-switch-context=false)
  # K3D_GPUS (e.g. all) hands the host's GPUs to the node containers (docker run --gpus).
  [[ -z ${K3D_GPUS:-} ]] || create+=(--gpus "$K3D_GPUS")
  if [[ -n $agent ]]; then
    # k3s's bundled local-path provisioner off: k3s re-applies its ConfigMap, so it cannot keep a second class;
    # upstream's, installed with both classes, takes its place (install_shared_storage).
    mkdir -p "$shared_dir"
    create+=(--agents 1 --volume "$shared_dir:$SHARED_PATH@all" --k3s-arg "--disable=local-storage@server:*")
  fi
  echo "creating cluster $CLUSTER_NAME with $K3S_IMAGE${K3D_GPUS:+ and GPUs $K3D_GPUS}${agent:+, an agent node and the shared folder $shared_dir}"
  "${create[@]}"
fi
echo "kubectl context: $context (the current context is left as it was)"

kube() { kubectl --context "$context" "$@"; }

scratch=$(mktemp -d)  # the checked downloads, and k8s/engines with its commits filled in
trap 'rm -rf "$scratch"' EXIT
# k8s/engines names each upstream source at a placeholder, the setting that holds its commit (?ref=JOBSET_COMMIT,
# in the engine's own settings.env); the copy applied names the commit.
engines="$scratch/engines"
cp -R k8s/engines "$engines"
declare -A filled=()
while read -r ref; do
  pin=${ref#*=}
  [[ -z ${filled[$pin]:-} ]] || continue
  filled[$pin]=1
  if [[ -z ${!pin:-} ]]; then
    echo "error: a kustomization in k8s/engines names the commit $pin, which no settings file sets: add $pin=<commit> to its engine's settings.env" >&2
    exit 1
  fi
  find "$engines" -name kustomization.yaml -exec sed -i.orig "s/?ref=$pin\$/?ref=${!pin}/" {} +
done < <(grep -rhoE --include=kustomization.yaml '[?]ref=[A-Z_]+$' "$engines")
if grep -rq --include=kustomization.yaml '?ref=[A-Z_]*$' "$engines"; then
  echo "error: a kustomization in k8s/engines names a commit placeholder k3d-up does not fill: $(grep -rl --include=kustomization.yaml '?ref=[A-Z_]*$' "$engines")" >&2
  exit 1
fi

# SERVE=1: what serving and the pipeline need (docs/serving.md): cert-manager (KServe's webhooks), KServe in
# Standard mode (no Knative, no Istio) with its cluster runtimes, and Argo Workflows.
install_serving() {
  echo "installing cert-manager $CERT_MANAGER_VERSION (its release manifest, applied only with the recorded sha256)"
  scripts/cluster/checked-download.sh \
    "https://github.com/cert-manager/cert-manager/releases/download/$CERT_MANAGER_VERSION/cert-manager.yaml" \
    "${CERT_MANAGER_MANIFEST_SHA256:-}" "$scratch/cert-manager.yaml"
  kube apply -f "$scratch/cert-manager.yaml"
  kube -n cert-manager wait --for condition=Available --timeout=300s deployment --all
  # KServe's release embeds its Standard-mode manifests in this script, as heredocs; only those are applied.
  local script="$scratch/kserve-standard-install.sh"
  scripts/cluster/checked-download.sh \
    "https://raw.githubusercontent.com/kserve/kserve/$KSERVE_COMMIT/install/$KSERVE_VERSION/kserve-standard-mode-full-install-with-manifests.sh" \
    "$KSERVE_INSTALL_SCRIPT_SHA256" "$script"
  install_kserve "$script"
  install_argo "$engines/argo-workflows"
}

# KATIB=1: Katib for make tune-cluster (k8s/engines/katib), from its Go module zip, applied only with the recorded sha256.
install_tuning() {
  local zip=$scratch/katib.zip
  scripts/cluster/checked-download.sh "https://proxy.golang.org/github.com/kubeflow/katib/@v/$KATIB_VERSION.zip" \
    "$KATIB_MODULE_ZIP_SHA256" "$zip"
  python3 -m zipfile -e "$zip" "$scratch/katib-module"  # the Python that checked the settings
  # kustomize takes the module's directory relative to the kustomization ($scratch/engines/katib).
  sed -i.orig "s|KATIB_MODULE/|../../katib-module/github.com/kubeflow/katib@$KATIB_VERSION/|" "$engines/katib/kustomization.yaml"
  install_katib "$engines/katib"
}

# NODES=2: upstream's local-path provisioner in place of k3s's, with local-path as k3s has it and local-path-shared
# on the shared folder, rendered by the script the local node uses too; its manifest from the Go module zip, applied
# only with the recorded sha256.
install_shared_storage() {
  local zip=$scratch/local-path.zip module
  echo "installing local-path-provisioner $LOCAL_PATH_PROVISIONER_VERSION: the classes local-path (the default) and local-path-shared (in $shared_dir)"
  scripts/cluster/checked-download.sh \
    "https://proxy.golang.org/github.com/rancher/local-path-provisioner/@v/$LOCAL_PATH_PROVISIONER_VERSION.zip" \
    "$LOCAL_PATH_PROVISIONER_MODULE_ZIP_SHA256" "$zip"
  python3 -m zipfile -e "$zip" "$scratch/local-path-module"  # the Python that checked the settings
  module=$scratch/local-path-module/github.com/rancher/local-path-provisioner@$LOCAL_PATH_PROVISIONER_VERSION
  scripts/cluster/render-local-path.sh "$module/deploy/local-path-storage.yaml" "$K3S_STORAGE_PATH" "$SHARED_PATH" \
    >"$scratch/local-path.yaml"
  kube apply -f "$scratch/local-path.yaml"
  kube -n local-path-storage rollout status deployment/local-path-provisioner --timeout=120s
}

[[ -z $agent ]] || install_shared_storage
install_engine "$engine" "${KUEUE:-}"
if [[ -n ${KUEUE:-} ]]; then
  echo "ready: kubectl --context $context apply -f k8s/engines/kueue/queues.yaml (docs/cluster.md)"
fi
if [[ -n ${SERVE:-} ]]; then
  install_serving
  echo "ready: make submit-pipeline ENGINE=$engine, then make serve-cluster"
fi
if [[ -n ${KATIB:-} ]]; then
  install_tuning
  echo "ready: make tune-cluster ENGINE=$engine"
fi
# Two nodes: a job's pods spread over both, so its volume must be one both mount (docs/cluster.md).
echo "ready: make submit ENGINE=$engine${agent:+ VOLUME_ACCESS_MODE=ReadWriteMany VOLUME_STORAGE_CLASS=local-path-shared}"
