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

echo "== go test"
short=()
[ -n "${SHORT:-}" ] && short=(-short)
# Unit and package tests first, two packages at a time; then the suites in
# test/ (real binaries, namespaces, sandboxes, Chromium) one package at a
# time, so their timing-sensitive steps do not compete with each other.
go test -race -count=1 -timeout 30m "${short[@]}" $(go list ./... | grep -v '/test/')
rm -rf test/report/cases # the report shows only what this run recorded
go test -race -count=1 -timeout 30m -p 1 "${short[@]}" ./test/...

echo "== attack-and-fault report (test/report/attack.md)"
# The suites recorded each THREATS case they asserted; this writes the
# report and fails if any recorded case failed.
go run ./test/report

echo "== demo (the README's first command)"
go run ./cmd/sluice demo
echo "test.sh: all passed"
