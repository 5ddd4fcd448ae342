#!/usr/bin/env bash
# Builds the trainer image, tags it $IMAGE (name:git revision) and name:latest, and prints its size.
# The image name and the container tool are derived here only: `--print-image` prints the name:tag
# it would build and `--print-tool` the tool it would build with, and exit (the Makefile and scripts/cluster/submit.py ask);
# `--print-source` prints the source URL the image's label will carry.
# Env (make passes on what is set on its command line or in the environment; IMAGE it sets itself):
#   IMAGE              name:tag to build (default IMAGE_NAME from k8s/base/settings.env : IMAGE_TAG,
#                      plus -gpu for the gpu flavour; `make image` passes it so `make submit` runs the same)
#   IMAGE_TAG          the tag part of IMAGE (default: the short git revision, dev outside a git checkout)
#   CONTAINER_TOOL     docker, podman or buildah (default: docker if its engine answers, else podman, else buildah)
#   IMAGE_TF_FLAVOUR   cpu (tensorflow-cpu, Linux x86-64; the default there), tf (tensorflow; the default on
#                      arm64 hosts, where tensorflow-cpu has no wheel) or gpu; tags end in -tf / -gpu
#   BASE_IMAGE         the base to build FROM (default: the Dockerfile's official image at the settings'
#                      BASE_IMAGE_DIGEST); where no registry is reachable: BASE_IMAGE=$(scripts/image/make-base-image.sh).
#                      A registry base must be pinned (name@sha256:...); ALLOW_UNPINNED_BASE=1 builds from a tag anyway
#   EXTRA_BUILD_FLAGS  more words for the build command, e.g. "-v /etc/ssl/certs:/etc/ssl/certs:ro"
#                      where the package index sits behind a proxy whose CA only the host trusts
# buildah and podman read BUILDAH_ISOLATION; set it to chroot where runc cannot run.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=/dev/null
source "$root/scripts/common/settings.sh"
load_settings  # the environment wins over the files
check_settings  # every value in its safe character set, before any of them reaches a command

die() { printf 'build-image: %s\n' "$*" >&2; exit 1; }

container_tool() {
  if [[ -n ${CONTAINER_TOOL:-} ]]; then echo "$CONTAINER_TOOL"
  elif command -v docker >/dev/null && docker info >/dev/null 2>&1; then echo docker
  elif command -v podman >/dev/null; then echo podman
  elif command -v buildah >/dev/null; then echo buildah
  else echo docker
  fi
}

if [[ ${1:-} == --print-tool ]]; then
  container_tool
  exit 0
fi

# The origin's URL without what can hold a secret: the user and password (a token in a clone URL), the query and
# the fragment; scp-like user@host:path keeps host:path. Anyone who can pull the image can read its labels.
public_url() {
  local url=${1%%[?#]*}
  if [[ $url =~ ^([A-Za-z][A-Za-z0-9+.-]*://)([^/@]*@)?(.*)$ ]]; then
    url=${BASH_REMATCH[1]}${BASH_REMATCH[3]}
  elif [[ $url =~ ^[^/@:]+@([^/:]+:.*)$ ]]; then
    url=${BASH_REMATCH[1]}
  fi
  printf '%s\n' "$url"
}
source_url=$(public_url "$(git -C "$root" remote get-url origin 2>/dev/null || echo unknown)")
if [[ ${1:-} == --print-source ]]; then
  echo "$source_url"
  exit 0
fi

# tensorflow-cpu 2.21.0 has no linux/aarch64 wheel and tensorflow 2.21.0 has one: arm64 hosts get tf.
default_flavour() {
  case "$(uname -m)" in
    aarch64 | arm64) echo tf ;;
    *) echo cpu ;;
  esac
}

flavour=${IMAGE_TF_FLAVOUR:-$(default_flavour)}
case "$flavour" in
  cpu) suffix= ;;
  tf) suffix=-tf ;;
  gpu) suffix=-gpu ;;
  *) die "IMAGE_TF_FLAVOUR must be cpu, tf or gpu, got '$flavour'" ;;
esac

# The tag is the git revision, so a re-submitted job never runs a stale image.
if revision=$(git -C "$root" rev-parse HEAD 2>/dev/null); then tag=${revision:0:12}; else revision=unknown tag=dev; fi
image=${IMAGE:-$IMAGE_NAME:${IMAGE_TAG:-$tag}$suffix}
[[ ${image##*/} == *:* ]] || die "IMAGE must be name:tag, got '$image'"
if [[ ${1:-} == --print-image ]]; then
  echo "$image"
  exit 0
fi
latest=${image%:*}:latest$suffix

# The base by digest: a tag on a registry can be moved to other contents. A local base (localhost/, made by
# make-base-image.sh on this machine) has no registry to move it.
base=${BASE_IMAGE:-$(sed -n 's/^ARG BASE_IMAGE=//p' "$root/Dockerfile")}
if [[ -z ${BASE_IMAGE:-} && -n ${BASE_IMAGE_DIGEST:-} ]]; then
  base="$base@$BASE_IMAGE_DIGEST"
fi
if [[ $base != *@sha256:* && $base != localhost/* && ${ALLOW_UNPINNED_BASE:-} != 1 ]]; then
  die "the base image $base is not pinned by digest. Record its digest as BASE_IMAGE_DIGEST=sha256:... in scripts/image/settings.env (docs/security.md says how to learn it: docker buildx imagetools inspect $base, or skopeo inspect docker://$base), give BASE_IMAGE=name@sha256:..., or build from the tag anyway with ALLOW_UNPINNED_BASE=1"
fi

tool=$(container_tool)
case "$tool" in
  docker | podman | buildah) ;;
  *) die "CONTAINER_TOOL must be docker, podman or buildah, got '$tool'" ;;
esac
command -v "$tool" >/dev/null || die "$tool is not installed; install it or set CONTAINER_TOOL to docker, podman or buildah"

if [[ -n $(git -C "$root" status --porcelain --untracked-files=no 2>/dev/null) ]]; then
  echo "build-image: warning: uncommitted changes are built into $image; commit them so the tag names the code" >&2
fi

version=$(python3 -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["project"]["version"])' "$root/pyproject.toml")

# The labels go in twice: as build args for a plain `docker build`, and as --label because
# buildah 1.28 reuses a cached LABEL step whose build args changed.
args=(
  --build-arg "TF_FLAVOUR=$flavour"
  --build-arg "VERSION=$version"
  --build-arg "REVISION=$revision"
  --build-arg "SOURCE=$source_url"
  --label "org.opencontainers.image.version=$version"
  --label "org.opencontainers.image.revision=$revision"
  --label "org.opencontainers.image.source=$source_url"
  --tag "$image"
  --tag "$latest"
)
args+=(--build-arg "BASE_IMAGE=$base")
read -r -a extra <<<"${EXTRA_BUILD_FLAGS:-}"
args+=("${extra[@]}")

echo "build-image: building $image ($flavour) with $tool" >&2
case "$tool" in
  docker | podman) build=("$tool" build) ;;
  buildah) build=(buildah bud --layers) ;;
esac
if ! "${build[@]}" "${args[@]}" --file "$root/Dockerfile" "$root"; then
  die "the build failed; where no registry is reachable, build FROM a local base: BASE_IMAGE=\$(scripts/image/make-base-image.sh) make image"
fi

size=$("$tool" images --format '{{.Size}}' "$image" | sed -n 1p)  # sed reads to the end: no SIGPIPE under pipefail
echo "build-image: built $image and $latest, size $size (uncompressed)"
