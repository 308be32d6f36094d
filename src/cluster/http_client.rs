//! A minimal HTTP/1.1 client on `glommio::net::TcpStream`, enough for etcd's JSON gRPC-gateway.
//!
//! - `POST` with a JSON body; responses parsed with `httparse`, bodies framed by `Content-Length`,
//!   `Transfer-Encoding: chunked` (trailers read and ignored) or connection close.
//! - Keep-alive: finished connections go back to a small per-endpoint idle pool. A request on a pooled
//!   connection that dies before any response byte arrives (the server closed it while idle) is retried once on
//!   another connection, like other HTTP clients do.
//! - Streaming: [`HttpClient::post_stream`] returns a [`JsonStream`] whose `next()` yields each complete top-level
//!   JSON object of the body as it arrives, whatever the chunk boundaries (etcd's watch and lease keepalive).
//! - Limits: every size is bounded (constants below, or fields of [`HttpConfig`]); connect and request have
//!   timeouts via `glommio::timer::timeout`. Server bytes never cause a panic: they become an [`HttpError`].
//!
//! Not supported: TLS, proxies, redirects, request bodies that are not in memory. Host names are resolved with the
//! system resolver (blocking, at connect time); IP literals are not resolved.

use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::net::TcpStream;
use std::cell::RefCell;
use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::rc::Rc;
use std::time::Duration;

/// Default time allowed to establish a TCP connection (per resolved address).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Default time allowed for a whole unary request (connect, send, full response), or for a stream's head.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest response head (status line + headers) accepted.
pub const MAX_HEAD_BYTES: usize = 16 * 1024;
/// Most response headers accepted.
pub const MAX_HEADERS: usize = 64;
/// Default largest decoded response body for unary requests.
pub const DEFAULT_MAX_BODY_BYTES: usize = 64 << 20;
/// Default largest single JSON object in a streamed body.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 64 << 20;
/// Largest chunk-size line (size plus extensions) in a chunked body.
pub const MAX_CHUNK_LINE_BYTES: usize = 1024;
/// Largest total trailer section of a chunked body.
pub const MAX_TRAILER_BYTES: usize = 16 * 1024;
/// Bytes asked of the socket per read.
pub const READ_CHUNK_BYTES: usize = 16 * 1024;
/// Default idle keep-alive connections kept per endpoint.
pub const DEFAULT_MAX_IDLE_CONNS: usize = 4;
/// TCP keepalive: idle time before the first probe, so a dead peer under a quiet stream is noticed.
pub const TCP_KEEPALIVE_IDLE: Duration = Duration::from_secs(10);
/// TCP keepalive: time between probes.
pub const TCP_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
/// TCP keepalive: unanswered probes before the kernel drops the connection.
pub const TCP_KEEPALIVE_RETRIES: u32 = 3;
/// Longest error body excerpt kept in messages.
pub const MAX_ERROR_EXCERPT: usize = 512;

/// Everything that can go wrong talking HTTP.
#[derive(Debug)]
pub enum HttpError {
    /// The endpoint URL or request path is not usable.
    BadUrl(String),
    /// No TCP connection could be made (refused, unreachable, name resolution, connect timeout). Nothing was sent.
    Connect { addr: String, error: io::Error },
    /// The request (or a stream's head) did not complete in time. It may or may not have been processed.
    Timeout(Duration),
    /// Reading or writing failed after the connection was made.
    Io(io::Error),
    /// The server closed the connection before the response was complete.
    Closed,
    /// The server sent bytes that are not valid HTTP/1.1 (or not a JSON object stream, in streaming mode).
    Malformed(String),
    /// The server sent more than a limit allows.
    TooLarge { what: &'static str, limit: usize },
    /// Streaming mode only: the response status was not 2xx; the (bounded) body is attached.
    Status { status: u16, body: Vec<u8> },
}

impl HttpError {
    /// True if the request certainly never reached the server, so trying another endpoint is always safe.
    pub fn is_connect(&self) -> bool {
        matches!(self, HttpError::Connect { .. })
    }
}

impl fmt::Display for HttpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HttpError::BadUrl(s) => write!(f, "bad url: {s}"),
            HttpError::Connect { addr, error } => write!(f, "cannot connect to {addr}: {error}"),
            HttpError::Timeout(d) => write!(f, "timed out after {d:?}"),
            HttpError::Io(e) => write!(f, "i/o error: {e}"),
            HttpError::Closed => write!(f, "connection closed before the response was complete"),
            HttpError::Malformed(s) => write!(f, "malformed response: {s}"),
            HttpError::TooLarge { what, limit } => write!(f, "{what} exceeds the limit of {limit}"),
            HttpError::Status { status, body } => {
                write!(f, "http status {status}: {}", excerpt(body))
            }
        }
    }
}

impl std::error::Error for HttpError {}

/// A printable, bounded excerpt of a body.
pub fn excerpt(body: &[u8]) -> String {
    let cut = &body[..body.len().min(MAX_ERROR_EXCERPT)];
    String::from_utf8_lossy(cut).into_owned()
}

/// Runs `fut` under a glommio timer; `None` if it did not finish within `dur`.
pub async fn within<F: Future>(dur: Duration, fut: F) -> Option<F::Output> {
    glommio::timer::timeout(dur, async { Ok(fut.await) })
        .await
        .ok()
}

/// Tunables of one [`HttpClient`].
#[derive(Debug, Clone)]
pub struct HttpConfig {
    pub connect_timeout: Duration,
    pub request_timeout: Duration,
    pub max_body_bytes: usize,
    pub max_message_bytes: usize,
    pub max_idle_conns: usize,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            max_idle_conns: DEFAULT_MAX_IDLE_CONNS,
        }
    }
}

/// A complete unary response.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub body: Vec<u8>,
}

/// How a response body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    Length(u64),
    Chunked,
    UntilClose,
}

/// The parts of a response head this client uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    pub status: u16,
    pub framing: Framing,
    /// The connection may carry another request after this response.
    pub keep_alive: bool,
}

