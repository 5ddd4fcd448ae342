# shellcheck shell=bash
# shellcheck disable=SC2034  # the names below are the sourcing scripts'
# Sourced by the local node's scripts (build.sh, up.sh, down.sh) from the repository's root: the settings (the
# environment wins over the file), checked, then the node's names, its processes, its certificates and
# kubeconfigs. One place for what each process is called and where its files lie.
# shellcheck source=/dev/null
source scripts/common/settings.sh
load_settings  # every settings file, the node's own scripts/node/settings.env among them
check_settings
NODE_NAME=$CLUSTER_NAME
# scripts/cluster/submit.py knows the local node by this context name, and imports the image into its containerd.
NODE_CONTEXT=node-$CLUSTER_NAME
NODE_BRIDGE=distml0
PKI=$NODE_ROOT/pki
BIN=$NODE_CACHE/bin
K8S_BIN=$BIN/kubernetes-$NODE_KUBERNETES_VERSION
# Stopped in this order by cluster-down: the node's users first, the store last.
NODE_PROCESSES=(coredns policy proxy kubelet scheduler controller-manager apiserver etcd containerd)

kube() { kubectl --kubeconfig "$NODE_ROOT/admin.kubeconfig" "$@"; }

# as_root TARGET WHY: true as root; otherwise says that make TARGET WHY, so needs root, and fails.
as_root() {
  [ "$(id -u)" -eq 0 ] && return
  echo "error: $1 $2: run it as root (sudo make $1)" >&2
  return 1
}

install_hint() {
  case $1 in
    ctr) echo "apt-get install containerd" ;;
    go) echo "install Go $(sed -n 's/^go //p' scripts/node/modules/kubernetes/go.mod) or newer: https://go.dev/dl/" ;;
    ss | tc) echo "apt-get install iproute2" ;;
    nsenter) echo "apt-get install util-linux" ;;
    kubectl) echo "install kubectl: https://kubernetes.io/docs/tasks/tools/" ;;
    *) echo "apt-get install $1" ;;
  esac
}

pid_of() { [ -f "$NODE_RUN/$1.pid" ] && cat "$NODE_RUN/$1.pid"; }

# running NAME: the process cluster-up started under NAME is alive (not merely a pid file left by a crash).
running() {
  local pid
  pid=$(pid_of "$1") || return 1
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null
}

# launch NAME COMMAND...: starts a node process in its own session, its output in logs/NAME.log.
launch() {
  local name=$1
  shift
  mkdir -p "$NODE_ROOT/logs" "$NODE_RUN"
  setsid "$@" >>"$NODE_ROOT/logs/$name.log" 2>&1 </dev/null &
  echo $! >"$NODE_RUN/$name.pid"
}

# wait_for WHAT COMMAND...: retries COMMAND for up to two minutes; on failure names the log to read.
wait_for() {
  local what=$1 tries=120
  shift
  until "$@" >/dev/null 2>&1; do
    tries=$((tries - 1))
    if [ "$tries" -eq 0 ]; then
      echo "error: timed out waiting for $what; see the logs in $NODE_ROOT/logs" >&2
      exit 1
    fi
    sleep 1
  done
}

port_owner() {
  local owner
  owner=$(ss -Hltnp "sport = :$1" | sed -n 's/.*users:((\("[^"]*"\).*/\1/p' | head -1)
  echo "${owner:-ss -ltnp names it, as root}"
}
port_taken() { [ -n "$(ss -Hltn "sport = :$1")" ]; }

# module_dir MODULE VERSION: the module's files in the Go module cache, downloaded and checked against the Go
# checksum database by the go command.
module_dir() {
  go mod download -json "$1@$2" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p'
}

