# shellcheck shell=bash
# Sourced by scripts/cluster/install-engines.sh's install_engine: the engine's install on a cluster.
# shellcheck disable=SC2154  # engines is the caller's

# install_jobset: JobSet from this folder's kustomization (a copy in $engines with its commit filled in).
install_jobset() {
  # Trainer's manager overlay installs the same JobSet into kubeflow-system: one JobSet controller per cluster.
  if kube -n kubeflow-system get deployment jobset-controller-manager >/dev/null 2>&1; then
    echo "JobSet is already installed with Kubeflow Trainer (kubeflow-system); using it"
    return
  fi
  echo "installing JobSet $JOBSET_VERSION (server-side: its CRD is too large for client-side apply)"
  kube apply --server-side -k "$engines/jobset"
  wait_established crd/jobsets.jobset.x-k8s.io
  echo "waiting for the JobSet controller to become available"
  kube -n jobset-system wait --for condition=Available --timeout=300s deployment --all
  kube -n jobset-system get deployments
}

