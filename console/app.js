// paygate operator console: one ES module, no framework, no build step.
//
// Architecture Invariant: the access token lives in `session.token` (module memory) and nowhere
// else: not in localStorage, sessionStorage, cookies, URLs or logs. Only the PKCE verifier, the
// OAuth `state` and the approval link the person opened (#approvals/<id> or #confirm/<id>) cross the
// sign-in redirect in sessionStorage, and they are removed on return.
//
// Architecture Invariant: text from the server is rendered with text nodes only (never innerHTML).
// Agents write memos, reasons and payee names, so that text is hostile: it may hold HTML,
// instructions aimed at a reviewer, bidi overrides or invisible characters. `clean()` makes those
// characters visible; the page never interprets any of it.

const PENDING_KEY = 'paygate.console.oidc'; // sessionStorage: {verifier, state} across the redirect only
const PAGE_LIMIT = 50;
const SUMMARY_POLL_MS = 15000;
const SCOPE = { audit: 'payments:audit', approve: 'payments:approve', admin: 'payments:admin', confirm: 'payments:confirm' };
// A view with one approval in it: #approvals/<id> (an operator's review) or #confirm/<id> (the
// user's own confirmation). Only these shapes survive the sign-in redirect.
const DEEP_LINK = /^#(approvals|confirm)\/(apr_[A-Za-z0-9]+)$/;

const session = { token: null, claims: null, scopes: new Set() };
let config = null;
let currentView = null;
let pollTimer = null;

// ---- small DOM helpers ------------------------------------------------------------------------

const $ = (sel, root = document) => root.querySelector(sel);
const $$ = (sel, root = document) => Array.from(root.querySelectorAll(sel));

// Control characters, zero-width and bidi-control characters: shown as ⟨U+XXXX⟩ so a reviewer sees
// them instead of being fooled by them.
const INVISIBLE = /[\u0000-\u001f\u007f-\u009f\u00ad\u061c\u115f\u1160\u180e\u200b-\u200f\u202a-\u202e\u2060-\u206f\u3164\ufe00-\ufe0f\ufeff\ufff9-\ufffb]/gu;
function clean(value) {
  if (value === null || value === undefined) return '';
  const s = typeof value === 'string' ? value : String(value);
  return s.replace(INVISIBLE, (c) => `⟨U+${c.codePointAt(0).toString(16).toUpperCase().padStart(4, '0')}⟩`);
}

// h('tag', {attr: value, class: 'x', on: {click: fn}}, ...children). Children are nodes or text;
// text always becomes a text node. Attributes are set with setAttribute, never as HTML.
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs ?? {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === 'on') for (const [ev, fn] of Object.entries(v)) el.addEventListener(ev, fn);
    else if (k === 'text') el.textContent = clean(v);
    else el.setAttribute(k, v === true ? '' : String(v));
  }
  append(el, children);
  return el;
}
function append(el, children) {
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(clean(c)));
  }
  return el;
}
function clear(el) {
  while (el.firstChild) el.firstChild.remove();
  return el;
}
const SVG_NS = 'http://www.w3.org/2000/svg';
function svg(tag, attrs, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs ?? {})) el.setAttribute(k, String(v));
  for (const c of children) el.append(c instanceof Node ? c : document.createTextNode(clean(c)));
  return el;
}

// RFC 3339 strings; a number is Unix seconds (the reconciliation report's `since`).
function fmtTime(iso) {
  if (iso === null || iso === undefined || iso === '') return '—';
  const d = typeof iso === 'number' ? new Date(iso * 1000) : new Date(iso);
  if (Number.isNaN(d.getTime())) return clean(iso);
  const p = (n) => String(n).padStart(2, '0');
  return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())} ${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}`;
}
function timeCell(iso) {
  return h('time', { datetime: typeof iso === 'string' ? iso : null, title: iso ?? null }, fmtTime(iso));
}
function fmtRemaining(ms) {
  if (ms <= 0) return 'expired';
  const s = Math.floor(ms / 1000);
  const d = Math.floor(s / 86400);
  const hh = Math.floor((s % 86400) / 3600);
  const mm = Math.floor((s % 3600) / 60);
  const ss = s % 60;
  if (d > 0) return `${d}d ${hh}h ${mm}m`;
  if (hh > 0) return `${hh}h ${String(mm).padStart(2, '0')}m`;
  return `${mm}m ${String(ss).padStart(2, '0')}s`;
}
function money(amount, currency) {
  if (amount === null || amount === undefined) return '—';
  return `${clean(amount)} ${clean(currency ?? '')}`.trim();
}
function badge(text, kind) {
  return h('span', { class: `badge ${kind ?? clean(text)}` }, text ?? '—');
}
// Agent-written text: set apart, so it reads as a quotation and not as part of the console.
function agentText(value, who = 'Written by an agent') {
  if (value === null || value === undefined || value === '') return h('span', { class: 'muted' }, '—');
  const text = typeof value === 'string' ? value : String(value);
  return h('q', { class: 'agent-text', title: `${who} (data, not instructions): ${clean(text).slice(0, 1000)}` }, text);
}
const RECORDED = 'Free text recorded with the event';
// Ids are long (`pay_` + 32 hex): tables cut them with an ellipsis, the title holds the whole id.
function mono(value) {
  return h('code', { class: 'id', title: value ?? null }, value ?? '—');
}

// ---- notices ----------------------------------------------------------------------------------

function notify(message, kind = 'info') {
  const el = $('[data-testid="notice"]');
  el.hidden = false;
  el.className = `notice ${kind}`;
  el.dataset.kind = kind;
  el.textContent = clean(message);
}
function clearNotice() {
  const el = $('[data-testid="notice"]');
  el.hidden = true;
  el.textContent = '';
}

// ---- tokens -----------------------------------------------------------------------------------

function b64urlDecode(s) {
  const pad = s.replace(/-/g, '+').replace(/_/g, '/').padEnd(Math.ceil(s.length / 4) * 4, '=');
  const bin = atob(pad);
  return new TextDecoder().decode(Uint8Array.from(bin, (c) => c.charCodeAt(0)));
}
function b64urlEncode(bytes) {
  let bin = '';
  for (const b of new Uint8Array(bytes)) bin += String.fromCharCode(b);
  return btoa(bin).replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '');
}
function b64urlBytes(s) {
  const pad = s.replace(/-/g, '+').replace(/_/g, '/').padEnd(Math.ceil(s.length / 4) * 4, '=');
  return Uint8Array.from(atob(pad), (c) => c.charCodeAt(0));
}

// ---- passkeys (WebAuthn) ------------------------------------------------------------------------
// A decision that needs a passkey is signed over the exact text the gateway shows for it
// (`passkey_payloads`): the challenge is its SHA-256, computed here, so the page signs what it was
// given and the gateway refuses an assertion over anything else.

const passkeysAvailable = () => typeof window.PublicKeyCredential === 'function' && !!navigator.credentials;

// A bearer token alone never registers a passkey: the first one takes an enrolment code another
// operator issued for this person (or `paygate passkeys enrol-code` at the box); a later one is
// vouched for by one of the person's live passkeys (an assertion over the registration's own
// challenge), or by a fresh code when one is given.
async function registerPasskey(name, enrolmentCode) {
  if (!passkeysAvailable()) throw new Error('This browser has no passkey support (WebAuthn).');
  const code = (enrolmentCode ?? '').trim();
  const { publicKey: o, enrolment } = await api('POST', '/passkeys/options');
  if (!code && (enrolment?.code_required ?? true)) {
    throw new Error('Your first passkey needs an enrolment code: ask another operator (an admin) to issue one for you, then enter it here.');
  }
  let vouch = null;
  if (!code) {
    const v = enrolment.publicKey;
    const got = await navigator.credentials.get({
      publicKey: {
        ...v,
        challenge: b64urlBytes(v.challenge),
        allowCredentials: (v.allowCredentials ?? []).map((c) => ({ ...c, id: b64urlBytes(c.id) })),
      },
    });
    vouch = {
      credential_id: b64urlEncode(got.rawId),
      client_data_json: b64urlEncode(got.response.clientDataJSON),
      authenticator_data: b64urlEncode(got.response.authenticatorData),
      signature: b64urlEncode(got.response.signature),
    };
  }
  const publicKey = {
    ...o,
    challenge: b64urlBytes(o.challenge),
    user: { ...o.user, id: b64urlBytes(o.user.id) },
    excludeCredentials: (o.excludeCredentials ?? []).map((c) => ({ ...c, id: b64urlBytes(c.id) })),
  };
  const cred = await navigator.credentials.create({ publicKey });
  return api('POST', '/passkeys', {
    body: {
      challenge: o.challenge,
      client_data_json: b64urlEncode(cred.response.clientDataJSON),
      attestation_object: b64urlEncode(cred.response.attestationObject),
      name: name || null,
      ...(code ? { enrolment_code: code } : { passkey: vouch }),
    },
  });
}

// An assertion by one of the signed-in person's passkeys over `payload` (a passkey_payloads text).
async function signWithPasskey(payload) {
  if (!passkeysAvailable()) throw new Error('This browser has no passkey support (WebAuthn).');
  const mine = await api('GET', '/passkeys');
  const live = (mine?.items ?? []).filter((p) => !p.revoked_at);
  if (!live.length) throw new Error('You have no passkey yet: register one (Passkeys), then decide again.');
  const challenge = new Uint8Array(await crypto.subtle.digest('SHA-256', new TextEncoder().encode(payload)));
  const cred = await navigator.credentials.get({
    publicKey: {
      challenge,
      rpId: location.hostname,
      allowCredentials: live.map((p) => ({ type: 'public-key', id: b64urlBytes(p.credential_id) })),
      userVerification: 'required',
      timeout: 120000,
    },
  });
  return {
    credential_id: b64urlEncode(cred.rawId),
    client_data_json: b64urlEncode(cred.response.clientDataJSON),
    authenticator_data: b64urlEncode(cred.response.authenticatorData),
    signature: b64urlEncode(cred.response.signature),
  };
}

// The body of a decision on `a`: the reason, and the passkey's assertion where it needs one.
async function decisionBody(a, decision, reason) {
  const body = reason ? { reason } : {};
  if (a.passkey_required) body.passkey = await signWithPasskey(a.passkey_payloads?.[decision] ?? '');
  return body;
}

// For display only: the server verifies the token; the page only reads who it names.
function decodeClaims(token) {
  try {
    const part = token.split('.')[1];
    const claims = JSON.parse(b64urlDecode(part));
    return claims && typeof claims === 'object' ? claims : {};
  } catch {
    return {};
  }
}
function scopesOf(claims) {
  const raw = claims.scope ?? claims.scp ?? '';
  const list = Array.isArray(raw) ? raw : String(raw).split(/\s+/);
  return new Set(list.filter(Boolean).map(String));
}
const can = (scope) => session.scopes.has(scope);
// A person who only confirms their own payments (payments:confirm, no operator scope) sees the
// confirmation view alone: the operator tabs are not theirs to see.
const confirmOnly = () => can(SCOPE.confirm) && ![SCOPE.audit, SCOPE.approve, SCOPE.admin].some(can);

function setToken(token) {
  session.token = token;
  session.claims = decodeClaims(token);
  session.scopes = scopesOf(session.claims);
}

function signOut(message) {
  session.token = null;
  session.claims = null;
  session.scopes = new Set();
  if (pollTimer) clearInterval(pollTimer);
  pollTimer = null;
  showSignIn(message);
}

// ---- the operator API -------------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, code, message, correlationId, retryAfter) {
    super(message);
    this.status = status;
    this.code = code;
    this.correlationId = correlationId;
    this.retryAfter = retryAfter;
  }
}

async function api(method, path, { query, body } = {}) {
  if (!session.token) throw new ApiError(401, 'SIGNED_OUT', 'Not signed in.');
  const url = new URL(config.api.replace(/\/$/, '') + path, location.origin);
  for (const [k, v] of Object.entries(query ?? {})) {
    if (v !== undefined && v !== null && v !== '') url.searchParams.set(k, v);
  }
  const headers = { accept: 'application/json', authorization: `Bearer ${session.token}` };
  if (body !== undefined) headers['content-type'] = 'application/json';
  let resp;
  try {
    resp = await fetch(url, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      cache: 'no-store',
      credentials: 'omit',
      referrerPolicy: 'no-referrer',
    });
  } catch {
    throw new ApiError(0, 'NETWORK', 'The gateway did not answer.');
  }
  let data = null;
  const text = await resp.text();
  if (text) {
    try {
      data = JSON.parse(text);
    } catch {
      data = null;
    }
  }
  if (resp.ok) return data;
  const err = data?.error ?? {};
  const e = new ApiError(
    resp.status,
    typeof err.code === 'string' ? err.code : `HTTP_${resp.status}`,
    typeof err.message === 'string' ? err.message : resp.statusText || `HTTP ${resp.status}`,
    typeof err.correlation_id === 'string' ? err.correlation_id : null,
    resp.headers.get('retry-after'),
  );
  if (resp.status === 401) {
    signOut('The gateway refused the token (401): it expired or is not valid here. Sign in again.');
  }
  throw e;
}

// One place that explains an API failure to the operator. `needs` names the scope the action needs,
// so a 403 can say which one the token lacks; `control` is disabled on a 403.
function explain(e, { needs, control, what } = {}) {
  const where = what ? `${what}: ` : '';
  const ref = e.correlationId ? ` (ref ${e.correlationId})` : '';
  if (e.status === 401) return; // signOut already said so
  if (['PASSKEY_REQUIRED', 'PASSKEY_INVALID', 'ENROLMENT_REQUIRED', 'ENROLMENT_CODE_INVALID'].includes(e.code)) {
    notify(`${where}${clean(e.message)} [${clean(e.code)}]${ref}`, 'error');
    return;
  }
  if (e.status === 403 && e.code !== 'SELF_REVIEW') {
    const scope = needs ?? 'for this action';
    if (control) disable(control, `Your token lacks scope ${scope}`);
    notify(`${where}your token lacks scope ${scope}. ${clean(e.message)}${ref}`, 'error');
    return;
  }
  if (e.status === 429) {
    const wait = e.retryAfter ? ` Try again in ${e.retryAfter} s.` : ' Try again shortly.';
    notify(`${where}too many requests.${wait}${ref}`, 'warn');
    return;
  }
  notify(`${where}${clean(e.message)} [${clean(e.code)}]${ref}`, 'error');
}

function disable(control, why) {
  control.disabled = true;
  control.title = why;
  control.setAttribute('aria-disabled', 'true');
  control.dataset.reason = why;
}
// Buttons for actions the token's scopes do not allow are disabled up front, with the reason.
function guard(button, scope) {
  if (!can(scope)) disable(button, `Your token lacks scope ${scope}`);
  return button;
}

// ---- sign-in ----------------------------------------------------------------------------------

function showSignIn(message) {
  $('[data-testid="who"]').hidden = true;
  $('[data-testid="nav"]').hidden = true;
  for (const v of $$('main > .view')) v.hidden = true;
  clearNotice();
  const box = $('[data-testid="signin"]');
  box.hidden = false;
  const err = $('[data-testid="signin-error"]');
  err.hidden = !message;
  err.textContent = message ? clean(message) : '';
  const oidc = config?.oidc;
  $('[data-testid="oidc-block"]').hidden = !oidc;
  if (oidc) $('[data-testid="oidc-issuer"]').textContent = clean(oidc.issuer);
  $('[data-testid="dev-signin"]').hidden = !config?.dev_sign_in;
  $('[data-testid="signin-unavailable"]').hidden = Boolean(oidc || config?.dev_sign_in);
  currentView = null;
}

async function discover(issuer) {
  const base = issuer.replace(/\/$/, '');
  const resp = await fetch(`${base}/.well-known/openid-configuration`, { credentials: 'omit', cache: 'no-store' });
  if (!resp.ok) throw new Error(`the issuer's discovery document answered ${resp.status}`);
  const doc = await resp.json();
  // Mix-up defence: the document must be the configured issuer's own.
  if (String(doc.issuer).replace(/\/$/, '') !== base) throw new Error('the discovery document names another issuer');
  for (const k of ['authorization_endpoint', 'token_endpoint']) {
    if (typeof doc[k] !== 'string') throw new Error(`the discovery document has no ${k}`);
  }
  return doc;
}

