#!/usr/bin/env bash
# postgres-rootfs.sh DIR: a root filesystem in DIR for Katib's database on the local node, from the host's Debian
# postgresql package (apt-get install postgresql): postgres, initdb and pg_isready with the libraries they load, the
# share files initdb reads, the UTC zone, a postgres user (999) and a static busybox for the entrypoint's shell.
set -euo pipefail
root=${1:?usage: postgres-rootfs.sh DIR}
bin=
for candidate in /usr/lib/postgresql/*/bin; do [ -x "$candidate/initdb" ] && bin=$candidate; done  # Debian holds one major version
busybox=$(command -v busybox || true)
if [ -z "$bin" ] || [ -z "$busybox" ]; then
  echo "error: Katib's database image needs Debian's postgresql and a static busybox: apt-get install postgresql busybox-static" >&2
  exit 1
fi
version=$(basename "$(dirname "$bin")")  # Debian lays each major version out apart
share=/usr/share/postgresql/$version
mkdir -p "$root/bin" "$root/etc" "$root/tmp" "$root/usr/share/zoneinfo/Etc" "$root/var/lib/postgresql"
chmod 1777 "$root/tmp"
cp "$busybox" "$root/bin/busybox"
for applet in sh rm mv cat; do ln -sf busybox "$root/bin/$applet"; done
# The programs the entrypoint and the readiness probe run, on PATH as in upstream's image (initdb finds postgres
# beside its own resolved path).
mkdir -p "$root$bin"
for program in postgres initdb pg_isready; do
  cp "$bin/$program" "$root$bin/" && ln -s "$bin/$program" "$root/bin/$program"
done
mkdir -p "$root$share" && cp -R "$share/." "$root$share/"
# The modules initdb loads (plpgsql, the snowball dictionaries...), without the JIT's (LLVM; the entrypoint turns it off).
lib=/usr/lib/postgresql/$version/lib
mkdir -p "$root$lib" && cp "$lib"/*.so "$root$lib/" && rm -f "$root$lib"/llvmjit*.so
for file in "$bin/postgres" "$bin/initdb" "$bin/pg_isready" "$root$lib"/*.so; do
  ldd "$file" | { grep -o '/[^ ]*' || true; } | while read -r library; do
    mkdir -p "$root$(dirname "$library")" && cp -L "$library" "$root$library"
  done
done
cp /usr/share/zoneinfo/UTC "$root/usr/share/zoneinfo/UTC" && cp /usr/share/zoneinfo/UTC "$root/usr/share/zoneinfo/Etc/UTC"
echo "postgres:x:999:999::/var/lib/postgresql:/bin/sh" >"$root/etc/passwd"
echo "postgres:x:999:" >"$root/etc/group"
cp "$(dirname "$0")/postgres-entrypoint.sh" "$root/entrypoint.sh"
