# shellcheck shell=bash
# Sourced by scripts/cluster/install-engines.sh's install_engine: the engine's install on a cluster.

# install_tfjob: the training operator (TFJob) from its standalone overlay, at its pinned module version or commit
# (the caller's upstream says where: k3d's from GitHub, the local node's from the Go module cache).
install_tfjob() {
  local source
  source=$(upstream github.com/kubeflow/training-operator "$TRAINING_OPERATOR_VERSION" github.com/kubeflow/trainer.git \
    "$TRAINING_OPERATOR_COMMIT" manifests/overlays/standalone)
  echo "installing the training operator $TRAINING_OPERATOR_VERSION (server-side: its CRDs are too large for client-side apply)"
  kube apply --server-side -k "$source"
  wait_established crd/tfjobs.kubeflow.org
  echo "waiting for the operator to become available"
  kube -n kubeflow wait --for condition=Available --timeout=300s deployment --all
  kube -n kubeflow get deployments
}