function randomToken(bytes = 32) {
  return b64urlEncode(crypto.getRandomValues(new Uint8Array(bytes)));
}
function redirectUri() {
  return `${location.origin}/console/callback`;
}

async function startOidc() {
  const oidc = config.oidc;
  try {
    const doc = await discover(oidc.issuer);
    const verifier = randomToken(32);
    const state = randomToken(16);
    const challenge = b64urlEncode(await crypto.subtle.digest('SHA-256', new TextEncoder().encode(verifier)));
    // The page the person was sent to (an approval, by URL elicitation) comes back with them.
    const link = DEEP_LINK.test(location.hash) ? location.hash : null;
    sessionStorage.setItem(PENDING_KEY, JSON.stringify({ verifier, state, link }));
    const url = new URL(doc.authorization_endpoint);
    const params = {
      response_type: 'code',
      client_id: oidc.client_id,
      redirect_uri: redirectUri(),
      scope: oidc.scopes,
      state,
      code_challenge: challenge,
      code_challenge_method: 'S256',
      resource: config.resource,
    };
    for (const [k, v] of Object.entries(params)) url.searchParams.set(k, v);
    location.assign(url.toString());
  } catch (e) {
    showSignIn(`Sign-in could not start: ${e.message}`);
  }
}

// The redirect back from the issuer: /console/callback?code=…&state=…
async function finishOidc() {
  const params = new URLSearchParams(location.search);
  const pendingRaw = sessionStorage.getItem(PENDING_KEY);
  sessionStorage.removeItem(PENDING_KEY);
  // The code leaves the address bar (and history) before anything else happens.
  history.replaceState(null, '', '/console');
  if (params.get('error')) {
    throw new Error(`the identity provider said ${params.get('error')}: ${params.get('error_description') ?? ''}`);
  }
  let pending = null;
  try {
    pending = JSON.parse(pendingRaw ?? 'null');
  } catch {
    pending = null;
  }
  if (typeof pending?.link === 'string' && DEEP_LINK.test(pending.link)) history.replaceState(null, '', `/console${pending.link}`);
  const code = params.get('code');
  if (!pending || !code) throw new Error('no sign-in was in progress in this tab');
  if (params.get('state') !== pending.state) throw new Error('the sign-in response does not match this tab (state)');
  const doc = await discover(config.oidc.issuer);
  const form = new URLSearchParams({
    grant_type: 'authorization_code',
    code,
    redirect_uri: redirectUri(),
    client_id: config.oidc.client_id,
    code_verifier: pending.verifier,
    resource: config.resource,
  });
  const resp = await fetch(doc.token_endpoint, {
    method: 'POST',
    headers: { 'content-type': 'application/x-www-form-urlencoded', accept: 'application/json' },
    body: form,
    credentials: 'omit',
    cache: 'no-store',
  });
  let data = null;
  try {
    data = await resp.json();
  } catch {
    data = null;
  }
  if (!resp.ok || typeof data?.access_token !== 'string') {
    const why = data?.error ? `${data.error}${data.error_description ? `: ${data.error_description}` : ''}` : `HTTP ${resp.status}`;
    throw new Error(`the token endpoint refused the code (${why})`);
  }
  return data.access_token;
}

function signedIn() {
  $('[data-testid="signin"]').hidden = true;
  const who = $('[data-testid="who"]');
  who.hidden = false;
  const c = session.claims ?? {};
  const name = c.preferred_username ?? c.email ?? c.sub ?? 'unknown';
  $('[data-testid="whoami"]').textContent = clean(name);
  $('[data-testid="whoami"]').title = clean(`sub ${c.sub ?? '?'} · iss ${c.iss ?? '?'}`);
  const scopes = clear($('[data-testid="scopes"]'));
  for (const s of [...session.scopes].filter((x) => x.startsWith('payments:')).sort()) {
    scopes.append(h('span', { class: 'chip', 'data-scope': s }, s.replace('payments:', '')));
  }
  if (!session.scopes.size) scopes.append(h('span', { class: 'chip warn' }, 'no scopes'));
  const exp = $('[data-testid="token-expiry"]');
  exp.dataset.exp = c.exp ? String(c.exp * 1000) : '';
  $('[data-testid="nav"]').hidden = confirmOnly();
  tickClocks();
  if (pollTimer) clearInterval(pollTimer);
  if (!confirmOnly()) {
    pollTimer = setInterval(refreshPendingCount, SUMMARY_POLL_MS);
    refreshPendingCount();
  }
  route();
}

// ---- routing ----------------------------------------------------------------------------------

const VIEWS = {
  overview: loadOverview,
  approvals: loadApprovals,
  confirm: loadConfirm,
  payments: loadPayments,
  audit: loadAudit,
  agents: loadAgents,
  mandates: loadMandates,
  payees: loadPayees,
  policy: loadPolicy,
  passkeys: loadPasskeys,
  reconciliation: loadReconciliation,
  webhooks: loadWebhooks,
  health: loadHealth,
};

