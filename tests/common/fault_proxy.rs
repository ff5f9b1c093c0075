//! A fault-injecting HTTP/1.1 proxy on 127.0.0.1:0, in front of a real ledger service: it passes
//! requests through, drops responses after the ledger committed, answers 500 without forwarding,
//! holds requests until the client gave up, or refuses connections at the TCP level.
//!
//! One request per connection (it forwards with `Connection: close`), raw tokio TCP so it can close
//! a connection without answering. Every request it reads is recorded (method, path,
//! `Idempotency-Key`, body), and every connection it accepts is counted.
#![allow(dead_code)]

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{Notify, mpsc, oneshot};

/// Bound on how long the proxy waits for anything (a request, the upstream, a hang-up).
const WAIT_MAX: Duration = Duration::from_secs(10);
const HEADER_BYTES_MAX: usize = 64 * 1024;

#[derive(Debug, Clone, PartialEq)]
pub enum Mode {
    PassThrough,
    /// Forward, let the ledger answer (and commit), then close the client connection silently.
    DropResponseAfterForward,
    /// Forward, let the ledger answer (and commit), then keep the answer until the client hangs up
    /// (a gateway killed while it waits for the ledger's answer), never sending it.
    HoldResponseAfterForward,
    /// Answer this status without forwarding.
    Status(u16),
    /// Forward, let the ledger answer (and commit), and pass the answer on with the first `from`
    /// replaced by `to` (same length: the headers stand) — a ledger whose answer contradicts itself.
    Rewrite(&'static str, &'static str),
    /// Hold the request for this long *and* until the client has hung up (so the client has
    /// certainly given up), then forward it; the answer goes nowhere.
    Slow(Duration),
    /// Stop listening: connections are refused by the OS, so no request can be sent.
    Refuse,
}

#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub idempotency_key: Option<String>,
    /// The `Paygate-Mandate` header, when the request carried one.
    pub mandate: Option<String>,
    pub body: Vec<u8>,
}

struct Shared {
    mode: Mutex<Mode>,
    /// Modes for the next requests, one each, before `mode` applies again.
    script: Mutex<VecDeque<Mode>>,
    seen: Mutex<Vec<Seen>>,
    connections: AtomicUsize,
    forwarded: AtomicUsize,
    forwarded_changed: Notify,
}

pub struct FaultProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    control: mpsc::Sender<(Mode, oneshot::Sender<()>)>,
}

fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = TcpSocket::new_v4()?;
    // Rebinding after `Refuse` must not trip over connections in TIME_WAIT.
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(128)
}

impl FaultProxy {
    pub async fn start(upstream: SocketAddr) -> FaultProxy {
        let listener = listen("127.0.0.1:0".parse().unwrap()).expect("bind proxy");
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Shared {
            mode: Mutex::new(Mode::PassThrough),
            script: Mutex::new(VecDeque::new()),
            seen: Mutex::new(Vec::new()),
            connections: AtomicUsize::new(0),
            forwarded: AtomicUsize::new(0),
            forwarded_changed: Notify::new(),
        });
        let (control, mut commands) = mpsc::channel::<(Mode, oneshot::Sender<()>)>(8);
        let state = shared.clone();
        tokio::spawn(async move {
            let mut listener = Some(listener);
            loop {
                let command = match &listener {
                    Some(l) => tokio::select! {
                        accepted = l.accept() => {
                            if let Ok((conn, _)) = accepted {
                                state.connections.fetch_add(1, Ordering::SeqCst);
                                tokio::spawn(handle(conn, state.clone(), upstream));
                            }
                            continue;
                        }
                        command = commands.recv() => command,
                    },
                    None => commands.recv().await,
                };
                let Some((mode, ack)) = command else { return };
                if mode == Mode::Refuse {
                    listener = None;
                } else if listener.is_none() {
                    listener = Some(listen(addr).expect("rebind proxy"));
                }
                *state.mode.lock().unwrap() = mode;
                let _ = ack.send(());
            }
        });
        FaultProxy { addr, shared, control }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Takes effect before it returns (`Refuse` has closed the listening socket).
    pub async fn set_mode(&self, mode: Mode) {
        let (ack, done) = oneshot::channel();
        self.control.send((mode, ack)).await.expect("proxy running");
        done.await.expect("proxy acknowledged");
    }

    /// The next requests get these modes, one each (then the current mode again). `Refuse` is not
    /// scriptable: the connection is already accepted.
    pub fn script(&self, modes: impl IntoIterator<Item = Mode>) {
        let modes: Vec<Mode> = modes.into_iter().collect();
        assert!(!modes.contains(&Mode::Refuse), "Refuse works at the listener: use set_mode");
        self.shared.script.lock().unwrap().extend(modes);
    }

    /// Connections accepted so far (a request that never reached the proxy is not counted).
    pub fn connections(&self) -> usize {
        self.shared.connections.load(Ordering::SeqCst)
    }

    /// Requests read so far, in arrival order.
    pub fn seen(&self) -> Vec<Seen> {
        self.shared.seen.lock().unwrap().clone()
    }

    /// Requests the ledger has answered (so any commit is done).
    pub fn forwarded(&self) -> usize {
        self.shared.forwarded.load(Ordering::SeqCst)
    }

