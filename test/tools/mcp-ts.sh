#!/bin/sh
# Installs the TypeScript MCP SDK (@modelcontextprotocol/sdk, from npm) that
# the MCP tests run under Debian's nodejs, once, and prints its directory.
# It lives under /opt because a sandbox sees the host's /opt (read-only):
# the tests run the TypeScript client inside a real sandbox.
set -eu
v=1.32.2
dir=${SLUICE_MCP_TS_DIR:-/opt/sluice-test/mcp-ts-$v}
if [ ! -f "$dir/node_modules/@modelcontextprotocol/sdk/package.json" ]; then
  mkdir -p "$dir"
  echo '{"name":"sluice-mcp-ts-tests","private":true,"type":"module"}' >"$dir/package.json"
  (cd "$dir" && npm install --no-audit --no-fund --loglevel=error "@modelcontextprotocol/sdk@$v" >&2)
  chmod -R a+rX "$(dirname "$dir")"
fi
echo "$dir"
