//! One client connection: read, parse every complete request in the buffer (pipelining), answer them in order,
//! write the answers in one go, repeat. Enforces the header-read and idle timeouts and closes at shutdown.

use super::reaper::ConnTable;
use super::request::{self, Limits, ParseError, Parsed};
use super::response::Response;
use super::routes;
use crate::clock::coarse_ms as now_ms;
use crate::engine::metrics::{Op, Stage};
use crate::engine::Engine;
use crate::front::Front;
use crate::tls::Stream;
use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::net::TcpStream;
use std::os::unix::io::AsRawFd;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// Bytes read per socket read.
const READ_CHUNK: usize = 16 << 10;

/// A connection's read or write buffer larger than this is released once empty. 64 KiB.
const MAX_IDLE_BUFFER: usize = 64 << 10;

/// Bytes written per write call; each one that completes renews the write deadline. 64 KiB.
const WRITE_CHUNK: usize = 64 << 10;

/// Writes `out` in chunks, each of which must complete within `timeout_ms` (the core's sweeper cuts the connection
/// otherwise): a client that stops reading cannot hold a connection and its buffers forever.
async fn write_out(
    stream: &mut Stream,
    watch: &super::reaper::Watch,
    out: &[u8],
    timeout_ms: u64,
) -> std::io::Result<()> {
    watch.writing.set(true);
    let mut result = Ok(());
    for chunk in out.chunks(WRITE_CHUNK) {
        watch.deadline_ms.set(now_ms() + timeout_ms);
        result = stream.write_all(chunk).await;
        if result.is_err() || watch.expired.get() {
            break;
        }
    }
    if result.is_ok() && !watch.expired.get() {
        // TLS may hold the last record until flushed (a no-op on a plain socket).
        result = stream.flush().await;
    }
    watch.writing.set(false);
    watch.deadline_ms.set(u64::MAX);
    if watch.expired.get() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "the client did not read its answers in time",
        ));
    }
    result
}

/// A connection's read buffer: `data[start..end]` holds bytes read and not yet parsed. Its memory is zeroed once,
/// when it grows, and reused by every read (a per-read `resize` cost a 16 KiB memset per request).
struct ReadBuf {
    data: Vec<u8>,
    start: usize,
    end: usize,
}

impl ReadBuf {
    fn new() -> ReadBuf {
        ReadBuf {
            data: vec![0; READ_CHUNK],
            start: 0,
            end: 0,
        }
    }

    fn data(&self) -> &[u8] {
        &self.data[self.start..self.end]
    }

    fn is_empty(&self) -> bool {
        self.start == self.end
    }

    fn consume(&mut self, n: usize) {
        assert!(self.start + n <= self.end);
        self.start += n;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
    }

    /// Room for the next read: at least `READ_CHUNK / 4` bytes, moving the unparsed bytes to the front or growing
    /// (a request larger than the buffer) when there is less.
    fn spare(&mut self) -> &mut [u8] {
        if self.data.len() - self.end < READ_CHUNK / 4 {
            if self.start > 0 {
                self.data.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
            }
            if self.data.len() - self.end < READ_CHUNK / 4 {
                let grown = (self.data.len() * 2).max(self.end + READ_CHUNK);
                self.data.resize(grown, 0);
            }
        }
        &mut self.data[self.end..]
    }

    fn filled(&mut self, n: usize) {
        self.end += n;
        assert!(self.end <= self.data.len());
    }

    /// An idle connection gives back what a large request made it grow to.
    fn shrink_idle(&mut self) {
        if self.data.len() > MAX_IDLE_BUFFER {
            *self = ReadBuf::new();
        }
    }
}