function route() {
  if (!session.token) return;
  const name = location.hash.replace(/^#/, '').split('/')[0];
  const view = confirmOnly() ? 'confirm' : Object.hasOwn(VIEWS, name) ? name : 'overview';
  for (const a of $$('nav.tabs a')) {
    if (a.dataset.view === view) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
  for (const v of $$('main > .view')) v.hidden = v.dataset.view !== view;
  if (currentView !== view) clearNotice();
  currentView = view;
  VIEWS[view]();
}

function section(name) {
  return $(`main > .view[data-view="${name}"]`);
}

async function load(name, fn) {
  const el = section(name);
  el.setAttribute('aria-busy', 'true');
  try {
    await fn(el);
    el.dataset.loaded = String(Date.now());
  } catch (e) {
    if (e instanceof ApiError) explain(e, { needs: SCOPE.audit, what: 'Loading failed' });
    else notify(`Loading failed: ${e.message}`, 'error');
  } finally {
    el.removeAttribute('aria-busy');
  }
}

// Lists with a cursor: `more` appends the next page.
function pager(el, fetchPage, renderItems) {
  const moreBtn = $('button.more', el);
  let cursor = null;
  async function page(first) {
    const data = await fetchPage(first ? null : cursor);
    const items = Array.isArray(data?.items) ? data.items : [];
    renderItems(items, first);
    cursor = data?.next_cursor ?? null;
    moreBtn.hidden = !cursor;
  }
  moreBtn.onclick = () => load(el.dataset.view, () => page(false));
  return page(true);
}

// ---- overview ---------------------------------------------------------------------------------

async function refreshPendingCount() {
  if (!session.token) return;
  try {
    const s = await api('GET', '/summary');
    const n = Number(s?.pending_approvals ?? 0);
    $('[data-testid="nav-pending"]').textContent = n > 0 ? String(n) : '';
  } catch {
    /* the view that needs it says why */
  }
}

function loadOverview() {
  return load('overview', async (el) => {
    const s = await api('GET', '/summary');
    $('[data-testid="summary-date"]').textContent = clean(s.date ?? '');
    $('[data-testid="nav-pending"]').textContent = s.pending_approvals > 0 ? String(s.pending_approvals) : '';
    const cards = clear($('[data-testid="summary-cards"]'));
    cards.append(
      card('Pending approvals', String(s.pending_approvals ?? 0), 'waiting for a human', 'card-pending', s.pending_approvals > 0 ? 'attention' : ''),
      card('Suspended agents', String(s.suspended_agents ?? 0), 'stopped until resumed', 'card-suspended', s.suspended_agents > 0 ? 'attention' : ''),
    );
    const totals = Array.isArray(s.totals) ? s.totals : [];
    const currencies = [...new Set([...totals.map((t) => t.currency), ...(s.hourly ?? []).map((x) => x.currency)])].filter(Boolean).sort();
    for (const cur of currencies) {
      const pick = (kind, status) => totals.find((t) => t.kind === kind && t.status === status && t.currency === cur);
      const paid = pick('payment', 'succeeded');
      const pending = pick('payment', 'pending');
      const failed = pick('payment', 'failed');
      const refunds = pick('refund', 'succeeded');
      cards.append(
        card(`Paid · ${cur}`, paid?.amount ?? '0', `${paid?.count ?? 0} payments`, `card-paid-${cur}`),
        card(`Pending · ${cur}`, pending?.amount ?? '0', `${pending?.count ?? 0} payments`, `card-pending-${cur}`),
        card(`Failed · ${cur}`, String(failed?.count ?? 0), `${failed?.amount ?? '0'} ${cur}`, `card-failed-${cur}`, failed?.count > 0 ? 'attention' : ''),
        card(`Refunded · ${cur}`, refunds?.amount ?? '0', `${refunds?.count ?? 0} refunds`, `card-refunds-${cur}`),
      );
    }
    const select = $('[data-testid="chart-currency"]');
    const previous = select.value;
    clear(select);
    for (const cur of currencies) select.append(h('option', { value: cur }, cur));
    if (currencies.includes(previous)) select.value = previous;
    select.onchange = () => drawChart(s.hourly ?? [], select.value);
    drawChart(s.hourly ?? [], select.value);
  });
}

function card(label, raw, sub, testid, extra) {
  const value = String(raw ?? '—');
  return h('div', { class: `card ${extra ?? ''}`, 'data-testid': testid },
    h('div', { class: 'card-label' }, label),
    h('div', { class: `card-value${value.length > 14 ? ' long' : ''}` }, value),
    h('div', { class: 'card-sub muted' }, sub));
}

// Today's volume as inline SVG bars: 24 hours, amount per hour in one currency.
function drawChart(hourly, currency) {
  const box = clear($('[data-testid="chart"]'));
  const hours = Array.from({ length: 24 }, (_, hr) => ({ hour: hr, amount: 0, count: 0, label: '0' }));
  for (const x of hourly) {
    if (x.currency !== currency || !(x.hour >= 0 && x.hour < 24)) continue;
    const slot = hours[x.hour];
    slot.amount += Number(x.amount) || 0;
    slot.count += Number(x.count) || 0;
    slot.label = String(x.amount);
  }
  const max = Math.max(0, ...hours.map((x) => x.amount));
  const W = 960;
  const H = 220;
  const left = 64;
  const bottom = 28;
  const top = 12;
  const plotH = H - bottom - top;
  const step = (W - left - 8) / 24;
  const total = hours.reduce((a, x) => a + x.amount, 0);
  const chart = svg('svg', {
    viewBox: `0 0 ${W} ${H}`, class: 'bars', role: 'img', 'data-testid': 'volume-chart',
    'aria-label': currency ? `Volume by hour in ${currency}; ${hours.filter((x) => x.count).length} hours with payments, peak ${max.toFixed(2)}` : 'No payments today',
  });
  const niceMax = max > 0 ? niceCeil(max) : 1;
  for (let i = 0; i <= 4; i++) {
    const v = (niceMax * i) / 4;
    const y = top + plotH - (plotH * i) / 4;
    chart.append(svg('line', { x1: left, x2: W - 8, y1: y, y2: y, class: 'gridline' }));
    chart.append(svg('text', { x: left - 8, y: y + 4, 'text-anchor': 'end', class: 'axis' }, compact(v)));
  }
  for (const x of hours) {
    const bh = x.amount > 0 ? Math.max(2, (plotH * x.amount) / niceMax) : 0;
    const bx = left + x.hour * step + step * 0.15;
    const bar = svg('rect', {
      x: bx.toFixed(1), y: (top + plotH - bh).toFixed(1), width: (step * 0.7).toFixed(1), height: bh.toFixed(1),
      rx: 2, class: 'bar', 'data-hour': x.hour,
    });
    bar.append(svg('title', {}, `${String(x.hour).padStart(2, '0')}:00 UTC — ${x.label} ${currency} in ${x.count} payments`));
    chart.append(bar);
    if (x.hour % 3 === 0) {
      chart.append(svg('text', { x: (left + x.hour * step + step / 2).toFixed(1), y: H - 8, 'text-anchor': 'middle', class: 'axis' }, `${String(x.hour).padStart(2, '0')}h`));
    }
  }
  box.append(chart);
  box.append(h('p', { class: 'muted small' }, currency ? `Total today: ${total.toFixed(2)} ${currency}` : 'No payments today.'));
}
function niceCeil(v) {
  const p = 10 ** Math.floor(Math.log10(v));
  for (const m of [1, 2, 2.5, 5, 10]) if (v <= m * p) return m * p;
  return 10 * p;
}
function compact(v) {
  if (v >= 1e6) return `${(v / 1e6).toFixed(v % 1e6 ? 1 : 0)}M`;
  if (v >= 1e3) return `${(v / 1e3).toFixed(v % 1e3 ? 1 : 0)}k`;
  return String(Math.round(v * 100) / 100);
}

// ---- approvals --------------------------------------------------------------------------------

// The approval a deep link names, if the address is one.
function linkedApproval(view) {
  const m = DEEP_LINK.exec(location.hash);
  return m && m[1] === view ? m[2] : null;
}

function loadApprovals() {
  const one = linkedApproval('approvals');
  if (one) {
    return load('approvals', async (el) => {
      const list = clear($('[data-testid="approvals-list"]'));
      $('button.more', el).hidden = true;
      const a = await api('GET', `/approvals/${encodeURIComponent(one)}`);
      list.append(h('p', { class: 'small' }, h('a', { href: '#approvals', 'data-testid': 'approvals-all' }, 'All approvals')));
      list.append(approvalCard(a));
      tickClocks();
    });
  }
  return load('approvals', async (el) => {
    const status = $('[data-testid="approvals-status"]').value;
    const list = $('[data-testid="approvals-list"]');
    await pager(el, (cursor) => api('GET', '/approvals', { query: { status, cursor, limit: PAGE_LIMIT } }), (items, first) => {
      if (first) clear(list);
      for (const a of items) list.append(approvalCard(a));
      if (first && !items.length) list.append(h('p', { class: 'empty muted', 'data-testid': 'approvals-empty' }, `No ${status} approvals.`));
    });
    tickClocks();
  });
}

function approvalCard(a) {
  const reviewers = Array.isArray(a.approved_by) ? a.approved_by : [];
  const pending = a.status === 'pending';
  const intent = a.intent && typeof a.intent === 'object' ? a.intent : {};
  const cardEl = h('article', {
    class: `approval panel status-${clean(a.status)}`, 'data-testid': 'approval', 'data-approval-id': a.approval_id,
    'aria-label': `Approval ${clean(a.approval_id)}`,
  });
  const head = h('header', { class: 'approval-head' },
    h('span', { class: 'amount', 'data-testid': 'approval-amount' }, money(a.amount ?? intent.amount, a.currency ?? intent.currency)),
    h('span', { class: 'muted' }, `${clean(a.tool ?? intent.tool ?? '')} · ${clean(a.kind ?? '')}`),
    badge(a.status),
    pending
      ? h('span', { class: 'countdown', 'data-testid': 'approval-expiry', 'data-expires': a.expires_at, title: `Expires ${a.expires_at}` }, '')
      : h('span', { class: 'muted small' }, `decided ${fmtTime(a.decided_at)}`));
  const facts = h('dl', { class: 'facts' },
    fact('Requesting agent', h('strong', { 'data-testid': 'approval-agent' }, a.agent_subject ?? a.requested_by ?? '—')),
    a.requested_by && a.requested_by !== a.agent_subject ? fact('Requested by', a.requested_by) : null,
    fact('Why a human', a.reason ? agentOrGateway(a.reason) : '—'),
    fact('Reviewers', h('span', { 'data-testid': 'approval-reviewers' },
      `${reviewers.length} of ${a.reviewers_required ?? '?'}`,
      reviewers.length ? ` — ${reviewers.map(clean).join(', ')}` : '')),
    a.rejected_by ? fact('Rejected by', a.rejected_by) : null,
    a.decision_reason ? fact('Decision reason', agentText(a.decision_reason, 'Written by the reviewer')) : null,
    fact('Approval', mono(a.approval_id)),
    a.mandate_id ? fact('Mandate', mono(a.mandate_id)) : null,
    a.passkey_required ? fact('Passkey', h('strong', { 'data-testid': 'approval-passkey' }, pending ? 'required: decide it with your passkey' : 'required: decided with a passkey')) : null,
    fact('Requested', timeCell(a.created_at)));
  const pinned = h('div', { class: 'pinned', 'data-testid': 'approval-intent' },
    h('h3', {}, 'Pinned intent'),
    h('p', { class: 'muted small' }, 'Approving allows exactly this call, once.'),
    intentList(intent));
  append(cardEl, [head, h('div', { class: 'approval-body' }, facts, pinned)]);
  if (pending) cardEl.append(reviewForm(a));
  return cardEl;
}

function agentOrGateway(text) {
  return h('span', {}, text);
}

function fact(label, value) {
  return [h('dt', {}, label), h('dd', {}, value instanceof Node ? value : clean(value))];
}

const INTENT_ORDER = ['tool', 'operation_id', 'payer', 'payee', 'from_account', 'to_account', 'payment_id', 'amount', 'currency', 'memo', 'reason'];
const AGENT_FIELDS = new Set(['memo', 'reason', 'description', 'account_reference', 'payee_name', 'name']);
function intentList(intent) {
  const dl = h('dl', { class: 'facts intent-facts' });
  const rank = (k) => { const i = INTENT_ORDER.indexOf(k); return i < 0 ? INTENT_ORDER.length : i; };
  const entries = Object.entries(intent).sort(([a], [b]) => rank(a) - rank(b) || a.localeCompare(b));
  for (const [k, v] of entries) {
    let value;
    if (v !== null && typeof v === 'object') value = h('code', {}, JSON.stringify(v));
    else if (AGENT_FIELDS.has(k)) value = agentText(v);
    else value = h('span', {}, v === null ? '—' : String(v));
    value.dataset.field = k;
    dl.append(h('dt', {}, k), h('dd', {}, value));
  }
  if (!dl.childElementCount) dl.append(h('dd', { class: 'muted' }, 'No intent recorded.'));
  return dl;
}

function reviewForm(a) {
  const id = `reason-${clean(a.approval_id).replace(/[^A-Za-z0-9_-]/g, '')}`;
  const input = h('input', { id, name: 'reason', type: 'text', maxlength: 500, autocomplete: 'off', 'data-testid': 'approval-reason', placeholder: 'What you checked, or why not' });
  // type=button: Enter in the reason field never approves by accident.
  const withKey = a.passkey_required ? ' with passkey' : '';
  const approve = guard(h('button', { type: 'button', class: 'primary', 'data-testid': 'approve' }, `Approve${withKey}`), SCOPE.approve);
  const reject = guard(h('button', { type: 'button', class: 'danger', 'data-testid': 'reject' }, `Reject${withKey}`), SCOPE.approve);
  const form = h('form', { class: 'review', 'data-testid': 'review-form' },
    h('label', { for: id }, 'Reason'), input, approve, reject);
  if (!can(SCOPE.approve)) form.append(h('span', { class: 'muted small', 'data-testid': 'approve-disabled-why' }, `Your token lacks scope ${SCOPE.approve}.`));
  form.addEventListener('submit', (ev) => ev.preventDefault());
  approve.addEventListener('click', () => decide('approve'));
  reject.addEventListener('click', () => decide('reject'));
  async function decide(decision) {
    const button = decision === 'reject' ? reject : approve;
    const reason = input.value.trim();
    if (decision === 'reject' && !reason) {
      notify('Say why you reject it: the agent and the audit trail get the reason.', 'warn');
      input.focus();
      return;
    }
    approve.disabled = true;
    reject.disabled = true;
    try {
      const body = await decisionBody(a, decision, reason);
      const updated = await api('POST', `/approvals/${encodeURIComponent(a.approval_id)}/${decision}`, { body });
      const verb = decision === 'approve' ? 'Approved' : 'Rejected';
      const still = updated?.status === 'pending' ? ` — still needs ${updated.reviewers_required - (updated.approved_by?.length ?? 0)} more reviewer(s)` : '';
      notify(`${verb} ${clean(a.approval_id)}${still}.`, 'ok');
      const card = form.closest('[data-testid="approval"]');
      card.replaceWith(approvalCard(updated ?? a));
      tickClocks();
      refreshPendingCount();
    } catch (e) {
      if (e instanceof ApiError) {
        if (e.code === 'SELF_REVIEW') notify(`You requested this payment yourself: someone else must review it. [SELF_REVIEW]`, 'error');
        else if (e.status === 409) notify(`Already decided by someone else. Refresh to see the outcome. [${clean(e.code)}]`, 'warn');
        else if (e.status === 410) notify('This approval expired before the decision. The agent may ask again.', 'warn');
        else explain(e, { needs: SCOPE.approve, control: button, what: `${decision === 'approve' ? 'Approve' : 'Reject'} failed` });
      } else notify(e.message, 'error');
      if (e.code === 'SELF_REVIEW') {
        disable(approve, 'You requested this payment: someone else must review it');
        disable(reject, 'You requested this payment: someone else must review it');
      } else if (e.status !== 403 || String(e.code).startsWith('PASSKEY_')) {
        approve.disabled = !can(SCOPE.approve);
        reject.disabled = !can(SCOPE.approve);
      } else {
        disable(approve, `Your token lacks scope ${SCOPE.approve}`);
        disable(reject, `Your token lacks scope ${SCOPE.approve}`);
      }
    }
  }
  return form;
}

// ---- the user's own confirmation (approvals_by = "user") ----------------------------------------

async function loadConfirm() {
  const el = section('confirm');
  const box = clear($('[data-testid="confirm-card"]', el));
  const id = linkedApproval('confirm');
  if (!id) {
    box.append(h('p', { class: 'empty muted' }, 'No payment to confirm: open the link your assistant gave you.'));
    return;
  }
  el.setAttribute('aria-busy', 'true');
  try {
    renderConfirm(box, await api('GET', `/confirmations/${encodeURIComponent(id)}`));
  } catch (e) {
    if (e instanceof ApiError && e.status === 404) box.append(h('p', { class: 'empty muted', 'data-testid': 'confirm-missing' }, 'There is no such payment waiting for you. Signed in as someone else?'));
    else if (e instanceof ApiError) explain(e, { needs: SCOPE.confirm, what: 'Loading failed' });
    else notify(`Loading failed: ${e.message}`, 'error');
  } finally {
    el.removeAttribute('aria-busy');
  }
}

// Every field the closed mandate will pin, in the words the person reads them: what they confirm
// is exactly what the payment carries (payer, payee, amount, currency, tool, operation id, memo or
// reason, the agent and the person it acts for).
const TOOL_NAMES = {
  create_payment: 'A payment',
  refund_payment: 'A refund',
  request_mpesa_payment: 'An M-Pesa collection',
  request_airtel_payment: 'An Airtel Money collection',
  send_mpesa_payout: 'An M-Pesa payout',
};
const INTENT_FIELDS = [
  ['payer', 'From', 'confirm-payer'],
  ['payee', 'To', 'confirm-payee'],
  ['payment_id', 'Refund of', 'confirm-refund-of'],
  ['operation_id', 'Operation', 'confirm-operation'],
  ['memo', 'Memo', 'confirm-memo'],
  ['reason', 'Reason', 'confirm-reason'],
  ['account_reference', 'Account reference', 'confirm-reference'],
  ['description', 'Description', 'confirm-description'],
  ['remarks', 'Remarks', 'confirm-remarks'],
];

function renderConfirm(box, a) {
  clear(box);
  const intent = a.intent && typeof a.intent === 'object' ? a.intent : {};
  const tool = String(intent.tool ?? a.tool ?? '');
  const facts = [
    fact('What', h('span', { 'data-testid': 'confirm-tool', title: tool }, `${TOOL_NAMES[tool] ?? 'A money movement'} (${tool})`)),
  ];
  for (const [key, label, testid] of INTENT_FIELDS) {
    if (intent[key] === undefined || intent[key] === null) continue;
    facts.push(fact(label, h('span', { 'data-testid': testid }, String(intent[key]))));
  }
  facts.push(
    fact('Asked for by', h('span', { 'data-testid': 'confirm-agent' }, a.agent_subject ?? '')),
    fact('On behalf of', h('span', { 'data-testid': 'confirm-user' }, a.user ?? '—')),
    fact('Why it needs you', a.reason ?? ''),
    fact('Status', h('strong', { 'data-testid': 'confirm-status' }, a.status ?? '')));
  box.append(
    h('p', { class: 'amount', 'data-testid': 'confirm-amount' }, money(a.amount, a.currency)),
    h('dl', { class: 'facts', 'data-testid': 'confirm-intent' }, ...facts),
    h('p', { class: 'muted small' }, 'Your assistant asked for exactly this, and confirming pays exactly this: these parties, this amount, this operation and memo. Confirm only if you meant it; the memo and names above came from the assistant.'));
  if (a.status !== 'pending') return;
  const withKey = a.passkey_required ? ' with passkey' : '';
  const yes = h('button', { type: 'button', class: 'primary', 'data-testid': 'confirm-approve' }, `Confirm payment${withKey}`);
  const no = h('button', { type: 'button', class: 'danger', 'data-testid': 'confirm-reject' }, `Decline${withKey}`);
  if (!can(SCOPE.confirm)) {
    disable(yes, `Your sign-in lacks scope ${SCOPE.confirm}`);
    disable(no, `Your sign-in lacks scope ${SCOPE.confirm}`);
  }
  async function decide(decision) {
    yes.disabled = true;
    no.disabled = true;
    try {
      const body = await decisionBody(a, decision, '');
      const updated = await api('POST', `/confirmations/${encodeURIComponent(a.approval_id)}/${decision}`, { body });
      notify(decision === 'approve' ? 'Confirmed. Your assistant can finish the payment now.' : 'Declined. Nothing was paid.', 'ok');
      renderConfirm(box, updated ?? a);
    } catch (e) {
      if (e instanceof ApiError) explain(e, { needs: SCOPE.confirm, control: decision === 'approve' ? yes : no, what: 'Confirmation failed' });
      else notify(e.message, 'error');
      yes.disabled = !can(SCOPE.confirm);
      no.disabled = !can(SCOPE.confirm);
    }
  }
  yes.addEventListener('click', () => decide('approve'));
  no.addEventListener('click', () => decide('reject'));
  box.append(h('div', { class: 'review' }, yes, no));
  if (a.passkey_required) {
    // The person confirming may have no passkey yet: register one here, on this device, with the
    // enrolment code an operator gave them.
    const codeInput = h('input', { name: 'enrolment_code', autocomplete: 'off', spellcheck: 'false', placeholder: 'xxxx-xxxx-…', 'data-testid': 'confirm-passkey-code' });
    const add = h('button', { type: 'button', class: 'ghost', 'data-testid': 'confirm-register-passkey' }, 'Register a passkey on this device');
    add.addEventListener('click', async () => {
      add.disabled = true;
      try {
        await registerPasskey('confirmation', codeInput.value);
        codeInput.value = '';
        notify('Passkey registered. Confirm or decline with it now.', 'ok');
      } catch (e) {
        if (e instanceof ApiError) explain(e, { needs: SCOPE.confirm, what: 'Registering the passkey failed' });
        else notify(`Registering the passkey failed: ${e.message}`, 'error');
      } finally {
        add.disabled = false;
      }
    });
    box.append(h('p', { class: 'muted small' }, 'This payment is confirmed only with a passkey: your device signs exactly what is shown above. Your first passkey needs the enrolment code an operator gave you.'),
      h('label', {}, 'Enrolment code ', codeInput), add);
  }
}

// ---- passkeys: the signed-in person's own ---------------------------------------------------------

function loadPasskeys() {
  return load('passkeys', async () => {
    const body = clear($('[data-testid="passkeys-table"] tbody'));
    const form = $('[data-testid="passkey-register"]');
    if (!form.dataset.wired) {
      form.dataset.wired = '1';
      form.addEventListener('submit', async (ev) => {
        ev.preventDefault();
        const submit = $('[data-testid="passkey-register-submit"]', form);
        submit.disabled = true;
        try {
          const p = await registerPasskey(form.elements.name.value.trim(), form.elements.enrolment_code.value);
          notify(`Passkey ${clean(p.name)} registered: decisions that need a passkey can be signed with it.`, 'ok');
          form.reset();
          await loadPasskeys();
        } catch (e) {
          if (e instanceof ApiError) explain(e, { needs: SCOPE.approve, what: 'Registering the passkey failed' });
          else notify(`Registering the passkey failed: ${e.message}`, 'error');
        } finally {
          submit.disabled = false;
        }
      });
    }
    wireEnrolmentCodes();
    const mine = await api('GET', '/passkeys');
    for (const p of mine?.items ?? []) body.append(passkeyRow(p));
    if (!mine?.items?.length) body.append(h('tr', {}, h('td', { colspan: 5, class: 'empty muted', 'data-testid': 'passkeys-empty' }, 'No passkeys yet.')));
  });
}

// An admin issues an enrolment code for another person (never for themself); it is shown once,
// here, to hand over out of band.
function wireEnrolmentCodes() {
  const form = $('[data-testid="enrolment-code-form"]');
  form.hidden = !can(SCOPE.admin);
  if (form.dataset.wired) return;
  form.dataset.wired = '1';
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    const submit = $('[data-testid="enrolment-code-submit"]', form);
    const out = $('[data-testid="enrolment-code-value"]');
    out.hidden = true;
    out.textContent = '';
    submit.disabled = true;
    try {
      const issued = await api('POST', '/passkeys/enrolment-codes', { body: { owner: form.elements.owner.value.trim() } });
      out.textContent = `${issued.code} — for ${clean(issued.owner)}, single use, until ${fmtTime(issued.expires_at)}. Give it to them yourself; it is not shown again.`;
      out.hidden = false;
      form.reset();
    } catch (e) {
      if (e instanceof ApiError) explain(e, { needs: SCOPE.admin, what: 'Issuing the enrolment code failed' });
      else notify(e.message, 'error');
    } finally {
      submit.disabled = false;
    }
  });
}