# cert NAME CN ORG SANS: a key and a certificate signed by the cluster's CA (ca.crt), for one year.
cert() {
  local name=$1 cn=$2 org=$3 sans=$4 subject="/CN=$2"
  [ -f "$PKI/$name.crt" ] && return
  [ -z "$org" ] || subject="/O=$org/CN=$cn"
  openssl req -new -newkey rsa:2048 -nodes -keyout "$PKI/$name.key" -subj "$subject" -out "$PKI/$name.csr" 2>/dev/null
  {
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=serverAuth,clientAuth"
    [ -z "$sans" ] || echo "subjectAltName=$sans"
  } >"$PKI/$name.ext"
  openssl x509 -req -in "$PKI/$name.csr" -CA "$PKI/${5:-ca}.crt" -CAkey "$PKI/${5:-ca}.key" -CAcreateserial \
    -days 365 -extfile "$PKI/$name.ext" -out "$PKI/$name.crt" 2>/dev/null
  rm -f "$PKI/$name.csr" "$PKI/$name.ext"
}

ca() {
  [ -f "$PKI/$1.crt" ] && return
  openssl req -x509 -new -newkey rsa:2048 -nodes -keyout "$PKI/$1.key" -subj "/CN=$2" -days 3650 \
    -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" -out "$PKI/$1.crt" 2>/dev/null
}

# kubeconfig NAME CERT [HOST]: a kubeconfig for the client certificate CERT, with the CA and the key embedded, that
# reaches the API server at HOST (default 127.0.0.1).
kubeconfig() {
  local file=$NODE_ROOT/$1.kubeconfig
  [ -f "$file" ] && return
  kubectl config --kubeconfig "$file" set-cluster "$NODE_CONTEXT" --server "https://${3:-127.0.0.1}:$NODE_API_PORT" \
    --certificate-authority "$PKI/ca.crt" --embed-certs >/dev/null
  kubectl config --kubeconfig "$file" set-credentials "$2" --client-certificate "$PKI/$2.crt" \
    --client-key "$PKI/$2.key" --embed-certs >/dev/null
  kubectl config --kubeconfig "$file" set-context "$NODE_CONTEXT" --cluster "$NODE_CONTEXT" --user "$2" >/dev/null
  kubectl config --kubeconfig "$file" use-context "$NODE_CONTEXT" >/dev/null
}

# The certificates local-up-cluster.sh makes: the API server's with the kubernetes.default names and the service
# range's first address, one client certificate per component in the group RBAC expects, the kubelet's serving
# and client certificates, the front proxy's, and the service-account signing key.
make_pki() {
  local first_service_ip
  mkdir -p "$PKI" && chmod 700 "$PKI"
  first_service_ip=$(python3 -c "import ipaddress,sys; print(ipaddress.ip_network(sys.argv[1])[1])" "$NODE_SERVICE_CIDR")
  ca ca "$CLUSTER_NAME-ca"
  ca front-proxy-ca "$CLUSTER_NAME-front-proxy-ca"
  cert apiserver kube-apiserver "" "DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost,IP:127.0.0.1,IP:$NODE_IP,IP:$first_service_ip"
  cert etcd etcd "" "DNS:localhost,IP:127.0.0.1"
  cert apiserver-etcd kube-apiserver-etcd-client "" ""
  cert apiserver-kubelet kube-apiserver-kubelet-client "" ""
  cert kubelet "system:node:$NODE_NAME" system:nodes "DNS:$NODE_NAME,DNS:localhost,IP:127.0.0.1,IP:$NODE_IP"
  cert admin kubernetes-admin system:masters ""
  cert controller-manager system:kube-controller-manager "" ""
  cert scheduler system:kube-scheduler "" ""
  cert proxy system:kube-proxy "" ""
  cert coredns system:coredns "" ""
  cert policy system:kube-router "" ""
  cert front-proxy-client front-proxy-client "" "" front-proxy-ca
  [ -f "$PKI/sa.key" ] || {
    openssl genrsa -out "$PKI/sa.key" 2048 2>/dev/null
    openssl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
  }
  for component in admin controller-manager scheduler proxy coredns policy kubelet; do kubeconfig "$component" "$component"; done
}

