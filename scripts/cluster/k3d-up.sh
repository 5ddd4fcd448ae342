#!/usr/bin/env bash
# Creates the project's k3d cluster and installs the engine that runs the job (make k3d-up ENGINE=...):
#   tfjob     the Kubeflow training operator TRAINING_OPERATOR_VERSION (TFJob), its standalone overlay at the
#             commit TRAINING_OPERATOR_COMMIT
#   jobset    JobSet JOBSET_VERSION (its release manifest, into jobset-system), checked against JOBSET_MANIFEST_SHA256
#   trainjob  Kubeflow Trainer KUBEFLOW_TRAINER_VERSION (k8s/engines/trainer: its manager overlay's pieces at the
#             commit KUBEFLOW_TRAINER_COMMIT, with the checked JobSet release; then its runtimes at that commit)
# The versions, commits, checksums and the Kubernetes minors their CI tests are pinned in the settings file: nothing
# is installed from a moving tag or an unchecked download (docs/security.md).
# Idempotent: a second run finds the cluster and the engine in place, changes nothing and succeeds.
set -euo pipefail

cd "$(dirname "$0")/../.."
# shellcheck source=/dev/null
source scripts/common/settings.sh
load_settings k8s/base/settings.env  # the environment wins over the file
check_settings  # every value in its safe character set, before any of them reaches a command

engine=${ENGINE:-tfjob}
case "$engine" in
  tfjob | jobset | trainjob) ;;
  *)
    echo "error: ENGINE=$engine is not an engine: use tfjob, jobset or trainjob" >&2
    exit 2
    ;;
esac
operator_source="github.com/kubeflow/trainer.git/manifests/overlays/standalone?ref=${TRAINING_OPERATOR_COMMIT}"
jobset_release="https://github.com/kubernetes-sigs/jobset/releases/download/${JOBSET_VERSION}/manifests.yaml"
trainer_runtimes="github.com/kubeflow/trainer.git/manifests/overlays/runtimes?ref=${KUBEFLOW_TRAINER_COMMIT}"
# The JobSet release manifest, downloaded and kept only when its sha256 is the recorded one.
checked_jobset() {
  scripts/cluster/checked-download.sh "$jobset_release" "${JOBSET_MANIFEST_SHA256:-}" "$1"
}
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
# kubectl fetches the operator's and Trainer's kustomizations from GitHub with git.
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
  k3d kubeconfig merge "$CLUSTER_NAME" --kubeconfig-merge-default --kubeconfig-switch-context=false >/dev/null
else
  # The cluster's context joins the kubeconfig, but the current context stays the user's: every command here and in
  # make submit, status, delete, logs and fetch-model names its context (KUBE_CONTEXT, default k3d-CLUSTER_NAME).
  create=(k3d cluster create "$CLUSTER_NAME" --image "$K3S_IMAGE" --wait --kubeconfig-update-default
    --kubeconfig-switch-context=false)
  # K3D_GPUS (e.g. all) hands the host's GPUs to the node containers (docker run --gpus).
  [[ -z ${K3D_GPUS:-} ]] || create+=(--gpus "$K3D_GPUS")
  echo "creating cluster $CLUSTER_NAME with $K3S_IMAGE${K3D_GPUS:+ and GPUs $K3D_GPUS}"
  "${create[@]}"
fi
echo "kubectl context: $context (the current context is left as it was)"

kube() { kubectl --context "$context" "$@"; }

install_operator() {
  echo "installing the training operator $TRAINING_OPERATOR_VERSION (server-side: its CRDs are too large for client-side apply)"
  kube apply --server-side -k "$operator_source"
  kube wait --for condition=established --timeout=120s crd/tfjobs.kubeflow.org
  echo "waiting for the operator to become available"
  kube -n kubeflow wait --for condition=Available --timeout=300s deployment --all
  kube -n kubeflow get deployments
}

install_jobset() {
  # Trainer's manager overlay installs the same JobSet into kubeflow-system: one JobSet controller per cluster.
  if kube -n kubeflow-system get deployment jobset-controller-manager >/dev/null 2>&1; then
    echo "JobSet is already installed with Kubeflow Trainer (kubeflow-system); using it"
    return
  fi
  echo "installing JobSet $JOBSET_VERSION (server-side: its CRD is too large for client-side apply)"
  checked_jobset "$scratch/jobset-manifests.yaml"
  kube apply --server-side -f "$scratch/jobset-manifests.yaml"
  kube wait --for condition=established --timeout=120s crd/jobsets.jobset.x-k8s.io
  echo "waiting for the JobSet controller to become available"
  kube -n jobset-system wait --for condition=Available --timeout=300s deployment --all
  kube -n jobset-system get deployments
}

