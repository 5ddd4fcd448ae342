#!/usr/bin/env bash
# Deletes the project's k3d cluster with everything in it, the volume too (make k3d-down).
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
