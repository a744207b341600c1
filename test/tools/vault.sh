#!/usr/bin/env bash
# Builds the Vault server the tests run against, once, from the Go module
# proxy, into a cache directory; later runs reuse it. Prints the binary's path.
#
# Vault cannot be `go install`ed (its go.mod has replace directives), and
# only v1.21.0 compiles from the proxy (later tags' in-tree sdk differs from
# the published one). So: a throwaway module outside the project, Vault's two
# non-local replaces repeated, then `go build`. A cold build takes 13-30 min
# on 2 cores, ~600 MB of modules and ~4.5 GB of memory for the link.
set -euo pipefail
version=1.21.0
cache=${SLUICE_CACHE:-$HOME/.cache/sluice}
bin=$cache/vault-$version/vault
if [ -x "$bin" ] && "$bin" version 2>/dev/null | grep -q "v$version"; then
  echo "$bin"
  exit 0
fi
src=$cache/vault-src-$version
mkdir -p "$src" "$(dirname "$bin")"
cd "$src"
export GOWORK=off GOFLAGS=-mod=mod
cat > go.mod <<MOD
module sluice.local/vaultbuild

go 1.26
MOD
cat > tools.go <<'GO'
//go:build tools

package tools

import _ "github.com/hashicorp/vault"
GO
go mod edit \
  -replace github.com/99designs/keyring=github.com/Jeffail/keyring@v1.2.3 \
  -replace github.com/ma314smith/signedxml@v1.1.1=github.com/moov-io/signedxml@v1.1.1
echo "test/tools/vault.sh: building Vault v$version (cold: 13-30 min)" >&2
start=$(date +%s)
go get "github.com/hashicorp/vault@v$version" >&2
go build -ldflags="-s -w" -o vault.tmp github.com/hashicorp/vault >&2
mv vault.tmp "$bin"
echo "test/tools/vault.sh: built in $(( $(date +%s) - start )) s" >&2
"$bin" version >&2
echo "$bin"
