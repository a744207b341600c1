#!/usr/bin/env bash
# Builds the OPA binary the tests run `opa test` with (policy: the same Rego
# and data documents pass under sluice and under OPA), once, from the Go
# module proxy into the cache the benchmarks use too. Prints its path.
set -euo pipefail
version=v1.22.3 # the version go.mod links, so both read Rego alike
cache=${SLUICE_CACHE:-$HOME/.cache/sluice}
bin=$cache/opa-$version/opa
if [ -x "$bin" ]; then
  echo "$bin"
  exit 0
fi
mkdir -p "$(dirname "$bin")"
cd "${TMPDIR:-/tmp}" # outside the repository: no go.mod, no workspace
GOBIN=$(dirname "$bin") GOWORK=off GOFLAGS=-mod=mod CGO_ENABLED=0 \
  go install "github.com/open-policy-agent/opa@$version" >&2
echo "$bin"
