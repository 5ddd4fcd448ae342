# shellcheck shell=bash
# Sourced by scripts/cluster/install-engines.sh's install_engine: the engine's install on a cluster.

# install_tfjob SOURCE _: the training operator (TFJob) from its standalone overlay at SOURCE.
install_tfjob() {
  echo "installing the training operator $TRAINING_OPERATOR_VERSION (server-side: its CRDs are too large for client-side apply)"
  kube apply --server-side -k "$1"
  wait_established crd/tfjobs.kubeflow.org
  echo "waiting for the operator to become available"
  kube -n kubeflow wait --for condition=Available --timeout=300s deployment --all
  kube -n kubeflow get deployments
}

