//! Responses and their wire encoding. Every error body is `{"error": code, "message": text}`.

use bytes::Bytes;

/// An HTTP response before encoding.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub content_type: &'static str,
    /// Extra headers (Receipt-Handle, Partition, Offset, Retry-After, Allow, ...).
    pub headers: Vec<(&'static str, String)>,
    pub body: Bytes,
    /// Close the connection after this response (a refused credential, a refused host).
    pub close: bool,
}

impl Response {
    pub fn empty(status: u16) -> Response {
        Response {
            status,
            content_type: "text/plain",
            headers: Vec::new(),
            body: Bytes::new(),
            close: false,
        }
    }

    pub fn json(status: u16, value: &serde_json::Value) -> Response {
        Response {
            status,
            content_type: "application/json",
            headers: Vec::new(),
            body: Bytes::from(value.to_string()),
            close: false,
        }
    }

    pub fn bytes(status: u16, content_type: &'static str, body: Bytes) -> Response {
        Response {
            status,
            content_type,
            headers: Vec::new(),
            body,
            close: false,
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

    pub fn with_header(mut self, name: &'static str, value: impl ToString) -> Response {
        self.headers.push((name, value.to_string()));
        self
    }

    /// Appends the encoded response to `out`. A 204 carries no Content-Length (RFC 9110 §8.6).
    pub fn encode(&self, close: bool, out: &mut Vec<u8>) {
        use std::io::Write;
        let _ = write!(out, "HTTP/1.1 {} {}\r\n", self.status, reason(self.status));
        if self.status != 204 {
            let _ = write!(out, "content-length: {}\r\n", self.body.len());
        }
        if !self.body.is_empty() {
            let _ = write!(out, "content-type: {}\r\n", self.content_type);
        }
        for (name, value) in &self.headers {
            let _ = write!(out, "{name}: {value}\r\n");
        }
        if close || self.close {
            out.extend_from_slice(b"connection: close\r\n");
        }
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(&self.body);
    }
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
