//! Request parsing: httparse for the head, then the limits berth enforces (header bytes, header count, body size,
//! Content-Length only). Pure functions over a byte buffer, so they can be fuzzed without a socket.

use bytes::Bytes;

/// A parsed request head plus its body.
#[derive(Debug, Clone)]
pub struct Request {
    /// One of the standard methods, or "" for any other (which no route allows: 405).
    pub method: &'static str,
    /// The path without the query.
    pub path: String,
    /// The query string (after '?'), still percent-encoded, with its pairs found (one pass at the parse serves
    /// every lookup after it; it reads as the raw text).
    pub query: crate::ops::params::Query,
    pub body: Bytes,
    /// The client asked to close after this request (or spoke HTTP/1.0 without keep-alive).
    pub close: bool,
    /// The Authorization header, if any.
    pub authorization: Option<String>,
    /// The Host header, if any.
    pub host: Option<String>,
    /// The Origin header, if any (sent by browsers).
    pub origin: Option<String>,
    /// The Content-Type header, if any (batch framing).
    pub content_type: Option<String>,
    /// The Accept header, if any (consume batch framing).
    pub accept: Option<String>,
    /// The `attributes` header, if any (a produce's message attributes, `ops::attributes`).
    pub attributes: Option<String>,
    /// The `X-Amz-Target` header, if any (the SQS face's JSON protocol: `AmazonSQS.<Action>`, `sqs/`).
    pub amz_target: Option<String>,
    /// Every header as received, kept only for a request SigV4 may have signed (one with `X-Amz-Target`, a form
    /// body, or an `AWS4-HMAC-SHA256` authorization): the SQS face verifies the signature over them.
    pub signed_headers: Vec<(String, Vec<u8>)>,
}

/// Limits applied while parsing.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_header_bytes: usize,
    pub max_headers: usize,
    /// A single message's body (`max_message_bytes`).
    pub max_body_bytes: usize,
    /// A batch body: a produce in a batch media type, or a settle's list of handles (`max_batch_bytes`).
    pub max_batch_bytes: usize,
}

/// Why a request cannot be served; each ends the connection after the error response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParseError {
    /// 400: not HTTP, or a malformed head or Content-Length.
    Malformed(String),
    /// 431: the head is larger than max_header_bytes or has more than max_headers headers.
    HeadersTooLarge,
    /// 413: Content-Length above max_body_bytes (or, for a batch, max_batch_bytes).
    BodyTooLarge { limit: usize, batch: bool },
    /// 411/501: Transfer-Encoding bodies are not accepted; send Content-Length.
    UnsupportedTransferEncoding,
}

/// Outcome of parsing the front of a buffer. (`Partial` is small and transient: boxing the request to even out
/// the variants would cost an allocation per request for nothing.)
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
pub enum Parsed {
    /// A whole request and the number of buffer bytes it used.
    Complete(Request, usize),
    /// More bytes are needed; `head_done` says whether the head is complete (only the body is missing), and
    /// `expect_continue` whether the client waits for `100 Continue` before sending that body.
    Partial {
        head_done: bool,
        expect_continue: bool,
    },
}

/// Parses one request from the front of `buf`.
pub fn parse(buf: &[u8], limits: &Limits) -> Result<Parsed, ParseError> {
    parse_inner(buf, limits, false)
}

/// The head of the request at the front of `buf` (its body empty), once the head is complete and within the
/// limits: what is checked before any of a body is waited for (the bearer token, the host), so an unauthenticated
/// client never has more than one read of its body buffered, nor gets `100 Continue`.
pub fn parse_head(buf: &[u8], limits: &Limits) -> Result<Option<Request>, ParseError> {
    match parse_inner(buf, limits, true)? {
        Parsed::Complete(head, _) => Ok(Some(head)),
        Parsed::Partial { .. } => Ok(None),
    }
}

