// Interop client: the MCP Inspector CLI (@modelcontextprotocol/inspector 2.12.0), one process per call.
// Usage: node inspector.mjs --url URL --token TOKEN --era legacy|modern --op-prefix P
import { execFileSync } from 'node:child_process';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const args = Object.fromEntries(
  process.argv.slice(2).reduce((acc, v, i, all) => (v.startsWith('--') ? [...acc, [v.slice(2), all[i + 1]]] : acc), []),
);
const bin = join(dirname(fileURLToPath(import.meta.url)), 'node_modules/.bin/mcp-inspector');
const era = args.era === 'modern' ? 'modern' : 'legacy';
// The token goes through the environment-free CLI flag the Inspector documents; it is never logged here.
// The CLI exits non-zero for tool errors too; its JSON is on stdout either way. Errors never carry
// the command line, which holds the token.
const inspect = (...extra) => {
  let out;
  try {
    out = execFileSync(
      bin,
      ['--cli', args.url, '--protocol-era', era, '--header', `Authorization: Bearer ${args.token}`, '--format', 'json', ...extra],
      { encoding: 'utf8', timeout: 60_000, stdio: ['ignore', 'pipe', 'pipe'] },
    );
  } catch (e) {
    out = e.stdout ?? '';
    if (!out.trim()) throw new Error(`inspector exited ${e.status}: ${String(e.stderr ?? '').split(args.token).join('***').slice(0, 300)}`);
  }
  const parsed = JSON.parse(out);
  if (parsed.error) throw new Error(JSON.stringify(parsed.error));
  return parsed.result ?? parsed;
};
// Tool arguments are JSON values on the Inspector's command line: strings must be quoted.
const tool = (name, a) => inspect('--method', 'tools/call', '--tool-name', name, ...Object.entries(a).flatMap(([k, v]) => ['--tool-arg', `${k}=${JSON.stringify(v)}`]));

let failed = 0;
const step = (name, fn) => {
  try {
    fn();
    console.log(`ok   ${name}`);
  } catch (e) {
    failed += 1;
    console.log(`FAIL ${name}: ${String(e?.message ?? e).slice(0, 400)}`);
  }
};
const must = (cond, msg) => {
  if (!cond) throw new Error(msg);
};

step('list_tools', () => {
  const names = inspect('--method', 'tools/list').tools.map((t) => t.name);
  for (const n of ['create_payment', 'get_balance', 'get_approval']) must(names.includes(n), `missing ${n}`);
});
step('read_capabilities', () => {
  const r = inspect('--method', 'resources/read', '--uri', 'payments://capabilities');
  must(JSON.parse(r.contents[0].text).allowed_accounts.includes('acct-A'), 'acct-A not allowed');
});
step('get_balance', () => {
  const r = tool('get_balance', { account_id: 'acct-A' });
  must(!r.isError && r.structuredContent.currency === 'KES', JSON.stringify(r));
});
step('create_payment_replay', () => {
  const a = { operation_id: `${args['op-prefix']}-pay`, from_account: 'acct-A', to_account: 'acct-B', amount: '1.00', currency: 'KES' };
  const first = tool('create_payment', a);
  must(!first.isError && first.structuredContent.replayed === false, JSON.stringify(first));
  const second = tool('create_payment', a);
  must(second.structuredContent.replayed === true, 'second call did not replay');
  must(second.structuredContent.payment_id === first.structuredContent.payment_id, 'different payment');
});
step('over_limit', () => {
  const r = tool('create_payment', {
    operation_id: `${args['op-prefix']}-big`, from_account: 'acct-A', to_account: 'acct-B', amount: '5000.00', currency: 'KES',
  });
  must(r.isError === true && r.structuredContent?.error?.code === 'APPROVAL_REQUIRED', JSON.stringify(r));
});
process.exit(failed ? 1 : 0);
