//! A minimal HTTP/1.1 keep-alive client on glommio for the load generator, and the berth driver on it. Responses are
//! parsed with httparse; only Content-Length bodies are read (all berth sends). With `--batch 1` the driver sends
//! version 1's single-message requests; with `--batch N` it produces `application/vnd.berth.frames`, consumes
//! `max=N` in the same framing, and acks a `text/plain` body of receipt handles.

use super::{Consumed, Driver, Pipelined};
use berth::tls::Stream;
use futures_lite::AsyncWriteExt;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

/// Largest response the client buffers (a consume of 1000 messages of 1 MiB would not fit, but the batch byte
/// limit of the server, 16 MiB, does).
const MAX_REPLY_BYTES: usize = 64 << 20;

/// `authorization: Bearer TOKEN\r\n` when a token was given (`--auth-token`), sent with every request.
static AUTH_HEADER: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Sends `token` with every request from now on; refused if it could not be one header value.
pub fn set_auth_token(token: &str) -> Result<(), String> {
    if token.is_empty() || token.bytes().any(|b| !(0x21..0x7f).contains(&b)) {
        return Err("--auth-token: empty, or not printable ASCII without spaces".into());
    }
    let _ = AUTH_HEADER.set(format!("authorization: Bearer {token}\r\n"));
    Ok(())
}

/// The token given to [`set_auth_token`], for the control-plane client.
pub fn auth_token() -> Option<String> {
    AUTH_HEADER.get().map(|h| {
        h.trim_start_matches("authorization: Bearer ")
            .trim_end()
            .to_string()
    })
}

/// A response as the load generator needs it.
pub struct Reply {
    pub status: u16,
    pub receipt_handle: Option<String>,
    pub body_len: usize,
    /// The body, only when the request asked to keep it.
    pub body: Vec<u8>,
}

/// One request to send.
pub struct Req<'a> {
    pub method: &'a str,
    pub path: &'a str,
    /// Extra header lines, each ending in CRLF (`content-type: ...\r\n`).
    pub headers: &'a str,
    pub body: &'a [u8],
    /// Keep the response body (batch replies are parsed; single messages only need their length).
    pub keep_body: bool,
}

impl<'a> Req<'a> {
    pub fn new(method: &'a str, path: &'a str, body: &'a [u8]) -> Req<'a> {
        Req {
            method,
            path,
            headers: "",
            body,
            keep_body: false,
        }
    }
}

/// One keep-alive connection.
pub struct Conn {
    stream: Stream,
    buf: Vec<u8>,
    out: Vec<u8>,
    host: String,
}

impl Conn {
    /// With `tls`, HTTPS: the server's certificate must name `addr`'s IP address.
    pub async fn connect(
        addr: SocketAddr,
        tls: Option<&Arc<rustls::ClientConfig>>,
    ) -> io::Result<Conn> {
        let tcp = super::wire::connect(addr).await?;
        let stream = match tls {
            None => Stream::Plain(tcp),
            Some(tls) => berth::tls::connect(tls, &addr.ip().to_string(), tcp).await?,
        };
        Ok(Conn {
            stream,
            buf: Vec::with_capacity(16 << 10),
            out: Vec::with_capacity(4 << 10),
            host: addr.to_string(),
        })
    }

    /// Sends one request and waits for its response.
    pub async fn request(&mut self, req: Req<'_>) -> io::Result<Reply> {
        self.out.clear();
        self.push(&req);
        self.stream.write_all(&self.out).await?;
        self.stream.flush().await?;
        self.read_reply(req.keep_body).await
    }