/// Serves a connection until the client closes, a limit is hit, or the server stops. Deadlines (TLS handshake and
/// header read time, idle time) are enforced by the core's sweeper through `table`, so a read costs no timer.
pub async fn serve(front: Rc<Front>, table: Rc<ConnTable>, tcp: TcpStream) {
    let core = front.engine().clone();
    let _ = tcp.set_nodelay(true);
    let config = core.config().clone();
    let limits = Limits {
        max_header_bytes: config.max_header_bytes,
        max_headers: config.max_headers,
        max_body_bytes: config.max_message_bytes,
        max_batch_bytes: config.max_batch_bytes,
    };
    let registration = table.register(tcp.as_raw_fd(), now_ms() + config.idle_timeout_ms);
    let watch = &registration.watch;
    let mut stream = match &config.tls {
        None => Stream::Plain(tcp),
        Some(tls) => {
            // The handshake has the header-read deadline, in both directions (its replies are writes too).
            watch
                .deadline_ms
                .set(now_ms() + config.header_read_timeout_ms);
            watch.writing.set(true);
            // A TLS connection opens with a handshake record (type 22); anything else is most likely plain HTTP
            // sent to the HTTPS port, which gets a readable answer rather than a TLS alert.
            let mut first = [0u8; 1];
            if matches!(tcp.peek(&mut first).await, Ok(1) if first[0] != 22) {
                watch.writing.set(false);
                let mut out = Vec::new();
                Response::error(
                    400,
                    "https_required",
                    "this listener speaks HTTPS only: use https://",
                )
                .encode(true, &mut out);
                let mut plain = Stream::Plain(tcp);
                close_after_error(&mut plain, watch, &out, config.max_header_bytes).await;
                return;
            }
            let (handshaking, cut) =
                table.start_handshake(&registration, config.max_tls_handshakes_per_core);
            if cut > 0 {
                let m = core.metrics();
                m.tls_handshakes_evicted
                    .set(m.tls_handshakes_evicted.get() + cut as u64);
            }
            let accepted = crate::tls::accept(tls, tcp).await;
            drop(handshaking);
            watch.writing.set(false);
            match accepted {
                Ok(stream) if !watch.expired.get() => stream,
                _ => {
                    let m = core.metrics();
                    m.tls_handshakes_failed
                        .set(m.tls_handshakes_failed.get() + 1);
                    return;
                }
            }
        }
    };
    let mut buf = ReadBuf::new();
    let mut out: Vec<u8> = Vec::with_capacity(READ_CHUNK);
    // When the first byte of the request being read arrived (None while idle between requests).
    let mut request_started_ms: Option<u64> = None;
    // `100 Continue` was already sent for the request being read.
    let mut continued = false;
    // The head of the request being read passed `routes::refuse` (token, host) while its body was still due.
    let mut vetted = false;
    // When the last read returned (the `queue` stage runs from it to a request's handling), and when the first
    // answer waiting in `out` was queued (the `reply` stage runs from it to their write).
    let mut read_at = Instant::now();
    let mut first_answer: Option<Instant> = None;
    // The last clock reading on this connection's path: a request's handling starts when the read that completed it
    // returned, or when the request before it in the buffer was answered (nothing runs in between but its parse),
    // so the start costs no clock read of its own.
    let mut last_mark = read_at;
    loop {
        // Answer the complete requests already buffered, in order, until the queued answers reach the per-connection
        // bound: a client that pipelines without reading then waits for its answers to drain before more of its
        // requests are served, so its output never grows without bound.
        let mut more_buffered = false;
        loop {
            if out.len() >= config.max_pending_output_bytes {
                more_buffered = true;
                break;
            }
            match request::parse(buf.data(), &limits) {
                Ok(Parsed::Complete(req, used)) => {
                    buf.consume(used);
                    continued = false;
                    vetted = false;
                    // Read and idle deadlines do not run while a request is being served (a long-poll may
                    // outlast them); the next read sets a fresh one.
                    watch.deadline_ms.set(u64::MAX);
                    request_started_ms = (!buf.is_empty()).then(now_ms);
                    let started = last_mark;
                    core.metrics().record_stage(
                        Stage::Queue,
                        started.saturating_duration_since(read_at).as_micros() as u64,
                    );
                    let long_poll = is_long_poll(&front, &req);
                    let mut op = Op::of(req.method, &req.path);
                    if op == Op::Consume && req.query.get("offset").is_some() {
                        // A replay waits at the partition's owner, for a time this core cannot tell apart.
                        op = Op::Other;
                    }
                    let close = req.close;
                    let response = if long_poll {
                        // A long-poll whose client hangs up must not go on to lease a message nobody will read.
                        let work = std::pin::pin!(routes::handle(&front, req));
                        let response = match unless_hung_up(&mut stream, &mut buf, work).await {
                            Some(response) => response,
                            None => return,
                        };
                        // Over TLS the watch may have read the start of the next request.
                        if request_started_ms.is_none() && !buf.is_empty() {
                            request_started_ms = Some(now_ms());
                        }
                        response
                    } else {
                        routes::handle(&front, req).await
                    };
                    let answered = Instant::now();
                    last_mark = answered;
                    let served_us = (answered.saturating_duration_since(started).as_micros()
                        as u64)
                        .saturating_sub(response.parked_us);
                    first_answer.get_or_insert(answered);
                    if long_poll && response.status >= 400 {
                        // An error ends the consume before its parked time reaches the response.
                        op = Op::Other;
                    }
                    core.metrics().record(op, served_us);
                    let close = close || response.close || core.is_stopping();
                    response.encode(close, &mut out);
                    if close {
                        let _ = write_out(&mut stream, watch, &out, config.write_timeout_ms).await;
                        let queued = first_answer.take().unwrap_or(answered);
                        core.metrics()
                            .record_stage(Stage::Reply, queued.elapsed().as_micros() as u64);
                        return;
                    }
                }
                Ok(Parsed::Partial {
                    head_done,
                    expect_continue,
                }) => {
                    if head_done && !vetted {
                        // Checked before any more of the body is read or invited: a client without the token (or
                        // from a refused host) is answered at once, with at most one read of its body buffered.
                        vetted = true;
                        let refusal = request::parse_head(buf.data(), &limits)
                            .ok()
                            .flatten()
                            .and_then(|head| routes::refuse_body(&front, &head));
                        if let Some(response) = refusal {
                            response.encode(true, &mut out);
                            watch.deadline_ms.set(now_ms() + config.write_timeout_ms);
                            close_after_error(&mut stream, watch, &out, config.max_message_bytes)
                                .await;
                            return;
                        }
                    }
                    if expect_continue && !continued {
                        out.extend_from_slice(b"HTTP/1.1 100 Continue\r\n\r\n");
                        continued = true;
                    }
                    break;
                }
                Err(e) => {
                    parse_error_response(&e).encode(true, &mut out);
                    watch.deadline_ms.set(now_ms() + config.write_timeout_ms);
                    if e == ParseError::HeadersTooLarge {
                        bump_timed_out(&core);
                    }
                    close_after_error(&mut stream, watch, &out, config.max_message_bytes).await;
                    return;
                }
            }
        }
        if !out.is_empty() {
            let written = write_out(&mut stream, watch, &out, config.write_timeout_ms).await;
            if let Some(queued) = first_answer.take() {
                core.metrics()
                    .record_stage(Stage::Reply, queued.elapsed().as_micros() as u64);
            }
            if written.is_err() {
                return;
            }
            out.clear();
            if out.capacity() > MAX_IDLE_BUFFER {
                // A large answer (metrics of many partitions) must not pin its memory on an idle connection.
                out = Vec::with_capacity(READ_CHUNK);
            }
        }
        if more_buffered {
            // The requests still buffered start after this write, not before it (it is the reply stage's).
            last_mark = Instant::now();
            continue;
        }
        if buf.is_empty() {
            buf.shrink_idle();
        }
        let idle = buf.is_empty();
        if idle && core.is_stopping() {
            return;
        }
        watch.idle.set(idle);
        watch.deadline_ms.set(match request_started_ms {
            Some(started) => started + config.header_read_timeout_ms,
            None => now_ms() + config.idle_timeout_ms,
        });
        let n = stream.read(buf.spare()).await.unwrap_or(0);
        read_at = Instant::now();
        last_mark = read_at;
        buf.filled(n);
        watch.idle.set(false);
        if n == 0 {
            if watch.expired.get() && request_started_ms.is_some() {
                bump_timed_out(&core);
                Response::error(408, "request_timeout", "request not received in time")
                    .encode(true, &mut out);
                // The sweeper has cut this connection already and will not again: the write has its own bound.
                let _ = glommio::timer::timeout(
                    Duration::from_millis(config.write_timeout_ms),
                    async {
                        stream.write_all(&out).await?;
                        stream.flush().await?;
                        Ok(())
                    },
                )
                .await;
            }
            return;
        }
        if request_started_ms.is_none() {
            request_started_ms = Some(now_ms());
        }
    }
}