/// Parses a response head at the start of `buf`. `Ok(None)`: incomplete, read more. `Ok(Some((head, n)))`: the
/// head took `n` bytes.
pub fn parse_head(buf: &[u8]) -> Result<Option<(Head, usize)>, HttpError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut headers);
    let window = &buf[..buf.len().min(MAX_HEAD_BYTES)];
    let n = match resp.parse(window) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => {
            if buf.len() >= MAX_HEAD_BYTES {
                return Err(HttpError::TooLarge {
                    what: "response head",
                    limit: MAX_HEAD_BYTES,
                });
            }
            return Ok(None);
        }
        Err(httparse::Error::TooManyHeaders) => {
            return Err(HttpError::TooLarge {
                what: "response header count",
                limit: MAX_HEADERS,
            })
        }
        Err(e) => return Err(HttpError::Malformed(format!("response head: {e}"))),
    };
    let status = resp
        .code
        .ok_or_else(|| HttpError::Malformed("no status code".into()))?;
    let mut close = resp.version != Some(1);
    let mut chunked: Option<bool> = None;
    let mut length: Option<u64> = None;
    for h in resp.headers.iter() {
        let value = || {
            std::str::from_utf8(h.value)
                .map(str::trim)
                .map_err(|_| HttpError::Malformed(format!("header {} is not text", h.name)))
        };
        if h.name.eq_ignore_ascii_case("transfer-encoding") {
            let last = value()?.rsplit(',').next().unwrap_or("").trim();
            chunked = Some(last.eq_ignore_ascii_case("chunked"));
        } else if h.name.eq_ignore_ascii_case("content-length") {
            let v = value()?;
            if v.is_empty() || v.len() > 19 || !v.bytes().all(|b| b.is_ascii_digit()) {
                return Err(HttpError::Malformed(format!("content-length {v:?}")));
            }
            let n: u64 = v
                .parse()
                .map_err(|_| HttpError::Malformed(format!("content-length {v:?}")))?;
            if length.is_some_and(|old| old != n) {
                return Err(HttpError::Malformed("conflicting content-length".into()));
            }
            length = Some(n);
        } else if h.name.eq_ignore_ascii_case("connection")
            && value()?
                .split(',')
                .any(|t| t.trim().eq_ignore_ascii_case("close"))
        {
            close = true;
        }
    }
    let framing = if (100..200).contains(&status) || status == 204 || status == 304 {
        Framing::Length(0)
    } else {
        match (chunked, length) {
            (Some(true), _) => Framing::Chunked,
            (Some(false), _) => Framing::UntilClose,
            (None, Some(n)) => Framing::Length(n),
            (None, None) => Framing::UntilClose,
        }
    };
    let keep_alive = !close && framing != Framing::UntilClose;
    Ok(Some((
        Head {
            status,
            framing,
            keep_alive,
        },
        n,
    )))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ChunkState {
    /// Reading a chunk-size line into `line`.
    Size,
    /// This many data bytes of the current chunk remain.
    Data(u64),
    /// Expecting the CR (or bare LF) after chunk data.
    DataEnd,
    /// Got the CR after chunk data, expecting LF.
    DataEndLf,
    /// Reading trailer lines until an empty one.
    Trailer,
    Done,
}

/// Incremental decoder of a `Transfer-Encoding: chunked` body. Feed it bytes in any pieces.
#[derive(Debug)]
pub struct ChunkedDecoder {
    state: ChunkState,
    line: Vec<u8>,
    trailer_bytes: usize,
}

impl Default for ChunkedDecoder {
    fn default() -> Self {
        Self::new()
    }
}

impl ChunkedDecoder {
    pub fn new() -> Self {
        ChunkedDecoder {
            state: ChunkState::Size,
            line: Vec::new(),
            trailer_bytes: 0,
        }
    }

    pub fn is_done(&self) -> bool {
        self.state == ChunkState::Done
    }

    /// Decodes from `input`, appending body bytes to `out`. Returns how many input bytes were consumed: all of
    /// them, unless the body ended (bytes after the end belong to whatever follows on the connection).
    pub fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<usize, HttpError> {
        let mut i = 0;
        while i < input.len() {
            match self.state {
                ChunkState::Done => return Ok(i),
                ChunkState::Size => {
                    let b = input[i];
                    i += 1;
                    if b == b'\n' {
                        let size = parse_chunk_size(&self.line)?;
                        self.line.clear();
                        self.state = if size == 0 {
                            ChunkState::Trailer
                        } else {
                            ChunkState::Data(size)
                        };
                    } else {
                        if self.line.len() >= MAX_CHUNK_LINE_BYTES {
                            return Err(HttpError::TooLarge {
                                what: "chunk size line",
                                limit: MAX_CHUNK_LINE_BYTES,
                            });
                        }
                        self.line.push(b);
                    }
                }
                ChunkState::Data(rem) => {
                    let avail = (input.len() - i) as u64;
                    let take = rem.min(avail) as usize;
                    out.extend_from_slice(&input[i..i + take]);
                    i += take;
                    let rem = rem - take as u64;
                    self.state = if rem == 0 {
                        ChunkState::DataEnd
                    } else {
                        ChunkState::Data(rem)
                    };
                }
                ChunkState::DataEnd => {
                    let b = input[i];
                    i += 1;
                    self.state = match b {
                        b'\r' => ChunkState::DataEndLf,
                        b'\n' => ChunkState::Size,
                        _ => {
                            return Err(HttpError::Malformed(
                                "chunk data not followed by CRLF".into(),
                            ))
                        }
                    };
                }
                ChunkState::DataEndLf => {
                    let b = input[i];
                    i += 1;
                    if b != b'\n' {
                        return Err(HttpError::Malformed(
                            "chunk data not followed by CRLF".into(),
                        ));
                    }
                    self.state = ChunkState::Size;
                }
                ChunkState::Trailer => {
                    let b = input[i];
                    i += 1;
                    if b == b'\n' {
                        let line = strip_cr(&self.line);
                        if line.is_empty() {
                            self.state = ChunkState::Done;
                            self.line = Vec::new();
                            return Ok(i);
                        }
                        self.line.clear();
                    } else {
                        self.trailer_bytes += 1;
                        if self.trailer_bytes > MAX_TRAILER_BYTES {
                            return Err(HttpError::TooLarge {
                                what: "chunked trailers",
                                limit: MAX_TRAILER_BYTES,
                            });
                        }
                        self.line.push(b);
                    }
                }
            }
        }
        Ok(i)
    }
}