    /// Sends several requests in one write (HTTP pipelining) and returns each response with the time it arrived.
    pub async fn pipeline(&mut self, requests: &[Req<'_>]) -> io::Result<Vec<(Reply, Instant)>> {
        self.out.clear();
        for req in requests {
            self.push(req);
        }
        self.stream.write_all(&self.out).await?;
        self.stream.flush().await?;
        let mut replies = Vec::with_capacity(requests.len());
        for req in requests {
            let reply = self.read_reply(req.keep_body).await?;
            replies.push((reply, Instant::now()));
        }
        Ok(replies)
    }

    fn push(&mut self, req: &Req<'_>) {
        use std::io::Write;
        let _ = write!(
            self.out,
            "{} {} HTTP/1.1\r\nhost: {}\r\n{}{}content-length: {}\r\n\r\n",
            req.method,
            req.path,
            self.host,
            AUTH_HEADER.get().map_or("", String::as_str),
            req.headers,
            req.body.len()
        );
        self.out.extend_from_slice(req.body);
    }

    async fn read_reply(&mut self, keep_body: bool) -> io::Result<Reply> {
        loop {
            if let Some((mut reply, head, used)) = parse_reply(&self.buf)? {
                if keep_body {
                    reply.body = self.buf[head..used].to_vec();
                }
                self.buf.drain(..used);
                return Ok(reply);
            }
            super::wire::read_more(
                &mut self.stream,
                &mut self.buf,
                16 << 10,
                MAX_REPLY_BYTES,
                "the server",
            )
            .await?;
        }
    }
}

/// A complete response at the start of `buf`: the reply (without its body), where the body starts, where it ends.
fn parse_reply(buf: &[u8]) -> io::Result<Option<(Reply, usize, usize)>> {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut response = httparse::Response::new(&mut headers);
    let head = match response.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(io::Error::new(io::ErrorKind::InvalidData, e.to_string())),
    };
    let mut content_length = 0usize;
    let mut receipt_handle = None;
    for h in response.headers.iter() {
        if h.name.eq_ignore_ascii_case("content-length") {
            content_length = std::str::from_utf8(h.value)
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
        } else if h.name.eq_ignore_ascii_case("receipt-handle") {
            receipt_handle = Some(String::from_utf8_lossy(h.value).into_owned());
        }
    }
    let status = response.code.unwrap_or(0);
    let end = head.saturating_add(content_length);
    if buf.len() < end {
        return Ok(None);
    }
    Ok(Some((
        Reply {
            status,
            receipt_handle,
            body_len: content_length,
            body: Vec::new(),
        },
        head,
        end,
    )))
}

/// Frames as berth batches carry them: a 4-byte little-endian length, then that many bytes.
pub fn frames_of(body: &[u8], n: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(n * (body.len() + 4));
    for _ in 0..n {
        out.extend_from_slice(&(body.len() as u32).to_le_bytes());
        out.extend_from_slice(body);
    }
    out
}

/// Splits a frames body; None when it is not made of whole frames.
fn split_frames(mut bytes: &[u8]) -> Option<Vec<&[u8]>> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let len = u32::from_le_bytes(bytes.get(..4)?.try_into().ok()?) as usize;
        let frame = bytes.get(4..4usize.checked_add(len)?)?;
        out.push(frame);
        bytes = &bytes[4 + len..];
    }
    Some(out)
}

#[derive(serde::Deserialize)]
struct BatchProduced {
    failed: usize,
    results: Vec<serde::de::IgnoredAny>,
}

#[derive(serde::Deserialize)]
struct DeliveryHeader {
    receipt_handle: String,
}

#[derive(serde::Deserialize)]
struct Settled {
    results: Vec<SettleResult>,
}

#[derive(serde::Deserialize)]
struct SettleResult {
    status: u16,
}

/// The berth driver: one connection and the request lines of the bench topic.
pub struct Berth {
    conn: Conn,
    topic: String,
    batch: usize,
    message: Arc<Vec<u8>>,
    /// A full batch's produce body (frames), when batching.
    frames: Vec<u8>,
    produce_path: String,
    consume_path: String,
    ack_path: String,
}

const FRAMES_OUT: &str = "content-type: application/vnd.berth.frames\r\n";
const FRAMES_IN: &str = "accept: application/vnd.berth.frames\r\n";
const TEXT_OUT: &str = "content-type: text/plain\r\n";

impl Berth {
    #[allow(clippy::too_many_arguments)]
    pub async fn connect(
        addr: SocketAddr,
        tls: Option<&Arc<rustls::ClientConfig>>,
        topic: &str,
        visibility: &str,
        wait: &str,
        batch: usize,
        message: Arc<Vec<u8>>,
    ) -> io::Result<Berth> {
        let max = if batch > 1 {
            format!("&max={batch}")
        } else {
            String::new()
        };
        Ok(Berth {
            conn: Conn::connect(addr, tls).await?,
            topic: topic.to_string(),
            batch,
            frames: if batch > 1 {
                frames_of(&message, batch)
            } else {
                Vec::new()
            },
            message,
            produce_path: format!("/produce?topic={topic}"),
            consume_path: format!(
                "/consume?topic={topic}&visibility={visibility}&wait={wait}{max}"
            ),
            ack_path: format!("/ack?topic={topic}"),
        })
    }

    fn single_ack_path(&self, handle: &str) -> String {
        format!("/ack?topic={}&receipt_handle={handle}", self.topic)
    }

    /// Messages accepted by a produce reply of `n` records.
    fn produced(&self, reply: &Reply, n: usize) -> usize {
        if reply.status != 200 {
            return 0;
        }
        if self.batch == 1 {
            return 1;
        }
        match serde_json::from_slice::<BatchProduced>(&reply.body) {
            Ok(b) if b.results.len() == n => n.saturating_sub(b.failed),
            _ => 0,
        }
    }

