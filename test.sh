#!/usr/bin/env bash
# Runs everything CI runs, installing what the tests need first.
# Usage: ./test.sh            (as root: the end-to-end tests make network namespaces)
#        SHORT=1 ./test.sh    (skip the slow suites)
set -euo pipefail
cd "$(dirname "$0")"
export PATH=/usr/local/go/bin:$PATH

need=()
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v bwrap >/dev/null 2>&1 || need+=(bubblewrap)
command -v nft >/dev/null 2>&1 || need+=(nftables)
command -v chromium >/dev/null 2>&1 || need+=(chromium) # test/browser drives the review UI in it
command -v curl >/dev/null 2>&1 || need+=(curl) # test/e2e runs Debian's curl inside a sandbox
# test/bench measures sluice against these peers (its smoke run is part of ./test/...)
for p in squid tinyproxy crun dnsperf; do command -v $p >/dev/null 2>&1 || need+=($p); done
command -v dnsmasq >/dev/null 2>&1 || need+=(dnsmasq-base)
/usr/bin/python3 -m pip --version >/dev/null 2>&1 || need+=(python3-pip) # test/e2e runs pip inside a sandbox
command -v node >/dev/null 2>&1 || need+=(nodejs) # test/e2e runs the TypeScript MCP SDK's client in a sandbox
command -v npm >/dev/null 2>&1 || need+=(npm)
for p in buildah podman runc; do command -v $p >/dev/null 2>&1 || need+=($p); done # test/deploy builds the gateway image and runs it (runc: crun refuses the hybrid cgroup layout)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql) # the PostgreSQL store (gateway/store/pgtest) and Vault's database engine
if [ ${#need[@]} -gt 0 ]; then
  echo "test.sh: installing ${need[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"
fi

echo "== gofmt"
bad=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [ -n "$bad" ]; then echo "gofmt would change: $bad"; exit 1; fi

echo "== go vet"
go vet ./...

echo "== Vault server for the Vault tests (built once, cached)"
SLUICE_VAULT_BIN=$(test/tools/vault.sh)
export SLUICE_VAULT_BIN SLUICE_REQUIRE_VAULT=1
# PostgreSQL store tests fail, not skip, without a server: test.sh installs it.
export SLUICE_REQUIRE_POSTGRES=1

echo "== OPA for \`opa test\` on the same Rego and data (built once, cached)"
SLUICE_OPA_BIN=$(test/tools/opa.sh)
export SLUICE_OPA_BIN

echo "== TypeScript MCP SDK for the MCP tests (npm, installed once under /opt)"
SLUICE_MCP_TS_DIR=$(test/tools/mcp-ts.sh)
export SLUICE_MCP_TS_DIR

echo "== go test"
short=()
[ -n "${SHORT:-}" ] && short=(-short)
# Unit and package tests first, two packages at a time; then the suites in
# test/ (real binaries, namespaces, sandboxes, Chromium) one package at a
# time, so their timing-sensitive steps do not compete with each other.
go test -race -count=1 -timeout 30m "${short[@]}" $(go list ./... | grep -v '/test/')
rm -rf test/report/cases # the report shows only what this run recorded
go test -race -count=1 -timeout 30m -p 1 "${short[@]}" ./test/...

# The full benchmark run (minutes; rewrites test/report/bench.md) is
# SLUICE_BENCH=full go test ./test/bench -run TestBench -timeout 60m -v

echo "== attack-and-fault report (test/report/attack.md)"
# The suites recorded each THREATS case they asserted; this writes the
# report and fails if any recorded case failed.
go run ./test/report

echo "== demo (the README's first command)"
go run ./cmd/sluice demo
echo "test.sh: all passed"
