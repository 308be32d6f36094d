//! The NATS JetStream baseline, spoken in NATS's text protocol over glommio TCP. Each connection subscribes once to
//! its own inbox, `_INBOX.<random>.*`, and gives every request a reply subject `_INBOX.<random>.<N>` there:
//!
//! - produce = a JetStream publish: `PUB <subject> <inbox.N> <len>` per message (`--batch` of them in one write),
//!   each answered by a publish ack `{"stream":...,"seq":N}` (an `{"error":...}` is a message not accepted);
//! - consume = a pull consumer's fetch: `PUB $JS.API.CONSUMER.MSG.NEXT.<stream>.<consumer> <inbox.N>` with
//!   `{"batch":B,...}`; the messages come to the inbox with their `$JS.ACK...` reply subject (the handle), and the
//!   fetch ends with B of them or with a status message (404 No Messages, 408 Request Timeout);
//! - ack = `+ACK` published to each handle with a reply subject, answered by the server's empty AckAck once the ack
//!   is processed (a "double ack", as `AckSync`), so an ack is confirmed like berth's 200.
//!
//! The connection announces `"headers":true`: the fetch's status messages are header-only `HMSG`s, and without
//! header support the server strips them to empty `MSG`s, where "No Messages", "Request Timeout" and "Requests
//! Pending" (a no-wait fetch refused while other fetches wait) could not be told apart. The messages themselves are
//! published without headers and arrive as plain `MSG`s.
//!
//! `create_stream` sets up a file-backed work-queue stream (acked messages are deleted, as berth's) with
//! `--nats-replicas` replicas and one durable pull consumer with explicit acks, through the JetStream API, then
//! moves the stream's and the consumer's leaders to the server the bench is connected to (leader stepdowns with
//! `placement.preferred`), as berth's bench loads a partition through its leader.

use super::{Consumed, Driver, Pipelined};
use futures_lite::AsyncWriteExt;
use glommio::net::TcpStream;
use std::io::{self, Write as _};
use std::net::SocketAddr;
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The durable pull consumer the bench uses.
pub const CONSUMER: &str = "g";

/// Largest message the client accepts (a fetch of 1000 messages is 1000 frames, each within this).
pub const MAX_REPLY_BYTES: usize = 64 << 20;

/// Longest control line the client waits for (an INFO line with many cluster URLs is a few KiB).
const MAX_LINE_BYTES: usize = 1 << 20;

/// A driver call whose answers do not all arrive this long after its wait (the fetch's `expires`) fails the run
/// rather than hanging it: a publish to a stream without a leader, say, is never answered.
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);

/// A draining consume (`--workload consume`) that the server refuses at once with 408 Requests Pending (other
/// fetches wait for the messages there are) asks again for up to this long, each fetch waiting this long for a
/// first message.
const DRAIN_RETRY_WAIT: Duration = Duration::from_millis(100);

/// The pause before a no-wait fetch refused with 408 Requests Pending asks again: the fetches already waiting are
/// served meanwhile (a consume asks again until its wait is over).
const PENDING_RETRY_PAUSE: Duration = Duration::from_millis(1);

fn bad(what: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.into())
}

/// One operation from the server.
#[derive(Debug, PartialEq, Eq)]
pub enum Frame<'a> {
    /// `MSG subject sid [reply] len` or `HMSG subject sid [reply] hdr_len total_len`, with its header block (empty
    /// for `MSG`) and payload.
    Msg {
        subject: &'a [u8],
        reply: Option<&'a [u8]>,
        header: &'a [u8],
        payload: &'a [u8],
    },
    Ping,
    Pong,
    Ok,
    Err(&'a [u8]),
    /// `INFO {...}`: the first line of a connection, and again when the cluster changes; its JSON.
    Info(&'a [u8]),
}

fn number(digits: &[u8]) -> Option<usize> {
    if digits.is_empty() || digits.len() > 18 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(digits.iter().fold(0, |n, d| n * 10 + usize::from(d - b'0')))
}

/// One complete frame at the start of `buf` and the bytes it takes, or None when more bytes are needed.
pub fn parse(buf: &[u8]) -> io::Result<Option<(Frame<'_>, usize)>> {
    let Some(nl) = buf.iter().position(|&b| b == b'\n') else {
        if buf.len() > MAX_LINE_BYTES {
            return Err(bad(format!(
                "nats-server: a line over {MAX_LINE_BYTES} bytes"
            )));
        }
        return Ok(None);
    };
    let line = buf[..nl].strip_suffix(b"\r").unwrap_or(&buf[..nl]);
    let after = nl + 1;
    let mut words = line
        .split(|&b| b == b' ' || b == b'\t')
        .filter(|w| !w.is_empty());
    let op = words.next().unwrap_or_default().to_ascii_uppercase();
    let frame = match op.as_slice() {
        b"MSG" | b"HMSG" => {
            let headers = op.len() == 4;
            let mut args: [&[u8]; 5] = [&[]; 5];
            let mut n = 0;
            for w in words {
                if n == args.len() {
                    return Err(bad(format!(
                        "nats-server: bad line {:?}",
                        String::from_utf8_lossy(line)
                    )));
                }
                args[n] = w;
                n += 1;
            }
            let sizes = usize::from(headers) + 1;
            if n != 2 + sizes && n != 3 + sizes {
                return Err(bad(format!(
                    "nats-server: bad line {:?}",
                    String::from_utf8_lossy(line)
                )));
            }
            let reply = (n == 3 + sizes).then_some(args[2]);
            let size = |i: usize| {
                number(args[i]).ok_or_else(|| {
                    bad(format!(
                        "nats-server: bad size in {:?}",
                        String::from_utf8_lossy(line)
                    ))
                })
            };
            let (header_len, total) = if headers {
                (size(n - 2)?, size(n - 1)?)
            } else {
                (0, size(n - 1)?)
            };
            if header_len > total || total > MAX_REPLY_BYTES {
                return Err(bad(format!(
                    "nats-server: bad sizes in {:?}",
                    String::from_utf8_lossy(line)
                )));
            }
            let end = after + total;
            if buf.len() < end + 2 {
                return Ok(None);
            }
            if &buf[end..end + 2] != b"\r\n" {
                return Err(bad("nats-server: a message without its CRLF"));
            }
            let frame = Frame::Msg {
                subject: args[0],
                reply,
                header: &buf[after..after + header_len],
                payload: &buf[after + header_len..end],
            };
            return Ok(Some((frame, end + 2)));
        }
        b"PING" => Frame::Ping,
        b"PONG" => Frame::Pong,
        b"+OK" => Frame::Ok,
        b"-ERR" => Frame::Err(line.get(5..).unwrap_or_default()),
        b"INFO" => Frame::Info(line.get(5..).unwrap_or_default().trim_ascii()),
        _ => {
            return Err(bad(format!(
                "nats-server: unexpected {:?}",
                String::from_utf8_lossy(line)
            )))
        }
    };
    Ok(Some((frame, after)))
}

/// The status of a header block `NATS/1.0 408 Request Timeout\r\n...`: its code and description.
pub fn status(header: &[u8]) -> Option<(u16, &[u8])> {
    let first = header.split(|&b| b == b'\r' || b == b'\n').next()?;
    let rest = first.strip_prefix(b"NATS/1.0")?.trim_ascii_start();
    let code = rest.get(..3).and_then(number)?;
    Some((code as u16, rest[3..].trim_ascii()))
}

/// A JetStream publish ack (`{"stream":"s","seq":1}`), not an error (`{"error":{...}}`).
fn is_pub_ack(payload: &[u8]) -> bool {
    let has = |needle: &[u8]| payload.windows(needle.len()).any(|w| w == needle);
    has(b"\"seq\"") && !has(b"\"error\"")
}

/// How a fetch ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// It got its whole batch.
    Full,
    /// 404 No Messages or 408 Request Timeout (0: a status without a header block).
    Drained(u16),
    /// 408 Requests Pending: a no-wait fetch refused while other fetches wait; worth asking again with a wait.
    RequestsPending,
    /// Another status (409 ...: the consumer is gone, too many waiting fetches).
    Failed(u16),
}

