// Interop client: the TypeScript SDK 1.x (@modelcontextprotocol/sdk 1.32.2, 2025-11-25 sessions),
// directly over streamable HTTP or through mcp-remote over stdio (how stdio-only desktop apps connect).
// Usage: node ts_sdk1.mjs --url URL --token TOKEN --op-prefix P [--via http|mcp-remote]
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';

const args = Object.fromEntries(
  process.argv.slice(2).reduce((acc, v, i, all) => (v.startsWith('--') ? [...acc, [v.slice(2), all[i + 1]]] : acc), []),
);
const via = args.via ?? 'http';
let failed = 0;
const step = async (name, fn) => {
  try {
    const note = await fn();
    console.log(`ok   ${name}${note ? ` (${note})` : ''}`);
  } catch (e) {
    failed += 1;
    console.log(`FAIL ${name}: ${e?.message ?? e}`);
  }
};
const must = (cond, msg) => {
  if (!cond) throw new Error(msg);
};

let transport;
if (via === 'mcp-remote') {
  // The token goes in a header file, not the process arguments.
  const dir = mkdtempSync(join(tmpdir(), 'paygate-mcp-remote-'));
  const headers = join(dir, 'headers');
  writeFileSync(headers, `Authorization: Bearer ${args.token}\n`, { mode: 0o600 });
  const here = dirname(fileURLToPath(import.meta.url));
  transport = new StdioClientTransport({
    command: process.execPath,
    args: [join(here, 'node_modules/mcp-remote/dist/proxy.js'), args.url, '--header-file', headers, '--transport', 'http-only'],
    env: { ...process.env, MCP_REMOTE_CONFIG_DIR: dir },
    stderr: 'ignore',
  });
} else {
  transport = new StreamableHTTPClientTransport(new URL(args.url), {
    requestInit: { headers: { Authorization: `Bearer ${args.token}` } },
  });
}
const client = new Client({ name: `paygate-interop-sdk1-${via}`, version: '1.0.0' });
try {
  await client.connect(transport);
} catch (e) {
  console.log(`FAIL connect: ${e?.message ?? e}`);
  process.exit(1);
}
console.log(`info protocol ${transport.protocolVersion ?? client.getServerVersion()?.name ?? '?'}`);

await step('list_tools', async () => {
  const { tools } = await client.listTools();
  const names = tools.map((t) => t.name);
  for (const n of ['create_payment', 'get_balance', 'get_approval']) must(names.includes(n), `missing ${n}`);
  return `${names.length} tools`;
});
await step('read_capabilities', async () => {
  const r = await client.readResource({ uri: 'payments://capabilities' });
  const caps = JSON.parse(r.contents[0].text);
  must(caps.allowed_accounts.includes('acct-A'), 'acct-A not allowed');
});
await step('get_balance', async () => {
  const r = await client.callTool({ name: 'get_balance', arguments: { account_id: 'acct-A' } });
  must(!r.isError, JSON.stringify(r.structuredContent));
  must(r.structuredContent.currency === 'KES', 'currency');
});
await step('create_payment_replay', async () => {
  const a = { operation_id: `${args['op-prefix']}-pay`, from_account: 'acct-A', to_account: 'acct-B', amount: '1.00', currency: 'KES' };
  const first = await client.callTool({ name: 'create_payment', arguments: a });
  must(!first.isError && first.structuredContent.replayed === false, JSON.stringify(first.structuredContent));
  const second = await client.callTool({ name: 'create_payment', arguments: a });
  must(second.structuredContent.replayed === true, 'second call did not replay');
  must(second.structuredContent.payment_id === first.structuredContent.payment_id, 'different payment');
});
await step('over_limit', async () => {
  const r = await client.callTool({
    name: 'create_payment',
    arguments: { operation_id: `${args['op-prefix']}-big`, from_account: 'acct-A', to_account: 'acct-B', amount: '5000.00', currency: 'KES' },
  });
  must(r.isError === true, 'not a tool error');
  must(r.structuredContent?.error?.code === 'APPROVAL_REQUIRED', JSON.stringify(r.structuredContent));
});
await client.close();
process.exit(failed ? 1 : 0);