fn parse_inner(buf: &[u8], limits: &Limits, head_only: bool) -> Result<Parsed, ParseError> {
    if buf.is_empty() {
        // Between requests: nothing to look at (the connection loop asks once more after each request).
        return Ok(Parsed::Partial {
            head_done: false,
            expect_continue: false,
        });
    }
    // Headers on the stack up to 64 (the default limit), else on the heap; left uninitialised, as httparse writes
    // each one before it is read (zeroing 64 of them cost more than parsing a short head).
    let mut on_stack = [const { std::mem::MaybeUninit::<httparse::Header>::uninit() }; 64];
    let mut on_heap = Vec::new();
    let headers: &mut [std::mem::MaybeUninit<httparse::Header>] =
        if limits.max_headers <= on_stack.len() {
            &mut on_stack[..limits.max_headers]
        } else {
            on_heap.resize_with(limits.max_headers, std::mem::MaybeUninit::uninit);
            &mut on_heap
        };
    let mut req = httparse::Request::new(&mut []);
    let head_len = match req.parse_with_uninit_headers(buf, headers) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => {
            if buf.len() > limits.max_header_bytes {
                return Err(ParseError::HeadersTooLarge);
            }
            return Ok(Parsed::Partial {
                head_done: false,
                expect_continue: false,
            });
        }
        Err(httparse::Error::TooManyHeaders) => return Err(ParseError::HeadersTooLarge),
        Err(e) => return Err(ParseError::Malformed(format!("malformed request: {e}"))),
    };
    if head_len > limits.max_header_bytes {
        return Err(ParseError::HeadersTooLarge);
    }
    let version = req.version.unwrap_or(1);
    let mut content_length: Option<usize> = None;
    let mut close = version == 0;
    let mut authorization = None;
    let mut host = None;
    let mut origin = None;
    let mut content_type = None;
    let mut accept = None;
    let mut attributes = None;
    let mut amz_target = None;
    let mut expect_continue = false;
    for h in req.headers.iter() {
        if h.name.eq_ignore_ascii_case("content-length") {
            let value = content_length_of(h.value)
                .ok_or_else(|| ParseError::Malformed("bad Content-Length".into()))?;
            if content_length.is_some_and(|v| v != value) {
                return Err(ParseError::Malformed(
                    "conflicting Content-Length headers".into(),
                ));
            }
            content_length = Some(value);
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            return Err(ParseError::UnsupportedTransferEncoding);
        } else if h.name.eq_ignore_ascii_case("connection") {
            if contains_ignore_case(h.value, b"close") {
                close = true;
            } else if contains_ignore_case(h.value, b"keep-alive") {
                close = false;
            }
        } else if h.name.eq_ignore_ascii_case("expect") {
            expect_continue = h.value.eq_ignore_ascii_case(b"100-continue");
        } else if h.name.eq_ignore_ascii_case("authorization") {
            authorization = Some(text_of(h.value));
        } else if h.name.eq_ignore_ascii_case("host") {
            host = Some(text_of(h.value));
        } else if h.name.eq_ignore_ascii_case("origin") {
            origin = Some(text_of(h.value));
        } else if h.name.eq_ignore_ascii_case("content-type") {
            content_type = Some(text_of(h.value));
        } else if h.name.eq_ignore_ascii_case("accept") {
            accept = Some(text_of(h.value));
        } else if h.name.eq_ignore_ascii_case("attributes") {
            attributes = Some(text_of(h.value));
        } else if h.name.eq_ignore_ascii_case("x-amz-target") {
            amz_target = Some(text_of(h.value));
        }
    }
    let body_len = content_length.unwrap_or(0);
    let signed_headers = if amz_target.is_some()
        || authorization
            .as_deref()
            .is_some_and(|a| a.starts_with("AWS4-HMAC-SHA256"))
        || content_type
            .as_deref()
            .is_some_and(|t| t.starts_with("application/x-www-form-urlencoded"))
    {
        // Bounded by max_headers and max_header_bytes.
        req.headers
            .iter()
            .map(|h| (h.name.to_string(), h.value.to_vec()))
            .collect()
    } else {
        Vec::new()
    };
    let target = req.path.unwrap_or("/");
    let batch = is_batch_body(target, content_type.as_deref());
    let limit = if batch {
        limits.max_batch_bytes
    } else {
        limits.max_body_bytes
    };
    if body_len > limit {
        return Err(ParseError::BodyTooLarge { limit, batch });
    }
    let total = if head_only {
        head_len
    } else {
        head_len + body_len
    };
    if buf.len() < total {
        return Ok(Parsed::Partial {
            head_done: true,
            expect_continue,
        });
    }
    // A byte search: `?` is ASCII, so the cut is a char boundary.
    let (path, query) = match target.bytes().position(|b| b == b'?') {
        Some(q) => (&target[..q], &target[q + 1..]),
        None => (target, ""),
    };
    Ok(Parsed::Complete(
        Request {
            method: standard_method(req.method.unwrap_or("")),
            path: path.to_string(),
            query: crate::ops::params::Query::new(query),
            body: Bytes::copy_from_slice(&buf[head_len..total]),
            close,
            authorization,
            host,
            origin,
            content_type,
            accept,
            attributes,
            amz_target,
            signed_headers,
        },
        total,
    ))
}

/// The method as a static string (no allocation per request); "" for a method berth has no route for.
fn standard_method(method: &str) -> &'static str {
    const METHODS: [&str; 9] = [
        "GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS", "CONNECT", "TRACE",
    ];
    METHODS.into_iter().find(|m| *m == method).unwrap_or("")
}

/// A Content-Length value: 1 to 19 ASCII digits (no sign, no space), within `usize`.
fn content_length_of(value: &[u8]) -> Option<usize> {
    if value.is_empty() || value.len() > 19 {
        return None;
    }
    value.iter().try_fold(0usize, |n, &b| {
        b.is_ascii_digit()
            .then(|| n.checked_mul(10)?.checked_add(usize::from(b - b'0')))
            .flatten()
    })
}

/// A header value as text: valid UTF-8 as is (one copy), anything else with replacement characters.
fn text_of(value: &[u8]) -> String {
    match std::str::from_utf8(value) {
        Ok(text) => text.to_owned(),
        Err(_) => String::from_utf8_lossy(value).into_owned(),
    }
}