/// The answers one write expects, in any order: acks of `acks`, publish acks of `pubs`, and a fetch's messages.
#[derive(Default)]
struct Exchange {
    acks: Range<u64>,
    acks_left: usize,
    acked: usize,
    acks_at: Option<Instant>,
    pubs: Range<u64>,
    pubs_left: usize,
    accepted: usize,
    pubs_at: Option<Instant>,
    fetch: Option<u64>,
    want: usize,
    handles: Vec<Vec<u8>>,
    intact: usize,
    end: Option<(End, Instant)>,
}

impl Exchange {
    fn fetching(&self) -> bool {
        self.fetch.is_some() && self.end.is_none()
    }

    fn done(&self) -> bool {
        self.acks_left == 0 && self.pubs_left == 0 && !self.fetching()
    }

    /// Takes one frame in; true when the server asked for a PONG.
    fn on_frame(&mut self, frame: Frame<'_>, inbox: &[u8], message_len: usize) -> io::Result<bool> {
        let (subject, reply, header, payload) = match frame {
            Frame::Ping => return Ok(true),
            Frame::Err(e) => {
                return Err(bad(format!(
                    "nats-server: -ERR {}",
                    String::from_utf8_lossy(e)
                )))
            }
            Frame::Msg {
                subject,
                reply,
                header,
                payload,
            } => (subject, reply, header, payload),
            Frame::Pong | Frame::Ok | Frame::Info(_) => return Ok(false),
        };
        if let Some(handle) = reply.filter(|r| r.starts_with(b"$JS.ACK.")) {
            // A message of the fetch (only one fetch is ever open on a connection).
            if self.fetching() {
                self.handles.push(handle.to_vec());
                self.intact += usize::from(payload.len() == message_len);
                if self.handles.len() >= self.want {
                    self.end = Some((End::Full, Instant::now()));
                }
            }
            return Ok(false);
        }
        let Some(id) = subject
            .strip_prefix(inbox)
            .and_then(number)
            .map(|n| n as u64)
        else {
            return Ok(false);
        };
        if self.acks.contains(&id) && self.acks_left > 0 {
            self.acked += usize::from(header.is_empty() && payload.is_empty());
            self.acks_left -= 1;
            if self.acks_left == 0 {
                self.acks_at = Some(Instant::now());
            }
        } else if self.pubs.contains(&id) && self.pubs_left > 0 {
            self.accepted += usize::from(is_pub_ack(payload));
            self.pubs_left -= 1;
            if self.pubs_left == 0 {
                self.pubs_at = Some(Instant::now());
            }
        } else if self.fetch == Some(id) && self.fetching() {
            let end = match status(header) {
                None => End::Drained(0),
                Some((code @ (404 | 408), text)) if text != b"Requests Pending" => {
                    End::Drained(code)
                }
                Some((408, _)) => End::RequestsPending,
                Some((code, _)) => End::Failed(code),
            };
            self.end = Some((end, Instant::now()));
        }
        // Anything else answers a request given up on: nothing waits for it.
        Ok(false)
    }

    fn consumed(&mut self) -> Consumed<Vec<u8>> {
        let end = self.end.map(|(e, _)| e);
        let handles = std::mem::take(&mut self.handles);
        Consumed {
            ok: matches!(end, Some(End::Full | End::Drained(_))),
            empty: handles.is_empty() && matches!(end, Some(End::Drained(_))),
            intact: self.intact,
            handles,
        }
    }
}