function passkeyRow(p) {
  let action = h('span', { class: 'muted' }, '—');
  if (!p.revoked_at) {
    action = h('button', { type: 'button', class: 'danger', 'data-testid': 'passkey-revoke' }, 'Revoke');
    action.addEventListener('click', async () => {
      action.disabled = true;
      try {
        await api('POST', `/passkeys/${encodeURIComponent(p.credential_id)}/revoke`);
        notify(`Passkey ${clean(p.name)} revoked: it signs nothing more.`, 'ok');
        await loadPasskeys();
      } catch (e) {
        if (e instanceof ApiError) explain(e, { what: 'Revoke failed' });
        else notify(e.message, 'error');
        action.disabled = false;
      }
    });
  }
  return h('tr', { 'data-testid': 'passkey-row', 'data-credential-id': p.credential_id },
    h('td', {}, p.name), h('td', {}, mono(p.credential_id)), h('td', {}, timeCell(p.created_at)),
    h('td', {}, p.revoked_at ? `revoked ${fmtTime(p.revoked_at)}` : 'live'), h('td', {}, action));
}

// One clock for every countdown on the page.
function tickClocks() {
  const now = Date.now();
  for (const el of $$('[data-expires]')) {
    const at = Date.parse(el.dataset.expires);
    if (Number.isNaN(at)) continue;
    const left = at - now;
    el.textContent = left > 0 ? `expires in ${fmtRemaining(left)}` : 'expired';
    el.classList.toggle('soon', left > 0 && left < 10 * 60 * 1000);
    el.classList.toggle('gone', left <= 0);
    if (left <= 0) for (const b of $$('button', el.closest('[data-testid="approval"]') ?? document.createElement('div'))) b.disabled = true;
  }
  const exp = $('[data-testid="token-expiry"]');
  if (exp?.dataset.exp) {
    const left = Number(exp.dataset.exp) - now;
    exp.textContent = left > 0 ? `token ${fmtRemaining(left)} left` : 'token expired';
  }
}
setInterval(tickClocks, 1000);

// ---- payments ---------------------------------------------------------------------------------

function formQuery(form) {
  const q = {};
  for (const [k, v] of new FormData(form).entries()) if (String(v).trim()) q[k] = String(v).trim();
  return q;
}

function loadPayments() {
  return load('payments', async (el) => {
    const q = formQuery($('[data-testid="payments-filters"]'));
    const body = $('[data-testid="payments-table"] tbody');
    await pager(el, (cursor) => api('GET', '/payments', { query: { ...q, cursor, limit: PAGE_LIMIT } }), (items, first) => {
      if (first) clear(body);
      for (const p of items) body.append(paymentRow(p));
      if (first && !items.length) body.append(h('tr', {}, h('td', { colspan: 9, class: 'empty muted' }, 'No payments match.')));
    });
  });
}

function paymentRow(p) {
  const open = h('button', { type: 'button', class: 'link id', 'data-testid': 'payment-open', title: `${clean(p.payment_id)}: show the timeline` }, p.payment_id);
  open.addEventListener('click', () => showPayment(p.payment_id));
  return h('tr', { 'data-testid': 'payment-row', 'data-payment-id': p.payment_id },
    h('td', {}, timeCell(p.created_at)),
    h('td', {}, open),
    h('td', {}, p.kind, p.refund_of ? h('span', { class: 'muted small' }, ` of ${clean(p.refund_of)}`) : null),
    h('td', {}, badge(p.status)),
    h('td', {}, p.rail),
    h('td', {}, h('span', {}, p.from_account), ' → ', h('span', {}, p.to_account)),
    h('td', { class: 'num' }, money(p.amount, p.currency)),
    h('td', { 'data-testid': 'payment-agent' }, principal(p.agent_subject, p.user)),
    h('td', { class: 'memo' }, agentText(p.memo)));
}

async function showPayment(id) {
  const pane = $('[data-testid="payment-detail"]');
  pane.hidden = false;
  clear(pane).append(h('p', { class: 'muted' }, 'Loading…'));
  for (const r of $$('[data-testid="payment-row"]')) r.classList.toggle('selected', r.dataset.paymentId === id);
  try {
    const d = await api('GET', `/payments/${encodeURIComponent(id)}`);
    const p = d.payment ?? {};
    const close = h('button', { type: 'button', class: 'ghost', 'aria-label': 'Close the detail' }, '✕');
    close.addEventListener('click', () => { pane.hidden = true; });
    clear(pane).append(
      h('div', { class: 'view-head' }, h('h2', {}, 'Payment'), close),
      h('dl', { class: 'facts' },
        fact('Payment', mono(p.payment_id)),
        fact('Status', badge(p.status)),
        fact('Amount', money(p.amount, p.currency)),
        fact('From → to', `${clean(p.from_account)} → ${clean(p.to_account)}`),
        fact('Agent', h('span', { 'data-testid': 'detail-agent' }, p.agent_subject ?? '')),
        p.user ? fact('On behalf of', h('span', { 'data-testid': 'detail-user' }, p.user)) : null,
        fact('Rail', `${clean(p.rail)}${p.rail_ref ? ` · ${clean(p.rail_ref)}` : ''}`),
        p.mandate_id ? fact('Mandate', mono(p.mandate_id)) : null,
        p.refund_of ? fact('Refund of', mono(p.refund_of)) : null,
        Number(p.refunded) > 0 ? fact('Refunded', money(p.refunded, p.currency)) : null,
        p.rail_state ? fact('Rail state', p.rail_state) : null,
        p.receipt ? fact('Receipt', typeof p.receipt === 'object' ? JSON.stringify(p.receipt) : p.receipt) : null,
        fact('Memo', agentText(p.memo)),
        fact('Created', timeCell(p.created_at))),
      h('h3', {}, 'Timeline'),
      timeline(Array.isArray(d.timeline) ? d.timeline : []));
    pane.focus?.();
  } catch (e) {
    clear(pane).append(h('p', { class: 'error' }, 'Could not load this payment.'));
    if (e instanceof ApiError) explain(e, { needs: SCOPE.audit, what: 'Payment' });
  }
}