/// Whether `needle` (lower-case ASCII) occurs in `haystack`, ignoring ASCII case.
fn contains_ignore_case(haystack: &[u8], needle: &[u8]) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w.eq_ignore_ascii_case(needle))
}

/// A body of several records (a produce in a batch media type) or of receipt handles (a settle): bounded by
/// `max_batch_bytes` instead of `max_message_bytes`.
fn is_batch_body(target: &str, content_type: Option<&str>) -> bool {
    use crate::ops::params::Media;
    let path = target.split('?').next().unwrap_or("");
    matches!(path, "/ack" | "/nack" | "/extend")
        || matches!(Media::of(content_type), Media::Ndjson | Media::Frames)
        || crate::sqs::is_sqs_body(path, content_type)
}

/// Decoded query parameters in order.
pub fn query_pairs(query: &str) -> Vec<(String, String)> {
    form_urlencoded::parse(query.as_bytes())
        .into_owned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        max_header_bytes: 1024,
        max_headers: 8,
        max_body_bytes: 16,
        max_batch_bytes: 32,
    };

    fn complete(buf: &[u8]) -> (Request, usize) {
        match parse(buf, &LIMITS) {
            Ok(Parsed::Complete(r, n)) => (r, n),
            other => panic!("not complete: {other:?}"),
        }
    }

    #[test]
    fn pipelined_requests_parse_one_at_a_time() {
        let buf = b"POST /produce?topic=a HTTP/1.1\r\nContent-Length: 3\r\n\r\nabcGET /health HTTP/1.1\r\n\r\n";
        let (first, used) = complete(buf);
        assert_eq!(
            (first.method, first.path.as_str(), first.query.raw()),
            ("POST", "/produce", "topic=a")
        );
        assert_eq!(&first.body[..], b"abc");
        let (second, rest) = complete(&buf[used..]);
        assert_eq!(second.path, "/health");
        assert_eq!(used + rest, buf.len());
    }

    #[test]
    fn a_body_still_arriving_is_partial() {
        let r = parse(b"POST /p HTTP/1.1\r\nContent-Length: 5\r\n\r\nab", &LIMITS).unwrap();
        assert!(matches!(
            r,
            Parsed::Partial {
                head_done: true,
                expect_continue: false
            }
        ));
    }

    #[test]
    fn limits_are_enforced() {
        let big = format!("GET / HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(2000));
        assert_eq!(
            parse(big.as_bytes(), &LIMITS).unwrap_err(),
            ParseError::HeadersTooLarge
        );
        let many: String = (0..9).map(|i| format!("H{i}: v\r\n")).collect();
        let many = format!("GET / HTTP/1.1\r\n{many}\r\n");
        assert_eq!(
            parse(many.as_bytes(), &LIMITS).unwrap_err(),
            ParseError::HeadersTooLarge
        );
        let body = b"POST / HTTP/1.1\r\nContent-Length: 17\r\n\r\n";
        assert_eq!(
            parse(body, &LIMITS).unwrap_err(),
            ParseError::BodyTooLarge {
                limit: 16,
                batch: false
            }
        );
        let batch = b"POST /produce HTTP/1.1\r\nContent-Type: application/x-ndjson\r\nContent-Length: 33\r\n\r\n";
        assert_eq!(
            parse(batch, &LIMITS).unwrap_err(),
            ParseError::BodyTooLarge {
                limit: 32,
                batch: true
            }
        );
    }

    #[test]
    fn lying_or_garbage_content_length_is_refused() {
        for cl in ["-1", "abc", "1 2", "99999999999999999999999", ""] {
            let req = format!("POST / HTTP/1.1\r\nContent-Length: {cl}\r\n\r\n");
            assert!(
                matches!(
                    parse(req.as_bytes(), &LIMITS),
                    Err(ParseError::Malformed(_))
                ),
                "{cl}"
            );
        }
        let two = b"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n";
        assert!(matches!(parse(two, &LIMITS), Err(ParseError::Malformed(_))));
    }

    #[test]
    fn garbage_is_malformed_not_a_panic() {
        assert!(matches!(
            parse(b"\x00\x01\x02 garbage\r\n\r\n", &LIMITS),
            Err(ParseError::Malformed(_))
        ));
        assert!(matches!(
            parse(b"GET", &LIMITS),
            Ok(Parsed::Partial {
                head_done: false,
                ..
            })
        ));
    }

    #[test]
    fn connection_close_and_http10_are_noticed() {
        assert!(
            complete(b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n")
                .0
                .close
        );
        assert!(complete(b"GET / HTTP/1.0\r\n\r\n").0.close);
        assert!(
            !complete(b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
                .0
                .close
        );
    }

    #[test]
    fn query_is_percent_decoded() {
        assert_eq!(
            query_pairs("topic=a%2Eb&key=x+y"),
            vec![("topic".into(), "a.b".into()), ("key".into(), "x y".into())]
        );
    }
}