# add_context: the cluster, user and context node-CLUSTER_NAME in the user's kubeconfig, as k3d adds k3d-NAME;
# the current context stays as it was.
add_context() {
  local config=${KUBECONFIG:-$HOME/.kube/config}
  config=${config%%:*}
  mkdir -p "$(dirname "$config")"
  kubectl config --kubeconfig "$config" set-cluster "$NODE_CONTEXT" --server "https://127.0.0.1:$NODE_API_PORT" \
    --certificate-authority "$PKI/ca.crt" --embed-certs >/dev/null
  kubectl config --kubeconfig "$config" set-credentials "$NODE_CONTEXT-admin" --client-certificate "$PKI/admin.crt" \
    --client-key "$PKI/admin.key" --embed-certs >/dev/null
  kubectl config --kubeconfig "$config" set-context "$NODE_CONTEXT" --cluster "$NODE_CONTEXT" \
    --user "$NODE_CONTEXT-admin" >/dev/null
  echo "kubectl context: $NODE_CONTEXT (the current context is left as it was)"
}

# module_commit MODULE VERSION: the commit the module proxy recorded for the version's tag.
module_commit() {
  go mod download -json "$1@$2" | sed -n 's/^\t\t"Hash": "\(.*\)",*$/\1/p'
}

# engine_builds: the controllers the node builds for the engines and add-ons that k8s/engines installs from a pinned
# module, one line each: FOLDER REPO MODULE VERSION COMMIT NAME PACKAGE DEPLOYMENT LDFLAGS (the table below names
# the settings that hold VERSION and COMMIT, and the package of the version ldflags). A line is left out when
# k8s/engines/FOLDER is gone (a fork may delete an optional engine, and its settings go with it), so neither the build
# nor render_engines asks for a version that is not there. NAME-VERSION is the binary's name in the build cache;
# LDFLAGS are the version ldflags the module's Makefile sets (the commit is the one the module holds), none for "-".
engine_builds() {
  local folder repo module version_key commit_key name package deployment stamps version commit
  while read -r folder repo module version_key commit_key name package deployment stamps; do
    [ -d "k8s/engines/$folder" ] || continue
    version=${!version_key} commit=${!commit_key}
    echo "$folder $repo $module $version $commit $name $package $deployment" \
      "$([ "$stamps" = - ] || echo "-X $stamps.GitVersion=$version -X $stamps.GitCommit=$commit")"
  done <<'EOF_BUILDS'
jobset kubernetes-sigs/jobset sigs.k8s.io/jobset JOBSET_VERSION JOBSET_MODULE_COMMIT jobset . jobset-controller-manager sigs.k8s.io/jobset/pkg/version
trainjob kubeflow/trainer github.com/kubeflow/trainer/v2 KUBEFLOW_TRAINER_VERSION KUBEFLOW_TRAINER_COMMIT trainer-controller-manager ./cmd/trainer-controller-manager kubeflow-trainer-controller-manager -
kueue kubernetes-sigs/kueue sigs.k8s.io/kueue KUEUE_VERSION KUEUE_COMMIT kueue ./cmd/kueue kueue-controller-manager sigs.k8s.io/kueue/pkg/version
EOF_BUILDS
}

