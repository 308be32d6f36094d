//! What the load generator's protocol clients (berth's HTTP, beanstalkd, Redis, NATS) share on the wire: the
//! connection setup and the read that grows a reply buffer.

use futures_lite::AsyncReadExt;
use glommio::net::TcpStream;
use std::io;
use std::net::SocketAddr;

/// Connects with TCP_NODELAY (every request is one small write the server should see at once).
pub async fn connect(addr: SocketAddr) -> io::Result<TcpStream> {
    let stream = TcpStream::connect(addr).await.map_err(io::Error::from)?;
    let _ = stream.set_nodelay(true);
    Ok(stream)
}

/// Reads more bytes onto the end of `buf`, up to `chunk` at a time. An error when `buf` already holds more than
/// `limit` bytes (a reply without an end in sight) or when `peer` closed the connection.
pub async fn read_more<S: futures_lite::AsyncRead + Unpin>(
    stream: &mut S,
    buf: &mut Vec<u8>,
    chunk: usize,
    limit: usize,
    peer: &str,
) -> io::Result<()> {
    if buf.len() > limit {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a reply from {peer} over {limit} bytes"),
        ));
    }
    let len = buf.len();
    buf.resize(len + chunk, 0);
    let n = stream.read(&mut buf[len..]).await?;
    buf.truncate(len + n);
    if n == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("{peer} closed"),
        ));
    }
    Ok(())
}