/// Answers a connection over a connection cap with 503 and closes it, draining what the client sends meanwhile
/// (bounded in bytes and time) so it reads the answer instead of a reset. A TLS listener closes it without an
/// answer: the handshake an answer needs costs more than the refusal is meant to save.
pub async fn refuse(mut stream: TcpStream, tls: bool) {
    if tls {
        return;
    }
    let mut out = Vec::new();
    Response::error(503, "too_many_connections", "connection limit reached")
        .with_header("retry-after", 1)
        .encode(true, &mut out);
    if stream.write_all(&out).await.is_err() {
        return;
    }
    let _ = stream.shutdown(std::net::Shutdown::Write).await;
    let _ = glommio::timer::timeout(std::time::Duration::from_millis(LINGER_MS), async {
        let mut sink = vec![0u8; READ_CHUNK];
        let mut drained = 0usize;
        while drained < (1 << 20) {
            match stream.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => drained += n,
            }
        }
        Ok(())
    })
    .await;
}

/// How long a refused request's remaining bytes are drained before the socket closes.
const LINGER_MS: u64 = 2000;

/// Sends the error answer, then half-closes and drains what the client is still sending (bounded in bytes and by
/// the sweeper's deadline) before closing: closing with unread data would make the kernel reset the connection
/// and the client would see a reset instead of the 413/431.
async fn close_after_error(
    stream: &mut Stream,
    watch: &super::reaper::Watch,
    out: &[u8],
    max_body: usize,
) {
    // Bounded (the sweeper may have cut this connection already, and then does not again): the answer, then a
    // flush, TLS's close_notify and the end of the sending side.
    let sent = glommio::timer::timeout(Duration::from_millis(LINGER_MS), async {
        stream.write_all(out).await?;
        stream.close().await?;
        Ok(())
    })
    .await;
    if sent.is_err() {
        return;
    }
    watch.deadline_ms.set(now_ms() + LINGER_MS);
    let limit = max_body.saturating_mul(2).max(1 << 20);
    let mut sink = vec![0u8; READ_CHUNK];
    let mut drained = 0usize;
    while drained < limit {
        match stream.read(&mut sink).await {
            Ok(0) | Err(_) => break,
            Ok(n) => drained += n,
        }
    }
}