/// A fresh random token for an inbox: the standard library's per-process random hash keys, with the time.
fn random_token() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.write_u32(std::process::id());
    format!("{:016x}", h.finish())
}

/// The `CONNECT` line: no `+OK` per operation, headers for the fetch's status messages.
fn connect_line(no_responders: bool) -> String {
    format!(
        "CONNECT {{\"verbose\":false,\"pedantic\":false,\"headers\":true,\"no_responders\":{no_responders},\"lang\":\"rust\",\"version\":\"berth-bench\",\"name\":\"berth-bench\"}}\r\nPING\r\n"
    )
}

/// A fetch request's body: `{"batch":B}` with `expires` (ns) when it waits, `no_wait` when it returns as soon as
/// it has anything (with `expires`: waits that long for a first message).
fn fetch_body(batch: usize, expires: Option<Duration>, no_wait: bool) -> String {
    let mut body = format!("{{\"batch\":{batch}");
    if let Some(e) = expires {
        body.push_str(&format!(",\"expires\":{}", e.as_nanos()));
    }
    if no_wait {
        body.push_str(",\"no_wait\":true");
    }
    body.push('}');
    body
}

/// The NATS JetStream driver for one connection.
pub struct Nats {
    stream: TcpStream,
    buf: Vec<u8>,
    /// Bytes of `buf` already taken.
    pos: usize,
    out: Vec<u8>,
    /// `_INBOX.<random>.`: the reply subjects' prefix.
    inbox: Vec<u8>,
    next_id: u64,
    batch: usize,
    message: Arc<Vec<u8>>,
    /// `PUB <subject> <inbox>`: a publish up to its request id.
    pub_head: Vec<u8>,
    /// ` <len>\r\n<message>\r\n`: a publish after its request id.
    pub_tail: Vec<u8>,
    /// `$JS.API.CONSUMER.MSG.NEXT.<stream>.<consumer>`.
    next_subject: String,
    /// The fetch a consume sends first.
    fetch: String,
    /// The fetch it sends again after a 408 Requests Pending (after a short pause, until `wait` is over).
    fetch_again: String,
    /// How long a consume may wait for a message (its fetch's `expires`, and how long it asks again while
    /// refused with Requests Pending).
    wait: Duration,
}

impl Nats {
    /// `wait`: how long a consume waits for a first message (None: it returns at once when there is none, as a
    /// draining consume does).
    pub async fn connect(
        addr: SocketAddr,
        stream_name: &str,
        batch: usize,
        message: Arc<Vec<u8>>,
        wait: Option<Duration>,
    ) -> io::Result<Nats> {
        let stream = super::wire::connect(addr).await?;
        let inbox = format!("_INBOX.{}.", random_token()).into_bytes();
        let mut pub_head = format!("PUB {stream_name} ").into_bytes();
        pub_head.extend_from_slice(&inbox);
        let mut pub_tail = format!(" {}\r\n", message.len()).into_bytes();
        pub_tail.extend_from_slice(&message);
        pub_tail.extend_from_slice(b"\r\n");
        // A waiting consume of one message waits in line at once (a no-wait fetch would be refused while other
        // connections' fetches wait; a fetch of one returns with its first message anyway). Of a batch, it is
        // berth's `max=N`: a no-wait fetch with `expires` takes what is there, or waits for a first message and
        // returns with it; refused with 408 Requests Pending (there are messages, but fewer than the fetches
        // already waiting want), it asks the same again after a short pause (not a fetch without no_wait: that
        // one would wait for a whole batch or its expiry).
        let (fetch, fetch_again) = match wait {
            Some(w) if batch == 1 => (fetch_body(1, Some(w), false), fetch_body(1, Some(w), false)),
            Some(w) => (
                fetch_body(batch, Some(w), true),
                fetch_body(batch, Some(w), true),
            ),
            None => (
                fetch_body(batch, None, true),
                fetch_body(batch, Some(DRAIN_RETRY_WAIT), true),
            ),
        };
        let mut n = Nats {
            stream,
            buf: Vec::with_capacity(64 << 10),
            pos: 0,
            out: Vec::with_capacity(4 << 10),
            inbox,
            next_id: 1,
            batch,
            message,
            pub_head,
            pub_tail,
            next_subject: format!("$JS.API.CONSUMER.MSG.NEXT.{stream_name}.{CONSUMER}"),
            fetch,
            fetch_again,
            wait: wait.unwrap_or(DRAIN_RETRY_WAIT),
        };
        n.handshake().await?;
        Ok(n)
    }

    /// INFO, then CONNECT, PING and the inbox's SUB; done at the PONG.
    async fn handshake(&mut self) -> io::Result<()> {
        let deadline = Instant::now() + REPLY_TIMEOUT;
        loop {
            match parse(&self.buf[self.pos..])? {
                Some((Frame::Info(_), used)) => {
                    self.pos += used;
                    break;
                }
                Some((Frame::Err(e), _)) => {
                    return Err(bad(format!(
                        "nats-server: -ERR {}",
                        String::from_utf8_lossy(e)
                    )))
                }
                Some((_, _)) => return Err(bad("nats-server: no INFO first")),
                None => self.read_more(deadline).await?,
            }
        }
        self.out.clear();
        self.out.extend_from_slice(connect_line(false).as_bytes());
        self.out.extend_from_slice(b"SUB ");
        self.out.extend_from_slice(&self.inbox);
        self.out.extend_from_slice(b"* 1\r\n");
        self.stream.write_all(&self.out).await?;
        loop {
            match parse(&self.buf[self.pos..])? {
                Some((Frame::Pong, used)) => {
                    self.pos += used;
                    return Ok(());
                }
                Some((Frame::Err(e), _)) => {
                    return Err(bad(format!(
                        "nats-server: -ERR {}",
                        String::from_utf8_lossy(e)
                    )))
                }
                Some((Frame::Ping, used)) => {
                    self.pos += used;
                    self.stream.write_all(b"PONG\r\n").await?;
                }
                Some((_, used)) => self.pos += used,
                None => self.read_more(deadline).await?,
            }
        }
    }