# render_engines DIR: a copy of k8s/engines in DIR whose GitHub sources are the pinned modules' files in the Go module
# cache (checked against the checksum database by the go command), each refused unless the proxy's commit for its tag
# is the one the settings pin. Kueue's controller is the only pod there whose policy forces a pull: the copy pulls it
# only if it is not present, as the node has no registry.
render_engines() {
  local out=$1 builds folder repo module version commit dir file
  builds=$(engine_builds)
  cp -R k8s/engines "$out"
  while read -r folder repo module version commit _; do
    [[ -n $folder ]] || continue  # no engine of a pinned module left
    dir=$(module_dir "$module" "$version")
    if [ "$(module_commit "$module" "$version")" != "$commit" ]; then
      echo "error: the module proxy's $module@$version is not the commit the settings pin ($commit): check the version and the commit in the engine's k8s/engines/<engine>/settings.env and scripts/node/settings.env" >&2
      exit 1
    fi
    # kustomize takes no absolute root: each kustomization names the module's directory relative to itself.
    grep -rl --include=kustomization.yaml "github.com/$repo.git/" "$out" | while read -r file; do
      sed -i "s|github.com/$repo.git/\(.*\)?ref=[A-Z_]*\$|$(realpath --relative-to "$(dirname "$file")" "$dir")/\1|" "$file"
    done
  done <<<"$builds"
  [ ! -d "$out/kueue" ] || cat >>"$out/kueue/kustomization.yaml" <<'EOF_PATCH'

patches:
  - target: {kind: Deployment, name: kueue-controller-manager}
    patch: |-
      - {op: replace, path: /spec/template/spec/containers/0/imagePullPolicy, value: IfNotPresent}
EOF_PATCH
}

# render_katib DIR: a copy of k8s/engines/katib in DIR whose source is Katib's module in the Go module cache, its
# database the image build.sh makes from Debian's PostgreSQL.
render_katib() {
  local out=$1 dir
  dir=$(module_dir github.com/kubeflow/katib "$KATIB_VERSION")
  cp -R k8s/engines/katib "$out"
  sed -i "s|KATIB_MODULE/|$(realpath --relative-to "$out" "$dir")/|" "$out/kustomization.yaml"
  cat >>"$out/kustomization.yaml" <<EOF_PATCH
  - target: {group: apps, version: v1, kind: Deployment, name: katib-postgres}
    patch: |-
      - {op: replace, path: /spec/template/spec/containers/0/image, value: $NODE_KATIB_POSTGRES_IMAGE}
EOF_PATCH
}

# deployment_image SOURCE NAME [N]: the image of container N (default 0, the first) of the Deployment NAME in SOURCE,
# a kustomization's directory or a manifest file.
deployment_image() {
  { if [ -d "$1" ]; then kubectl kustomize "$1" 2>/dev/null; else cat "$1"; fi; } |
    awk -v name="$2" -v n="${3:-0}" 'BEGIN {RS = "\n---\n"}
    /(^|\n)kind: Deployment\n/ && $0 ~ "\n  name: " name "\n" {
      rest = $0
      for (i = 0; i <= n; i++) {
        if (!match(rest, /\n +image: [^\n]+/)) exit
        image = substr(rest, RSTART, RLENGTH); rest = substr(rest, RSTART + RLENGTH)
      }
      sub(/.*image: /, "", image); print image; exit
    }'
}

# qualified IMAGE: the name containerd stores IMAGE under, as the kubelet asks for it (docker.io/ and library/ added
# where the name has no registry).
qualified() {
  local first=${1%%/*}
  if [[ $1 != */* ]]; then echo "docker.io/library/$1"
  elif [[ $first == *.* || $first == *:* || $first == localhost ]]; then echo "$1"
  else echo "docker.io/$1"; fi
}

# kserve_install_script: KServe's Standard-mode install script from the pinned module (the file k3d-up downloads
# from the same commit), refused unless its sha256 is the one the settings pin.
kserve_install_script() {
  local script
  script=$(module_dir github.com/kserve/kserve "$KSERVE_VERSION")/install/$KSERVE_VERSION/kserve-standard-mode-full-install-with-manifests.sh
  if [ "$(sha256sum <"$script" | cut -d' ' -f1)" != "$KSERVE_INSTALL_SCRIPT_SHA256" ]; then
    echo "error: $script does not have the sha256 KSERVE_INSTALL_SCRIPT_SHA256 pins: check KSERVE_VERSION and the sha256 in scripts/pipeline/settings.env" >&2
    exit 1
  fi
  echo "$script"
}
