// The TypeScript MCP SDK's client, run by Debian's nodejs inside a
// sandbox: it connects to SLUICE_MCP_URL, lists the tools, makes an
// allowed, a blocked and an ask call (with a progress callback), and
// prints one line per step. MCP_TS_DIR is where test/tools/mcp-ts.sh
// installed @modelcontextprotocol/sdk.
const base = process.env.MCP_TS_DIR + "/node_modules/@modelcontextprotocol/sdk/dist/esm/";
const { Client } = await import(base + "client/index.js");
const { StreamableHTTPClientTransport } = await import(base + "client/streamableHttp.js");

const out = (...a) => process.stdout.write(a.join(" ") + "\n");
const client = new Client({ name: "sandbox-ts", version: "1" });
await client.connect(new StreamableHTTPClientTransport(new URL(process.env.SLUICE_MCP_URL)));
const { tools } = await client.listTools();
out("tools", tools.map((t) => t.name).sort().join(","));
const text = (r) => (r.content || []).map((c) => c.text || "").join("").replace(/\n/g, " ");
const call = async (step, name, args, opts) => {
  try {
    const r = await client.callTool({ name, arguments: args }, undefined, opts);
    out(step, String(!!r.isError), JSON.stringify(r.structuredContent ?? null), text(r));
  } catch (e) {
    out(step, "error", String(e && e.message));
  }
};
await call("allowed", "tickets.list_tickets", { query: { limit: 3 } });
await call("blocked", "tickets.delete_ticket", { path: { id: "T-1" } });
let progress = 0;
out("asking");
await call("ask", "tickets.create_refund", { body: { amount: 5, reason: "dup" } }, {
  timeout: 120000,
  resetTimeoutOnProgress: true,
  onprogress: () => { progress++; if (progress === 1) out("progress-first"); },
});
out("progress", String(progress));
await client.close();
