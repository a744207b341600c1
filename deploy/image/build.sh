#!/bin/sh
# Build the gateway image (deploy/Containerfile) with buildah, pulling
# nothing: the root is assembled here from a static build of cmd/sluice,
# this host's CA roots and a passwd/group naming uid 65532.
#   deploy/image/build.sh [TAG]      (default localhost/sluice:dev)
# Needs go and buildah. Storage and runtime settings come from buildah's
# usual files and environment (CONTAINERS_STORAGE_CONF, ...).
set -eu
tag=${1:-localhost/sluice:dev}
repo=$(cd "$(dirname "$0")/../.." && pwd)
ca=${SLUICE_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
[ -r "$ca" ] || { echo "build.sh: no CA bundle at $ca (set SLUICE_CA_BUNDLE)" >&2; exit 2; }
command -v buildah >/dev/null || { echo "build.sh: buildah is not installed" >&2; exit 2; }
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
r=$ctx/rootfs
mkdir -p "$r/usr/local/bin" "$r/etc/ssl/certs" "$r/etc/sluice" "$r/etc/sluice-connectors" \
  "$r/etc/sluice-tls" "$r/etc/sluice-oidc" "$r/var/lib" "$r/run" "$r/tmp" "$ctx/rootfs-state"
chmod 1777 "$r/tmp"
(cd "$repo" && CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "$r/usr/local/bin/sluice" ./cmd/sluice)
cp "$ca" "$r/etc/ssl/certs/ca-certificates.crt"
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/var/lib/sluice:/sbin/nologin\n' >"$r/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$r/etc/group"
buildah bud --quiet -f "$repo/deploy/Containerfile" -t "$tag" "$ctx"
