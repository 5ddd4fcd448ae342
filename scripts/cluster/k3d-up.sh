#!/usr/bin/env bash
# Creates the project's k3d cluster and installs the Kubeflow training operator (make k3d-up).
# Idempotent: a second run finds the cluster and the operator in place, changes nothing and succeeds.
set -euo pipefail

cd "$(dirname "$0")/../.."
# shellcheck source=/dev/null
source scripts/common/settings.sh
load_settings k8s/base/settings.env  # the environment wins over the file

operator_source="github.com/kubeflow/training-operator.git/manifests/overlays/standalone?ref=${TRAINING_OPERATOR_VERSION}"
context="k3d-${CLUSTER_NAME}"

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
# kubectl fetches the operator's kustomization from GitHub with git.
require git "Install git: https://git-scm.com/downloads"
if [ "$missing" -ne 0 ]; then
  exit 1
fi
if ! docker info >/dev/null 2>&1; then
  echo "error: docker is installed but its daemon does not answer. Start Docker (Desktop), or add this user to the docker group." >&2
  exit 1
fi

if k3d cluster get "$CLUSTER_NAME" >/dev/null 2>&1; then
  # "SERVERS" reads running/total, e.g. 0/1 after a reboot.
  servers=$(k3d cluster list "$CLUSTER_NAME" --no-headers | awk '{print $2}')
  if [ "${servers%%/*}" = "0" ]; then
    echo "cluster $CLUSTER_NAME exists but is stopped; starting it"
    k3d cluster start "$CLUSTER_NAME" --wait
  else
    echo "cluster $CLUSTER_NAME is already running"
  fi
  k3d kubeconfig merge "$CLUSTER_NAME" --kubeconfig-merge-default --kubeconfig-switch-context >/dev/null
else
  create=(k3d cluster create "$CLUSTER_NAME" --image "$K3S_IMAGE" --wait --kubeconfig-update-default
    --kubeconfig-switch-context)
  # K3D_GPUS (e.g. all) hands the host's GPUs to the node containers (docker run --gpus).
  [[ -z ${K3D_GPUS:-} ]] || create+=(--gpus "$K3D_GPUS")
  echo "creating cluster $CLUSTER_NAME with $K3S_IMAGE${K3D_GPUS:+ and GPUs $K3D_GPUS}"
  "${create[@]}"
fi
echo "kubectl context: $(kubectl config current-context)"

echo "installing the training operator $TRAINING_OPERATOR_VERSION (server-side: its CRDs are too large for client-side apply)"
kubectl --context "$context" apply --server-side -k "$operator_source"
kubectl --context "$context" wait --for condition=established --timeout=120s crd/tfjobs.kubeflow.org
echo "waiting for the operator to become available"
kubectl --context "$context" -n kubeflow wait --for condition=Available --timeout=300s deployment --all
kubectl --context "$context" -n kubeflow get deployments
echo "ready: make submit"
