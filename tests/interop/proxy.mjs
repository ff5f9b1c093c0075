// Loopback proxy that adds a bearer token: the conformance suite cannot send headers.
// Usage: node proxy.mjs LISTEN_PORT TARGET_BASE_URL TOKEN   (prints "proxy <port>" when ready)
// The Host and Origin headers pass through unchanged, so paygate's DNS-rebinding checks see what
// the suite sent.
import http from 'node:http';
const [listenPort, target, token] = [Number(process.argv[2]), new URL(process.argv[3]), process.argv[4]];
const server = http.createServer((req, res) => {
  const headers = { ...req.headers, authorization: `Bearer ${token}` };
  delete headers['content-length'];
  const chunks = [];
  req.on('data', (c) => chunks.push(c));
  req.on('end', () => {
    const body = Buffer.concat(chunks);
    if (body.length) headers['content-length'] = String(body.length);
    const up = http.request({ host: target.hostname, port: target.port, path: req.url, method: req.method, headers }, (r) => {
      res.writeHead(r.statusCode, r.headers);
      r.pipe(res);
    });
    up.on('error', (e) => { res.writeHead(502); res.end(String(e)); });
    up.end(body);
  });
});
server.listen(listenPort, '127.0.0.1', () => console.log(`proxy ${server.address().port}`));