    /// Reads more bytes (dropping those taken), failing at `deadline`.
    async fn read_more(&mut self, deadline: Instant) -> io::Result<()> {
        if self.pos > 0 {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "nats-server did not answer in time",
            ));
        }
        // The timer wins only when the run fails: the half-done read is dropped with the connection.
        let read = super::wire::read_more(
            &mut self.stream,
            &mut self.buf,
            16 << 10,
            MAX_REPLY_BYTES,
            "nats-server",
        );
        let timer = async {
            glommio::timer::Timer::new(deadline - now).await;
            Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "nats-server did not answer within {} s",
                    REPLY_TIMEOUT.as_secs()
                ),
            ))
        };
        futures_lite::future::or(read, timer).await
    }

    fn take_ids(&mut self, n: usize) -> Range<u64> {
        let start = self.next_id;
        self.next_id += n as u64;
        start..self.next_id
    }

    fn push_reply(out: &mut Vec<u8>, inbox: &[u8], id: u64) {
        out.extend_from_slice(inbox);
        let _ = write!(out, "{id}");
    }

    /// Acks of `handles` (each `+ACK` with a reply subject), `pubs` publishes and, with `fetch`, that fetch, in one
    /// write; returns when every answer is in.
    async fn exchange(
        &mut self,
        handles: &[Vec<u8>],
        pubs: usize,
        fetch: Option<&str>,
    ) -> io::Result<Exchange> {
        self.out.clear();
        let acks = self.take_ids(handles.len());
        for (handle, id) in handles.iter().zip(acks.clone()) {
            self.out.extend_from_slice(b"PUB ");
            self.out.extend_from_slice(handle);
            self.out.push(b' ');
            Self::push_reply(&mut self.out, &self.inbox, id);
            self.out.extend_from_slice(b" 4\r\n+ACK\r\n");
        }
        let pub_ids = self.take_ids(pubs);
        for id in pub_ids.clone() {
            self.out.extend_from_slice(&self.pub_head);
            let _ = write!(self.out, "{id}");
            self.out.extend_from_slice(&self.pub_tail);
        }
        let fetch_id = fetch.map(|body| {
            let id = self.take_ids(1).start;
            let _ = write!(self.out, "PUB {} ", self.next_subject);
            Self::push_reply(&mut self.out, &self.inbox, id);
            let _ = write!(self.out, " {}\r\n{body}\r\n", body.len());
            id
        });
        let mut x = Exchange {
            acks_left: handles.len(),
            acks,
            pubs_left: pubs,
            pubs: pub_ids,
            fetch: fetch_id,
            want: self.batch,
            ..Exchange::default()
        };
        self.stream.write_all(&self.out).await?;
        let deadline = Instant::now() + self.wait + REPLY_TIMEOUT;
        loop {
            while !x.done() {
                let Some((frame, used)) = parse(&self.buf[self.pos..])? else {
                    break;
                };
                let pong = x.on_frame(frame, &self.inbox, self.message.len())?;
                self.pos += used;
                if pong {
                    self.stream.write_all(b"PONG\r\n").await?;
                }
            }
            if x.done() {
                return Ok(x);
            }
            self.read_more(deadline).await?;
        }
    }

    /// A consume after the rest of `x` (while its fetch is refused with Requests Pending: `fetch_again` after a
    /// short pause, until the consume's wait is over, when it counts as empty, as berth's 204 after its wait), with
    /// the time it ended.
    async fn finish_consume(
        &mut self,
        mut x: Exchange,
    ) -> io::Result<(Consumed<Vec<u8>>, Instant)> {
        let give_up = Instant::now() + self.wait;
        while matches!(x.end, Some((End::RequestsPending, _))) {
            if Instant::now() >= give_up {
                x.end = Some((End::Drained(408), Instant::now()));
                break;
            }
            glommio::timer::sleep(PENDING_RETRY_PAUSE).await;
            let again = std::mem::take(&mut self.fetch_again);
            let retried = self.exchange(&[], 0, Some(&again)).await;
            self.fetch_again = again;
            x = retried?;
        }
        let at = x.end.map_or_else(Instant::now, |(_, at)| at);
        Ok((x.consumed(), at))
    }
}

impl Driver for Nats {
    type Handle = Vec<u8>;

    async fn produce(&mut self, n: usize) -> io::Result<usize> {
        Ok(self.exchange(&[], n, None).await?.accepted)
    }

    async fn consume(&mut self) -> io::Result<Consumed<Vec<u8>>> {
        let fetch = std::mem::take(&mut self.fetch);
        let x = self.exchange(&[], 0, Some(&fetch)).await;
        self.fetch = fetch;
        Ok(self.finish_consume(x?).await?.0)
    }

    async fn ack(&mut self, handles: &[Vec<u8>]) -> io::Result<usize> {
        Ok(self.exchange(handles, 0, None).await?.acked)
    }

    async fn pipelined_cycle(&mut self, previous: &[Vec<u8>]) -> io::Result<Pipelined<Vec<u8>>> {
        let fetch = std::mem::take(&mut self.fetch);
        let x = self.exchange(previous, self.batch, Some(&fetch)).await;
        self.fetch = fetch;
        let x = x?;
        let now = Instant::now();
        let acked = (!previous.is_empty()).then(|| (x.acked, x.acks_at.unwrap_or(now)));
        let produced = (x.accepted, x.pubs_at.unwrap_or(now));
        let consumed = self.finish_consume(x).await?;
        Ok(Pipelined {
            acked,
            produced,
            consumed,
        })
    }
}

