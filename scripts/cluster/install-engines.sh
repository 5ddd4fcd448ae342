# shellcheck shell=bash
# Sourced by the cluster set-ups (k3d-up.sh, scripts/node/up.sh) after load_settings: installs the engine that runs the job,
# Kueue, and what serving and the pipeline need (KServe, Argo Workflows). The caller defines `kube` (kubectl on its context) and `engines` (a copy of k8s/engines whose upstream
# sources it has pinned: commits on GitHub for k3d, the Go module cache for the local node).
# shellcheck disable=SC2154  # engines is the caller's

# check_engine ENGINE: an engine folder (k8s/engines/ENGINE/engine.env, whose install.sh install_engine sources), or a
# one-line error naming them.
check_engine() {
  local root
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  if [[ ! $1 =~ ^[a-z0-9-]+$ || ! -f $root/k8s/engines/$1/engine.env ]]; then
    echo "error: ENGINE=$1 is not an engine: use one of $(cd "$root/k8s/engines" && echo */engine.env | sed 's|/engine.env||g')" >&2
    exit 2
  fi
}

# wait_established CRD...: each CRD serves its API. A CRD just applied can have no status yet, which kubectl wait
# refuses ("status.conditions accessor error") instead of waiting: asked again until 120 s are up.
wait_established() {
  local tries=60
  until kube wait --for condition=established --timeout=2s "$@" >/dev/null 2>&1; do
    tries=$((tries - 1))
    if [ "$tries" -eq 0 ]; then
      kube wait --for condition=established --timeout=1s "$@"
      return 1
    fi
    sleep 2
  done
}

install_kueue() {
  echo "installing Kueue $KUEUE_VERSION (server-side: its CRDs are too large for client-side apply)"
  kube apply --server-side -k "$engines/kueue"
  kube -n kueue-system wait --for condition=Available --timeout=300s deployment --all
}

# install_katib KUSTOMIZATION: Katib into kubeflow, after the engines (its controller reads which trial kinds exist
# when it starts); a controller already running is restarted to read its configuration again.
install_katib() {
  local running=""
  kube -n kubeflow get deployment katib-controller >/dev/null 2>&1 && running=1
  echo "installing Katib $KATIB_VERSION (server-side: its CRDs are too large for client-side apply)"
  kube apply --server-side -k "$1" >/dev/null
  wait_established crd/experiments.kubeflow.org crd/trials.kubeflow.org crd/suggestions.kubeflow.org
  [[ -z $running ]] || kube -n kubeflow rollout restart deployment/katib-controller >/dev/null
  echo "waiting for Katib's controller, DB manager and database to become available"
  kube -n kubeflow rollout status --timeout=300s deployment/katib-postgres deployment/katib-db-manager \
    deployment/katib-controller
}

# install_engine ENGINE [KUEUE]: the engine, by its folder's install.sh (install_ENGINE, which names its own upstream
# and reads it through the caller's `upstream MODULE VERSION REPOSITORY COMMIT PATH`), and Kueue when KUEUE is not
# empty.
install_engine() {
  local root
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  check_engine "$1"
  # shellcheck source=/dev/null
  source "$root/k8s/engines/$1/install.sh"
  "install_$1"
  [[ -z ${2:-} ]] || install_kueue
  # Katib's controller watches the trial kinds it finds at its start: an engine added beside it needs a restart.
  if kube -n kubeflow get deployment katib-controller >/dev/null 2>&1; then
    kube -n kubeflow rollout restart deployment/katib-controller >/dev/null
  fi
}

# kserve_manifest SCRIPT FUNCTION END: the body of the heredoc that FUNCTION of KServe's install SCRIPT prints: the
# lines between "FUNCTION() {" and the heredoc's END marker, less the two opening lines. Empty output means the script
# changed shape: refuse.
kserve_manifest() {
  local script=$1 function=$2 end=$3 manifest
  manifest=$(sed -n "/^$function() {\$/,/^$end\$/p" "$script" | sed '1,2d;$d')
  if [[ -z $manifest ]]; then
    echo "error: $function is not in KServe's install script $KSERVE_VERSION as expected; check KSERVE_COMMIT and KSERVE_VERSION" >&2
    exit 1
  fi
  printf '%s\n' "$manifest"
}

# install_kserve SCRIPT [PREPARE]: KServe KSERVE_VERSION in Standard mode (no Knative, no Istio) with its cluster
# runtimes, from the manifests its release's install SCRIPT embeds (only those are applied, not the script). The core
# manifest passes through PREPARE, a command from stdin to stdout (the local node's makes the webhooks' certificate,
# which cert-manager makes on k3d).
install_kserve() {
  local script=$1 prepare=${2:-} dir
  dir=$(mktemp -d)
  kserve_manifest "$script" get_kserve_crd_manifest KSERVE_CRD_MANIFEST_EOF >"$dir/kserve-crds.yaml"
  if [[ -n $prepare ]]; then
    kserve_manifest "$script" get_kserve_core_manifest KSERVE_CORE_MANIFEST_EOF | "$prepare" >"$dir/kserve.yaml"
  else
    kserve_manifest "$script" get_kserve_core_manifest KSERVE_CORE_MANIFEST_EOF >"$dir/kserve.yaml"
  fi
  kserve_manifest "$script" get_kserve_runtime_manifests KSERVE_RUNTIME_MANIFEST_EOF >"$dir/kserve-runtimes.yaml"
  echo "installing KServe $KSERVE_VERSION in Standard mode (server-side: its CRDs are too large for client-side apply)"
  kube apply --server-side -f "$dir/kserve-crds.yaml" >/dev/null
  wait_established crd/inferenceservices.serving.kserve.io
  kube apply --server-side -f "$dir/kserve.yaml" >/dev/null
  kube -n kserve wait --for condition=Available --timeout=300s deployment --all
  # The cluster runtimes go through KServe's webhook, which answers once the controller is available.
  kube apply --server-side -f "$dir/kserve-runtimes.yaml" >/dev/null
  rm -rf "$dir"
}

# install_argo KUSTOMIZATION: Argo Workflows into the namespace argo.
install_argo() {
  echo "installing Argo Workflows from $1"
  kube create namespace argo --dry-run=client -o yaml | kube apply -f - >/dev/null
  kube apply --server-side -k "$1" >/dev/null
  kube -n argo wait --for condition=Available --timeout=300s deployment --all
}
