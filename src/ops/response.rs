//! Responses and their wire encoding. Every error body is `{"error": code, "message": text}`.

use bytes::Bytes;

/// An HTTP response before encoding.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub content_type: &'static str,
    /// Extra header lines, encoded (`name: value\r\n` each: Receipt-Handle, Partition, Offset, Retry-After,
    /// Allow, ...), in one buffer so a response's headers cost one allocation, not one per value.
    headers: Vec<u8>,
    pub body: Bytes,
    /// Close the connection after this response (a refused credential, a refused host).
    pub close: bool,
    /// Time a long-poll spent parked waiting for messages, in µs: left out of the request's latency.
    pub parked_us: u64,
}

impl Response {
    pub fn empty(status: u16) -> Response {
        Response {
            status,
            content_type: "text/plain",
            headers: Vec::new(),
            body: Bytes::new(),
            close: false,
            parked_us: 0,
        }
    }

    pub fn json(status: u16, value: &serde_json::Value) -> Response {
        Response {
            status,
            content_type: "application/json",
            headers: Vec::new(),
            body: Bytes::from(value.to_string()),
            close: false,
            parked_us: 0,
        }
    }

    pub fn bytes(status: u16, content_type: &'static str, body: Bytes) -> Response {
        Response {
            status,
            content_type,
            headers: Vec::new(),
            body,
            close: false,
            parked_us: 0,
        }
    }

    pub fn error(status: u16, code: &str, message: &str) -> Response {
        Response::json(
            status,
            &serde_json::json!({"error": code, "message": message}),
        )
    }

    /// Marks the response as the connection's last.
    pub fn closing(mut self) -> Response {
        self.close = true;
        self
    }

    pub fn with_header(mut self, name: &'static str, value: impl std::fmt::Display) -> Response {
        use std::io::Write;
        if self.headers.is_empty() {
            self.headers.reserve(128);
        }
        self.headers.extend_from_slice(name.as_bytes());
        self.headers.extend_from_slice(b": ");
        let _ = write!(self.headers, "{value}");
        self.headers.extend_from_slice(b"\r\n");
        self
    }

    /// A header whose value is unsigned integers in decimal joined by `separator` (an offset; a receipt handle's
    /// three parts, `ReceiptHandle::parts`): the same bytes as `with_header` with their text, written without the
    /// formatting machinery (a consume's reply carries four such headers).
    pub fn with_header_decimals(
        mut self,
        name: &'static str,
        values: &[u64],
        separator: u8,
    ) -> Response {
        if self.headers.is_empty() {
            self.headers.reserve(128);
        }
        self.headers.extend_from_slice(name.as_bytes());
        self.headers.extend_from_slice(b": ");
        for (i, &n) in values.iter().enumerate() {
            if i > 0 {
                self.headers.push(separator);
            }
            push_decimal(&mut self.headers, n);
        }
        self.headers.extend_from_slice(b"\r\n");
        self
    }

    /// The value of extra header `name`, if set (headers set with [`Response::with_header`]; for tests).
    #[cfg(test)]
    pub fn header(&self, name: &str) -> Option<&str> {
        let text = std::str::from_utf8(&self.headers).ok()?;
        text.split("\r\n").find_map(|line| {
            let (n, v) = line.split_once(": ")?;
            n.eq_ignore_ascii_case(name).then_some(v)
        })
    }