    /// Wait (bounded) until the ledger has answered `n` forwarded requests.
    pub async fn wait_forwarded(&self, n: usize) {
        tokio::time::timeout(WAIT_MAX, async {
            loop {
                let changed = self.shared.forwarded_changed.notified();
                if self.forwarded() >= n {
                    return;
                }
                changed.await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("the proxy forwarded {} requests, not {n}", self.forwarded()));
    }
}

struct RawRequest {
    head: String,
    body: Vec<u8>,
}

async fn handle(mut client: TcpStream, shared: Arc<Shared>, upstream: SocketAddr) {
    let Ok(Some(req)) = tokio::time::timeout(WAIT_MAX, read_request(&mut client)).await else { return };
    let mut lines = req.head.split("\r\n");
    let mut request_line = lines.next().unwrap_or("").split(' ');
    let (method, path) = (request_line.next().unwrap_or("").to_string(), request_line.next().unwrap_or("").to_string());
    let mut rewritten = format!("{}\r\n", req.head.split("\r\n").next().unwrap_or(""));
    let mut idempotency_key = None;
    let mut mandate = None;
    for line in lines.filter(|l| !l.is_empty()) {
        let (name, value) = line.split_once(':').unwrap_or((line, ""));
        if name.eq_ignore_ascii_case("idempotency-key") {
            idempotency_key = Some(value.trim().to_string());
        }
        if name.eq_ignore_ascii_case("paygate-mandate") {
            mandate = Some(value.trim().to_string());
        }
        if !name.eq_ignore_ascii_case("connection") {
            rewritten.push_str(line);
            rewritten.push_str("\r\n");
        }
    }
    rewritten.push_str("connection: close\r\n\r\n");
    let mut raw = rewritten.into_bytes();
    raw.extend_from_slice(&req.body);
    shared.seen.lock().unwrap().push(Seen { method, path, idempotency_key, mandate, body: req.body });

    let scripted = shared.script.lock().unwrap().pop_front();
    let mode = scripted.unwrap_or_else(|| shared.mode.lock().unwrap().clone());
    match mode {
        Mode::PassThrough => {
            let response = forward(&raw, upstream, &shared).await;
            let _ = client.write_all(&response).await;
            let _ = client.shutdown().await;
        }
        Mode::DropResponseAfterForward => {
            let _ = forward(&raw, upstream, &shared).await;
            drop(client);
        }
        Mode::Rewrite(from, to) => {
            assert_eq!(from.len(), to.len(), "a rewrite keeps the length (content-length stands)");
            let response = forward(&raw, upstream, &shared).await;
            let text = String::from_utf8_lossy(&response).replacen(from, to, 1);
            let _ = client.write_all(text.as_bytes()).await;
            let _ = client.shutdown().await;
        }
        Mode::HoldResponseAfterForward => {
            let _ = forward(&raw, upstream, &shared).await;
            let mut byte = [0u8; 1];
            let hung_up = async {
                while let Ok(n) = client.read(&mut byte).await {
                    if n == 0 {
                        return;
                    }
                }
            };
            let _ = tokio::time::timeout(WAIT_MAX, hung_up).await;
        }
        Mode::Status(code) => {
            let body = format!(r#"{{"code":"INJECTED","message":"injected {code}"}}"#);
            let response = format!(
                "HTTP/1.1 {code} Injected\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = client.write_all(response.as_bytes()).await;
            let _ = client.shutdown().await;
        }
        Mode::Slow(delay) => {
            let hung_up = async {
                let mut byte = [0u8; 1];
                // 0 bytes: the client closed its side (its timeout fired and it dropped the request).
                while let Ok(n) = client.read(&mut byte).await {
                    if n == 0 {
                        return;
                    }
                }
            };
            let _ = tokio::join!(tokio::time::sleep(delay), tokio::time::timeout(WAIT_MAX, hung_up));
            let _ = forward(&raw, upstream, &shared).await;
        }
        Mode::Refuse => {
            // Accepted just before the listener closed: say nothing.
        }
    }
}

/// Send one request upstream and read its whole answer (the upstream closes: `Connection: close`).
async fn forward(raw: &[u8], upstream: SocketAddr, shared: &Shared) -> Vec<u8> {
    let exchange = async {
        let mut up = TcpStream::connect(upstream).await?;
        up.write_all(raw).await?;
        let mut response = Vec::new();
        up.read_to_end(&mut response).await?;
        Ok::<_, std::io::Error>(response)
    };
    let response = tokio::time::timeout(WAIT_MAX, exchange)
        .await
        .ok()
        .and_then(Result::ok)
        .unwrap_or_else(|| b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".to_vec());
    shared.forwarded.fetch_add(1, Ordering::SeqCst);
    shared.forwarded_changed.notify_waiters();
    response
}

/// Read one request: the head up to the blank line, then `content-length` bytes of body.
async fn read_request(conn: &mut TcpStream) -> Option<RawRequest> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        if buf.len() > HEADER_BYTES_MAX {
            return None;
        }
        let n = conn.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8(buf[..head_end].to_vec()).ok()?;
    let content_length = head
        .split("\r\n")
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.trim().parse::<usize>().ok())
        .unwrap_or(0);
    let mut body = buf[head_end + 4..].to_vec();
    while body.len() < content_length {
        let n = conn.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    body.truncate(content_length);
    Some(RawRequest { head, body })
}