function timeline(events) {
  const ol = h('ol', { class: 'timeline', 'data-testid': 'timeline' });
  for (const ev of events) {
    const step = ev.step ?? 'other';
    ol.append(h('li', { 'data-testid': 'timeline-event', 'data-step': step, class: `step-${clean(step)}` },
      h('div', { class: 'tl-head' }, badge(step.replace(/_/g, ' '), `step ${clean(step)}`), ' ', timeCell(ev.at)),
      h('div', { class: 'tl-body' },
        h('span', { 'data-testid': 'timeline-actor' }, principal(ev.actor, ev.user)), ' · ', h('code', {}, ev.tool ?? ''), ' · ', h('span', {}, ev.decision ?? ''),
        Number(ev.repeats) > 1 ? [' · ', h('span', { class: 'muted' }, `×${Number(ev.repeats)}`)] : null,
        ev.code ? [' · ', h('code', { class: 'code' }, ev.code)] : null,
        ev.approval_id ? [' · ', mono(ev.approval_id)] : null),
      ev.detail ? h('div', { class: 'tl-detail' }, agentText(typeof ev.detail === 'object' ? JSON.stringify(ev.detail) : ev.detail, RECORDED)) : null));
  }
  if (!events.length) ol.append(h('li', { class: 'muted' }, 'No events recorded.'));
  return ol;
}

// ---- audit ------------------------------------------------------------------------------------

function loadAudit() {
  return load('audit', async (el) => {
    const q = formQuery($('[data-testid="audit-filters"]'));
    const body = $('[data-testid="audit-table"] tbody');
    await pager(el, (cursor) => api('GET', '/audit', { query: { ...q, cursor, limit: PAGE_LIMIT } }), (items, first) => {
      if (first) clear(body);
      for (const ev of items) body.append(auditRow(ev));
      if (first && !items.length) body.append(h('tr', {}, h('td', { colspan: 8, class: 'empty muted' }, 'No audit records match.')));
    });
  });
}

function auditRow(ev) {
  const ids = h('div', { class: 'ids' },
    ev.payment_id ? h('div', {}, mono(ev.payment_id)) : null,
    ev.approval_id ? h('div', {}, mono(ev.approval_id)) : null,
    ev.idempotency_key ? h('div', {}, mono(ev.idempotency_key)) : null,
    ev.correlation_id ? h('div', { class: 'muted' }, mono(ev.correlation_id)) : null);
  return h('tr', { 'data-testid': 'audit-row' },
    h('td', {}, timeCell(ev.at)),
    h('td', {}, ev.step ? badge(ev.step.replace(/_/g, ' '), `step ${clean(ev.step)}`) : '—'),
    h('td', { 'data-testid': 'audit-actor' }, principal(ev.actor, ev.user), Number(ev.repeats) > 1 ? h('span', { class: 'muted small' }, ` ×${Number(ev.repeats)}`) : null),
    h('td', {}, h('code', {}, ev.tool ?? '')),
    h('td', {}, ev.decision ?? ''),
    h('td', {}, ev.code ? h('code', { class: 'code' }, ev.code) : ''),
    h('td', {}, ids),
    h('td', { class: 'memo' }, ev.detail ? agentText(typeof ev.detail === 'object' ? JSON.stringify(ev.detail) : ev.detail, RECORDED) : ''));
}

// ---- agents -----------------------------------------------------------------------------------

function loadAgents() {
  return load('agents', async (el) => {
    const body = $('[data-testid="agents-table"] tbody');
    await pager(el, (cursor) => api('GET', '/principals', { query: { cursor, limit: PAGE_LIMIT } }), (items, first) => {
      if (first) clear(body);
      for (const p of items) body.append(agentRow(p));
      if (first && !items.length) body.append(h('tr', {}, h('td', { colspan: 6, class: 'empty muted' }, 'No agents seen yet.')));
    });
  });
}

// An agent, and the person it acted for when it did (RFC 8693 delegation): "bot for alice".
function principal(agent, user) {
  return user ? [clean(agent ?? ''), h('span', { class: 'muted' }, ' for '), clean(user)] : clean(agent ?? '');
}

function agentRow(p) {
  const input = h('input', { type: 'text', name: 'reason', maxlength: 500, autocomplete: 'off', placeholder: 'Reason', 'aria-label': `Reason to suspend ${clean(p.subject)}`, 'data-testid': 'agent-reason' });
  // Which suspension this row is: the agent (whoever it acts for), or it acting for one user.
  const query = {};
  if (p.issuer) query.issuer = p.issuer;
  if (p.scope === 'pair' && p.user) query.user = p.user;
  const action = p.suspended
    ? guard(h('button', { type: 'button', class: 'primary', 'data-testid': 'agent-resume' }, 'Resume'), SCOPE.admin)
    : guard(h('button', { type: 'button', class: 'danger', 'data-testid': 'agent-suspend' }, 'Suspend'), SCOPE.admin);
  action.addEventListener('click', async () => {
    const verb = p.suspended ? 'resume' : 'suspend';
    action.disabled = true;
    try {
      await api('POST', `/principals/${encodeURIComponent(p.subject)}/${verb}`, verb === 'suspend' ? { query, body: { reason: input.value.trim() } } : { query, body: {} });
      notify(`${verb === 'suspend' ? 'Suspended' : 'Resumed'} ${clean(p.subject)}.`, 'ok');
      await loadAgents();
      refreshPendingCount();
    } catch (e) {
      if (e instanceof ApiError) explain(e, { needs: SCOPE.admin, control: action, what: `${verb} failed` });
      if (e.status !== 403) action.disabled = !can(SCOPE.admin);
    }
  });
  const scope = p.scope === 'pair' ? (p.user ? `acting for ${clean(p.user)}` : 'on its own token') : 'whoever it acts for';
  return h('tr', { 'data-testid': 'agent-row', 'data-subject': p.subject, 'data-user': p.user ?? '' },
    h('td', {}, h('strong', {}, p.subject), h('div', { class: 'muted small', 'data-testid': 'agent-scope' }, scope)),
    h('td', {}, p.suspended ? badge('suspended') : badge('active')),
    h('td', {}, p.suspended ? timeCell(p.suspended_at) : '—'),
    h('td', { class: 'memo' }, p.suspended_reason ? agentText(p.suspended_reason) : '—'),
    h('td', {}, timeCell(p.last_seen)),
    h('td', { class: 'actions' }, p.suspended ? null : input, action));
}

// ---- mandates ---------------------------------------------------------------------------------

function loadMandates() {
  return load('mandates', async (el) => {
    const status = $('[data-testid="mandates-status"]').value;
    const body = $('[data-testid="mandates-table"] tbody');
    await pager(el, (cursor) => api('GET', '/mandates', { query: { status, cursor, limit: PAGE_LIMIT } }), (items, first) => {
      if (first) clear(body);
      for (const m of items) body.append(mandateRow(m));
      if (first && !items.length) body.append(h('tr', {}, h('td', { colspan: 9, class: 'empty muted' }, `No ${status === 'all' ? '' : `${status} `}mandates.`)));
    });
  });
}

function mandateRow(m) {
  const live = m.status === 'active';
  const input = h('input', { type: 'text', name: 'reason', maxlength: 500, autocomplete: 'off', placeholder: 'Reason', 'aria-label': `Reason to revoke ${clean(m.mandate_id)}`, 'data-testid': 'mandate-reason' });
  const revoke = guard(h('button', { type: 'button', class: 'danger', 'data-testid': 'mandate-revoke' }, 'Revoke'), SCOPE.approve);
  revoke.addEventListener('click', async () => {
    revoke.disabled = true;
    try {
      await api('POST', `/mandates/${encodeURIComponent(m.mandate_id)}/revoke`, { body: { reason: input.value.trim() } });
      notify(`Revoked ${clean(m.mandate_id)}: the agent can no longer draw on it.`, 'ok');
      await loadMandates();
    } catch (e) {
      if (e instanceof ApiError) explain(e, { needs: SCOPE.approve, control: revoke, what: 'Revoke failed' });
      if (e.status !== 403) revoke.disabled = !can(SCOPE.approve);
    }
  });
  const budget = m.budget === null || m.budget === undefined ? 'no budget' : money(m.budget, m.currency);
  return h('tr', { 'data-testid': 'mandate-row', 'data-mandate-id': m.mandate_id, 'data-approval-id': m.approval_id ?? '' },
    h('td', {}, mono(m.mandate_id)),
    h('td', {}, mono(m.approval_id)),
    h('td', {}, m.kind ?? ''),
    h('td', {}, m.agent_subject ?? ''),
    h('td', { class: 'num' }, `${money(m.spent, m.currency)} / ${budget}`),
    h('td', { class: 'num' }, `${clean(m.uses ?? 0)} / ${clean(m.max_uses ?? '∞')}`),
    h('td', {}, timeCell(m.expires_at)),
    h('td', {}, badge(m.status), m.revoked_by ? h('div', { class: 'muted small' }, `by ${clean(m.revoked_by)}`) : null),
    h('td', { class: 'actions' }, live ? [input, revoke] : '—'));
}

// ---- payees -----------------------------------------------------------------------------------

function loadPayees() {
  return load('payees', async (el) => {
    guard($('[data-testid="payee-add-submit"]'), SCOPE.approve);
    const q = formQuery($('[data-testid="payees-filters"]'));
    const body = $('[data-testid="payees-table"] tbody');
    await pager(el, (cursor) => api('GET', '/payees', { query: { agent: q.agent, user: q.user, cursor, limit: PAGE_LIMIT } }), (items, first) => {
      if (first) clear(body);
      for (const p of items) body.append(payeeRow(p));
      if (first && !items.length) {
        const whose = q.agent ? ` for ${clean(q.agent)}${q.user ? ` acting for ${clean(q.user)}` : ''}` : '';
        body.append(h('tr', {}, h('td', { colspan: 9, class: 'empty muted', 'data-testid': 'payees-empty' }, `No known payees${whose}.`)));
      }
    });
  });
}

// The body naming one payee of one agent (and the user it acts for): add and revoke both take it.
function payeeArgs(agent, user, payee, reason) {
  const args = { agent_subject: agent, payee };
  if (user) args.user = user;
  if (reason) args.reason = reason;
  return args;
}

// `added_by` and `revoked_by` are "<issuer> <subject>": the subject shown, the whole in the title.
function operatorName(value, testid) {
  if (!value) return h('span', { class: 'muted' }, '—');
  const s = String(value);
  const cut = s.indexOf(' ');
  return h('span', { title: clean(s), 'data-testid': testid }, cut > 0 ? s.slice(cut + 1) : s);
}

// An approval id links to that approval's own view (#approvals/<id>), and only a well-formed one does.
function approvalLink(id) {
  if (!id) return h('span', { class: 'muted' }, '—');
  const link = `#approvals/${id}`;
  if (!DEEP_LINK.test(link)) return mono(id);
  return h('a', { href: link, class: 'id', title: `${clean(id)}: open the approval`, 'data-testid': 'payee-approval' }, id);
}

function payeeRow(p) {
  const known = p.status === 'known';
  const label = `${clean(p.payee)} for ${clean(p.agent_subject)}${p.user ? ` acting for ${clean(p.user)}` : ''}`;
  let action = '—';
  if (known) {
    const input = h('input', { type: 'text', name: 'reason', maxlength: 500, autocomplete: 'off', placeholder: 'Reason', 'aria-label': `Reason to revoke ${label}`, 'data-testid': 'payee-reason' });
    const revoke = guard(h('button', { type: 'button', class: 'danger', 'data-testid': 'payee-revoke' }, 'Revoke'), SCOPE.approve);
    revoke.addEventListener('click', async () => {
      revoke.disabled = true;
      try {
        await api('POST', '/payees/revoke', { body: payeeArgs(p.agent_subject, p.user, p.payee, input.value.trim()) });
        notify(`Revoked ${label}: the next payment to it is a first payment again.`, 'ok');
        await loadPayees();
      } catch (e) {
        if (e instanceof ApiError) {
          if (e.status === 404) notify(`${label} is not a known payee any more. Refresh to see its state. [${clean(e.code)}]`, 'warn');
          else explain(e, { needs: SCOPE.approve, control: revoke, what: 'Revoke failed' });
        } else notify(e.message, 'error');
        if (e.status !== 403) revoke.disabled = !can(SCOPE.approve);
      }
    });
    action = [input, revoke];
  }
  return h('tr', { 'data-testid': 'payee-row', 'data-agent': p.agent_subject, 'data-user': p.user ?? '', 'data-payee': p.payee, 'data-status': p.status },
    h('td', {}, h('strong', {}, p.agent_subject ?? '')),
    h('td', {}, p.user ? p.user : h('span', { class: 'muted', title: 'Known to the agent on its own token, not acting for a user' }, 'own token')),
    h('td', {}, h('code', { 'data-testid': 'payee-account' }, p.payee ?? '')),
    h('td', { 'data-testid': 'payee-status' }, badge(p.status)),
    h('td', {}, timeCell(p.known_since)),
    h('td', {}, operatorName(p.added_by, 'payee-added-by')),
    h('td', {}, approvalLink(p.approval_id)),
    h('td', {}, p.revoked_at ? [timeCell(p.revoked_at), p.revoked_by ? h('div', { class: 'muted small' }, 'by ', operatorName(p.revoked_by, 'payee-revoked-by')) : null] : '—'),
    h('td', { class: 'actions' }, action));
}