    /// Appends the encoded response to `out`. A 204 carries no Content-Length (RFC 9110 §8.6).
    pub fn encode(&self, close: bool, out: &mut Vec<u8>) {
        out.reserve(self.headers.len() + self.body.len() + 96);
        out.extend_from_slice(b"HTTP/1.1 ");
        push_decimal(out, u64::from(self.status));
        out.push(b' ');
        out.extend_from_slice(reason(self.status).as_bytes());
        out.extend_from_slice(b"\r\n");
        if self.status != 204 {
            out.extend_from_slice(b"content-length: ");
            push_decimal(out, self.body.len() as u64);
            out.extend_from_slice(b"\r\n");
        }
        if !self.body.is_empty() {
            out.extend_from_slice(b"content-type: ");
            out.extend_from_slice(self.content_type.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(&self.headers);
        if close || self.close {
            out.extend_from_slice(b"connection: close\r\n");
        }
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(&self.body);
    }
}

/// "00", "01", ..., "99": two digits per division (as the `itoa` crate does).
const DIGIT_PAIRS: [u8; 200] = {
    let mut pairs = [0u8; 200];
    let mut i = 0;
    while i < 100 {
        pairs[2 * i] = b'0' + (i / 10) as u8;
        pairs[2 * i + 1] = b'0' + (i % 10) as u8;
        i += 1;
    }
    pairs
};

/// `n` in decimal ASCII, without the formatting machinery (a response encodes two or three numbers).
pub(crate) fn push_decimal(out: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    while n >= 100 {
        let pair = (n % 100) as usize * 2;
        n /= 100;
        at -= 2;
        digits[at..at + 2].copy_from_slice(&DIGIT_PAIRS[pair..pair + 2]);
    }
    if n >= 10 {
        let pair = n as usize * 2;
        at -= 2;
        digits[at..at + 2].copy_from_slice(&DIGIT_PAIRS[pair..pair + 2]);
    } else {
        at -= 1;
        digits[at] = b'0' + n as u8;
    }
    out.extend_from_slice(&digits[at..]);
}

/// How many bytes [`push_decimal`] writes for `n`.
pub(crate) fn decimal_len(n: u64) -> usize {
    n.checked_ilog10().map_or(1, |l| l as usize + 1)
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        201 => "Created",
        204 => "No Content",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        410 => "Gone",
        411 => "Length Required",
        413 => "Payload Too Large",
        422 => "Unprocessable Entity",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        507 => "Insufficient Storage",
        _ => "Unknown",
    }
}

/// A `200` with `value` as its JSON body.
pub fn json_reply(value: &impl serde::Serialize) -> Response {
    let body = serde_json::to_vec(value).expect("an answer serialises");
    Response::bytes(200, "application/json", body.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal_len_is_what_push_decimal_writes() {
        for n in [
            0,
            1,
            9,
            10,
            99,
            100,
            999_999,
            1_000_000,
            u64::from(u32::MAX),
            u64::MAX,
        ] {
            let mut out = Vec::new();
            push_decimal(&mut out, n);
            assert_eq!(out, n.to_string().as_bytes());
            assert_eq!(decimal_len(n), out.len(), "{n}");
        }
        let around_powers = (0..20u32).flat_map(|e| {
            let p = 10u64.pow(e);
            [p - 1, p, p + 1, p.saturating_mul(7) / 3]
        });
        for n in (0..100_000u64).chain(around_powers).chain([u64::MAX - 1]) {
            let mut out = Vec::new();
            push_decimal(&mut out, n);
            assert_eq!(out, n.to_string().as_bytes(), "{n}");
        }
    }

    #[test]
    fn encoding_writes_status_length_type_headers_then_body() {
        let mut out = Vec::new();
        Response::bytes(200, "application/octet-stream", Bytes::from_static(b"hi"))
            .with_header("receipt-handle", "0:7:18446744073709551615")
            .with_header("offset", 7u64)
            .encode(false, &mut out);
        assert_eq!(
            out,
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-type: application/octet-stream\r\n\
              receipt-handle: 0:7:18446744073709551615\r\noffset: 7\r\n\r\nhi"
                .to_vec()
        );
        let mut out = Vec::new();
        Response::empty(204).encode(true, &mut out);
        assert_eq!(
            out,
            b"HTTP/1.1 204 No Content\r\nconnection: close\r\n\r\n".to_vec()
        );
        let mut digits = Vec::new();
        for n in [0u64, 9, 10, 1234567890, u64::MAX] {
            digits.clear();
            push_decimal(&mut digits, n);
            assert_eq!(digits, n.to_string().into_bytes());
        }
    }

    #[test]
    fn decimal_headers_are_the_bytes_of_their_text() {
        for values in [
            &[][..],
            &[0],
            &[7, 0, u64::MAX],
            &[3, 41, 459798116755456001],
        ] {
            let text = values
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(":");
            let (mut fast, mut slow) = (Vec::new(), Vec::new());
            Response::empty(200)
                .with_header_decimals("receipt-handle", values, b':')
                .encode(false, &mut fast);
            Response::empty(200)
                .with_header("receipt-handle", text)
                .encode(false, &mut slow);
            assert_eq!(fast, slow, "{values:?}");
        }
    }

    #[test]
    fn header_finds_a_value_by_name() {
        let r = Response::empty(503)
            .with_header("retry-after", 1)
            .with_header("allow", "GET, PUT");
        assert_eq!(r.header("Retry-After"), Some("1"));
        assert_eq!(r.header("allow"), Some("GET, PUT"));
        assert_eq!(r.header("offset"), None);
    }
}