/// A queue-style or replay consume that may park (`wait` other than 0).
/// Without `wait`, a consume waits its topic's `receive_wait`.
fn is_long_poll(front: &Front, req: &request::Request) -> bool {
    if req.method == "GET" && req.path == "/consume" {
        return match req.query.get("wait") {
            Some(v) => crate::duration::parse_duration_ms(&v).is_ok_and(|ms| ms > 0),
            None => req.query.get("topic").is_some_and(|t| {
                front
                    .engine()
                    .topic(&t)
                    .is_ok_and(|t| t.config().receive_wait_ms > 0)
            }),
        };
    }
    crate::sqs::is_receive(req)
}

/// Runs `work` unless the client closes its side first, in which case `work` is dropped — cancelling a parked
/// consume before it leases anything — and None is returned. Plain text: the end is seen by a peek, and pipelined
/// bytes that arrive meanwhile stay in the socket for the next request. TLS: a client that closes cleanly sends an
/// encrypted close_notify before its end, which only rustls can read, so the watch reads through it: the end (or an
/// error) is a hang-up; what it reads instead (a pipelined request) goes into `buf` for the next request, and the
/// watch stops.
async fn unless_hung_up(
    stream: &mut Stream,
    buf: &mut ReadBuf,
    mut work: std::pin::Pin<&mut impl std::future::Future<Output = Response>>,
) -> Option<Response> {
    // Pinned by the caller and polled in place: the routes' future is large, and moving it (into a box or the
    // combinator) cost a memcpy per consume.
    // Most consumes find a message at once: they need no hang-up watch (a peek and its cancel on the ring).
    if let Some(response) = futures_lite::future::poll_once(work.as_mut()).await {
        return Some(response);
    }
    let hangup = async {
        if stream.is_tls() {
            // Cancel-safe: bytes taken off the socket stay in rustls (or in glommio's pending read).
            match stream.read(buf.spare()).await {
                Ok(0) | Err(_) => return None,
                Ok(n) => buf.filled(n),
            }
        } else {
            let mut probe = [0u8; 1];
            if let Ok(0) | Err(_) = stream.tcp().peek(&mut probe).await {
                return None;
            }
        }
        futures_lite::future::pending().await
    };
    futures_lite::future::or(async { Some(work.await) }, hangup).await
}

fn bump_timed_out(core: &Engine) {
    let c = &core.metrics().connections_timed_out;
    c.set(c.get() + 1);
}

fn parse_error_response(e: &ParseError) -> Response {
    match e {
        ParseError::Malformed(why) => Response::error(400, "bad_request", why),
        ParseError::HeadersTooLarge => Response::error(
            431,
            "headers_too_large",
            "request head exceeds the header limits",
        ),
        ParseError::BodyTooLarge {
            limit,
            batch: false,
        } => Response::error(
            413,
            "message_too_large",
            &format!("body exceeds {limit} bytes"),
        ),
        ParseError::BodyTooLarge { limit, batch: true } => Response::error(
            413,
            "batch_too_large",
            &format!("batch body exceeds {limit} bytes (max_batch_bytes)"),
        ),
        ParseError::UnsupportedTransferEncoding => Response::error(
            411,
            "length_required",
            "send the body with Content-Length; Transfer-Encoding is not accepted",
        ),
    }
}