async function addPayee(form) {
  const button = $('[data-testid="payee-add-submit"]', form);
  const f = formQuery(form);
  if (!f.agent_subject || !f.payee) {
    notify('Name the agent and the payee account.', 'warn');
    return;
  }
  button.disabled = true;
  try {
    const p = await api('POST', '/payees', { body: payeeArgs(f.agent_subject, f.user, f.payee, f.reason) });
    const who = `${clean(p?.payee ?? f.payee)} for ${clean(p?.agent_subject ?? f.agent_subject)}${p?.user ? ` acting for ${clean(p.user)}` : ''}`;
    notify(`${who} is a known payee now (its cooling-off period, if any, starts now).`, 'ok');
    for (const name of ['payee', 'reason']) form.elements[name].value = '';
    await loadPayees();
  } catch (e) {
    if (e instanceof ApiError) explain(e, { needs: SCOPE.approve, control: button, what: 'Adding the payee failed' });
    else notify(e.message, 'error');
  } finally {
    if (can(SCOPE.approve) && !button.dataset.reason) button.disabled = false;
  }
}

// ---- policy -------------------------------------------------------------------------------------
// Policy as data: the version in force and its history, an editor (dry run, propose), and the
// proposals that widen the policy, waiting for a second operator: each is dry-run in the page before
// its Approve button opens, so the reviewer sees what it would have changed against history.

// The newest version as last read: the editor starts from it, and Reset goes back to it.
const policyState = { version: null, document: null };
const canSimulate = () => can(SCOPE.audit) || can(SCOPE.admin);
const SIMULATE_SCOPES = `${SCOPE.audit} or ${SCOPE.admin}`;

// `keepResult`: the outcome of a proposal just made stays shown (every other load clears it).
function loadPolicy({ keepResult = false } = {}) {
  return load('policy', async () => {
    const editor = $('[data-testid="policy-editor"]');
    guard($('[data-testid="policy-propose"]', editor), SCOPE.admin);
    const sim = $('[data-testid="policy-simulate"]', editor);
    if (!canSimulate()) disable(sim, `Your token lacks scope ${SIMULATE_SCOPES}`);
    if (!keepResult) policyResult(null);
    const [current, versions, proposals] = await Promise.all([
      api('GET', '/policy'),
      api('GET', '/policy/versions'),
      api('GET', '/policy/proposals', { query: { status: 'pending' } }),
    ]);
    policyState.version = current.version;
    policyState.document = current.document;
    renderPolicyCurrent(current);
    renderPolicyVersions(Array.isArray(versions?.items) ? versions.items : []);
    loadPolicyEditor();
    const list = clear($('[data-testid="policy-proposals"]'));
    const pending = Array.isArray(proposals?.items) ? proposals.items : [];
    for (const p of pending) list.append(proposalCard(p));
    if (!pending.length) list.append(h('p', { class: 'empty muted panel', 'data-testid': 'policy-proposals-empty' }, 'No proposal is waiting for a second operator.'));
  });
}

function renderPolicyCurrent(v) {
  const box = clear($('[data-testid="policy-current"]'));
  box.append(
    h('div', { class: 'view-head' },
      h('h2', {}, 'Version in force'),
      v.in_force ? badge('in force', 'active') : h('span', { class: 'badge pending', title: 'The newest version in the store: this replica takes it within policy.refresh_secs' }, 'newest, arriving')),
    h('dl', { class: 'facts' },
      fact('Version', h('strong', { class: 'policy-version', 'data-testid': 'policy-version' }, String(v.version ?? '—'))),
      fact('Author', h('span', { 'data-testid': 'policy-author', title: v.author_iss ? `issuer ${clean(v.author_iss)}` : 'from the config file' }, v.author ?? '—')),
      fact('Approved by', v.approved_by
        ? h('span', { 'data-testid': 'policy-approved-by' }, v.approved_by)
        : h('span', { class: 'muted', 'data-testid': 'policy-approved-by' }, 'nobody else: it only narrowed, or came from the config file')),
      fact('Reason', h('span', { 'data-testid': 'policy-version-reason' }, agentText(v.reason, 'Written by the author of this version'))),
      v.proposal_id ? fact('Proposal', mono(v.proposal_id)) : null,
      fact('Created', timeCell(v.created_at))));
}

function renderPolicyVersions(items) {
  const body = clear($('[data-testid="policy-versions"] tbody'));
  const diff = $('[data-testid="policy-diff"]');
  diff.hidden = true;
  clear(diff);
  const sorted = [...items].sort((a, b) => Number(b.version) - Number(a.version));
  for (const v of sorted) body.append(policyVersionRow(v));
  if (!sorted.length) body.append(h('tr', {}, h('td', { colspan: 6, class: 'empty muted' }, 'No version stored yet.')));
}

function policyVersionRow(v) {
  const actions = [];
  if (Number(v.version) > 1) {
    const show = h('button', { type: 'button', class: 'ghost', 'data-testid': 'policy-version-diff', title: `What version ${clean(v.version)} changed from version ${clean(v.version - 1)}` }, 'Changes');
    show.addEventListener('click', () => showPolicyDiff(v.version - 1, v.version, show));
    actions.push(show);
  }
  if (!v.in_force && v.document) {
    const edit = h('button', { type: 'button', class: 'ghost', 'data-testid': 'policy-version-edit', title: `Put version ${clean(v.version)}'s document in the editor (to dry-run it and propose going back to it)` }, 'Load in editor');
    edit.addEventListener('click', () => {
      setEditor(v.document, policyState.version, true);
      notify(`Version ${clean(v.version)}'s document is in the editor, as a change to version ${clean(policyState.version)}: dry-run it, then propose it.`, 'info');
      $('[data-testid="policy-document"]').focus();
    });
    actions.push(edit);
  }
  return h('tr', { 'data-testid': 'policy-version-row', 'data-version': v.version, class: v.in_force ? 'selected' : null },
    h('td', { class: 'num' }, h('strong', {}, String(v.version)), v.in_force ? [' ', badge('in force', 'active')] : null),
    h('td', {}, timeCell(v.created_at)),
    h('td', {}, h('span', { title: v.author_iss ? `issuer ${clean(v.author_iss)}` : 'from the config file' }, v.author ?? '—')),
    h('td', {}, v.approved_by ? h('span', { title: clean(v.approved_by) }, shortWho(v.approved_by)) : h('span', { class: 'muted' }, '—')),
    h('td', { class: 'memo' }, agentText(v.reason, 'Written by the author of this version')),
    h('td', { class: 'actions' }, actions.length ? actions : '—'));
}

// "<sub> (<iss>)" as the subject alone (the whole in the title): the history table stays narrow.
function shortWho(value) {
  return String(value).replace(/ \([^()]*\)$/, '');
}

async function showPolicyDiff(from, to, button) {
  const box = $('[data-testid="policy-diff"]');
  button.disabled = true;
  try {
    const d = await api('GET', '/policy/diff', { query: { from, to } });
    clear(box).append(h('h3', {}, `Version ${clean(from)} → ${clean(to)}`), changesTable(d?.changes ?? [], 'policy-diff-changes'));
    box.hidden = false;
  } catch (e) {
    if (e instanceof ApiError) explain(e, { needs: SIMULATE_SCOPES, what: 'Diff' });
    else notify(e.message, 'error');
  } finally {
    button.disabled = false;
  }
}

// The editor holds a document and the version it was read from (the proposal's base_version: the
// change applies only while that is still the newest). Edits survive a refresh; a newer version
// arriving meanwhile is named, and Propose then gets the gateway's "read it again".
function setEditor(document, version, dirty) {
  const ta = $('[data-testid="policy-document"]');
  ta.value = JSON.stringify(document ?? {}, null, 2);
  ta.dataset.version = String(version ?? '');
  if (dirty) ta.dataset.dirty = '1';
  else delete ta.dataset.dirty;
  editorBase();
}
function loadPolicyEditor() {
  const ta = $('[data-testid="policy-document"]');
  if (!ta.dataset.dirty || !ta.dataset.version) setEditor(policyState.document, policyState.version, false);
  else editorBase();
}
function editorBase() {
  const ta = $('[data-testid="policy-document"]');
  const label = $('[data-testid="policy-editor-base"]');
  const base = ta.dataset.version;
  const stale = base && policyState.version !== null && base !== String(policyState.version);
  label.className = stale ? 'small error' : 'muted small';
  label.textContent = stale
    ? `Edited from version ${clean(base)}, but version ${clean(policyState.version)} is the newest now: reset and edit again.`
    : `A change to version ${clean(base || '—')}${ta.dataset.dirty ? ' (edited)' : ''}`;
}

// The editor's document, parsed; null (and a notice) when it is not JSON.
function editorDocument() {
  const ta = $('[data-testid="policy-document"]');
  try {
    const doc = JSON.parse(ta.value);
    if (!doc || typeof doc !== 'object' || Array.isArray(doc)) throw new Error('it must be a JSON object with "policy" and "tools"');
    return doc;
  } catch (e) {
    notify(`The document is not valid JSON: ${e.message}`, 'warn');
    ta.focus();
    return null;
  }
}

function simulateWindow() {
  const q = {};
  for (const name of ['since', 'until']) {
    const v = $(`[data-testid="policy-${name}"]`).value.trim();
    if (v) q[name] = v;
  }
  return q;
}

// The dry run of `document` into `box` (the report replaces whatever was there).
async function simulateInto(box, document, title, button) {
  clear(box);
  box.setAttribute('aria-busy', 'true');
  box.append(h('p', { class: 'muted' }, 'Replaying the recorded calls…'));
  if (button) button.disabled = true;
  try {
    const r = await api('POST', '/policy/simulate', { body: { document, ...simulateWindow() } });
    clear(box).append(policyReport(r ?? {}, title));
    return true;
  } catch (e) {
    clear(box);
    if (e instanceof ApiError) explain(e, { needs: SIMULATE_SCOPES, control: button, what: 'Dry run failed' });
    else notify(`Dry run failed: ${e.message}`, 'error');
    return false;
  } finally {
    box.removeAttribute('aria-busy');
    if (button && canSimulate() && !button.dataset.reason) button.disabled = false;
  }
}

async function simulateEditor(button) {
  const doc = editorDocument();
  if (!doc) return;
  clearNotice();
  policyResult(null);
  await simulateInto($('[data-testid="policy-report-box"]'), doc, 'Dry run of the edited document', button);
}

async function proposePolicy(button) {
  const doc = editorDocument();
  if (!doc) return;
  const input = $('[data-testid="policy-reason"]');
  const reason = input.value.trim();
  if (!reason) {
    notify('Say why you change the policy: the reason is kept with the version and in the audit trail.', 'warn');
    input.focus();
    return;
  }
  const ta = $('[data-testid="policy-document"]');
  const base = Number(ta.dataset.version) || policyState.version;
  button.disabled = true;
  policyResult(null);
  try {
    const r = await api('POST', '/policy/proposals', { body: { document: doc, reason, base_version: base } });
    input.value = '';
    if (r?.status === 'applied') {
      policyResult(r, `Applied: version ${clean(r.version)} is in force. It only narrows the policy, so one operator suffices.`);
      notify(`Policy version ${clean(r.version)} is in force.`, 'ok');
    } else {
      policyResult(r, `Waiting for a second operator: proposal ${clean(r?.proposal_id)} widens the policy and applies once another operator approves it.`);
      notify(`Proposal ${clean(r?.proposal_id)} is waiting for a second operator.`, 'info');
    }
    setEditor(policyState.document, policyState.version, false);
    await loadPolicy({ keepResult: true });
  } catch (e) {
    if (e instanceof ApiError) {
      const what = e.status === 409 ? 'Propose failed (read the newest version, then edit again)' : 'Propose failed';
      explain(e, { needs: SCOPE.admin, control: button, what });
    } else notify(e.message, 'error');
  } finally {
    if (can(SCOPE.admin) && !button.dataset.reason) button.disabled = false;
  }
}

// What the last proposal made came to (null: nothing shown).
function policyResult(r, text) {
  const el = $('[data-testid="policy-propose-result"]');
  clear(el);
  el.hidden = !r;
  if (!r) {
    delete el.dataset.status;
    return;
  }
  el.dataset.status = r.status ?? '';
  el.className = `policy-result ${r.status === 'applied' ? 'applied' : 'pending'}`;
  el.append(h('strong', {}, text), changesTable(Array.isArray(r.changes) ? r.changes : [], 'policy-result-changes'));
}

