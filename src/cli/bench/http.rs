//! A minimal HTTP/1.1 keep-alive client on glommio for the load generator: one request in flight per connection,
//! responses parsed with httparse. Not a general client: it reads Content-Length bodies only (all berth sends).

use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::net::TcpStream;
use std::net::SocketAddr;
use std::time::Instant;

/// A response as the load generator needs it.
pub struct Reply {
    pub status: u16,
    pub receipt_handle: Option<String>,
    pub body_len: usize,
}

/// One keep-alive connection.
pub struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
    out: Vec<u8>,
    host: String,
}

impl Conn {
    pub async fn connect(addr: SocketAddr) -> std::io::Result<Conn> {
        let stream = TcpStream::connect(addr)
            .await
            .map_err(std::io::Error::from)?;
        let _ = stream.set_nodelay(true);
        Ok(Conn {
            stream,
            buf: Vec::with_capacity(16 << 10),
            out: Vec::with_capacity(4 << 10),
            host: addr.to_string(),
        })
    }

    /// Sends one request and waits for its response.
    pub async fn request(
        &mut self,
        method: &str,
        path: &str,
        body: &[u8],
    ) -> std::io::Result<Reply> {
        self.out.clear();
        self.push(method, path, body);
        self.stream.write_all(&self.out).await?;
        self.read_reply().await
    }

    /// Sends several requests in one write (HTTP pipelining) and returns each response with the time it arrived.
    pub async fn pipeline(
        &mut self,
        requests: &[(&str, &str, &[u8])],
    ) -> std::io::Result<Vec<(Reply, Instant)>> {
        self.out.clear();
        for (method, path, body) in requests {
            self.push(method, path, body);
        }
        self.stream.write_all(&self.out).await?;
        let mut replies = Vec::with_capacity(requests.len());
        for _ in requests {
            let reply = self.read_reply().await?;
            replies.push((reply, Instant::now()));
        }
        Ok(replies)
    }

    fn push(&mut self, method: &str, path: &str, body: &[u8]) {
        use std::io::Write;
        let _ = write!(
            self.out,
            "{method} {path} HTTP/1.1\r\nhost: {}\r\ncontent-length: {}\r\n\r\n",
            self.host,
            body.len()
        );
        self.out.extend_from_slice(body);
    }

    async fn read_reply(&mut self) -> std::io::Result<Reply> {
        loop {
            if let Some((reply, used)) = parse_reply(&self.buf)? {
                self.buf.drain(..used);
                return Ok(reply);
            }
            let len = self.buf.len();
            self.buf.resize(len + (16 << 10), 0);
            let n = self.stream.read(&mut self.buf[len..]).await?;
            self.buf.truncate(len + n);
            if n == 0 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "server closed",
                ));
            }
        }
    }
}

fn parse_reply(buf: &[u8]) -> std::io::Result<Option<(Reply, usize)>> {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut response = httparse::Response::new(&mut headers);
    let head = match response.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                e.to_string(),
            ))
        }
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
    if buf.len() < head + content_length {
        return Ok(None);
    }
    Ok(Some((
        Reply {
            status,
            receipt_handle,
            body_len: content_length,
        },
        head + content_length,
    )))
}