/// What a JetStream API request got.
#[derive(Debug)]
enum ApiReply {
    /// A JSON response (with `"error"` when the request failed).
    Json(serde_json::Value),
    /// A status message: 503 when nothing answers the API yet (no JetStream, or no meta leader).
    Status(u16),
    /// Nothing within the timeout.
    Timeout,
}

/// A blocking connection for setup and cleanup (outside the executors), with `no_responders` on so a request
/// that nothing answers yet gets a 503 at once.
struct Blocking {
    addr: SocketAddr,
    s: std::net::TcpStream,
    buf: Vec<u8>,
    inbox: String,
    next_id: u64,
    /// The INFO line's `server_name`: the server this connection (and the bench's, to the same address) is on.
    server_name: String,
    /// The INFO line's `version`.
    version: String,
    /// Whether the server is in a cluster (the INFO line has `cluster`).
    clustered: bool,
}

impl Blocking {
    fn connect(addr: SocketAddr) -> Result<Blocking, String> {
        use std::io::Write;
        let s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5))
            .map_err(|e| format!("connect to nats-server at {addr}: {e}"))?;
        let _ = s.set_nodelay(true);
        let mut b = Blocking {
            addr,
            s,
            buf: Vec::new(),
            inbox: format!("_INBOX.{}.", random_token()),
            next_id: 1,
            server_name: String::new(),
            version: String::new(),
            clustered: false,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut connected = false;
        let mut info: Option<serde_json::Value> = None;
        while !connected {
            let Some(used) = b.next_frame(deadline, |frame| match frame {
                Frame::Info(json) if info.is_none() => {
                    info = Some(
                        serde_json::from_slice(json)
                            .map_err(|e| format!("an INFO line that is not JSON: {e}"))?,
                    );
                    Ok(true)
                }
                Frame::Pong if info.is_some() => {
                    connected = true;
                    Ok(false)
                }
                Frame::Err(e) => Err(format!("-ERR {}", String::from_utf8_lossy(e))),
                _ => Ok(false),
            })?
            else {
                return Err(format!("nats-server at {addr}: no answer to CONNECT"));
            };
            if used {
                let i = info.as_ref().expect("INFO was read");
                let text = |key: &str| i[key].as_str().unwrap_or_default().to_string();
                b.server_name = text("server_name");
                b.version = text("version");
                b.clustered = i.get("cluster").is_some();
                let hello = format!("{}SUB {}* 1\r\n", connect_line(true), b.inbox);
                b.s.write_all(hello.as_bytes())
                    .map_err(|e| format!("nats-server at {addr}: {e}"))?;
            }
        }
        Ok(b)
    }

    /// Reads one frame (answering PINGs) and hands it to `f`; None at `deadline`.
    fn next_frame<T>(
        &mut self,
        deadline: Instant,
        mut f: impl FnMut(Frame<'_>) -> Result<T, String>,
    ) -> Result<Option<T>, String> {
        use std::io::{Read, Write};
        let addr = self.addr;
        let err = |e: io::Error| format!("nats-server at {addr}: {e}");
        loop {
            if let Some((frame, used)) = parse(&self.buf).map_err(err)? {
                let ping = frame == Frame::Ping;
                let out = f(frame).map_err(|e| format!("nats-server at {addr}: {e}"))?;
                self.buf.drain(..used);
                if ping {
                    self.s.write_all(b"PONG\r\n").map_err(err)?;
                }
                return Ok(Some(out));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            self.s.set_read_timeout(Some(left)).map_err(err)?;
            let mut chunk = [0u8; 16 << 10];
            match self.s.read(&mut chunk) {
                Ok(0) => return Err(format!("nats-server at {addr} closed the connection")),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return Ok(None)
                }
                Err(e) => return Err(err(e)),
            }
        }
    }

    /// One request and its reply (another request's late reply is skipped).
    fn request(
        &mut self,
        subject: &str,
        body: &str,
        timeout: Duration,
    ) -> Result<ApiReply, String> {
        use std::io::Write;
        let id = self.next_id;
        self.next_id += 1;
        let reply_to = format!("{}{id}", self.inbox);
        let out = format!("PUB {subject} {reply_to} {}\r\n{body}\r\n", body.len());
        self.s
            .write_all(out.as_bytes())
            .map_err(|e| format!("nats-server at {}: {e}", self.addr))?;
        let deadline = Instant::now() + timeout;
        loop {
            let got = self.next_frame(deadline, |frame| {
                Ok(match frame {
                    Frame::Msg {
                        subject: to,
                        header,
                        payload,
                        ..
                    } if to == reply_to.as_bytes() => Some(match status(header) {
                        Some((code, _)) if payload.is_empty() => ApiReply::Status(code),
                        _ => ApiReply::Json(
                            serde_json::from_slice(payload)
                                .map_err(|e| format!("{subject}: a reply that is not JSON: {e}"))?,
                        ),
                    }),
                    Frame::Err(e) => return Err(format!("-ERR {}", String::from_utf8_lossy(e))),
                    _ => None,
                })
            })?;
            match got {
                None => return Ok(ApiReply::Timeout),
                Some(Some(reply)) => return Ok(reply),
                Some(None) => {}
            }
        }
    }

    /// A JetStream API request, asked again while the API is not ready (no responders, 503 errors such as "JetStream
    /// system temporarily unavailable", peers not known yet, no answer) for up to `patience`. `fine`: error
    /// codes that count as success (a delete of a stream that is not there).
    fn api(
        &mut self,
        subject: &str,
        body: &str,
        patience: Duration,
        fine: &[u64],
    ) -> Result<serde_json::Value, String> {
        let deadline = Instant::now() + patience;
        loop {
            let last = match self.request(subject, body, Duration::from_secs(3))? {
                ApiReply::Json(v) => match v.get("error") {
                    None => return Ok(v),
                    Some(e) if e["code"].as_u64().is_some_and(|c| fine.contains(&c)) => {
                        return Ok(v)
                    }
                    // Retried: 5xx (10008 "JetStream system temporarily unavailable", 10023 "insufficient
                    // resources" while the peers are not all known), 10005 "no suitable peers for placement".
                    Some(e)
                        if e["code"].as_u64().is_none_or(|c| c < 500)
                            && e["err_code"].as_u64() != Some(10005) =>
                    {
                        return Err(format!("{subject}: {e}"))
                    }
                    Some(e) => e.to_string(),
                },
                ApiReply::Status(code) => format!("status {code} (no JetStream answering yet)"),
                ApiReply::Timeout => "no answer".to_string(),
            };
            if Instant::now() >= deadline {
                return Err(format!(
                    "{subject} at nats-server {}: {last} after {} s",
                    self.addr,
                    patience.as_secs()
                ));
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

/// The settings of the bench's stream and consumer.
pub struct Setup<'a> {
    /// The stream's name, and its one subject.
    pub stream: &'a str,
    /// `num_replicas`.
    pub replicas: usize,
    /// The consumer's `ack_wait`: berth's lease visibility.
    pub ack_wait: Duration,
    /// The consumer's `max_waiting`: room for a waiting fetch per connection.
    pub max_waiting: usize,
}

/// How long setup asks again while a cluster elects its leaders.
const SETUP_PATIENCE: Duration = Duration::from_secs(20);

/// How long setup waits for the stream's and the consumer's leaders to be on the server the bench is connected to,
/// with the stream's replicas current.
const PLACEMENT_PATIENCE: Duration = Duration::from_secs(20);

/// A leader stepdown that has not moved the leader this long after it was asked is asked again.
const STEPDOWN_AGAIN: Duration = Duration::from_secs(3);

/// The leader of a stream or consumer info (`cluster.leader`; empty while there is none).
fn leader_of(info: &serde_json::Value) -> &str {
    info["cluster"]["leader"].as_str().unwrap_or_default()
}

/// The followers of a stream or consumer info (`cluster.replicas`): name and whether it is current.
fn replicas_of(info: &serde_json::Value) -> Vec<(String, bool)> {
    info["cluster"]["replicas"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|r| {
                    (
                        r["name"].as_str().unwrap_or("?").to_string(),
                        r["current"].as_bool() == Some(true),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// `n2 (current), n3 (not current)`.
fn describe_replicas(replicas: &[(String, bool)]) -> String {
    if replicas.is_empty() {
        return "none".to_string();
    }
    replicas
        .iter()
        .map(|(name, current)| {
            format!(
                "{name} ({})",
                if *current { "current" } else { "not current" }
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Where the stream and its consumer are, once `place_leaders` is done.
struct Placement {
    stream_leader: String,
    consumer_leader: String,
    num_replicas: u64,
    replicas: Vec<(String, bool)>,
    /// The leaders moved here: (what, from).
    moved: Vec<(&'static str, String)>,
}

impl Placement {
    /// The report line on stderr (benches/nats.sh reads it: keep its `key=value` words).
    fn report(&self, stream: &str, here: &str, version: &str) -> String {
        let moved = if self.moved.is_empty() {
            "none".to_string()
        } else {
            self.moved
                .iter()
                .map(|(what, from)| format!("{what}:{from}"))
                .collect::<Vec<_>>()
                .join(",")
        };
        let replicas = self
            .replicas
            .iter()
            .map(|(name, _)| name.as_str())
            .collect::<Vec<_>>()
            .join(",");
        format!(
            "nats: stream {stream} num_replicas={} stream_leader={} replicas={} consumer {CONSUMER} \
             consumer_leader={} connected_to={here} moved_from={moved} (followers: {}; nats-server {version})",
            self.num_replicas,
            self.stream_leader,
            if replicas.is_empty() { "-" } else { &replicas },
            self.consumer_leader,
            describe_replicas(&self.replicas),
        )
    }
}

/// Asks the leader of `what` (`subject`: its `$JS.API....LEADER.STEPDOWN...`) to hand over to `here`.
fn step_down_to(b: &mut Blocking, what: &str, subject: &str, here: &str) -> Result<(), String> {
    let body = serde_json::json!({ "placement": { "preferred": here } }).to_string();
    // 400: inspected below (a server without placement in its stepdown refuses any body as a bad request).
    let reply = b.api(subject, &body, Duration::from_secs(5), &[400])?;
    match reply.get("error") {
        None => Ok(()),
        Some(e) if e["err_code"].as_u64() == Some(10003) => Err(format!(
            "{subject}: {e}: nats-server {} refuses a leader stepdown with a placement (placement.preferred is \
             not supported: nats-server 2.11 or later has it), so the {what} leader cannot be moved to {here}",
            b.version
        )),
        Some(e) => Err(format!("{subject} (to move the {what} leader to {here}): {e}")),
    }
}

/// Moves the stream's leader and its consumer's leader to the server `b` is connected to (the bench sends all its
/// load there, as berth's bench sends to a partition's leader) and waits until both are there and the stream's
/// followers are current; fails otherwise, or when the stream does not have `replicas` replicas.
fn place_leaders(b: &mut Blocking, setup: &Setup<'_>) -> Result<Placement, String> {
    let stream = setup.stream;
    let here = b.server_name.clone();
    if here.is_empty() {
        return Err(format!(
            "nats-server at {}: no server_name in its INFO line",
            b.addr
        ));
    }
    let stream_info = format!("$JS.API.STREAM.INFO.{stream}");
    let consumer_info = format!("$JS.API.CONSUMER.INFO.{stream}.{CONSUMER}");
    let deadline = Instant::now() + PLACEMENT_PATIENCE;
    let mut moved = Vec::new();
    let mut asked: [Option<Instant>; 2] = [None, None];
    loop {
        let patience = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_secs(1));
        let s = b.api(&stream_info, "", patience, &[])?;
        let c = b.api(&consumer_info, "", patience, &[])?;
        let num_replicas = s["config"]["num_replicas"].as_u64().unwrap_or(0);
        if num_replicas != setup.replicas as u64 {
            return Err(format!(
                "stream {stream}: num_replicas {num_replicas}, not the {} asked for",
                setup.replicas
            ));
        }
        let replicas = replicas_of(&s);
        let placed = Placement {
            stream_leader: leader_of(&s).to_string(),
            consumer_leader: leader_of(&c).to_string(),
            num_replicas,
            replicas,
            moved: moved.clone(),
        };
        if !b.clustered {
            // One server: everything is on it.
            return Ok(Placement {
                stream_leader: here.clone(),
                consumer_leader: here,
                ..placed
            });
        }
        let peers: Vec<&str> = std::iter::once(placed.stream_leader.as_str())
            .chain(placed.replicas.iter().map(|(name, _)| name.as_str()))
            .collect();
        let all_known =
            !placed.stream_leader.is_empty() && placed.replicas.len() + 1 == setup.replicas;
        if all_known && !peers.contains(&here.as_str()) {
            return Err(format!(
                "stream {stream} (R = {}) is on {}, not on {here}, the server the bench is connected to: its \
                 leader cannot move there (use --nats-replicas as large as the cluster, or connect to one of them)",
                setup.replicas,
                peers.join(", ")
            ));
        }
        let current = all_known && placed.replicas.iter().all(|(_, current)| *current);
        if placed.stream_leader == here && placed.consumer_leader == here && current {
            return Ok(placed);
        }
        if Instant::now() >= deadline {
            let unsupported = if moved.is_empty() {
                String::new()
            } else {
                format!(
                    "; leader stepdowns preferring {here} were asked for ({}) but did not put the leaders there: \
                     does nats-server {} honor placement.preferred (2.11 and later do)?",
                    moved
                        .iter()
                        .map(|(what, from)| format!("{what} from {from}"))
                        .collect::<Vec<_>>()
                        .join(", "),
                    b.version
                )
            };
            return Err(format!(
                "stream {stream} and consumer {CONSUMER} not led by {here} (the server the bench is connected to) \
                 with current followers after {} s: stream leader {:?}, followers {}, consumer leader {:?}{unsupported}",
                PLACEMENT_PATIENCE.as_secs(),
                placed.stream_leader,
                describe_replicas(&placed.replicas),
                placed.consumer_leader,
            ));
        }
        let due = |at: Option<Instant>| at.is_none_or(|t| t.elapsed() >= STEPDOWN_AGAIN);
        if !placed.stream_leader.is_empty() && placed.stream_leader != here && due(asked[0]) {
            step_down_to(
                b,
                "stream",
                &format!("$JS.API.STREAM.LEADER.STEPDOWN.{stream}"),
                &here,
            )?;
            moved.push(("stream", placed.stream_leader.clone()));
            asked[0] = Some(Instant::now());
        }
        if !placed.consumer_leader.is_empty() && placed.consumer_leader != here && due(asked[1]) {
            step_down_to(
                b,
                "consumer",
                &format!("$JS.API.CONSUMER.LEADER.STEPDOWN.{stream}.{CONSUMER}"),
                &here,
            )?;
            moved.push(("consumer", placed.consumer_leader.clone()));
            asked[1] = Some(Instant::now());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Creates the bench's stream (deleting one of its name first) and its durable pull consumer, moves both leaders to
/// the server at `addr` (the one the load goes to) and checks the stream's replicas; says on stderr where they are.
pub fn create_stream(addr: SocketAddr, setup: &Setup<'_>) -> Result<(), String> {
    let mut b = Blocking::connect(addr)?;
    let stream = setup.stream;
    // 10059: stream not found.
    b.api(
        &format!("$JS.API.STREAM.DELETE.{stream}"),
        "",
        SETUP_PATIENCE,
        &[404],
    )?;
    let config = serde_json::json!({
        "name": stream,
        "subjects": [stream],
        "storage": "file",
        "num_replicas": setup.replicas,
        "retention": "workqueue",
    });
    b.api(
        &format!("$JS.API.STREAM.CREATE.{stream}"),
        &config.to_string(),
        SETUP_PATIENCE,
        &[],
    )?;
    let consumer = serde_json::json!({
        "stream_name": stream,
        "config": {
            "durable_name": CONSUMER,
            "ack_policy": "explicit",
            "ack_wait": setup.ack_wait.as_nanos() as u64,
            "max_ack_pending": 1 << 20,
            "max_waiting": setup.max_waiting,
        },
    });
    b.api(
        &format!("$JS.API.CONSUMER.CREATE.{stream}.{CONSUMER}"),
        &consumer.to_string(),
        SETUP_PATIENCE,
        &[],
    )?;
    let placed = place_leaders(&mut b, setup)?;
    eprintln!("{}", placed.report(stream, &b.server_name, &b.version));
    Ok(())
}

/// Deletes the bench's stream (cleanup; its consumer goes with it).
pub fn delete_stream(addr: SocketAddr, stream: &str) -> Result<(), String> {
    let mut b = Blocking::connect(addr)?;
    b.api(
        &format!("$JS.API.STREAM.DELETE.{stream}"),
        "",
        Duration::from_secs(5),
        &[404],
    )
    .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_parsed_whole_or_not_at_all() {
        let wire = b"INFO {\"x\":1}\r\nPING\r\nMSG s 1 $JS.ACK.s.g.1.1.1.1.0 5\r\nhello\r\n\
            HMSG _INBOX.a.7 1 28 28\r\nNATS/1.0 404 No Messages\r\n\r\n\r\nMSG _INBOX.a.3 1 0\r\n\r\n";
        let mut frames = Vec::new();
        let mut at = 0;
        while let Some((frame, used)) = parse(&wire[at..]).unwrap() {
            frames.push(frame);
            at += used;
        }
        assert_eq!(at, wire.len());
        assert_eq!(frames[0], Frame::Info(b"{\"x\":1}"));
        assert_eq!(frames[1], Frame::Ping);
        assert_eq!(
            frames[2],
            Frame::Msg {
                subject: b"s",
                reply: Some(b"$JS.ACK.s.g.1.1.1.1.0"),
                header: b"",
                payload: b"hello"
            }
        );
        let Frame::Msg { header, .. } = &frames[3] else {
            panic!("{:?}", frames[3])
        };
        assert_eq!(status(header), Some((404, b"No Messages".as_slice())));
        assert!(matches!(
            frames[4],
            Frame::Msg {
                reply: None,
                payload: b"",
                ..
            }
        ));
        // Cut anywhere inside the 40-byte MSG frame after INFO (14 bytes) and PING (6): not yet a frame.
        let msg = &wire[20..];
        for len in 0..40 {
            assert!(parse(&msg[..len]).unwrap().is_none(), "cut at {len}");
        }
        assert_eq!(parse(&msg[..40]).unwrap().map(|(_, used)| used), Some(40));
        assert!(parse(b"MSG s 1 x y z w\r\n").is_err());
        assert!(parse(b"BOGUS\r\n").is_err());
    }

    #[test]
    fn an_exchange_sorts_the_answers_by_request() {
        let inbox = b"_INBOX.a.";
        let mut x = Exchange {
            acks: 1..3,
            acks_left: 2,
            pubs: 3..4,
            pubs_left: 1,
            fetch: Some(4),
            want: 2,
            ..Exchange::default()
        };
        let msg = |subject: &'static [u8], reply, header, payload| Frame::Msg {
            subject,
            reply,
            header,
            payload,
        };
        let feed = |x: &mut Exchange, f| x.on_frame(f, inbox, 3).unwrap();
        feed(
            &mut x,
            msg(b"s", Some(b"$JS.ACK.s.g.1.9.9.1.0"), b"", b"xxx"),
        );
        feed(
            &mut x,
            msg(b"_INBOX.a.3", None, b"", b"{\"stream\":\"s\",\"seq\":9}"),
        );
        feed(&mut x, msg(b"_INBOX.a.1", None, b"", b""));
        assert!(feed(&mut x, Frame::Ping));
        feed(&mut x, msg(b"_INBOX.a.99", None, b"", b""));
        assert!(!x.done());
        feed(&mut x, msg(b"_INBOX.a.2", None, b"", b""));
        assert!(!x.done());
        feed(
            &mut x,
            msg(
                b"_INBOX.a.4",
                None,
                b"NATS/1.0 408 Request Timeout\r\n\r\n",
                b"",
            ),
        );
        assert!(x.done());
        assert_eq!((x.acked, x.accepted), (2, 1));
        let c = x.consumed();
        assert_eq!(
            (c.handles.len(), c.intact, c.ok, c.empty),
            (1, 1, true, false)
        );

        let mut refused = Exchange {
            fetch: Some(1),
            want: 5,
            ..Exchange::default()
        };
        feed(
            &mut refused,
            msg(
                b"_INBOX.a.1",
                None,
                b"NATS/1.0 408 Requests Pending\r\n\r\n",
                b"",
            ),
        );
        assert_eq!(refused.end.map(|e| e.0), Some(End::RequestsPending));
        assert!(!is_pub_ack(b"{\"error\":{\"code\":503}}"));
        assert!(x.on_frame(Frame::Err(b"'nope'"), inbox, 3).is_err());
    }

    #[test]
    fn the_placement_report_has_what_nats_sh_checks() {
        let info = serde_json::json!({
            "config": {"num_replicas": 3},
            "cluster": {"leader": "n1", "replicas": [
                {"name": "n2", "current": true},
                {"name": "n3", "current": false},
            ]},
        });
        assert_eq!(leader_of(&info), "n1");
        assert_eq!(leader_of(&serde_json::json!({})), "");
        let replicas = replicas_of(&info);
        assert_eq!(
            describe_replicas(&replicas),
            "n2 (current), n3 (not current)"
        );
        let placed = Placement {
            stream_leader: "n1".into(),
            consumer_leader: "n1".into(),
            num_replicas: 3,
            replicas,
            moved: vec![("stream", "n3".into())],
        };
        let line = placed.report("s", "n1", "2.15.1");
        assert!(line.starts_with("nats: stream s num_replicas=3 stream_leader=n1 replicas=n2,n3 "));
        assert!(line.contains(" consumer_leader=n1 connected_to=n1 moved_from=stream:n3 "));
    }

    #[test]
    fn fetch_bodies() {
        assert_eq!(fetch_body(1, None, true), r#"{"batch":1,"no_wait":true}"#);
        assert_eq!(
            fetch_body(10, Some(Duration::from_millis(500)), false),
            r#"{"batch":10,"expires":500000000}"#
        );
    }
}