// A value of a change: absent (null), text, or JSON.
function changeValue(v) {
  if (v === null || v === undefined) return h('span', { class: 'muted' }, 'absent');
  return h('code', {}, typeof v === 'string' ? v : JSON.stringify(v));
}

function changesTable(changes, testid = 'policy-changes') {
  if (!changes.length) return h('p', { class: 'muted small', 'data-testid': testid }, 'No difference from the newest version.');
  return h('div', { class: 'table-wrap' }, h('table', { class: 'grid policy-changes', 'data-testid': testid },
    h('thead', {}, h('tr', {},
      h('th', { scope: 'col' }, 'Where'), h('th', { scope: 'col' }, 'Before'), h('th', { scope: 'col' }, 'After'), h('th', { scope: 'col' }, 'Effect'))),
    h('tbody', {}, changes.map((c) => h('tr', { 'data-testid': 'policy-change', 'data-path': c.path, 'data-widens': c.widens ? 'true' : 'false', class: c.widens ? 'widens' : null },
      h('td', {}, h('code', {}, c.path ?? '')),
      h('td', { class: 'memo' }, changeValue(c.before)),
      h('td', { class: 'memo' }, changeValue(c.after)),
      h('td', {}, c.widens
        ? h('span', { class: 'badge widens', title: 'It lets some agent do more: a second operator must approve it' }, 'widens: four eyes')
        : h('span', { class: 'badge narrows', title: 'It only narrows: one operator applies it' }, 'narrows')))))));
}

function outcomeBadge(o) {
  const outcome = String(o?.outcome ?? '?');
  const text = o?.code ? `${outcome} (${o.code})` : outcome;
  return h('span', { class: `badge outcome ${clean(outcome)}`, 'data-outcome': outcome }, text);
}

// A dry run's report: what it replayed, what the document changes, the calls it would have
// answered differently (before → after), and per agent and currency how many got stricter or looser.
function policyReport(r, title) {
  const changed = Array.isArray(r.changed) ? r.changed : [];
  const totals = Array.isArray(r.totals) ? r.totals : [];
  const changes = Array.isArray(r.changes) ? r.changes : [];
  const widens = changes.filter((c) => c.widens).length;
  return h('section', { class: 'panel policy-report', 'data-testid': 'policy-report', 'data-changed': changed.length, 'aria-label': title },
    h('div', { class: 'view-head' },
      h('h2', {}, title),
      h('span', { class: 'muted small', 'data-testid': 'policy-report-window' }, `calls from ${fmtTime(r.since)} to ${fmtTime(r.until)}`)),
    h('div', { class: 'cards' },
      card('Calls replayed', String(r.replayed ?? 0), 'judged money calls in the window', 'policy-report-replayed'),
      card('Skipped', String(r.skipped ?? 0), 'their version or question unreadable', 'policy-report-skipped', r.skipped > 0 ? 'attention' : ''),
      card('Answered differently', String(changed.length), 'calls this document changes', 'policy-report-changed', changed.length ? 'attention' : ''),
      card('Widening changes', String(widens), widens ? 'a second operator must approve' : 'one operator applies it', 'policy-report-widens', widens ? 'attention' : '')),
    r.truncated ? h('p', { class: 'notice warn', 'data-testid': 'policy-report-truncated' }, 'The window held more calls than one dry run reads (policy.simulate_records_max): its later part was not replayed. Narrow the window.') : null,
    h('h3', {}, 'What it changes'),
    changesTable(changes),
    h('h3', {}, 'Calls answered differently'),
    h('div', { class: 'table-wrap' }, h('table', { class: 'grid', 'data-testid': 'policy-report-calls' },
      h('thead', {}, h('tr', {},
        h('th', { scope: 'col' }, 'At'), h('th', { scope: 'col' }, 'Agent (for user)'), h('th', { scope: 'col' }, 'Tool'), h('th', { scope: 'col' }, 'Payee'),
        h('th', { scope: 'col', class: 'num' }, 'Amount'), h('th', { scope: 'col', class: 'num' }, 'Decided under'), h('th', { scope: 'col' }, 'Before → after'), h('th', { scope: 'col' }, 'Correlation'))),
      h('tbody', {}, changed.length
        ? changed.map((c) => h('tr', {
          'data-testid': 'policy-report-row', 'data-seq': c.seq, 'data-amount': c.amount, 'data-currency': c.currency,
          'data-before': c.before?.outcome ?? '', 'data-after': c.after?.outcome ?? '',
        },
        h('td', {}, timeCell(c.at)),
        h('td', { 'data-testid': 'policy-report-agent' }, principal(c.agent, c.user)),
        h('td', {}, h('code', {}, c.tool ?? '')),
        h('td', {}, h('code', {}, c.payee ?? '')),
        h('td', { class: 'num', 'data-testid': 'policy-report-amount' }, money(c.amount, c.currency)),
        h('td', { class: 'num' }, `v${clean(c.version ?? '?')}`),
        h('td', { 'data-testid': 'policy-report-outcome' }, outcomeBadge(c.before), ' → ', outcomeBadge(c.after)),
        h('td', {}, mono(c.correlation_id))))
        : h('tr', {}, h('td', { colspan: 8, class: 'empty muted', 'data-testid': 'policy-report-none' }, 'No recorded call would have been answered differently.'))))),
    h('h3', {}, 'Per agent and currency'),
    h('div', { class: 'table-wrap' }, h('table', { class: 'grid', 'data-testid': 'policy-report-totals' },
      h('thead', {}, h('tr', {},
        h('th', { scope: 'col' }, 'Agent (for user)'), h('th', { scope: 'col' }, 'Currency'),
        h('th', { scope: 'col', class: 'num' }, 'Stricter'), h('th', { scope: 'col', class: 'num' }, 'Stricter amount'),
        h('th', { scope: 'col', class: 'num' }, 'Looser'), h('th', { scope: 'col', class: 'num' }, 'Looser amount'))),
      h('tbody', {}, totals.length
        ? totals.map((t) => h('tr', { 'data-testid': 'policy-report-total', 'data-agent': t.agent, 'data-currency': t.currency },
          h('td', {}, t.agent ?? ''), h('td', {}, t.currency ?? ''),
          h('td', { class: 'num', 'data-field': 'stricter' }, clean(t.stricter ?? 0)), h('td', { class: 'num', 'data-field': 'stricter_amount' }, money(t.stricter_amount, t.currency)),
          h('td', { class: 'num', 'data-field': 'looser' }, clean(t.looser ?? 0)), h('td', { class: 'num', 'data-field': 'looser_amount' }, money(t.looser_amount, t.currency))))
        : h('tr', {}, h('td', { colspan: 6, class: 'empty muted' }, 'Nothing would change.'))))));
}

// Proposals name their author "<sub> (<iss>)": the signed-in operator's own cannot be approved by them.
function mine(author) {
  const c = session.claims ?? {};
  if (!c.sub) return false;
  return author === (c.iss ? `${c.sub} (${c.iss})` : c.sub);
}

function proposalCard(p) {
  const own = mine(p.author);
  const id = clean(p.proposal_id);
  const el = h('article', { class: `approval panel policy-proposal status-${clean(p.status)}`, 'data-testid': 'policy-proposal', 'data-proposal-id': p.proposal_id, 'aria-label': `Policy proposal ${id}` });
  const head = h('header', { class: 'approval-head' },
    h('span', { class: 'amount' }, `Proposal on version ${clean(p.base_version)}`),
    badge(p.status),
    mono(p.proposal_id),
    h('span', { class: 'muted small countdown' }, 'proposed ', timeCell(p.created_at)));
  const facts = h('dl', { class: 'facts' },
    fact('Proposed by', h('strong', { 'data-testid': 'policy-proposal-author' }, p.author ?? '—', own ? h('span', { class: 'muted' }, ' (you)') : null)),
    fact('Reason', h('span', { 'data-testid': 'policy-proposal-why' }, agentText(p.reason, 'Written by the proposing operator'))),
    fact('Applies', `only while version ${clean(p.base_version)} is the newest (it is ${clean(policyState.version ?? '?')})`));
  const reportBox = h('div', { 'data-testid': 'policy-proposal-report-box' });
  const input = h('input', { type: 'text', name: 'reason', maxlength: 500, autocomplete: 'off', placeholder: 'Why you reject it', 'aria-label': `Reason to reject ${id}`, 'data-testid': 'policy-proposal-reason' });
  const dry = h('button', { type: 'button', 'data-testid': 'policy-proposal-simulate' }, 'Dry run');
  const approve = h('button', { type: 'button', class: 'primary', 'data-testid': 'policy-proposal-approve' }, 'Approve');
  const reject = guard(h('button', { type: 'button', class: 'danger', 'data-testid': 'policy-proposal-reject' }, own ? 'Withdraw' : 'Reject'), SCOPE.admin);
  if (!canSimulate()) disable(dry, `Your token lacks scope ${SIMULATE_SCOPES}`);
  // Approve opens once the reviewer has seen the dry run (and never for the change's own author).
  const approvable = () => can(SCOPE.admin) && !own;
  if (!can(SCOPE.admin)) disable(approve, `Your token lacks scope ${SCOPE.admin}`);
  else if (own) disable(approve, 'You proposed this change: a second operator must approve it');
  else {
    approve.disabled = true;
    approve.title = 'Run the dry run first: see what it would have changed';
  }
  dry.addEventListener('click', async () => {
    if (await simulateInto(reportBox, p.document, `Dry run of proposal ${id}`, dry) && approvable()) {
      approve.disabled = false;
      approve.title = 'Apply this change as the next version';
    }
  });
  approve.addEventListener('click', async () => {
    approve.disabled = true;
    reject.disabled = true;
    try {
      const r = await api('POST', `/policy/proposals/${encodeURIComponent(p.proposal_id)}/approve`);
      if (r?.status === 'pending') {
        // Nobody authenticated proposed it (the config file, `paygate policy import`) and it widens:
        // approving adopted it as yours; a second operator approves the new proposal.
        notify(`Adopted ${id} as proposal ${clean(r?.proposal_id)}: it widens the policy and applies once another operator approves it.`, 'warn');
      } else notify(`Approved ${id}: policy version ${clean(r?.version)} is in force.`, 'ok');
      await loadPolicy();
    } catch (e) {
      if (e instanceof ApiError) {
        if (e.code === 'SELF_REVIEW') {
          notify(`You proposed this change: a second operator must approve it. [SELF_REVIEW]`, 'error');
          disable(approve, 'You proposed this change: a second operator must approve it');
        } else if (e.status === 409) notify(`${clean(e.message)} [${clean(e.code)}]`, 'warn');
        else explain(e, { needs: SCOPE.admin, control: approve, what: 'Approve failed' });
      } else notify(e.message, 'error');
      if (approvable() && !approve.dataset.reason) approve.disabled = false;
      if (can(SCOPE.admin) && !reject.dataset.reason) reject.disabled = false;
    }
  });
  reject.addEventListener('click', async () => {
    const reason = input.value.trim();
    if (!reason) {
      notify('Say why you reject it: the reason is kept in the audit trail.', 'warn');
      input.focus();
      return;
    }
    reject.disabled = true;
    try {
      await api('POST', `/policy/proposals/${encodeURIComponent(p.proposal_id)}/reject`, { body: { reason } });
      notify(`${own ? 'Withdrew' : 'Rejected'} ${id}: the policy stays as it is.`, 'ok');
      await loadPolicy();
    } catch (e) {
      if (e instanceof ApiError) explain(e, { needs: SCOPE.admin, control: reject, what: 'Reject failed' });
      else notify(e.message, 'error');
      if (can(SCOPE.admin) && !reject.dataset.reason) reject.disabled = false;
    }
  });
  const form = h('form', { class: 'review', 'data-testid': 'policy-proposal-review' }, dry, input, approve, reject);
  form.addEventListener('submit', (ev) => ev.preventDefault());
  append(el, [head, facts, h('h3', {}, 'What it changes'), changesTable(Array.isArray(p.changes) ? p.changes : [], 'policy-proposal-changes'), form, reportBox]);
  return el;
}

// ---- reconciliation ---------------------------------------------------------------------------

function loadReconciliation() {
  return load('reconciliation', async () => {
    guard($('[data-testid="recon-run"]'), SCOPE.admin);
    const data = await api('GET', '/reconciliation');
    renderRecon(data?.last ?? null);
  });
}

