#!/usr/bin/env bash
# Makes a Debian bookworm image with Python 3.11 by debootstrap, for machines that cannot pull a
# registry base: pass its name as BASE_IMAGE to scripts/image/build-image.sh.
# Prints the image name on stdout (progress goes to stderr). An image made by this exact script
# version is reused, because its tag is a hash of this file.
# Env: CONTAINER_TOOL=buildah|podman|docker (default buildah), DEBIAN_MIRROR (default deb.debian.org).
set -euo pipefail

tool=${CONTAINER_TOOL:-buildah}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
suite=bookworm
# bookworm's python3 is 3.11, the version pyproject.toml requires; python3-venv brings ensurepip.
packages=python3,python3-venv,ca-certificates
script_hash=$(sha256sum "${BASH_SOURCE[0]}" | cut -c1-12)
name=localhost/debootstrap-python3.11:${suite}-${script_hash}
# An imported file system has no environment; give it the PATH Debian's official images set.
path=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

log() { printf '%s\n' "$*" >&2; }
die() { log "make-base-image: $*"; exit 1; }

case "$tool" in
  buildah | podman | docker) ;;
  *) die "CONTAINER_TOOL must be buildah, podman or docker, got '$tool'" ;;
esac
command -v "$tool" >/dev/null || die "$tool is not installed (Debian: apt-get install $tool)"
command -v debootstrap >/dev/null || die "debootstrap is not installed (Debian: apt-get install debootstrap)"

image_exists() {
  case "$tool" in
    buildah) buildah inspect --type image "$name" >/dev/null 2>&1 ;;
    *) "$tool" image inspect "$name" >/dev/null 2>&1 ;;
  esac
}

if image_exists; then
  log "make-base-image: reusing $name"
  echo "$name"
  exit 0
fi
[[ $(id -u) == 0 ]] || die "debootstrap needs root: run this script as root (e.g. with sudo)"

workdir=$(mktemp -d "${TMPDIR:-/var/tmp}/base-image.XXXXXX")
trap 'rm -rf "$workdir"' EXIT
rootfs=$workdir/rootfs

log "make-base-image: debootstrap $suite ($packages) from $mirror"
debootstrap --variant=minbase --include="$packages" "$suite" "$rootfs" "$mirror" >&2

# debootstrap configures the release only; add its updates and security fixes, as the official images do.
rm -f "$rootfs/etc/apt/sources.list"
cat >"$rootfs/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $mirror
Suites: $suite $suite-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: $suite-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
cp /etc/resolv.conf "$rootfs/etc/resolv.conf"
chroot "$rootfs" apt-get update -qq >&2
chroot "$rootfs" env DEBIAN_FRONTEND=noninteractive apt-get upgrade -y -qq >&2
chroot "$rootfs" apt-get clean
# An image carries no package lists, logs or host resolver; the runtime provides resolv.conf.
rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/log/* "$rootfs"/var/cache/debconf/*-old
: >"$rootfs/etc/resolv.conf"

log "make-base-image: importing as $name"
# /dev, /proc and /sys are provided by the container runtime; device nodes do not belong in a layer.
tar -C "$rootfs" --exclude=./dev/* --exclude=./proc/* --exclude=./sys/* -cf "$workdir/rootfs.tar" .
case "$tool" in
  buildah)
    container=$(buildah from scratch)
    buildah add --quiet "$container" "$workdir/rootfs.tar" / >&2
    buildah config --env PATH="$path" --env LANG=C.UTF-8 --cmd python3 "$container"
    buildah commit --quiet --rm "$container" "$name" >&2
    ;;
  *)
    "$tool" import --change "ENV PATH=$path" --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' "$workdir/rootfs.tar" "$name" >&2
    ;;
esac
echo "$name"