    /// What a consume reply delivered.
    fn consumed(&self, reply: Reply) -> Consumed<String> {
        let mut c = Consumed {
            handles: Vec::new(),
            intact: 0,
            ok: reply.status == 200,
            empty: reply.status == 204,
        };
        if reply.status != 200 {
            return c;
        }
        if self.batch == 1 {
            c.intact = usize::from(reply.body_len == self.message.len());
            c.handles.extend(reply.receipt_handle);
            return c;
        }
        let Some(frames) = split_frames(&reply.body) else {
            c.ok = false;
            return c;
        };
        c.ok = frames.len() % 2 == 0;
        for pair in frames.chunks_exact(2) {
            match serde_json::from_slice::<DeliveryHeader>(pair[0]) {
                Ok(h) => {
                    c.handles.push(h.receipt_handle);
                    c.intact += usize::from(pair[1].len() == self.message.len());
                }
                Err(_) => c.ok = false,
            }
        }
        c
    }

    /// Handles a settle reply acked.
    fn acked(&self, reply: &Reply, n: usize) -> usize {
        if reply.status != 200 {
            return 0;
        }
        if self.batch == 1 {
            return n.min(1);
        }
        match serde_json::from_slice::<Settled>(&reply.body) {
            Ok(s) => s.results.iter().filter(|r| r.status == 200).count(),
            Err(_) => 0,
        }
    }
}

impl Driver for Berth {
    type Handle = String;

    async fn produce(&mut self, n: usize) -> io::Result<usize> {
        let partial;
        let req = if self.batch == 1 {
            Req::new("POST", &self.produce_path, &self.message)
        } else {
            let body = if n == self.batch {
                &self.frames
            } else {
                partial = frames_of(&self.message, n);
                &partial
            };
            Req {
                headers: FRAMES_OUT,
                keep_body: true,
                ..Req::new("POST", &self.produce_path, body)
            }
        };
        let reply = self.conn.request(req).await?;
        Ok(self.produced(&reply, n))
    }

    async fn consume(&mut self) -> io::Result<Consumed<String>> {
        let req = Req {
            headers: if self.batch > 1 { FRAMES_IN } else { "" },
            keep_body: self.batch > 1,
            ..Req::new("GET", &self.consume_path, &[])
        };
        let reply = self.conn.request(req).await?;
        Ok(self.consumed(reply))
    }

    async fn ack(&mut self, handles: &[String]) -> io::Result<usize> {
        let (path, body);
        let req = if self.batch == 1 && handles.len() == 1 {
            path = self.single_ack_path(&handles[0]);
            Req::new("POST", &path, &[])
        } else {
            body = handles.join("\n");
            Req {
                headers: TEXT_OUT,
                keep_body: true,
                ..Req::new("POST", &self.ack_path, body.as_bytes())
            }
        };
        let reply = self.conn.request(req).await?;
        Ok(self.acked(&reply, handles.len()))
    }

    async fn pipelined_cycle(&mut self, previous: &[String]) -> io::Result<Pipelined<String>> {
        let mut requests: Vec<Req<'_>> = Vec::with_capacity(3);
        let (single_path, ack_body);
        if !previous.is_empty() {
            if self.batch == 1 && previous.len() == 1 {
                single_path = self.single_ack_path(&previous[0]);
                requests.push(Req::new("POST", &single_path, &[]));
            } else {
                ack_body = previous.join("\n");
                requests.push(Req {
                    headers: TEXT_OUT,
                    keep_body: true,
                    ..Req::new("POST", &self.ack_path, ack_body.as_bytes())
                });
            }
        }
        if self.batch == 1 {
            requests.push(Req::new("POST", &self.produce_path, &self.message));
        } else {
            requests.push(Req {
                headers: FRAMES_OUT,
                keep_body: true,
                ..Req::new("POST", &self.produce_path, &self.frames)
            });
        }
        requests.push(Req {
            headers: if self.batch > 1 { FRAMES_IN } else { "" },
            keep_body: self.batch > 1,
            ..Req::new("GET", &self.consume_path, &[])
        });
        let with_ack = requests.len() == 3;
        let mut replies = self.conn.pipeline(&requests).await?.into_iter();
        let mut next = || {
            replies
                .next()
                .ok_or_else(|| io::Error::other("a pipelined reply is missing"))
        };
        let acked = if with_ack {
            let (reply, at) = next()?;
            Some((self.acked(&reply, previous.len()), at))
        } else {
            None
        };
        let (reply, produced_at) = next()?;
        let produced = self.produced(&reply, self.batch);
        let (reply, consumed_at) = next()?;
        Ok(Pipelined {
            acked,
            produced: (produced, produced_at),
            consumed: (self.consumed(reply), consumed_at),
        })
    }
}