function renderRecon(last) {
  const box = clear($('[data-testid="recon-report"]'));
  if (!last) {
    box.append(h('p', { class: 'panel muted', 'data-testid': 'recon-none' }, 'Reconciliation has not run yet.'));
    return;
  }
  const r = last.report ?? {};
  const findings = Array.isArray(r.findings) ? r.findings : [];
  append(box, [
    h('div', { class: 'cards' },
      card('Last run', fmtTime(last.at), `by ${clean(last.by ?? '?')}`, 'recon-at'),
      card('Checked', String(r.checked ?? 0), `since ${fmtTime(r.since)}`, 'recon-checked'),
      card('Resolved', String(r.resolved ?? 0), 'settled by this run', 'recon-resolved'),
      card('Findings', String(findings.length + (r.findings_omitted ?? 0)), `backend ${clean(r.backend ?? '?')}`, 'recon-findings', findings.length ? 'attention' : '')),
    h('div', { class: 'table-wrap' }, h('table', { class: 'grid', 'data-testid': 'recon-findings-table' },
      h('thead', {}, h('tr', {}, h('th', { scope: 'col' }, 'Kind'), h('th', { scope: 'col' }, 'Payment'), h('th', { scope: 'col' }, 'Detail'))),
      h('tbody', {}, findings.length
        ? findings.map((f) => h('tr', { 'data-testid': 'recon-finding' }, h('td', {}, badge(f.kind, 'finding')), h('td', {}, mono(f.payment_id)), h('td', { class: 'memo' }, f.detail ?? '')))
        : h('tr', {}, h('td', { colspan: 3, class: 'empty muted' }, 'No findings: the gateway and the backend agree.'))))),
    r.findings_omitted ? h('p', { class: 'muted small' }, `${r.findings_omitted} more findings not shown.`) : null,
  ]);
}

async function runRecon(button) {
  button.disabled = true;
  notify('Reconciliation running…', 'info');
  try {
    const run = await api('POST', '/reconciliation/run', { body: {} });
    renderRecon(run);
    notify('Reconciliation finished.', 'ok');
  } catch (e) {
    if (e instanceof ApiError) explain(e, { needs: SCOPE.admin, control: button, what: 'Reconciliation' });
  } finally {
    if (can(SCOPE.admin) && !button.dataset.reason) button.disabled = false;
  }
}

// ---- webhooks ---------------------------------------------------------------------------------

function loadWebhooks() {
  return load('webhooks', async (el) => {
    const state = $('[data-testid="webhooks-state"]').value;
    const body = $('[data-testid="webhooks-table"] tbody');
    await pager(el, (cursor) => api('GET', '/webhooks', { query: { state, cursor, limit: PAGE_LIMIT } }), (items, first) => {
      if (first) clear(body);
      for (const w of items) body.append(webhookRow(w));
      if (first && !items.length) {
        body.append(h('tr', {}, h('td', { colspan: 8, class: 'empty muted', 'data-testid': 'webhooks-empty' },
          `No ${state ? `${state} ` : ''}webhook messages. Messages are written only for the endpoints the gateway is configured to notify.`)));
      }
    });
    const open = $('[data-testid="webhook-detail"]').dataset.messageId;
    for (const r of $$('[data-testid="webhook-row"]')) r.classList.toggle('selected', r.dataset.messageId === open);
  });
}

function lastResult(status, error) {
  const parts = [];
  if (status !== null && status !== undefined) parts.push(h('code', {}, `HTTP ${clean(status)}`));
  if (error) parts.push(h('span', { class: 'muted', title: clean(error) }, `${parts.length ? ' · ' : ''}${clean(error).slice(0, 80)}`));
  return parts.length ? parts : '—';
}

function webhookRow(w) {
  // The whole row opens the detail; the id is a button so the keyboard reaches it too.
  const open = h('button', { type: 'button', class: 'link id', 'data-testid': 'webhook-open', title: `${clean(w.id)}: show the attempts and the body` }, w.id);
  const row = h('tr', { class: 'clickable', 'data-testid': 'webhook-row', 'data-message-id': w.id, 'data-state': w.state },
    h('td', {}, timeCell(w.created_at)),
    h('td', {}, open),
    h('td', {}, badge(w.event, 'event')),
    h('td', { class: 'memo' }, h('code', { class: 'endpoint' }, w.endpoint ?? '')),
    h('td', {}, badge(w.state)),
    h('td', { class: 'num' }, clean(w.attempts ?? 0)),
    h('td', {}, lastResult(w.last_status, w.last_error)),
    h('td', {}, w.delivered_at ? timeCell(w.delivered_at) : w.next_attempt_at ? timeCell(w.next_attempt_at) : '—'));
  row.addEventListener('click', () => showWebhook(w));
  return row;
}

// JSON as text: pretty-printed, one text node per line (clean() would show the line breaks as
// ⟨U+000A⟩; JSON.stringify already escapes every control character inside strings).
function jsonText(value, testid) {
  const pre = h('pre', { class: 'json', 'data-testid': testid });
  let text;
  try {
    text = JSON.stringify(value ?? null, null, 2) ?? 'null';
  } catch {
    text = String(value);
  }
  text.split('\n').forEach((line, i) => {
    if (i) pre.append(document.createTextNode('\n'));
    pre.append(document.createTextNode(clean(line)));
  });
  return pre;
}

async function showWebhook(w) {
  const pane = $('[data-testid="webhook-detail"]');
  pane.hidden = false;
  pane.dataset.messageId = w.id;
  clear(pane).append(h('p', { class: 'muted' }, 'Loading…'));
  for (const r of $$('[data-testid="webhook-row"]')) r.classList.toggle('selected', r.dataset.messageId === w.id);
  const close = h('button', { type: 'button', class: 'ghost', 'aria-label': 'Close the detail' }, '✕');
  close.addEventListener('click', () => {
    pane.hidden = true;
    delete pane.dataset.messageId;
    for (const r of $$('[data-testid="webhook-row"]')) r.classList.remove('selected');
  });
  let attempts = null;
  let failure = null;
  try {
    const data = await api('GET', `/webhooks/${encodeURIComponent(w.id)}/attempts`);
    attempts = Array.isArray(data?.items) ? data.items : [];
  } catch (e) {
    failure = e;
  }
  if (pane.dataset.messageId !== w.id) return; // another message was opened meanwhile
  const body = w.body && typeof w.body === 'object' ? w.body : {};
  clear(pane).append(
    h('div', { class: 'view-head' }, h('h2', {}, 'Webhook message'), close),
    h('dl', { class: 'facts' },
      fact('Message', mono(w.id)),
      fact('Event', badge(w.event, 'event')),
      fact('Endpoint', h('code', { 'data-testid': 'webhook-endpoint' }, w.endpoint ?? '')),
      fact('State', badge(w.state)),
      fact('Attempts', clean(w.attempts ?? 0)),
      fact('Created', timeCell(w.created_at)),
      w.next_attempt_at ? fact('Next attempt', timeCell(w.next_attempt_at)) : null,
      w.delivered_at ? fact('Delivered', timeCell(w.delivered_at)) : null,
      fact('Last result', h('span', {}, lastResult(w.last_status, w.last_error)))),
    h('h3', {}, 'Attempts'),
    attempts ? attemptsTable(attempts) : h('p', { class: 'error' }, 'Could not load the attempts.'),
    h('h3', {}, 'Body as sent'),
    h('p', { class: 'muted small' }, `${clean(body.type ?? '')}${body.timestamp ? ` · ${clean(body.timestamp)}` : ''}`),
    jsonText(w.body, 'webhook-body'));
  if (failure instanceof ApiError) explain(failure, { needs: SCOPE.audit, what: 'Webhook attempts' });
  else if (failure) notify(`Webhook attempts: ${failure.message}`, 'error');
}

function attemptsTable(items) {
  return h('div', { class: 'table-wrap' }, h('table', { class: 'grid', 'data-testid': 'webhook-attempts' },
    h('thead', {}, h('tr', {},
      h('th', { scope: 'col', class: 'num' }, '#'), h('th', { scope: 'col' }, 'At'), h('th', { scope: 'col' }, 'Status'),
      h('th', { scope: 'col' }, 'Error'), h('th', { scope: 'col', class: 'num' }, 'Duration'))),
    h('tbody', {}, items.length
      ? items.map((a) => h('tr', { 'data-testid': 'webhook-attempt' },
        h('td', { class: 'num' }, clean(a.attempt ?? '')),
        h('td', {}, timeCell(a.at)),
        h('td', {}, a.status === null || a.status === undefined ? '—' : h('code', {}, `HTTP ${clean(a.status)}`)),
        h('td', { class: 'memo' }, a.error ?? '—'),
        h('td', { class: 'num' }, `${clean(a.duration_ms ?? 0)} ms`)))
      : h('tr', {}, h('td', { colspan: 5, class: 'empty muted', 'data-testid': 'webhook-attempts-none' }, 'No attempts yet.')))));
}

// ---- health -----------------------------------------------------------------------------------

function loadHealth() {
  return load('health', async () => {
    const data = await api('GET', '/health');
    const box = clear($('[data-testid="health-report"]'));
    const checks = Array.isArray(data?.checks) ? data.checks : [];
    box.append(
      h('div', { class: 'cards' },
        card('Status', data?.status ?? '?', `version ${clean(data?.version ?? '?')}`, 'health-status', data?.status === 'ok' ? 'good' : 'attention'),
        card('Server time', fmtTime(data?.time), clean(data?.time ?? ''), 'health-time')),
      h('div', { class: 'table-wrap' }, h('table', { class: 'grid', 'data-testid': 'health-checks' },
        h('thead', {}, h('tr', {}, h('th', { scope: 'col' }, 'Check'), h('th', { scope: 'col' }, 'State'), h('th', { scope: 'col' }, 'Detail'))),
        h('tbody', {}, checks.map((c) => h('tr', { 'data-testid': 'health-check', 'data-check': c.name },
          h('td', {}, h('strong', {}, c.name)),
          h('td', {}, c.ok ? badge('ok', 'ok') : badge('failing', 'failed')),
          h('td', { class: 'memo' }, c.detail ?? '')))))));
  });
}

// ---- start ------------------------------------------------------------------------------------

function wire() {
  window.addEventListener('hashchange', route);
  // A click on the tab already shown reloads it (no hashchange fires for the same hash).
  for (const a of $$('nav.tabs a')) {
    a.addEventListener('click', () => {
      if (session.token && a.dataset.view === currentView && location.hash === `#${currentView}`) VIEWS[currentView]();
    });
  }
  $('[data-testid="signout"]').addEventListener('click', () => {
    signOut('Signed out. The token was only in this tab\'s memory and is gone.');
    history.replaceState(null, '', '/console');
  });
  $('[data-testid="oidc-signin"]').addEventListener('click', startOidc);
  $('[data-testid="dev-signin"]').addEventListener('submit', async (ev) => {
    ev.preventDefault();
    const input = $('#dev-token');
    const token = input.value.trim().replace(/^Bearer\s+/i, '');
    input.value = '';
    if (token.split('.').length !== 3) {
      showSignIn('That does not look like a JWT (three dot-separated parts).');
      return;
    }
    setToken(token);
    signedIn();
  });
  for (const el of $$('main > .view')) {
    const refresh = $('button.refresh', el);
    if (refresh) refresh.addEventListener('click', () => VIEWS[el.dataset.view]());
  }
  $('[data-testid="approvals-status"]').addEventListener('change', loadApprovals);
  $('[data-testid="mandates-status"]').addEventListener('change', loadMandates);
  $('[data-testid="webhooks-state"]').addEventListener('change', loadWebhooks);
  $('[data-testid="payees-filters"]').addEventListener('submit', (ev) => { ev.preventDefault(); loadPayees(); });
  $('[data-testid="payee-add"]').addEventListener('submit', (ev) => { ev.preventDefault(); addPayee(ev.currentTarget); });
  $('[data-testid="payments-filters"]').addEventListener('submit', (ev) => { ev.preventDefault(); loadPayments(); });
  $('[data-testid="audit-filters"]').addEventListener('submit', (ev) => { ev.preventDefault(); loadAudit(); });
  const doc = $('[data-testid="policy-document"]');
  doc.addEventListener('input', () => { doc.dataset.dirty = '1'; editorBase(); });
  $('[data-testid="policy-editor"]').addEventListener('submit', (ev) => ev.preventDefault());
  const simulate = $('[data-testid="policy-simulate"]');
  simulate.addEventListener('click', () => simulateEditor(simulate));
  const propose = $('[data-testid="policy-propose"]');
  propose.addEventListener('click', () => proposePolicy(propose));
  $('[data-testid="policy-reset"]').addEventListener('click', () => {
    setEditor(policyState.document, policyState.version, false);
    policyResult(null);
    clear($('[data-testid="policy-report-box"]'));
  });
  const run = $('[data-testid="recon-run"]');
  run.addEventListener('click', () => runRecon(run));
}

async function start() {
  wire();
  try {
    const resp = await fetch('/console/config.json', { cache: 'no-store', credentials: 'omit' });
    if (!resp.ok) throw new Error(`HTTP ${resp.status}`);
    config = await resp.json();
    if (typeof config?.api !== 'string') throw new Error('no API path');
  } catch (e) {
    config = null;
    showSignIn(`The console configuration could not be loaded (${e.message}).`);
    return;
  }
  if (location.pathname === '/console/callback' && config.oidc) {
    try {
      setToken(await finishOidc());
      signedIn();
    } catch (e) {
      showSignIn(`Sign-in failed: ${e.message}`);
    }
    return;
  }
  if (location.pathname === '/console/callback') history.replaceState(null, '', '/console');
  showSignIn(null);
}

start();
