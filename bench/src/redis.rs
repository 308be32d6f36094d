//! The Redis Streams baseline, spoken in RESP2 (`resp`) over glommio TCP: produce = `XADD stream * body <bytes>`,
//! consume = `XREADGROUP GROUP g <consumer> COUNT n [BLOCK ms] STREAMS stream >`, ack = `XACK stream g id...`.
//! With `--batch N`: N XADDs pipelined in one write, `COUNT N`, one XACK of N ids.

use super::resp::{self, Value};
use super::{Consumed, Driver, Pipelined};
use futures_lite::AsyncWriteExt;
use glommio::net::TcpStream;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The consumer group the bench uses.
pub const GROUP: &str = "g";

/// Largest reply the client buffers without finding its end (a COUNT 1000 read of 1 MiB messages would not fit).
pub const MAX_REPLY_BYTES: usize = 64 << 20;

/// One Redis connection with a reply buffer.
pub struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
    out: Vec<u8>,
}

impl Conn {
    pub async fn connect(addr: SocketAddr) -> io::Result<Conn> {
        let stream = super::wire::connect(addr).await?;
        Ok(Conn {
            stream,
            buf: Vec::with_capacity(64 << 10),
            out: Vec::with_capacity(4 << 10),
        })
    }

    async fn send(&mut self) -> io::Result<()> {
        self.stream.write_all(&self.out).await
    }

    async fn read_value(&mut self) -> io::Result<Value> {
        loop {
            if let Some((value, used)) = resp::parse(&self.buf)? {
                self.buf.drain(..used);
                return Ok(value);
            }
            super::wire::read_more(
                &mut self.stream,
                &mut self.buf,
                64 << 10,
                MAX_REPLY_BYTES,
                "redis",
            )
            .await?;
        }
    }
}

/// The Redis driver for one connection (its own consumer name in the group).
pub struct Redis {
    conn: Conn,
    stream: String,
    batch: usize,
    message: Arc<Vec<u8>>,
    /// One encoded `XADD stream * body <message>`.
    xadd: Vec<u8>,
    /// The encoded `XREADGROUP` for a full batch.
    xreadgroup: Vec<u8>,
}

impl Redis {
    /// `block_ms`: the XREADGROUP `BLOCK` (None: return at once when the stream has nothing new).
    pub async fn connect(
        addr: SocketAddr,
        stream: &str,
        consumer: &str,
        batch: usize,
        message: Arc<Vec<u8>>,
        block_ms: Option<u64>,
    ) -> io::Result<Redis> {
        let mut xadd = Vec::new();
        resp::encode_command(
            &mut xadd,
            &[b"XADD", stream.as_bytes(), b"*", b"body", &message],
        );
        Ok(Redis {
            conn: Conn::connect(addr).await?,
            xreadgroup: xreadgroup(stream, consumer, batch, block_ms),
            stream: stream.to_string(),
            batch,
            message,
            xadd,
        })
    }

    fn push_xadds(&mut self, n: usize) {
        for _ in 0..n {
            self.conn.out.extend_from_slice(&self.xadd);
        }
    }

    fn push_xack(&mut self, ids: &[Vec<u8>]) {
        let mut args: Vec<&[u8]> = Vec::with_capacity(ids.len() + 3);
        args.extend([b"XACK".as_slice(), self.stream.as_bytes(), GROUP.as_bytes()]);
        args.extend(ids.iter().map(Vec::as_slice));
        resp::encode_command(&mut self.conn.out, &args);
    }

    /// Reads `n` XADD replies: how many were entry ids.
    async fn read_xadds(&mut self, n: usize) -> io::Result<usize> {
        let mut added = 0;
        for _ in 0..n {
            added += usize::from(matches!(self.conn.read_value().await?, Value::Bulk(_)));
        }
        Ok(added)
    }

