// A third-party authorization server on loopback: oauth2-mock-server with one RS256 key.
// Usage: node issuer.mjs PORT KID     (PORT 0 picks one; prints "issuer <url>" when ready)
// Tokens from POST /token (client_credentials) carry aud = the requested `resource` (RFC 8707),
// sub = the client id, and the requested scope. Restart with another KID on the same port to
// rotate the signing key (the old key is gone from /jwks).
import { OAuth2Server } from 'oauth2-mock-server';

const [port, kid] = [Number(process.argv[2] ?? 0), process.argv[3] ?? 'k1'];
const server = new OAuth2Server();
await server.issuer.keys.generate('RS256', { kid });
server.service.on('beforeTokenSigning', (token, req) => {
  const body = req.body ?? {};
  if (body.resource) token.payload.aud = body.resource;
  let clientId = body.client_id;
  const basic = req.headers?.authorization;
  if (!clientId && basic?.startsWith('Basic ')) {
    clientId = Buffer.from(basic.slice(6), 'base64').toString().split(':')[0];
  }
  token.payload.sub = clientId ?? 'interop-agent';
  if (body.scope) token.payload.scope = body.scope;
});
await server.start(port, '127.0.0.1');
console.log(`issuer ${server.issuer.url}`);
process.on('SIGTERM', async () => {
  await server.stop();
  process.exit(0);
});
