//! A beanstalkd client for the load generator, so berth and beanstalkd are measured by the same client in the
//! same run: produce = `put`, consume = `reserve-with-timeout`, ack = `delete`.

use super::{Consumed, Driver, Pipelined};
use futures_lite::AsyncWriteExt;
use glommio::net::TcpStream;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

/// One beanstalkd connection.
pub struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
    out: Vec<u8>,
}

fn bad(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}

/// The body length announced by a `RESERVED <id> <bytes>` line (0 for any other line).
fn reserved_body_len(line: &str) -> usize {
    line.strip_prefix("RESERVED ")
        .and_then(|rest| rest.split(' ').nth(1))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

impl Conn {
    pub async fn connect(addr: SocketAddr) -> io::Result<Conn> {
        let stream = super::wire::connect(addr).await?;
        Ok(Conn {
            stream,
            buf: Vec::with_capacity(8 << 10),
            out: Vec::with_capacity(4 << 10),
        })
    }

    async fn send(&mut self) -> io::Result<()> {
        self.stream.write_all(&self.out).await
    }

    /// Reads one `\r\n`-terminated line, plus `body` bytes and their `\r\n` when asked.
    async fn read_line(&mut self, body: impl Fn(&str) -> usize) -> io::Result<(String, usize)> {
        loop {
            if let Some(end) = self.buf.windows(2).position(|w| w == b"\r\n") {
                let line = String::from_utf8_lossy(&self.buf[..end]).into_owned();
                let extra = body(&line);
                let need = end + 2 + if extra > 0 { extra + 2 } else { 0 };
                if self.buf.len() >= need {
                    self.buf.drain(..need);
                    return Ok((line, extra));
                }
            }
            super::wire::read_more(
                &mut self.stream,
                &mut self.buf,
                8 << 10,
                usize::MAX,
                "beanstalkd",
            )
            .await?;
        }
    }

    /// `put`: returns whether the job was inserted.
    pub async fn put(&mut self, body: &[u8]) -> io::Result<bool> {
        use std::io::Write;
        self.out.clear();
        let _ = write!(self.out, "put 0 0 60 {}\r\n", body.len());
        self.out.extend_from_slice(body);
        self.out.extend_from_slice(b"\r\n");
        self.send().await?;
        let (line, _) = self.read_line(|_| 0).await?;
        Ok(line.starts_with("INSERTED"))
    }

    /// `reserve-with-timeout`: the job id and body length, or None on TIMED_OUT.
    pub async fn reserve(&mut self, timeout_s: u32) -> io::Result<Option<(u64, usize)>> {
        use std::io::Write;
        self.out.clear();
        let _ = write!(self.out, "reserve-with-timeout {timeout_s}\r\n");
        self.send().await?;
        let (line, len) = self.read_line(reserved_body_len).await?;
        if let Some(rest) = line.strip_prefix("RESERVED ") {
            let id = rest
                .split(' ')
                .next()
                .and_then(|n| n.parse().ok())
                .ok_or_else(|| bad(&line))?;
            return Ok(Some((id, len)));
        }
        if line.starts_with("TIMED_OUT") || line.starts_with("DEADLINE_SOON") {
            return Ok(None);
        }
        Err(bad(&line))
    }

    /// Pipelined cycle: `delete` of the previous job (if any), `put`, `reserve-with-timeout` in one write; returns
    /// (deleted, inserted, reserved job) with the time each answer arrived.
    pub async fn cycle(
        &mut self,
        previous: Option<u64>,
        body: &[u8],
        timeout_s: u32,
    ) -> io::Result<(
        Option<(bool, std::time::Instant)>,
        (bool, std::time::Instant),
        (Option<(u64, usize)>, std::time::Instant),
    )> {
        use std::io::Write;
        self.out.clear();
        if let Some(id) = previous {
            let _ = write!(self.out, "delete {id}\r\n");
        }
        let _ = write!(self.out, "put 0 0 60 {}\r\n", body.len());
        self.out.extend_from_slice(body);
        let _ = write!(self.out, "\r\nreserve-with-timeout {timeout_s}\r\n");
        self.send().await?;
        let deleted = match previous {
            Some(_) => {
                let (line, _) = self.read_line(|_| 0).await?;
                Some((line.starts_with("DELETED"), std::time::Instant::now()))
            }
            None => None,
        };
        let (line, _) = self.read_line(|_| 0).await?;
        let inserted = (line.starts_with("INSERTED"), std::time::Instant::now());
        let (line, len) = self.read_line(reserved_body_len).await?;
        let job = line
            .strip_prefix("RESERVED ")
            .and_then(|rest| rest.split(' ').next())
            .and_then(|n| n.parse().ok())
            .map(|id| (id, len));
        Ok((deleted, inserted, (job, std::time::Instant::now())))
    }

    /// `delete`: whether the job was deleted.
    pub async fn delete(&mut self, id: u64) -> io::Result<bool> {
        use std::io::Write;
        self.out.clear();
        let _ = write!(self.out, "delete {id}\r\n");
        self.send().await?;
        let (line, _) = self.read_line(|_| 0).await?;
        Ok(line.starts_with("DELETED"))
    }
}

/// The beanstalkd driver: one job per request (beanstalkd has no batches; `--batch` is refused for it).
pub struct Beanstalk {
    conn: Conn,
    message: Arc<Vec<u8>>,
    /// `reserve-with-timeout` seconds: 1 in cycles (as berth's `wait=1s`), 0 when draining.
    timeout_s: u32,
}

impl Beanstalk {
    pub async fn connect(
        addr: SocketAddr,
        message: Arc<Vec<u8>>,
        timeout_s: u32,
    ) -> io::Result<Beanstalk> {
        Ok(Beanstalk {
            conn: Conn::connect(addr).await?,
            message,
            timeout_s,
        })
    }

    fn consumed(&self, reserved: Option<(u64, usize)>) -> Consumed<u64> {
        match reserved {
            Some((id, len)) => Consumed {
                handles: vec![id],
                intact: usize::from(len == self.message.len()),
                ok: true,
                empty: false,
            },
            None => Consumed {
                handles: Vec::new(),
                intact: 0,
                ok: false,
                empty: true,
            },
        }
    }
}

impl Driver for Beanstalk {
    type Handle = u64;

    async fn produce(&mut self, n: usize) -> io::Result<usize> {
        let mut inserted = 0;
        for _ in 0..n {
            inserted += usize::from(self.conn.put(&self.message).await?);
        }
        Ok(inserted)
    }

    async fn consume(&mut self) -> io::Result<Consumed<u64>> {
        let reserved = self.conn.reserve(self.timeout_s).await?;
        Ok(self.consumed(reserved))
    }

    async fn ack(&mut self, handles: &[u64]) -> io::Result<usize> {
        let mut deleted = 0;
        for &id in handles {
            deleted += usize::from(self.conn.delete(id).await?);
        }
        Ok(deleted)
    }

    async fn pipelined_cycle(&mut self, previous: &[u64]) -> io::Result<Pipelined<u64>> {
        // One job per cycle: at most one previous job to delete.
        let (deleted, (inserted, put_at), (reserved, reserved_at)) = self
            .conn
            .cycle(previous.first().copied(), &self.message, self.timeout_s)
            .await?;
        Ok(Pipelined {
            acked: deleted.map(|(ok, at)| (usize::from(ok), at)),
            produced: (usize::from(inserted), put_at),
            consumed: (self.consumed(reserved), reserved_at),
        })
    }
}