fn strip_cr(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\r").unwrap_or(line)
}

fn parse_chunk_size(line: &[u8]) -> Result<u64, HttpError> {
    let line = strip_cr(line);
    let end = line.iter().position(|&b| b == b';').unwrap_or(line.len());
    let hex = line[..end].trim_ascii();
    // 15 hex digits keep the value below 2^60: no overflow, and far above any limit.
    if hex.is_empty() || hex.len() > 15 || !hex.iter().all(u8::is_ascii_hexdigit) {
        return Err(HttpError::Malformed(format!(
            "chunk size line {:?}",
            String::from_utf8_lossy(&line[..line.len().min(64)])
        )));
    }
    let mut n: u64 = 0;
    for &b in hex {
        let d = match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'f' => b - b'a' + 10,
            _ => b - b'A' + 10,
        };
        n = (n << 4) | u64::from(d);
    }
    Ok(n)
}

/// Incremental decoder of a response body under any framing.
#[derive(Debug)]
pub struct BodyDecoder {
    kind: BodyKind,
}

#[derive(Debug)]
enum BodyKind {
    Length(u64),
    Chunked(ChunkedDecoder),
    UntilClose,
    Done,
}

impl BodyDecoder {
    pub fn new(framing: Framing) -> Self {
        let kind = match framing {
            Framing::Length(0) => BodyKind::Done,
            Framing::Length(n) => BodyKind::Length(n),
            Framing::Chunked => BodyKind::Chunked(ChunkedDecoder::new()),
            Framing::UntilClose => BodyKind::UntilClose,
        };
        BodyDecoder { kind }
    }

    pub fn is_done(&self) -> bool {
        matches!(self.kind, BodyKind::Done)
    }

    /// Decodes from `input` into `out`; returns the input bytes consumed (fewer than given only once done).
    pub fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<usize, HttpError> {
        match &mut self.kind {
            BodyKind::Done => Ok(0),
            BodyKind::UntilClose => {
                out.extend_from_slice(input);
                Ok(input.len())
            }
            BodyKind::Length(rem) => {
                let take = (*rem).min(input.len() as u64) as usize;
                out.extend_from_slice(&input[..take]);
                *rem -= take as u64;
                if *rem == 0 {
                    self.kind = BodyKind::Done;
                }
                Ok(take)
            }
            BodyKind::Chunked(dec) => {
                let n = dec.feed(input, out)?;
                if dec.is_done() {
                    self.kind = BodyKind::Done;
                }
                Ok(n)
            }
        }
    }

    /// The connection reached end of file: fine for close-delimited bodies, an error otherwise.
    pub fn eof(&mut self) -> Result<(), HttpError> {
        match self.kind {
            BodyKind::Done => Ok(()),
            BodyKind::UntilClose => {
                self.kind = BodyKind::Done;
                Ok(())
            }
            _ => Err(HttpError::Closed),
        }
    }
}

/// Splits a byte stream into complete top-level JSON objects (or arrays), whatever the boundaries of the pieces
/// pushed. Whitespace between values is skipped; anything else outside a value is an error. It only delimits:
/// the objects it returns still have to be parsed.
#[derive(Debug)]
pub struct JsonSplitter {
    buf: Vec<u8>,
    /// Next byte of `buf` to scan.
    pos: usize,
    /// Start of the value being scanned, if inside one.
    start: Option<usize>,
    depth: usize,
    in_string: bool,
    escape: bool,
    max_message: usize,
    ready: VecDeque<Vec<u8>>,
}

impl JsonSplitter {
    pub fn new(max_message: usize) -> Self {
        JsonSplitter {
            buf: Vec::new(),
            pos: 0,
            start: None,
            depth: 0,
            in_string: false,
            escape: false,
            max_message,
            ready: VecDeque::new(),
        }
    }

    /// Adds bytes; complete objects become available from [`JsonSplitter::pop`].
    pub fn push(&mut self, data: &[u8]) -> Result<(), HttpError> {
        self.buf.extend_from_slice(data);
        while self.pos < self.buf.len() {
            let b = self.buf[self.pos];
            match self.start {
                None => {
                    if b.is_ascii_whitespace() {
                        self.pos += 1;
                        continue;
                    }
                    if b != b'{' && b != b'[' {
                        return Err(HttpError::Malformed(format!(
                            "expected a JSON object in the stream, found byte 0x{b:02x}"
                        )));
                    }
                    self.start = Some(self.pos);
                    self.depth = 1;
                    self.pos += 1;
                }
                Some(start) => {
                    self.pos += 1;
                    if self.in_string {
                        if self.escape {
                            self.escape = false;
                        } else if b == b'\\' {
                            self.escape = true;
                        } else if b == b'"' {
                            self.in_string = false;
                        }
                        continue;
                    }
                    match b {
                        b'"' => self.in_string = true,
                        b'{' | b'[' => self.depth += 1,
                        b'}' | b']' => {
                            self.depth -= 1;
                            if self.depth == 0 {
                                if self.pos - start > self.max_message {
                                    return Err(self.too_large());
                                }
                                self.ready.push_back(self.buf[start..self.pos].to_vec());
                                self.start = None;
                            }
                        }
                        _ => {}
                    }
                }
            }
        }
        // Drop what has been consumed: everything before the value in progress, or everything.
        let keep_from = self.start.unwrap_or(self.pos);
        if keep_from > 0 {
            self.buf.drain(..keep_from);
            self.pos -= keep_from;
            if self.start.is_some() {
                self.start = Some(0);
            }
        }
        if self.start.is_some() && self.buf.len() > self.max_message {
            return Err(self.too_large());
        }
        Ok(())
    }

    fn too_large(&self) -> HttpError {
        HttpError::TooLarge {
            what: "streamed JSON message",
            limit: self.max_message,
        }
    }

    /// The next complete object, if any.
    pub fn pop(&mut self) -> Option<Vec<u8>> {
        self.ready.pop_front()
    }

    /// The stream ended: an unfinished object is an error.
    pub fn finish(&self) -> Result<(), HttpError> {
        if self.start.is_some() {
            return Err(HttpError::Malformed(
                "stream ended inside a JSON object".into(),
            ));
        }
        Ok(())
    }
}

