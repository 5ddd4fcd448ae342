#!/usr/bin/env bash
# Builds the local node's parts from exact module versions (make cluster-up runs it first): Kubernetes' five
# binaries, etcd, CoreDNS, the pause and helper images, the local-path provisioner and the training operator. Each
# lands in NODE_CACHE keyed by its version, so a second run builds nothing. go.sum (ours for the wrapper modules,
# the module's own for `go install pkg@version`) is checked against the Go checksum database by the go command.
set -euo pipefail

cd "$(dirname "$0")/../.."
# shellcheck source=/dev/null
source scripts/node/common.sh  # the settings, checked, and the node's names
# shellcheck source=/dev/null
source scripts/cluster/install-engines.sh  # kserve_manifest

modules=$PWD/scripts/node/modules
cache=${NODE_CACHE:-/var/cache/distml-node}
bin=$cache/bin
images=$cache/images
mkdir -p "$bin" "$images"
# No DWARF from the compiler: the links strip it (-s -w) anyway, and not writing it makes a cold build cheaper.
export CGO_ENABLED=0 GOFLAGS="-trimpath -gcflags=all=-dwarf=false"

built() { [ -x "$bin/$1" ] && echo "  cached: $1"; }

# Kubernetes reads its version from ldflags; without them clients see v0.0.0-master (hack/lib/version.sh).
kubernetes() {
  local v=$NODE_KUBERNETES_VERSION out=$bin/kubernetes-$NODE_KUBERNETES_VERSION minor
  built "kubernetes-$v/kubelet" && return
  minor=${v#v*.}
  minor=${minor%%.*}
  local ldflags="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=$v -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
  done
  echo "  building Kubernetes $v (kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kube-proxy)"
  mkdir -p "$out.tmp"
  (cd "$modules/kubernetes" && go build -ldflags "$ldflags" -o "$out.tmp/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy)
  rm -rf "$out" && mv "$out.tmp" "$out"
}

etcd() {
  built "etcd-$NODE_ETCD_VERSION" && return
  echo "  building etcd $NODE_ETCD_VERSION"
  (cd "$modules/etcd" && go build -ldflags "-s -w" -o "$bin/etcd-$NODE_ETCD_VERSION.tmp" go.etcd.io/etcd/server/v3)
  mv "$bin/etcd-$NODE_ETCD_VERSION.tmp" "$bin/etcd-$NODE_ETCD_VERSION"
}

# module_build NAME MODULE VERSION PACKAGE [LDFLAGS]: builds PACKAGE (./cmd/...) inside the module's own directory in
# the module cache, against the module's own go.sum, as its Dockerfile does (go install MODULE@VERSION would also
# read the proxy's version list, which it does not serve for every module). -mod=mod: a module zip keeps a vendored
# module's vendor/modules.txt but not its vendor tree (local-path-provisioner), and the go command would read that.
# SOURCE (optional): build in this copy of the module instead.
module_build() {
  local name=$1 module=$2 version=$3 package=$4 ldflags=${5:-} dir
  built "$name-$version" && return
  echo "  building $name $version ($module, $package)"
  dir=${SOURCE:-$(module_dir "$module" "$version")}
  (cd "$dir" && go build -mod=mod -ldflags "-s -w $ldflags" -o "$bin/$name-$version.tmp" "$package")
  mv "$bin/$name-$version.tmp" "$bin/$name-$version"
}

# image NAME USER ENTRYPOINT FILE...: a single-layer image FROM scratch holding the files (SRC:DEST pairs) and, as
# the distroless base of the upstream images has, a world-writable /tmp (Argo's executor writes a resource template's
# manifest there); saved as an OCI archive that cluster-up imports into containerd under exactly NAME, the name the
# manifests use. WORKDIR (optional): the image's working directory (Katib's manifests run ./NAME from it).
image() {
  local name=$1 user=$2 entrypoint=$3 archive ctr base
  shift 3
  archive=$images/$(printf '%s' "$name" | tr '/:' '__').tar
  [ -f "$archive" ] && echo "  cached: $name" && return
  echo "  image $name"
  ctr=$(buildah from scratch)
  base=$(mktemp -d) && mkdir -m 1777 "$base/tmp"
  buildah copy --quiet "$ctr" "$base" / >/dev/null
  rm -rf "$base"
  for pair in "$@"; do buildah copy --quiet "$ctr" "${pair%%:*}" "${pair#*:}" >/dev/null; done
  buildah config --entrypoint "[\"$entrypoint\"]" --cmd "" --user "$user" --env PATH=/usr/bin:/bin \
    ${WORKDIR:+--workingdir "$WORKDIR"} "$ctr"
  buildah commit --quiet --rm "$ctr" "$name" >/dev/null
  buildah push --quiet "$name" "oci-archive:$archive.tmp:$name"
  mv "$archive.tmp" "$archive"
}

for tool in go gcc buildah; do
  if ! command -v "$tool" >/dev/null; then
    echo "error: $tool is not installed: apt-get install golang-go gcc buildah (Go $(sed -n 's/^go //p' "$modules/kubernetes/go.mod") or newer)" >&2
    exit 1
  fi
done

kubernetes
etcd
module_build coredns github.com/coredns/coredns "$NODE_COREDNS_VERSION" .
module_build local-path-provisioner github.com/rancher/local-path-provisioner "$LOCAL_PATH_PROVISIONER_VERSION" .
module_build training-operator github.com/kubeflow/training-operator "$TRAINING_OPERATOR_VERSION" \
  ./cmd/training-operator.v1
module_build kube-router github.com/cloudnativelabs/kube-router/v2 "$NODE_KUBE_ROUTER_VERSION" ./cmd/kube-router \
  "-X github.com/cloudnativelabs/kube-router/v2/pkg/version.Version=$NODE_KUBE_ROUTER_VERSION"
# The engines' controllers and Kueue's, each while its folder in k8s/engines is there (engine_builds in common.sh).
builds=$(engine_builds)
while read -r -u 3 folder _ module version _ name package _ ldflags; do
  [[ -n $folder ]] || continue  # no engine of a pinned module left
  module_build "$name" "$module" "$version" "$package" "$ldflags"
done 3<<<"$builds"

# SERVE=1 (make cluster-up SERVE=1): what serving and the pipeline run, from the same modules: Argo Workflows'
# controller and executor (the executor image's name comes from the version ldflag), KServe's controller, and the
# kube-rbac-proxy its Deployment runs beside it, at the version that Deployment names.
if [[ -n ${SERVE:-} ]]; then
  argo=github.com/argoproj/argo-workflows/v4
  argo_ldflags="-X $argo.version=$NODE_ARGO_WORKFLOWS_VERSION -X $argo.gitTag=$NODE_ARGO_WORKFLOWS_VERSION -X $argo.gitTreeState=clean"
  # Argo's repository holds workflow/executor/osspecific/signal_linux.go as a symlink to signal_darwin.go, and a module
  # zip holds no symlinks: the build runs in a copy of the module with that one link put back.
  argo_source=$cache/src/argo-workflows-$NODE_ARGO_WORKFLOWS_VERSION
  if [ ! -e "$argo_source/workflow/executor/osspecific/signal_linux.go" ]; then
    rm -rf "$argo_source" && mkdir -p "$cache/src"
    cp -R "$(module_dir "$argo" "$NODE_ARGO_WORKFLOWS_VERSION")" "$argo_source.tmp" && chmod -R u+w "$argo_source.tmp"
    ln -s signal_darwin.go "$argo_source.tmp/workflow/executor/osspecific/signal_linux.go"
    mv "$argo_source.tmp" "$argo_source"
  fi
  SOURCE=$argo_source module_build workflow-controller "$argo" "$NODE_ARGO_WORKFLOWS_VERSION" ./cmd/workflow-controller \
    "$argo_ldflags"
  SOURCE=$argo_source module_build argoexec "$argo" "$NODE_ARGO_WORKFLOWS_VERSION" ./cmd/argoexec "$argo_ldflags"
  module_build kserve-controller github.com/kserve/kserve "$KSERVE_VERSION" ./cmd/manager
  kserve_script=$(kserve_install_script)
  kserve_core=$(mktemp)
  kserve_manifest "$kserve_script" get_kserve_core_manifest KSERVE_CORE_MANIFEST_EOF >"$kserve_core"
  rbac_proxy_image=$(deployment_image "$kserve_core" kserve-controller-manager 1)
  rbac_proxy_version=${rbac_proxy_image##*:}
  module_build kube-rbac-proxy github.com/brancz/kube-rbac-proxy "$rbac_proxy_version" ./cmd/kube-rbac-proxy
fi

# KATIB=1 (make cluster-up KATIB=1): Katib's controller, DB manager, goptuna suggestion and file/StdOut metrics
# collector from its module (every main is a v1beta1 package), as its Dockerfiles build them.
if [[ -n ${KATIB:-} ]]; then
  katib=github.com/kubeflow/katib
  module_build katib-controller "$katib" "$KATIB_VERSION" ./cmd/katib-controller/v1beta1
  module_build katib-db-manager "$katib" "$KATIB_VERSION" ./cmd/db-manager/v1beta1
  module_build suggestion-goptuna "$katib" "$KATIB_VERSION" ./cmd/suggestion/goptuna/v1beta1
  module_build file-metrics-collector "$katib" "$KATIB_VERSION" ./cmd/metricscollector/v1beta1/file-metricscollector
fi

# The pause binary is C: Kubernetes' own source at the pinned version, static, as build/pause/Makefile builds it.
pause_src=$(cd "$modules/kubernetes" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)/build/pause/linux/pause.c
if ! built "pause-$NODE_PAUSE_VERSION"; then
  gcc -Os -Wall -Werror -static -DVERSION="v$NODE_PAUSE_VERSION" -o "$bin/pause-$NODE_PAUSE_VERSION" "$pause_src"
fi
image "registry.k8s.io/pause:$NODE_PAUSE_VERSION" 65535:65535 /pause "$bin/pause-$NODE_PAUSE_VERSION:/pause"
# Its manifest runs the command by name, as its upstream image (from alpine) has it on PATH.
image "docker.io/rancher/local-path-provisioner:$LOCAL_PATH_PROVISIONER_VERSION" 0:0 /usr/bin/local-path-provisioner \
  "$bin/local-path-provisioner-$LOCAL_PATH_PROVISIONER_VERSION:/usr/bin/local-path-provisioner"
image "$TRAINING_OPERATOR_IMAGE" 65532:65532 /manager "$bin/training-operator-$TRAINING_OPERATOR_VERSION:/manager"
# Each engine's image under the name its install manifest (k8s/engines, rendered from the pinned module) gives it;
# distroless/static:nonroot, their upstream base, runs them as 65532 too.
engines=$(mktemp -d)
render_engines "$engines/engines"
while read -r -u 3 folder _ _ version _ name _ deployment _; do
  [[ -n $folder ]] || continue
  image "$(deployment_image "$engines/engines/$folder" "$deployment")" 65532:65532 /manager "$bin/$name-$version:/manager"
done 3<<<"$builds"
rm -rf "$engines"
if [[ -n ${KATIB:-} ]]; then
  # As their Dockerfiles lay them out, each binary in its working directory; the trial's collector runs as the
  # trainer (injectSecurityContext) and the suggestion as katib-config.yaml says.
  for part in katib-controller:/app katib-db-manager:/app file-metrics-collector:/app suggestion-goptuna:/opt/katib; do
    name=${part%%:*} dir=${part#*:}
    WORKDIR=$dir image "ghcr.io/kubeflow/katib/$name:$KATIB_VERSION" 65532:65532 "$dir/$name" "$bin/$name-$KATIB_VERSION:$dir/$name"
  done
  # Its database: PostgreSQL from the host's Debian package, started as upstream's postgres image starts.
  rootfs=$(mktemp -d)
  scripts/node/katib/postgres-rootfs.sh "$rootfs"
  image "$NODE_KATIB_POSTGRES_IMAGE" 999:999 /entrypoint.sh "$rootfs:/"
  rm -rf "$rootfs"
fi
if [[ -n ${SERVE:-} ]]; then
  # As their Dockerfiles lay them out, on distroless/static: Argo's binaries in /bin (its manifests run them by
  # name), the controller as 8737 and the executor as root (the pods it joins set their own user).
  image "quay.io/argoproj/workflow-controller:$NODE_ARGO_WORKFLOWS_VERSION" 8737:8737 /bin/workflow-controller \
    "$bin/workflow-controller-$NODE_ARGO_WORKFLOWS_VERSION:/bin/workflow-controller"
  image "quay.io/argoproj/argoexec:$NODE_ARGO_WORKFLOWS_VERSION" 0:0 /bin/argoexec \
    "$bin/argoexec-$NODE_ARGO_WORKFLOWS_VERSION:/bin/argoexec"
  image "$(qualified "$(deployment_image "$kserve_core" kserve-controller-manager)")" 65532:65532 /manager \
    "$bin/kserve-controller-$KSERVE_VERSION:/manager"
  image "$rbac_proxy_image" 65532:65532 /usr/local/bin/kube-rbac-proxy \
    "$bin/kube-rbac-proxy-$rbac_proxy_version:/usr/local/bin/kube-rbac-proxy"
  rm -f "$kserve_core"
fi
# local-path's helper pod runs `sh` with mkdir, chmod and rm as root on the node's directory; Debian's static
# busybox provides them.
busybox=$(command -v busybox || true)
if [ -z "$busybox" ] || [[ $(ldd "$busybox" 2>&1 || true) != *"not a dynamic executable"* ]]; then
  echo "error: a static busybox is needed for local-path's helper image: apt-get install busybox-static" >&2
  exit 1
fi
rootfs=$(mktemp -d)
mkdir "$rootfs/bin" && cp "$busybox" "$rootfs/bin/busybox"
for applet in sh mkdir chmod rm ls cat; do ln -s busybox "$rootfs/bin/$applet"; done
image docker.io/library/busybox:latest 0:0 /bin/sh "$rootfs:/"
rm -rf "$rootfs"
echo "node parts ready in $cache"
