#!/usr/bin/env bash
# Checks, before make installs or starts anything, that kubectl can render the overlays of k8s/ (make run-local
# and make submit render one with `kubectl kustomize`). Prints one line saying what is missing and exits 1.
# Verified: kubectl v1.32.4 (kustomize v5.5.0) renders k8s/engines/*/sync and */async; v1.20.2 (Debian 12's kubernetes-client) does not.
set -uo pipefail

cd "$(dirname "$0")/../.." || exit 1
get_it="install kubectl v1.32 or newer: https://kubernetes.io/docs/tasks/tools/"

if ! command -v kubectl >/dev/null 2>&1; then
  echo "kubectl is not installed (make run-local and make submit render k8s/engines/ENGINE/STRATEGY with it); $get_it"
  exit 1
fi
# The async overlays use the most of kustomize; each engine folder this checkout holds is rendered.
for overlay in k8s/engines/*/async; do
  errors=$(kubectl kustomize "$overlay" 2>&1 >/dev/null) && continue
  version=$(kubectl version --client 2>/dev/null | grep -oE 'v[0-9]+\.[0-9]+\.[0-9]+' | sed -n 1p)
  echo "kubectl ${version:-(version unknown)} cannot render $overlay: ${errors%%$'\n'*}; its kustomize is too old, $get_it"
  exit 1
done
