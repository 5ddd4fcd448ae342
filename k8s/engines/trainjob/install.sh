# shellcheck shell=bash
# Sourced by scripts/cluster/install-engines.sh's install_engine: the engine's install on a cluster.
# shellcheck disable=SC2154  # engines is the caller's

# install_trainjob: Kubeflow Trainer with its JobSet, then its cluster runtimes, at its pinned module version or commit
# (the caller's upstream says where: k3d's from GitHub, the local node's from the Go module cache).
install_trainjob() {
  local runtimes
  runtimes=$(upstream github.com/kubeflow/trainer/v2 "$KUBEFLOW_TRAINER_VERSION" github.com/kubeflow/trainer.git \
    "$KUBEFLOW_TRAINER_COMMIT" manifests/overlays/runtimes)
  if kube -n jobset-system get deployment jobset-controller-manager >/dev/null 2>&1; then
    echo "error: JobSet is installed on its own (jobset-system, ENGINE=jobset), and Kubeflow Trainer would install a second JobSet controller. Remove the first: delete the cluster and start again, or kubectl delete -k on a copy of k8s/engines/jobset with JOBSET_COMMIT replaced by its value in the settings" >&2
    exit 1
  fi
  echo "installing Kubeflow Trainer $KUBEFLOW_TRAINER_VERSION with its JobSet (server-side: the CRDs are too large for client-side apply)"
  kube apply --server-side -k "$engines/trainjob"
  wait_established crd/trainjobs.trainer.kubeflow.org crd/jobsets.jobset.x-k8s.io
  echo "waiting for the Trainer and JobSet controllers to become available"
  kube -n kubeflow-system wait --for condition=Available --timeout=300s deployment --all
  # The runtimes go through Trainer's webhook, which answers once the manager is available.
  kube apply --server-side -k "$runtimes"
  kube -n kubeflow-system get deployments
}