    async fn read_xack(&mut self) -> io::Result<usize> {
        Ok(match self.conn.read_value().await? {
            Value::Integer(n) => usize::try_from(n).unwrap_or(0),
            _ => 0,
        })
    }

    async fn read_xreadgroup(&mut self) -> io::Result<Consumed<Vec<u8>>> {
        let reply = self.conn.read_value().await?;
        Ok(entries(reply, self.message.len()))
    }
}

/// `XREADGROUP GROUP g <consumer> COUNT n [BLOCK ms] STREAMS stream >`, encoded.
fn xreadgroup(stream: &str, consumer: &str, count: usize, block_ms: Option<u64>) -> Vec<u8> {
    let count = count.to_string();
    let block = block_ms.map(|ms| ms.to_string());
    let mut args: Vec<&[u8]> = vec![
        b"XREADGROUP",
        b"GROUP",
        GROUP.as_bytes(),
        consumer.as_bytes(),
        b"COUNT",
        count.as_bytes(),
    ];
    if let Some(ms) = &block {
        args.extend([b"BLOCK".as_slice(), ms.as_bytes()]);
    }
    args.extend([b"STREAMS".as_slice(), stream.as_bytes(), b">"]);
    let mut out = Vec::new();
    resp::encode_command(&mut out, &args);
    out
}

/// The entries of an XREADGROUP reply: `[[stream, [[id, [field, value, ...]], ...]]]`, or nil when nothing came.
fn entries(reply: Value, message_len: usize) -> Consumed<Vec<u8>> {
    let mut c = Consumed {
        handles: Vec::new(),
        intact: 0,
        ok: false,
        empty: matches!(reply, Value::NilArray | Value::NilBulk),
    };
    let Value::Array(streams) = reply else {
        return c;
    };
    c.ok = true;
    for s in streams {
        let Value::Array(mut pair) = s else {
            c.ok = false;
            continue;
        };
        let Some(Value::Array(items)) = pair.pop() else {
            c.ok = false;
            continue;
        };
        for item in items {
            let Value::Array(mut entry) = item else {
                c.ok = false;
                continue;
            };
            let fields = entry.pop();
            let Some(Value::Bulk(id)) = entry.pop() else {
                c.ok = false;
                continue;
            };
            let body = match &fields {
                Some(Value::Array(f)) => f
                    .chunks_exact(2)
                    .find(|kv| kv[0].as_bytes() == Some(b"body".as_slice()))
                    .and_then(|kv| kv[1].as_bytes()),
                _ => None,
            };
            c.intact += usize::from(body.is_some_and(|b| b.len() == message_len));
            c.handles.push(id);
        }
    }
    c.empty = c.handles.is_empty() && c.ok;
    c
}

impl Driver for Redis {
    type Handle = Vec<u8>;

    async fn produce(&mut self, n: usize) -> io::Result<usize> {
        self.conn.out.clear();
        self.push_xadds(n);
        self.conn.send().await?;
        self.read_xadds(n).await
    }

    async fn consume(&mut self) -> io::Result<Consumed<Vec<u8>>> {
        self.conn.out.clear();
        self.conn.out.extend_from_slice(&self.xreadgroup);
        self.conn.send().await?;
        self.read_xreadgroup().await
    }

    async fn ack(&mut self, handles: &[Vec<u8>]) -> io::Result<usize> {
        self.conn.out.clear();
        self.push_xack(handles);
        self.conn.send().await?;
        self.read_xack().await
    }

    async fn pipelined_cycle(&mut self, previous: &[Vec<u8>]) -> io::Result<Pipelined<Vec<u8>>> {
        self.conn.out.clear();
        if !previous.is_empty() {
            self.push_xack(previous);
        }
        self.push_xadds(self.batch);
        let read = std::mem::take(&mut self.xreadgroup);
        self.conn.out.extend_from_slice(&read);
        self.xreadgroup = read;
        self.conn.send().await?;
        let acked = if previous.is_empty() {
            None
        } else {
            Some((self.read_xack().await?, Instant::now()))
        };
        let added = self.read_xadds(self.batch).await?;
        let produced = (added, Instant::now());
        let consumed = self.read_xreadgroup().await?;
        Ok(Pipelined {
            acked,
            produced,
            consumed: (consumed, Instant::now()),
        })
    }
}

