// A third-party authorization server on loopback: oauth2-mock-server with one RS256 key.
// Usage: node issuer.mjs PORT KID     (PORT 0 picks one; prints "issuer <url>" when ready)
// Tokens from POST /token (client_credentials) carry aud = the requested `resource` (RFC 8707),
// sub = the client id, and the requested scope. Restart with another KID on the same port to
// rotate the signing key (the old key is gone from /jwks).
//
// The operator console signs in with authorization_code + PKCE (a public client). The mock has no
// login page: GET /authorize redirects at once, as if a person were already signed in there. Who
// that person is comes from ISSUER_OPERATOR_SUBJECT (default "operator") and can be changed by a
// test with POST /test/login {"sub": "...", "scopes": "payments:audit ..."} ("scopes" caps what
// the person may be granted; absent = anything asked for). For that flow this issuer insists on
// PKCE S256, a one-time code, the same redirect_uri and client_id at /token, and it issues
// aud = `resource`, sub = the signed-in person, scope = the scope asked at /authorize minus
// `openid` (within the cap). client_credentials tokens are unchanged, except that a request with
// `on_behalf_of=<user>` gets a delegated token (RFC 8693's shape: sub = the user, act.sub = the
// client), standing in for a token exchange.
import { OAuth2Server } from 'oauth2-mock-server';

const [port, kid] = [Number(process.argv[2] ?? 0), process.argv[3] ?? 'k1'];
const server = new OAuth2Server();
await server.issuer.keys.generate('RS256', { kid });

let login = { sub: process.env.ISSUER_OPERATOR_SUBJECT || 'operator', scopes: null };
const codes = new Map(); // code → what /authorize was asked, and by whom; used once at /token

server.service.addRoute('POST', '/test/login', (req, res) => {
  const body = req.body ?? {};
  login = {
    sub: typeof body.sub === 'string' && body.sub ? body.sub : login.sub,
    scopes: typeof body.scopes === 'string' ? body.scopes.split(/\s+/).filter(Boolean) : null,
  };
  res.setHeader('content-type', 'application/json');
  res.end(JSON.stringify(login));
});

server.service.on('beforeAuthorizeRedirect', (redirect, req) => {
  const q = req.query ?? {};
  const url = redirect.url;
  const code = url.searchParams.get('code');
  if (!code) return;
  if (q.code_challenge_method !== 'S256' || !q.code_challenge || !q.client_id || !q.state) {
    url.searchParams.delete('code');
    url.searchParams.set('error', 'invalid_request');
    url.searchParams.set('error_description', 'client_id, state and PKCE (S256) are required');
    return;
  }
  const asked = String(q.scope ?? '').split(/\s+/).filter((s) => s && s !== 'openid');
  const granted = login.scopes ? asked.filter((s) => login.scopes.includes(s)) : asked;
  codes.set(code, {
    sub: login.sub,
    scope: granted.join(' '),
    client_id: q.client_id,
    redirect_uri: q.redirect_uri,
    resource: q.resource,
  });
});

server.service.on('beforeTokenSigning', (token, req) => {
  const body = req.body ?? {};
  if (body.grant_type === 'authorization_code') {
    const grant = codes.get(body.code);
    if (!grant) return; // refused in beforeResponse
    token.payload.sub = grant.sub;
    if ('scope' in token.payload) {
      // the access token (the id token carries no scope): for the resource the client named
      token.payload.aud = body.resource ?? grant.resource;
      token.payload.scope = grant.scope;
      token.payload.client_id = grant.client_id;
    }
    return;
  }
  if (body.resource) token.payload.aud = body.resource;
  let clientId = body.client_id;
  const basic = req.headers?.authorization;
  if (!clientId && basic?.startsWith('Basic ')) {
    clientId = Buffer.from(basic.slice(6), 'base64').toString().split(':')[0];
  }
  token.payload.sub = clientId ?? 'interop-agent';
  if (body.on_behalf_of) {
    token.payload.act = { sub: token.payload.sub };
    token.payload.sub = String(body.on_behalf_of);
  }
  if (body.scope) token.payload.scope = body.scope;
});

server.service.on('beforeResponse', (response, req) => {
  const body = req.body ?? {};
  if (body.grant_type !== 'authorization_code') return;
  const grant = codes.get(body.code);
  codes.delete(body.code);
  const refuse = (why) => {
    response.statusCode = 400;
    response.body = { error: 'invalid_grant', error_description: why };
  };
  if (!grant) return refuse('unknown or used code');
  if (!body.code_verifier) return refuse('code_verifier is required');
  if (body.redirect_uri !== grant.redirect_uri) return refuse('redirect_uri differs from the authorization request');
  if (body.client_id !== grant.client_id) return refuse('client_id differs from the authorization request');
  if (grant.resource && body.resource && body.resource !== grant.resource) return refuse('resource differs');
  response.body.scope = grant.scope;
});

await server.start(port, '127.0.0.1');
console.log(`issuer ${server.issuer.url}`);
process.on('SIGTERM', async () => {
  await server.stop();
  process.exit(0);
});
