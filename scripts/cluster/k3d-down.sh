#!/usr/bin/env bash
# Deletes the project's k3d cluster with everything in it, the volume too (make k3d-down). make k3d-up NODES=2's shared
# folder, on the host, is left and named: k3d does not delete it, and the files pods wrote there may be root's.
set -euo pipefail

cd "$(dirname "$0")/../.."
# shellcheck source=/dev/null
source scripts/common/settings.sh
load_settings  # the environment wins over the files
check_settings  # every value in its safe character set, before any of them reaches a command

if ! command -v k3d >/dev/null 2>&1; then
  echo "error: k3d is not installed, so there is no k3d cluster to delete (install: https://k3d.io/stable/#installation)" >&2
  exit 1
fi
if k3d cluster get "$CLUSTER_NAME" >/dev/null 2>&1; then
  k3d cluster delete "$CLUSTER_NAME"
else
  echo "cluster $CLUSTER_NAME does not exist; nothing to delete"
fi
# k3d-up.sh's folder, named the same way.
shared_dir=${K3D_SHARED_DIR:-${HOME:-}/.local/share/distml/k3d-$CLUSTER_NAME-shared}
if [[ -d $shared_dir ]]; then
  echo "the shared folder $shared_dir (make k3d-up NODES=2's local-path-shared volumes) is left in place: remove it when its data is no longer needed (sudo rm -rf if pods wrote files as root)"
fi
