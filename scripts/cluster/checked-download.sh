#!/usr/bin/env bash
# Downloads URL to DEST and keeps it only if its sha256 is the one recorded: the engines' release manifests bring
# cluster-scoped CRDs, RBAC and webhooks, so what is applied must be what was checked. Usage:
#   checked-download.sh URL SHA256 DEST
# An empty SHA256 (none recorded yet) refuses, printing the file's sha256 and how to record it (docs/security.md);
# ALLOW_UNRECORDED_CHECKSUM=1 keeps such a file anyway, trust on first use, printing the sha256 to record. A sha256
# that differs from the recorded one always refuses.
set -euo pipefail

url=${1:?usage: checked-download.sh URL SHA256 DEST} expected=${2-} destination=${3:?usage: checked-download.sh URL SHA256 DEST}
partial="$destination.partial"
trap 'rm -f "$partial"' EXIT

if ! command -v curl >/dev/null 2>&1; then
  echo "error: curl is not installed; it downloads $url (https://curl.se/download.html)" >&2
  exit 1
fi
curl --fail --silent --show-error --location --proto '=https' --output "$partial" "$url"
sha256() {
  if command -v sha256sum >/dev/null 2>&1; then sha256sum "$1"; else shasum -a 256 "$1"; fi
}
actual=$(sha256 "$partial" | awk '{print $1}')
if [[ -z $expected && ${ALLOW_UNRECORDED_CHECKSUM:-} == 1 ]]; then
  echo "warning: no sha256 is recorded for $url; applying it anyway (ALLOW_UNRECORDED_CHECKSUM=1). Check it (docs/security.md) and record its sha256 in k8s/base/settings.env: $actual" >&2
elif [[ -z $expected ]]; then
  echo "error: no sha256 is recorded for $url, so it is not applied. Check the file (docs/security.md, \"Recording a release manifest's sha256\"); if it is what the release published, record its sha256 in k8s/base/settings.env: $actual. To apply it once unchecked, trust on first use: ALLOW_UNRECORDED_CHECKSUM=1" >&2
  exit 2
elif [[ $actual != "$expected" ]]; then
  echo "error: $url has sha256 $actual, not the recorded $expected: it changed since it was checked, so it is not applied. Find out why before recording a new value (docs/security.md)" >&2
  exit 2
fi
mv "$partial" "$destination"
[[ -z $expected ]] || echo "checked $url: sha256 $actual as recorded"
