#!/usr/bin/env bash
# Prints local-path-provisioner's own deploy manifest (deploy/local-path-storage.yaml of its Go module, at
# LOCAL_PATH_PROVISIONER_VERSION) with two StorageClasses, for both clusters that offer them: make k3d-up NODES=2 and
# make cluster-up (scripts/node/up.sh), so the two cannot drift. Usage:
#   render-local-path.sh MANIFEST STORAGE_DIR SHARED_DIR
# local-path, the default as k3s ships it: each volume a folder under STORAGE_DIR on the node that first mounts it
# (ReadWriteOnce). local-path-shared, every access mode: each volume a folder under SHARED_DIR, which every node
# mounts (upstream's shared-filesystem mode; the folder stands in for NFS or a cloud file store).
# Bash and awk alone: no GNU sed (k3d-up runs it on macOS too), no other tool on k3d-up's tests' bare PATH.
set -euo pipefail

usage="usage: render-local-path.sh MANIFEST STORAGE_DIR SHARED_DIR"
manifest=${1:?$usage} storage=${2:?$usage} shared=${3:?$usage}

# The ConfigMap's config.json replaced by one config per class, the class local-path made the default, and the class
# local-path-shared added.
awk -v storage="$storage" -v shared="$shared" '
  /^  config.json: \|-$/ {
    print
    print "    {\"nodePathMap\": [], \"storageClassConfigs\": {"
    print "      \"local-path\": {\"nodePathMap\": [{\"node\": \"DEFAULT_PATH_FOR_NON_LISTED_NODES\", \"paths\": [\"" storage "\"]}]},"
    print "      \"local-path-shared\": {\"sharedFileSystemPath\": \"" shared "\"}}}"
    config = skip = 1
    next
  }
  skip && /^  [a-zA-Z.]+: / { skip = 0 }
  skip { next }
  { print }
  /^  name: local-path$/ {
    print "  annotations:"
    print "    storageclass.kubernetes.io/is-default-class: \"true\""
    class = 1
  }
  END {
    if (!config || !class) {
      print "error: " FILENAME " is not the local-path-provisioner manifest this renders (no config.json, or no class local-path): check LOCAL_PATH_PROVISIONER_VERSION" > "/dev/stderr"
      exit 1
    }
    print "---"
    print "apiVersion: storage.k8s.io/v1"
    print "kind: StorageClass"
    print "metadata:"
    print "  name: local-path-shared"
    print "provisioner: rancher.io/local-path"
    print "volumeBindingMode: Immediate"
    print "reclaimPolicy: Delete"
  }' "$manifest"