/// One TCP connection with its read-ahead buffer.
struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
    scratch: Box<[u8]>,
    /// Any byte of the current response has arrived.
    received: bool,
}

impl Conn {
    fn new(stream: TcpStream) -> Conn {
        Conn {
            stream,
            buf: Vec::new(),
            scratch: vec![0u8; READ_CHUNK_BYTES].into_boxed_slice(),
            received: false,
        }
    }

    async fn send(&mut self, bytes: &[u8]) -> Result<(), HttpError> {
        self.received = false;
        self.stream.write_all(bytes).await.map_err(HttpError::Io)?;
        self.stream.flush().await.map_err(HttpError::Io)
    }

    /// Reads once into `buf`; returns the byte count (0 = end of file).
    async fn read_more(&mut self) -> Result<usize, HttpError> {
        let n = self
            .stream
            .read(&mut self.scratch)
            .await
            .map_err(HttpError::Io)?;
        if n > 0 {
            self.received = true;
            self.buf.extend_from_slice(&self.scratch[..n]);
        }
        Ok(n)
    }

    async fn read_head(&mut self) -> Result<Head, HttpError> {
        loop {
            if let Some((head, n)) = parse_head(&self.buf)? {
                self.buf.drain(..n);
                if head.status == 101 {
                    return Err(HttpError::Malformed("unexpected protocol switch".into()));
                }
                if (100..200).contains(&head.status) {
                    continue; // interim response; the real one follows
                }
                return Ok(head);
            }
            if self.read_more().await? == 0 {
                return Err(HttpError::Closed);
            }
        }
    }

    /// Decodes buffered bytes, reading from the socket first if none are buffered.
    async fn body_step(
        &mut self,
        dec: &mut BodyDecoder,
        out: &mut Vec<u8>,
    ) -> Result<(), HttpError> {
        if dec.is_done() {
            return Ok(());
        }
        if self.buf.is_empty() && self.read_more().await? == 0 {
            return dec.eof();
        }
        let n = dec.feed(&self.buf, out)?;
        self.buf.drain(..n);
        Ok(())
    }

    async fn read_body(&mut self, head: &Head, max: usize) -> Result<Vec<u8>, HttpError> {
        if let Framing::Length(n) = head.framing {
            if n > max as u64 {
                return Err(HttpError::TooLarge {
                    what: "response body",
                    limit: max,
                });
            }
        }
        let mut dec = BodyDecoder::new(head.framing);
        let mut body = Vec::new();
        while !dec.is_done() {
            self.body_step(&mut dec, &mut body).await?;
            if body.len() > max {
                return Err(HttpError::TooLarge {
                    what: "response body",
                    limit: max,
                });
            }
        }
        Ok(body)
    }
}

type Pool = Rc<RefCell<Vec<Conn>>>;

fn checkin(pool: &Pool, max_idle: usize, conn: Conn) {
    if !conn.buf.is_empty() {
        return; // stray bytes after the response: the connection is not trustworthy
    }
    let mut idle = pool.borrow_mut();
    if idle.len() < max_idle {
        idle.push(conn);
    }
}

/// An HTTP/1.1 client for one `http://host:port` endpoint. Cheap to share by reference within one executor;
/// concurrent requests use separate connections.
pub struct HttpClient {
    base_url: String,
    host: String,
    port: u16,
    host_header: String,
    cfg: HttpConfig,
    idle: Pool,
}

impl fmt::Debug for HttpClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpClient")
            .field("base_url", &self.base_url)
            .finish()
    }
}

/// Splits `http://host[:port][/]` into host, port and the `Host` header value.
fn parse_base_url(url: &str) -> Result<(String, u16, String), HttpError> {
    let bad = |why: &str| HttpError::BadUrl(format!("{url:?}: {why}"));
    let rest = match url.get(..7) {
        Some(scheme) if scheme.eq_ignore_ascii_case("http://") => &url[7..],
        _ => return Err(bad("expected http://host:port")),
    };
    let authority = match rest.find('/') {
        Some(i) if rest[i..] == *"/" => &rest[..i],
        Some(_) => return Err(bad("a path is not supported")),
        None => rest,
    };
    if authority.is_empty()
        || authority.contains('@')
        || authority
            .bytes()
            .any(|b| b.is_ascii_whitespace() || b.is_ascii_control())
    {
        return Err(bad("bad host"));
    }
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (h, after) = v6.split_once(']').ok_or_else(|| bad("unclosed ["))?;
        match after {
            "" => (h, None),
            p => (h, Some(p.strip_prefix(':').ok_or_else(|| bad("bad port"))?)),
        }
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    let port = match port {
        None => 80,
        Some(p) => match p.parse::<u16>() {
            Ok(n) if n != 0 => n,
            _ => return Err(bad("bad port")),
        },
    };
    if host.is_empty() {
        return Err(bad("empty host"));
    }
    Ok((host.to_string(), port, authority.to_string()))
}

/// Turns on TCP keepalive with the timings above (node RPC's connections use it too).
pub(crate) fn set_tcp_keepalive(stream: &TcpStream) {
    use std::os::fd::{AsRawFd, BorrowedFd};
    // SAFETY: the descriptor belongs to `stream`, which is borrowed for longer than `fd` lives.
    let fd = unsafe { BorrowedFd::borrow_raw(stream.as_raw_fd()) };
    let params = socket2::TcpKeepalive::new()
        .with_time(TCP_KEEPALIVE_IDLE)
        .with_interval(TCP_KEEPALIVE_INTERVAL)
        .with_retries(TCP_KEEPALIVE_RETRIES);
    // Best effort: without it a dead peer is only noticed by the caller's own timeouts.
    let _ = socket2::SockRef::from(&fd).set_tcp_keepalive(&params);
}

impl HttpClient {
    /// A client for `base_url` (`http://host:port`). No connection is made yet.
    pub fn new(base_url: &str, cfg: HttpConfig) -> Result<HttpClient, HttpError> {
        let (host, port, host_header) = parse_base_url(base_url)?;
        Ok(HttpClient {
            base_url: base_url.trim_end_matches('/').to_string(),
            host,
            port,
            host_header,
            cfg,
            idle: Rc::new(RefCell::new(Vec::new())),
        })
    }

    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    pub fn config(&self) -> &HttpConfig {
        &self.cfg
    }