/// One command on a blocking connection (setup and cleanup, outside the executors): the reply.
pub fn command(addr: SocketAddr, args: &[&[u8]]) -> Result<Value, String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .map_err(|e| format!("connect to redis at {addr}: {e}"))?;
    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
    let mut out = Vec::new();
    resp::encode_command(&mut out, args);
    s.write_all(&out)
        .map_err(|e| format!("redis at {addr}: {e}"))?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some((v, _)) = resp::parse(&buf).map_err(|e| format!("redis at {addr}: {e}"))? {
            return Ok(v);
        }
        let n = s
            .read(&mut chunk)
            .map_err(|e| format!("redis at {addr}: {e}"))?;
        if n == 0 || buf.len() > MAX_REPLY_BYTES {
            return Err(format!("redis at {addr}: no complete reply"));
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// Creates the stream and the bench's consumer group at its end (`XGROUP CREATE ... $ MKSTREAM`); an existing
/// group (`BUSYGROUP`) is fine.
pub fn create_group(addr: SocketAddr, stream: &str) -> Result<(), String> {
    match command(
        addr,
        &[
            b"XGROUP",
            b"CREATE",
            stream.as_bytes(),
            GROUP.as_bytes(),
            b"$",
            b"MKSTREAM",
        ],
    )? {
        Value::Simple(_) => Ok(()),
        Value::Error(e) if e.starts_with(b"BUSYGROUP") => Ok(()),
        other => Err(format!(
            "XGROUP CREATE {stream}: unexpected reply {other:?}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &[u8]) -> Value {
        Value::Bulk(s.to_vec())
    }

    #[test]
    fn xreadgroup_replies_yield_ids_and_intact_bodies() {
        let reply = Value::Array(vec![Value::Array(vec![
            bulk(b"s"),
            Value::Array(vec![
                Value::Array(vec![
                    bulk(b"1-0"),
                    Value::Array(vec![bulk(b"body"), bulk(b"xxx")]),
                ]),
                Value::Array(vec![
                    bulk(b"1-1"),
                    Value::Array(vec![bulk(b"body"), bulk(b"xx")]),
                ]),
                // An entry deleted while pending: id with nil fields.
                Value::Array(vec![bulk(b"1-2"), Value::NilArray]),
            ]),
        ])]);
        let c = entries(reply, 3);
        assert_eq!(
            c.handles,
            vec![b"1-0".to_vec(), b"1-1".to_vec(), b"1-2".to_vec()]
        );
        assert_eq!((c.intact, c.ok, c.empty), (1, true, false));
        let none = entries(Value::NilArray, 3);
        assert!(none.empty && none.handles.is_empty());
        let err = entries(Value::Error(b"NOGROUP".to_vec()), 3);
        assert!(!err.ok && !err.empty);
    }

    #[test]
    fn xreadgroup_is_encoded_with_and_without_block() {
        let with = xreadgroup("s", "c0", 10, Some(1000));
        assert_eq!(
            resp::parse(&with).unwrap().unwrap().0,
            Value::Array(
                [
                    "XREADGROUP",
                    "GROUP",
                    "g",
                    "c0",
                    "COUNT",
                    "10",
                    "BLOCK",
                    "1000",
                    "STREAMS",
                    "s",
                    ">"
                ]
                .iter()
                .map(|a| bulk(a.as_bytes()))
                .collect()
            )
        );
        let without = xreadgroup("s", "c0", 1, None);
        assert!(!String::from_utf8_lossy(&without).contains("BLOCK"));
    }
}