install_trainer() {
  if kube -n jobset-system get deployment jobset-controller-manager >/dev/null 2>&1; then
    echo "error: JobSet is installed on its own (jobset-system, make k3d-up ENGINE=jobset), and Kubeflow Trainer would install a second JobSet controller. Remove the first: kubectl --context $context delete -f $jobset_release (or make k3d-down and start again)" >&2
    exit 1
  fi
  echo "installing Kubeflow Trainer $KUBEFLOW_TRAINER_VERSION with its JobSet (server-side: the CRDs are too large for client-side apply)"
  cp -R k8s/engines/trainer "$scratch/trainer"
  sed -i.orig "s/KUBEFLOW_TRAINER_COMMIT/${KUBEFLOW_TRAINER_COMMIT}/" "$scratch/trainer/kustomization.yaml"
  checked_jobset "$scratch/trainer/jobset-manifests.yaml"
  kube apply --server-side -k "$scratch/trainer"
  kube wait --for condition=established --timeout=120s crd/trainjobs.trainer.kubeflow.org crd/jobsets.jobset.x-k8s.io
  echo "waiting for the Trainer and JobSet controllers to become available"
  kube -n kubeflow-system wait --for condition=Available --timeout=300s deployment --all
  # The runtimes go through Trainer's webhook, which answers once the manager is available.
  kube apply --server-side -k "$trainer_runtimes"
  kube -n kubeflow-system get deployments
}

scratch=$(mktemp -d)  # the checked downloads and the kustomization that reads them
trap 'rm -rf "$scratch"' EXIT

# SERVE=1: what serving and the pipeline need (docs/serving.md): cert-manager (KServe's webhooks), KServe in
# Standard mode (no Knative, no Istio) with its cluster runtimes, and Argo Workflows; each release manifest applied
# only when its sha256 is the one recorded in k8s/base/settings.env (scripts/cluster/checked-download.sh).
install_serving() {
  local releases=https://github.com
  echo "installing cert-manager $CERT_MANAGER_VERSION"
  scripts/cluster/checked-download.sh \
    "$releases/cert-manager/cert-manager/releases/download/$CERT_MANAGER_VERSION/cert-manager.yaml" \
    "${CERT_MANAGER_MANIFEST_SHA256:-}" "$scratch/cert-manager.yaml"
  kube apply -f "$scratch/cert-manager.yaml"
  kube -n cert-manager wait --for condition=Available --timeout=300s deployment --all
  echo "installing KServe $KSERVE_VERSION (server-side: its CRDs are too large for client-side apply)"
  scripts/cluster/checked-download.sh "$releases/kserve/kserve/releases/download/$KSERVE_VERSION/kserve.yaml" \
    "${KSERVE_MANIFEST_SHA256:-}" "$scratch/kserve.yaml"
  kube apply --server-side -f "$scratch/kserve.yaml"
  kube -n kserve wait --for condition=Available --timeout=300s deployment --all
  # The cluster runtimes go through KServe's webhook, which answers once the controller is available.
  scripts/cluster/checked-download.sh \
    "$releases/kserve/kserve/releases/download/$KSERVE_VERSION/kserve-cluster-resources.yaml" \
    "${KSERVE_RUNTIMES_MANIFEST_SHA256:-}" "$scratch/kserve-cluster-resources.yaml"
  kube apply --server-side -f "$scratch/kserve-cluster-resources.yaml"
  echo "installing Argo Workflows $ARGO_WORKFLOWS_VERSION"
  scripts/cluster/checked-download.sh \
    "$releases/argoproj/argo-workflows/releases/download/$ARGO_WORKFLOWS_VERSION/install.yaml" \
    "${ARGO_WORKFLOWS_MANIFEST_SHA256:-}" "$scratch/argo-install.yaml"
  kube create namespace argo --dry-run=client -o yaml | kube apply -f -
  kube apply --server-side -n argo -f "$scratch/argo-install.yaml"
  kube -n argo wait --for condition=Available --timeout=300s deployment --all
}

case "$engine" in
  tfjob) install_operator ;;
  jobset) install_jobset ;;
  trainjob) install_trainer ;;
esac
if [[ -n ${SERVE:-} ]]; then
  install_serving
  echo "ready: make submit-pipeline ENGINE=$engine, then make serve-cluster"
fi
echo "ready: make submit ENGINE=$engine"