    /// Idle pooled connections (for tests and metrics).
    pub fn idle_connections(&self) -> usize {
        self.idle.borrow().len()
    }

    fn request_bytes(&self, path: &str, body: &[u8]) -> Result<Vec<u8>, HttpError> {
        if !path.starts_with('/') || path.bytes().any(|b| b <= b' ' || b == 0x7f) {
            return Err(HttpError::BadUrl(format!("bad request path {path:?}")));
        }
        let mut req = format!(
            "POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nAccept: application/json\r\nContent-Length: {}\r\n\r\n",
            self.host_header,
            body.len()
        )
        .into_bytes();
        req.extend_from_slice(body);
        Ok(req)
    }

    async fn connect(&self) -> Result<Conn, HttpError> {
        let connect_err = |addr: String, error: io::Error| HttpError::Connect { addr, error };
        let addrs: Vec<SocketAddr> = (self.host.as_str(), self.port)
            .to_socket_addrs()
            .map_err(|e| connect_err(self.host_header.clone(), e))?
            .collect();
        let mut last = connect_err(
            self.host_header.clone(),
            io::Error::new(io::ErrorKind::NotFound, "no address"),
        );
        for addr in addrs {
            match within(self.cfg.connect_timeout, TcpStream::connect(addr)).await {
                Some(Ok(stream)) => {
                    let _ = stream.set_nodelay(true);
                    set_tcp_keepalive(&stream);
                    return Ok(Conn::new(stream));
                }
                Some(Err(e)) => last = connect_err(addr.to_string(), io::Error::from(e)),
                None => {
                    last = connect_err(
                        addr.to_string(),
                        io::Error::new(
                            io::ErrorKind::TimedOut,
                            format!("connect timed out after {:?}", self.cfg.connect_timeout),
                        ),
                    )
                }
            }
        }
        Err(last)
    }

    /// A pooled connection if there is one (second value `true`), else a new one.
    async fn checkout(&self) -> Result<(Conn, bool), HttpError> {
        let pooled = self.idle.borrow_mut().pop();
        match pooled {
            Some(conn) => Ok((conn, true)),
            None => Ok((self.connect().await?, false)),
        }
    }

