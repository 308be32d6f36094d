//! One client connection: read, parse every complete request in the buffer (pipelining), answer them in order,
//! write the answers in one go, repeat. Enforces the header-read and idle timeouts and closes at shutdown.

use super::request::{self, Limits, ParseError, Parsed};
use super::response::Response;
use super::routes;
use crate::broker::core::Core;
use bytes::{Buf, BytesMut};
use futures_lite::{future, AsyncReadExt, AsyncWriteExt};
use glommio::net::TcpStream;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// Bytes read per socket read.
const READ_CHUNK: usize = 16 << 10;

/// What one read attempt produced.
enum ReadOutcome {
    Data(usize),
    Closed,
    TimedOut,
    Stopping,
}

/// Serves a connection until the client closes, a limit is hit, or the server stops.
pub async fn serve(core: Rc<Core>, mut stream: TcpStream) {
    let _ = stream.set_nodelay(true);
    let config = core.config.clone();
    let limits = Limits {
        max_header_bytes: config.max_header_bytes,
        max_headers: config.max_headers,
        max_body_bytes: config.max_message_bytes,
    };
    let header_timeout = Duration::from_millis(config.header_read_timeout_ms);
    let idle_timeout = Duration::from_millis(config.idle_timeout_ms);
    let mut buf = BytesMut::with_capacity(READ_CHUNK);
    let mut out: Vec<u8> = Vec::with_capacity(READ_CHUNK);
    // When the first byte of the request being read arrived (None while idle between requests).
    let mut request_started: Option<Instant> = None;
    // `100 Continue` was already sent for the request being read.
    let mut continued = false;
    loop {
        // Answer every complete request already buffered, in order.
        loop {
            match request::parse(&buf, &limits) {
                Ok(Parsed::Complete(req, used)) => {
                    buf.advance(used);
                    continued = false;
                    request_started = (!buf.is_empty()).then(Instant::now);
                    let started = Instant::now();
                    let close = req.close;
                    let response = routes::handle(&core, req).await;
                    core.metrics.record(started.elapsed().as_micros() as u64);
                    let close = close || core.stopping.get();
                    response.encode(close, &mut out);
                    if close {
                        let _ = stream.write_all(&out).await;
                        return;
                    }
                }
                Ok(Parsed::Partial {
                    expect_continue, ..
                }) => {
                    if expect_continue && !continued {
                        out.extend_from_slice(b"HTTP/1.1 100 Continue\r\n\r\n");
                        continued = true;
                    }
                    break;
                }
                Err(e) => {
                    parse_error_response(&e).encode(true, &mut out);
                    if e == ParseError::HeadersTooLarge {
                        bump_timed_out(&core);
                    }
                    let _ = stream.write_all(&out).await;
                    return;
                }
            }
        }
        if !out.is_empty() {
            if stream.write_all(&out).await.is_err() {
                return;
            }
            out.clear();
        }
        let budget = match request_started {
            Some(started) => header_timeout.saturating_sub(started.elapsed()),
            None => idle_timeout,
        };
        match read_some(&core, &mut stream, &mut buf, budget).await {
            ReadOutcome::Data(_) => {
                if request_started.is_none() {
                    request_started = Some(Instant::now());
                }
            }
            ReadOutcome::Closed | ReadOutcome::Stopping => return,
            ReadOutcome::TimedOut => {
                if request_started.is_some() {
                    bump_timed_out(&core);
                    Response::error(408, "request_timeout", "request not received in time")
                        .encode(true, &mut out);
                    let _ = stream.write_all(&out).await;
                }
                return;
            }
        }
    }
}

fn bump_timed_out(core: &Core) {
    let c = &core.metrics.connections_timed_out;
    c.set(c.get() + 1);
}

/// Reads into the spare end of `buf`, racing the timeout and (while idle) the server's stop signal.
async fn read_some(
    core: &Core,
    stream: &mut TcpStream,
    buf: &mut BytesMut,
    budget: Duration,
) -> ReadOutcome {
    if core.stopping.get() && buf.is_empty() {
        return ReadOutcome::Stopping;
    }
    let len = buf.len();
    buf.resize(len + READ_CHUNK, 0);
    let stop = core.stop_event.listen();
    let idle = len == 0;
    let outcome = future::or(
        async {
            match glommio::timer::timeout(budget, async {
                stream
                    .read(&mut buf[len..])
                    .await
                    .map_err(glommio::GlommioError::from)
            })
            .await
            {
                Ok(0) => ReadOutcome::Closed,
                Ok(n) => ReadOutcome::Data(n),
                Err(glommio::GlommioError::TimedOut(_)) => ReadOutcome::TimedOut,
                Err(_) => ReadOutcome::Closed,
            }
        },
        async {
            if idle && !core.stopping.get() {
                stop.await;
            } else {
                future::pending::<()>().await;
            }
            ReadOutcome::Stopping
        },
    )
    .await;
    let got = if let ReadOutcome::Data(n) = outcome {
        n
    } else {
        0
    };
    buf.truncate(len + got);
    outcome
}

fn parse_error_response(e: &ParseError) -> Response {
    match e {
        ParseError::Malformed(why) => Response::error(400, "bad_request", why),
        ParseError::HeadersTooLarge => Response::error(
            431,
            "headers_too_large",
            "request head exceeds the header limits",
        ),
        ParseError::BodyTooLarge { limit } => Response::error(
            413,
            "message_too_large",
            &format!("body exceeds {limit} bytes"),
        ),
        ParseError::UnsupportedTransferEncoding => Response::error(
            411,
            "length_required",
            "send the body with Content-Length; Transfer-Encoding is not accepted",
        ),
    }
}