    /// Sends the request and reads the response head, retrying on a fresh connection when a pooled one turns out
    /// to be dead before anything came back.
    async fn open(&self, req: &[u8]) -> Result<(Conn, Head), HttpError> {
        let mut stale_retries = 0;
        loop {
            let (mut conn, reused) = self.checkout().await?;
            let result = match conn.send(req).await {
                Ok(()) => conn.read_head().await,
                Err(e) => Err(e),
            };
            match result {
                Ok(head) => return Ok((conn, head)),
                Err(HttpError::Io(_) | HttpError::Closed)
                    if reused && !conn.received && stale_retries <= self.cfg.max_idle_conns =>
                {
                    stale_retries += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// `POST path` with a JSON body; the whole response, whatever its status. Bounded by `request_timeout` and
    /// `max_body_bytes`.
    pub async fn post_json(&self, path: &str, body: &[u8]) -> Result<Response, HttpError> {
        let req = self.request_bytes(path, body)?;
        let timeout = self.cfg.request_timeout;
        within(timeout, async {
            let (mut conn, head) = self.open(&req).await?;
            let body = conn.read_body(&head, self.cfg.max_body_bytes).await?;
            if head.keep_alive {
                checkin(&self.idle, self.cfg.max_idle_conns, conn);
            }
            Ok(Response {
                status: head.status,
                body,
            })
        })
        .await
        .unwrap_or(Err(HttpError::Timeout(timeout)))
    }

    /// `POST path` with a JSON body, reading the response as a stream of JSON objects. Returns once a 2xx head has
    /// arrived (within `request_timeout`); a non-2xx response is read whole and returned as
    /// [`HttpError::Status`]. Reads on the stream have no timeout of their own.
    pub async fn post_stream(&self, path: &str, body: &[u8]) -> Result<JsonStream, HttpError> {
        let req = self.request_bytes(path, body)?;
        let timeout = self.cfg.request_timeout;
        within(timeout, async {
            let (mut conn, head) = self.open(&req).await?;
            if !(200..300).contains(&head.status) {
                let body = conn.read_body(&head, self.cfg.max_body_bytes).await?;
                if head.keep_alive {
                    checkin(&self.idle, self.cfg.max_idle_conns, conn);
                }
                return Err(HttpError::Status {
                    status: head.status,
                    body,
                });
            }
            Ok(JsonStream {
                conn: Some(conn),
                decoder: BodyDecoder::new(head.framing),
                splitter: JsonSplitter::new(self.cfg.max_message_bytes),
                keep_alive: head.keep_alive,
                pool: self.idle.clone(),
                max_idle: self.cfg.max_idle_conns,
                scratch: Vec::new(),
                in_read: false,
                ended: false,
            })
        })
        .await
        .unwrap_or(Err(HttpError::Timeout(timeout)))
    }
}

/// A response body read as a sequence of JSON objects. Dropping it closes the connection unless the body had
/// ended, in which case the connection returns to the pool.
pub struct JsonStream {
    conn: Option<Conn>,
    decoder: BodyDecoder,
    splitter: JsonSplitter,
    keep_alive: bool,
    pool: Pool,
    max_idle: usize,
    scratch: Vec<u8>,
    /// A read was under way: if `next` is entered with this set, the previous call was cancelled mid-read and the
    /// stream position is unknown.
    in_read: bool,
    ended: bool,
}

impl fmt::Debug for JsonStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JsonStream")
            .field("open", &self.conn.is_some())
            .field("ended", &self.ended)
            .finish()
    }
}

impl JsonStream {
    /// The next complete JSON object of the body; `Ok(None)` once the body has ended cleanly. After an error the
    /// stream is unusable and every further call fails. If a call is cancelled (e.g. by a timeout), the stream is
    /// poisoned likewise.
    pub async fn next(&mut self) -> Result<Option<Vec<u8>>, HttpError> {
        if self.in_read {
            self.conn = None;
        }
        loop {
            if let Some(msg) = self.splitter.pop() {
                return Ok(Some(msg));
            }
            if self.ended {
                return Ok(None);
            }
            if self.conn.is_none() {
                return Err(HttpError::Closed);
            }
            if self.decoder.is_done() {
                let conn = self.conn.take();
                self.splitter.finish()?;
                self.ended = true;
                if let Some(conn) = conn {
                    if self.keep_alive {
                        checkin(&self.pool, self.max_idle, conn);
                    }
                }
                return Ok(None);
            }
            let Some(conn) = self.conn.as_mut() else {
                return Err(HttpError::Closed);
            };
            self.scratch.clear();
            self.in_read = true;
            let step = conn.body_step(&mut self.decoder, &mut self.scratch).await;
            self.in_read = false;
            let pushed = step.and_then(|()| self.splitter.push(&self.scratch));
            if let Err(e) = pushed {
                self.conn = None;
                return Err(e);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs a whole response through the same pieces the async path uses, fed in the given pieces.
    fn decode(pieces: &[&[u8]], max_message: usize) -> Result<(Head, Vec<Vec<u8>>), HttpError> {
        let mut buf = Vec::new();
        let mut head: Option<Head> = None;
        let mut dec: Option<BodyDecoder> = None;
        let mut split = JsonSplitter::new(max_message);
        let mut msgs = Vec::new();
        for piece in pieces {
            buf.extend_from_slice(piece);
            if head.is_none() {
                if let Some((h, n)) = parse_head(&buf)? {
                    buf.drain(..n);
                    dec = Some(BodyDecoder::new(h.framing));
                    head = Some(h);
                }
            }
            if let Some(d) = dec.as_mut() {
                let mut out = Vec::new();
                let n = d.feed(&buf, &mut out)?;
                buf.drain(..n);
                split.push(&out)?;
                while let Some(m) = split.pop() {
                    msgs.push(m);
                }
            }
        }
        let mut d = dec.ok_or(HttpError::Closed)?;
        d.eof()?;
        split.finish()?;
        if !buf.is_empty() {
            return Err(HttpError::Malformed("trailing bytes".into()));
        }
        Ok((head.ok_or(HttpError::Closed)?, msgs))
    }

    /// Bytes captured from etcd 3.4.23: `POST /v3/watch`, then two puts and a two-key delete.
    const WATCH: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nGrpc-Metadata-Content-Type: application/grpc\r\nDate: Mon, 30 Nov 2026 21:20:14 GMT\r\nTransfer-Encoding: chunked\r\n\r\n\
8a\r\n{\"result\":{\"header\":{\"cluster_id\":\"324952591200643719\",\"member_id\":\"3319814642761637952\",\"revision\":\"4\",\"raft_term\":\"2\"},\"created\":true}}\n\r\n\
e2\r\n{\"result\":{\"header\":{\"cluster_id\":\"324952591200643719\",\"member_id\":\"3319814642761637952\",\"revision\":\"5\",\"raft_term\":\"2\"},\"events\":[{\"kv\":{\"key\":\"cDE=\",\"create_revision\":\"5\",\"mod_revision\":\"5\",\"version\":\"1\",\"value\":\"MQ==\"}}]}}\n\r\n\
f8\r\n{\"result\":{\"header\":{\"cluster_id\":\"324952591200643719\",\"member_id\":\"3319814642761637952\",\"revision\":\"7\",\"raft_term\":\"2\"},\"events\":[{\"type\":\"DELETE\",\"kv\":{\"key\":\"cDE=\",\"mod_revision\":\"7\"}},{\"type\":\"DELETE\",\"kv\":{\"key\":\"cDI=\",\"mod_revision\":\"7\"}}]}}\n\r\n\
0\r\n\r\n";

    /// etcd 3.4.23's error reply: chunked, with a trailer after the last chunk.
    const ERROR_WITH_TRAILER: &[u8] = b"HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nTrailer: Grpc-Trailer-Content-Type\r\nTransfer-Encoding: chunked\r\n\r\n\
6c\r\n{\"error\":\"etcdserver: requested lease not found\",\"message\":\"etcdserver: requested lease not found\",\"code\":5}\r\n\
0\r\nGrpc-Trailer-Content-Type: application/grpc\r\n\r\n";

    #[test]
    fn watch_stream_decodes_at_every_split_point() {
        let (head, whole) = decode(&[WATCH], 1 << 20).unwrap();
        assert_eq!(head.status, 200);
        assert_eq!(head.framing, Framing::Chunked);
        assert!(head.keep_alive);
        assert_eq!(whole.len(), 3);
        for m in &whole {
            let v: serde_json::Value = serde_json::from_slice(m).unwrap();
            assert!(v.get("result").is_some());
        }
        for i in 0..=WATCH.len() {
            let (_, msgs) = decode(&[&WATCH[..i], &WATCH[i..]], 1 << 20).unwrap();
            assert_eq!(msgs, whole, "split at {i}");
        }
        // Three-way splits around every chunk boundary region, and byte-at-a-time.
        for i in (0..WATCH.len()).step_by(7) {
            for j in (i..=WATCH.len()).step_by(5) {
                let (_, msgs) = decode(&[&WATCH[..i], &WATCH[i..j], &WATCH[j..]], 1 << 20).unwrap();
                assert_eq!(msgs, whole, "split at {i},{j}");
            }
        }
        let bytes: Vec<&[u8]> = WATCH.chunks(1).collect();
        assert_eq!(decode(&bytes, 1 << 20).unwrap().1, whole);
    }

    #[test]
    fn error_reply_with_trailer_decodes_at_every_split_point() {
        for i in 0..=ERROR_WITH_TRAILER.len() {
            let (head, msgs) = decode(
                &[&ERROR_WITH_TRAILER[..i], &ERROR_WITH_TRAILER[i..]],
                1 << 20,
            )
            .unwrap();
            assert_eq!(head.status, 404);
            assert_eq!(msgs.len(), 1);
            let v: serde_json::Value = serde_json::from_slice(&msgs[0]).unwrap();
            assert_eq!(v["code"], 5);
        }
    }

    #[test]
    fn objects_split_across_chunks_and_packed_in_one_chunk() {
        // One object spread over three chunks, then two objects in one chunk, braces inside strings, escapes.
        let body = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\
5\r\n{\"a\":\r\n3;ext=1\r\n\"}\"\r\n1\r\n}\r\n\
1A\r\n{\"b\":\"\\\"{[\"} \n [1,{\"c\":2}]\r\n0\r\n\r\n";
        for i in 0..=body.len() {
            let (_, msgs) = decode(&[&body[..i], &body[i..]], 1 << 20).unwrap();
            let texts: Vec<String> = msgs
                .iter()
                .map(|m| String::from_utf8(m.clone()).unwrap())
                .collect();
            assert_eq!(
                texts,
                vec![r#"{"a":"}"}"#, r#"{"b":"\"{["}"#, r#"[1,{"c":2}]"#],
                "split at {i}"
            );
        }
    }

    #[test]
    fn content_length_body() {
        let r = b"HTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\n{\"a\":1}";
        for i in 0..=r.len() {
            let (head, msgs) = decode(&[&r[..i], &r[i..]], 1 << 20).unwrap();
            assert_eq!(head.framing, Framing::Length(7));
            assert_eq!(msgs, vec![b"{\"a\":1}".to_vec()]);
        }
    }

    #[test]
    fn head_framing_rules() {
        let h = |s: &str| parse_head(s.as_bytes()).map(|o| o.map(|(h, _)| h));
        let head = h("HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 3\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(head.framing, Framing::Length(3));
        assert!(!head.keep_alive);
        let head = h("HTTP/1.0 200 OK\r\nContent-Length: 3\r\n\r\n")
            .unwrap()
            .unwrap();
        assert!(!head.keep_alive);
        let head = h("HTTP/1.1 200 OK\r\n\r\n").unwrap().unwrap();
        assert_eq!(head.framing, Framing::UntilClose);
        assert!(!head.keep_alive);
        let head = h("HTTP/1.1 204 No Content\r\nContent-Length: 9\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(head.framing, Framing::Length(0));
        let head =
            h("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\nContent-Length: 3\r\n\r\n")
                .unwrap()
                .unwrap();
        assert_eq!(head.framing, Framing::Chunked);
        assert!(h("HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n").is_err());
        assert!(h("HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n").is_err());
        assert!(h("HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999\r\n\r\n").is_err());
        assert!(h("HTTP/1.1 200 OK\r\nContent-Le").unwrap().is_none());
    }

    #[test]
    fn garbage_is_an_error_never_a_panic() {
        let cases: &[&[u8]] = &[
            b"garbage\r\n\r\n",
            b"HTTP/1.1 2000 OK\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-1\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffffff\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}XX",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n{}}\r\n0\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n{\"a",
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}extra",
        ];
        for case in cases {
            for i in 0..=case.len() {
                assert!(
                    decode(&[&case[..i], &case[i..]], 1 << 20).is_err(),
                    "accepted {:?} split at {i}",
                    String::from_utf8_lossy(case)
                );
            }
        }
        // Pseudo-random bytes after a valid chunked head: any outcome but a panic.
        let mut x: u32 = 0x1234_5678;
        for _ in 0..2000 {
            let mut bytes = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
            for _ in 0..64 {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                let alphabet = b"0123456789abcdef\r\n{}[]\"\\;: x";
                bytes.push(alphabet[(x as usize) % alphabet.len()]);
            }
            let _ = decode(&[&bytes], 64);
        }
    }

    #[test]
    fn oversized_inputs_are_refused() {
        // A JSON message over the limit, even when it never ends.
        let mut big = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
        let payload = format!("{{\"k\":\"{}\"}}", "x".repeat(200));
        big.extend_from_slice(format!("{:x}\r\n{payload}\r\n0\r\n\r\n", payload.len()).as_bytes());
        assert!(matches!(
            decode(&[&big], 100),
            Err(HttpError::TooLarge { .. })
        ));
        assert!(decode(&[&big], 1000).is_ok());
        let open_ended = format!("{{\"k\":\"{}", "x".repeat(300));
        let mut s = JsonSplitter::new(100);
        assert!(matches!(
            s.push(open_ended.as_bytes()),
            Err(HttpError::TooLarge { .. })
        ));
        // Message exactly at the limit is fine.
        let exact = b"{\"k\":\"xxxx\"}";
        let mut s = JsonSplitter::new(exact.len());
        s.push(exact).unwrap();
        assert_eq!(s.pop().unwrap(), exact.to_vec());
        // Chunk size line, trailers and head over their limits.
        let mut line = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1;".to_vec();
        line.extend(std::iter::repeat_n(b'e', MAX_CHUNK_LINE_BYTES + 10));
        assert!(matches!(
            decode(&[&line], 1 << 20),
            Err(HttpError::TooLarge { .. })
        ));
        let mut trailers = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n".to_vec();
        for _ in 0..(MAX_TRAILER_BYTES / 10 + 10) {
            trailers.extend_from_slice(b"X-Tr: abc\r\n");
        }
        assert!(matches!(
            decode(&[&trailers], 1 << 20),
            Err(HttpError::TooLarge { .. })
        ));
        let mut head = b"HTTP/1.1 200 OK\r\n".to_vec();
        while head.len() <= MAX_HEAD_BYTES {
            head.extend_from_slice(
                b"X-Long: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n",
            );
        }
        assert!(matches!(parse_head(&head), Err(HttpError::TooLarge { .. })));
        let mut many = b"HTTP/1.1 200 OK\r\n".to_vec();
        for i in 0..(MAX_HEADERS + 1) {
            many.extend_from_slice(format!("X-{i}: 1\r\n").as_bytes());
        }
        many.extend_from_slice(b"\r\n");
        assert!(matches!(parse_head(&many), Err(HttpError::TooLarge { .. })));
    }

    #[test]
    fn base_urls() {
        let p = parse_base_url;
        assert_eq!(
            p("http://127.0.0.1:2379").unwrap(),
            ("127.0.0.1".into(), 2379, "127.0.0.1:2379".into())
        );
        assert_eq!(
            p("HTTP://etcd/").unwrap(),
            ("etcd".into(), 80, "etcd".into())
        );
        assert_eq!(
            p("http://[::1]:2379").unwrap(),
            ("::1".into(), 2379, "[::1]:2379".into())
        );
        for bad in [
            "https://x:1",
            "x:1",
            "http://",
            "http://x:0",
            "http://x:99999",
            "http://x:1/v3",
            "http://u@x:1",
            "http://[::1",
            "http://:1",
            "",
        ] {
            assert!(p(bad).is_err(), "accepted {bad}");
        }
    }

    // ---- the async path against canned servers on loopback ----

    use glommio::net::TcpListener;
    use glommio::{LocalExecutorBuilder, Placement};

    fn run<Fut: Future<Output = ()>>(fut: Fut) {
        LocalExecutorBuilder::new(Placement::Unbound)
            .make()
            .unwrap()
            .run(fut);
    }

    /// Reads one request (head + Content-Length body) from `s`; `false` at end of file.
    async fn read_request(s: &mut TcpStream, buf: &mut Vec<u8>) -> bool {
        let mut tmp = [0u8; 4096];
        loop {
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .map(|v| v.trim().parse().unwrap())
                    .unwrap_or(0);
                if buf.len() >= end + 4 + len {
                    buf.drain(..end + 4 + len);
                    return true;
                }
            }
            let n = s.read(&mut tmp).await.unwrap_or(0);
            if n == 0 {
                return false;
            }
            buf.extend_from_slice(&tmp[..n]);
        }
    }

    /// Serves canned replies: for each accepted connection, the next entry of `script` lists the replies to send,
    /// one per request, then the connection is closed.
    fn canned_server(script: Vec<Vec<Vec<u8>>>) -> (String, glommio::task::JoinHandle<usize>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let task = glommio::spawn_local(async move {
            let mut accepted = 0;
            for replies in script {
                let mut s = listener.accept().await.unwrap();
                accepted += 1;
                let mut buf = Vec::new();
                for reply in replies {
                    if !read_request(&mut s, &mut buf).await {
                        break;
                    }
                    s.write_all(&reply).await.unwrap();
                }
                let _ = s.close().await;
            }
            accepted
        })
        .detach();
        (url, task)
    }

    fn ok(body: &str) -> Vec<u8> {
        format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .into_bytes()
    }

    #[test]
    fn keep_alive_reuse_and_stale_connection_retry() {
        run(async {
            // Connection 1 answers two requests then closes; the third request finds the pooled connection dead
            // and is retried on connection 2.
            let (url, server) = canned_server(vec![
                vec![ok("{\"n\":1}"), ok("{\"n\":2}")],
                vec![ok("{\"n\":3}")],
            ]);
            let c = HttpClient::new(&url, HttpConfig::default()).unwrap();
            for n in 1..=3 {
                let r = c.post_json("/x", b"{}").await.unwrap();
                assert_eq!(r.status, 200);
                assert_eq!(r.body, format!("{{\"n\":{n}}}").into_bytes());
                if n == 2 {
                    // Let the server's close land before the next request.
                    glommio::timer::sleep(Duration::from_millis(50)).await;
                }
            }
            assert_eq!(server.await, Some(2));
        });
    }

    #[test]
    fn chunked_unary_body_limit_and_timeout() {
        run(async {
            let chunked = b"HTTP/1.1 500 Internal\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n".to_vec();
            let big = ok(&"y".repeat(5000));
            let (url, _server) = canned_server(vec![vec![chunked, big]]);
            let cfg = HttpConfig {
                max_body_bytes: 1000,
                request_timeout: Duration::from_millis(300),
                ..HttpConfig::default()
            };
            let c = HttpClient::new(&url, cfg).unwrap();
            let r = c.post_json("/x", b"{}").await.unwrap();
            assert_eq!((r.status, r.body.as_slice()), (500, &b"abcde"[..]));
            assert_eq!(c.idle_connections(), 1);
            assert!(matches!(
                c.post_json("/x", b"{}").await,
                Err(HttpError::TooLarge { .. })
            ));
            assert_eq!(c.idle_connections(), 0);

            // A server that accepts and never answers.
            let silent = TcpListener::bind("127.0.0.1:0").unwrap();
            let url = format!("http://{}", silent.local_addr().unwrap());
            let hold = glommio::spawn_local(async move {
                let s = silent.accept().await.unwrap();
                glommio::timer::sleep(Duration::from_secs(2)).await;
                drop(s);
            })
            .detach();
            let cfg = HttpConfig {
                request_timeout: Duration::from_millis(200),
                ..HttpConfig::default()
            };
            let c = HttpClient::new(&url, cfg).unwrap();
            let t = std::time::Instant::now();
            assert!(matches!(
                c.post_json("/x", b"{}").await,
                Err(HttpError::Timeout(_))
            ));
            assert!(t.elapsed() < Duration::from_secs(1));
            hold.cancel();
        });
    }

    #[test]
    fn stream_yields_objects_then_returns_connection() {
        run(async {
            let mut reply = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
            reply.extend_from_slice(b"4\r\n{\"a\"\r\n6\r\n:1}\n{}\r\n0\r\n\r\n");
            let (url, _server) = canned_server(vec![vec![
                reply,
                b"HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\n\r\n{}".to_vec(),
            ]]);
            let c = HttpClient::new(&url, HttpConfig::default()).unwrap();
            let mut s = c.post_stream("/w", b"{}").await.unwrap();
            assert_eq!(s.next().await.unwrap().unwrap(), b"{\"a\":1}".to_vec());
            assert_eq!(s.next().await.unwrap().unwrap(), b"{}".to_vec());
            assert!(s.next().await.unwrap().is_none());
            assert!(s.next().await.unwrap().is_none());
            assert_eq!(c.idle_connections(), 1);
            match c.post_stream("/w", b"{}").await {
                Err(HttpError::Status { status: 404, body }) => assert_eq!(body, b"{}"),
                other => panic!("unexpected {:?}", other.map(|_| ())),
            }
        });
    }

    #[test]
    fn connect_errors_are_marked() {
        run(async {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            let c = HttpClient::new(&format!("http://127.0.0.1:{port}"), HttpConfig::default())
                .unwrap();
            let e = c.post_json("/x", b"{}").await.unwrap_err();
            assert!(e.is_connect(), "{e}");
        });
    }
}
