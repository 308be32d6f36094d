//! Node RPC's wire format (`docs/format.md`, "Node RPC"): length-prefixed frames, each a fixed 24-byte header and a
//! postcard body; the bodies each kind carries; and `FrameReader`, which cuts frames out of a byte stream and turns
//! anything malformed into a `FrameError` (never a panic, never a buffer more than one bounded read beyond what
//! actually arrived). Used by both ends of a connection, on whichever core runs that end.

use crate::ops::{OpResult, Reply, Request};
use futures_lite::{AsyncRead, AsyncReadExt};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::io;

/// `BRPC` on the wire (little-endian u32).
pub const MAGIC: u32 = 0x4350_5242;
/// The protocol version this code speaks: in every header, and in the hello. 2: `TopicConfig` gained `group_ids`
/// (version 1 peers could not decode its settings, so they are refused at the handshake instead). 3: `Probe` gained
/// `max_bytes` and `taken_any` (a consume's byte budget); a version 2 peer would fail to decode every probe. 4:
/// `TopicConfig` gained `replicas` (and `Request`/`Reply` a `Partitions` variant). 5: `Request::Replicate` and
/// `Reply::Replicated` (a leader ships its durable batches to its followers), and `AdminStep::Apply` names each
/// partition's followers. 6: `PartitionInfo` gained `commit_offset` (a replicated partition's commit offset, shown
/// by `GET /topics/T`), which a version 5 peer could not decode in any describe or stats reply. 7: `Replicate` and
/// `ReplicateFrontiers` carry the leader's `epoch` (a follower refuses an older one: `stale_epoch`), and
/// `AdminStep::Apply` names each partition's replicas, leader and epoch instead of its followers. 8: `CoreStats`
/// carries request latency per kind of request. 9: `GroupInfo` gained `oldest_unsettled_ms` (the status page's oldest
/// unsettled age), which a version 8 peer could not decode in any describe or stats reply. 10: `Replicate` carries
/// its records' `epochs` (the leader's epoch history entries for them), which a version 9 peer could not decode.
/// 11: a probe carries the leader's entry for its epoch and a batch the entry starting right after it (a version 10
/// peer refuses both at admission), and `Request::MoveLeader` exists (internal to a node). 12: `Replicate` carries
/// `hold` and `promote`, its answers and `Began` whether the replica is a learner. 13: `PartitionState` carries
/// `placed` (the replicas its topic's creation placed), `MoveLeader` a new replica set, `NodeEntry` `draining` and
/// `removed`, and `Request::DrainNode` exists (internal to a node). 14: `BeginEpoch`, `Began` and `Replicate` carry
/// nonce ceilings (`partition/nonces.rs`). 18: `TopicConfig` gained `delay_ms`, `receive_wait_ms`,
/// `max_message_bytes`, `created_ms`, `modified_ms`, `tags` and the SQS policies, `Settings` the same, and
/// `Request::Purge` / `Reply::Purged` exist (a version 17 peer could not decode any topic's settings). 19:
/// `FrontierMark` carries the group's acked-ahead ranges. 20: `CoreStats` carries the per-stage latency histograms (`engine::metrics::Stage`). 21: and the housekeeping
/// stage's. 22: `FollowerInfo` and `Replicated` carry `poisoned` (a follower's log refuses appends until a restart).
/// 23: a probe (`Replicate` of no records) carries its sender's whole epoch history, entries past the offset it asks
/// at included (a version 22 peer refuses those). 24: `Probed` carries `retry_in_ms` (a new leader waiting out its
/// predecessor's lease, `partition/lease.rs`) and `Began` the replica's epoch floor before the round (`floor`).
pub const VERSION: u8 = 24;
/// Header bytes before the body.
pub const HEADER_LEN: usize = 24;
/// Bytes asked of the socket per read at first: 16 KiB. While a large body arrives the reads grow with what has
/// arrived, up to `MAX_READ_CHUNK`.
const READ_CHUNK: usize = 16 << 10;
/// The most a reader's buffer runs ahead of the bytes it has received: 1 MiB.
const MAX_READ_CHUNK: usize = 1 << 20;

/// What a frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// Client to server: a `Hello`; server to client: a `Welcome`.
    Handshake = 1,
    /// `(core, Request)`, answered by a `Reply` frame with the same request id.
    Request = 2,
    /// `OpResult<Reply>`.
    Reply = 3,
    /// `(core, Request)` with no answer (signals), applied in arrival order.
    OneWay = 4,
}

impl Kind {
    fn from_u8(b: u8) -> Option<Kind> {
        Some(match b {
            1 => Kind::Handshake,
            2 => Kind::Request,
            3 => Kind::Reply,
            4 => Kind::OneWay,
            _ => return None,
        })
    }
}

/// The client's first frame.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// The protocol version the client speaks (`VERSION`).
    pub version: u32,
    /// The client's node id.
    pub node: u32,
    /// The cluster token (empty when the client has none).
    pub token: String,
}

/// The server's answer to a `Hello`. A refusal is followed by the server closing the connection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Welcome {
    /// Accepted by node `node`.
    Accepted { node: u32 },
    /// Refused: a bad token or an unsupported version.
    Refused { reason: String },
}

/// A request frame's body: the destination core on the receiving node, and the request.
pub type RequestBody = (u32, Request);
/// A reply frame's body.
pub type ReplyBody = OpResult<Reply>;

/// A decoded frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub version: u8,
    pub kind: Kind,
    pub id: u64,
    pub body_len: u32,
    pub body_crc32c: u32,
}

/// A whole frame, its body checked against its CRC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub version: u8,
    pub kind: Kind,
    pub id: u64,
    pub body: Vec<u8>,
}

/// Why a byte stream is not a sequence of frames. Any of these ends the connection.
#[derive(Debug)]
pub enum FrameError {
    Io(io::Error),
    /// The stream ended inside a frame.
    Truncated,
    BadMagic(u32),
    BadKind(u8),
    /// The reserved header bytes are not zero.
    BadReserved(u16),
    TooLarge {
        len: u32,
        limit: usize,
    },
    BadCrc,
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameError::Io(e) => write!(f, "i/o error: {e}"),
            FrameError::Truncated => write!(f, "the stream ended inside a frame"),
            FrameError::BadMagic(m) => write!(f, "bad magic {m:#010x}"),
            FrameError::BadKind(k) => write!(f, "unknown frame kind {k}"),
            FrameError::BadReserved(r) => write!(f, "reserved header bytes are {r:#06x}, not 0"),
            FrameError::TooLarge { len, limit } => {
                write!(f, "a {len}-byte body is over the {limit}-byte limit")
            }
            FrameError::BadCrc => write!(f, "the body does not match its CRC"),
        }
    }
}

/// Why a value could not be framed.
#[derive(Debug)]
pub enum EncodeError {
    /// The body would be larger than the limit (or than a u32).
    TooLarge {
        len: usize,
        limit: usize,
    },
    Serialize(postcard::Error),
}

impl fmt::Display for EncodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EncodeError::TooLarge { len, limit } => {
                write!(
                    f,
                    "it encodes to {len} bytes, over node RPC's {limit}-byte limit"
                )
            }
            EncodeError::Serialize(e) => write!(f, "it does not serialise: {e}"),
        }
    }
}

impl Header {
    /// Parses the first `HEADER_LEN` bytes of `b` (`Truncated` if there are fewer). The version is returned, not
    /// checked: the handshake answers a foreign version with a refusal rather than a closed connection.
    pub fn parse(b: &[u8], max_body: usize) -> Result<Header, FrameError> {
        let b: &[u8; HEADER_LEN] = b
            .get(..HEADER_LEN)
            .and_then(|h| h.try_into().ok())
            .ok_or(FrameError::Truncated)?;
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let magic = u32_at(0);
        if magic != MAGIC {
            return Err(FrameError::BadMagic(magic));
        }
        let kind = Kind::from_u8(b[5]).ok_or(FrameError::BadKind(b[5]))?;
        let reserved = u16::from_le_bytes([b[6], b[7]]);
        if reserved != 0 {
            return Err(FrameError::BadReserved(reserved));
        }
        let mut id = [0u8; 8];
        id.copy_from_slice(&b[8..16]);
        let body_len = u32_at(16);
        if body_len as usize > max_body {
            return Err(FrameError::TooLarge {
                len: body_len,
                limit: max_body,
            });
        }
        Ok(Header {
            version: b[4],
            kind,
            id: u64::from_le_bytes(id),
            body_len,
            body_crc32c: u32_at(20),
        })
    }
}

/// A postcard flavor that appends to a borrowed `Vec`, so a frame is serialised in place after its header.
struct Tail<'a>(&'a mut Vec<u8>);

impl postcard::ser_flavors::Flavor for Tail<'_> {
    type Output = ();

    fn try_extend(&mut self, data: &[u8]) -> postcard::Result<()> {
        self.0.extend_from_slice(data);
        Ok(())
    }

    fn try_push(&mut self, data: u8) -> postcard::Result<()> {
        self.0.push(data);
        Ok(())
    }

    fn finalize(self) -> postcard::Result<()> {
        Ok(())
    }
}

/// Appends a frame of `kind` carrying `body` to `out`. On error `out` is left as it was.
pub fn encode<T: Serialize + ?Sized>(
    kind: Kind,
    id: u64,
    body: &T,
    max_body: usize,
    out: &mut Vec<u8>,
) -> Result<(), EncodeError> {
    let start = out.len();
    out.extend_from_slice(&[0u8; HEADER_LEN]);
    if let Err(e) = postcard::serialize_with_flavor(body, Tail(out)) {
        out.truncate(start);
        return Err(EncodeError::Serialize(e));
    }
    let len = out.len() - start - HEADER_LEN;
    let limit = max_body.min(u32::MAX as usize);
    if len > limit {
        out.truncate(start);
        return Err(EncodeError::TooLarge { len, limit });
    }
    let crc = crc32c::crc32c(&out[start + HEADER_LEN..]);
    let h = &mut out[start..start + HEADER_LEN];
    h[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    h[4] = VERSION;
    h[5] = kind as u8;
    h[8..16].copy_from_slice(&id.to_le_bytes());
    h[16..20].copy_from_slice(&(len as u32).to_le_bytes());
    h[20..24].copy_from_slice(&crc.to_le_bytes());
    Ok(())
}

/// Decodes a body; every byte must be used.
pub fn decode<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, postcard::Error> {
    let (value, rest) = postcard::take_from_bytes(body)?;
    if !rest.is_empty() {
        return Err(postcard::Error::DeserializeBadEncoding);
    }
    Ok(value)
}

/// Cuts frames out of a byte stream. Cancel-safe: a read abandoned half-way loses nothing that was buffered.
pub struct FrameReader {
    /// Initialised memory; `start..end` holds bytes received and not yet cut.
    buf: Vec<u8>,
    start: usize,
    end: usize,
    max_body: usize,
    /// Bytes taken from the stream so far.
    received: u64,
}

impl FrameReader {
    pub fn new(max_body: usize) -> FrameReader {
        FrameReader {
            buf: Vec::new(),
            start: 0,
            end: 0,
            max_body: max_body.min(u32::MAX as usize),
            received: 0,
        }
    }

    /// Changes the largest body accepted from the next frame on; bytes already buffered are kept. The server reads
    /// the hello under a small limit and raises it once the hello is accepted.
    pub fn set_max_body(&mut self, max_body: usize) {
        self.max_body = max_body.min(u32::MAX as usize);
    }

    /// Bytes taken from the stream so far (cut into frames or still buffered).
    pub fn received(&self) -> u64 {
        self.received
    }

    /// The next whole frame; `Ok(None)` when the stream ends cleanly between frames.
    pub async fn next<R: AsyncRead + Unpin>(
        &mut self,
        stream: &mut R,
    ) -> Result<Option<Frame>, FrameError> {
        loop {
            if let Some(frame) = self.cut()? {
                return Ok(Some(frame));
            }
            self.make_room();
            let n = stream
                .read(&mut self.buf[self.end..])
                .await
                .map_err(FrameError::Io)?;
            if n == 0 {
                return match self.end - self.start {
                    0 => Ok(None),
                    _ => Err(FrameError::Truncated),
                };
            }
            self.end += n;
            self.received += n as u64;
        }
    }

    /// A whole frame from the bytes buffered, if there is one. A bad header fails before its body arrives.
    pub fn cut(&mut self) -> Result<Option<Frame>, FrameError> {
        let avail = &self.buf[self.start..self.end];
        if avail.len() < HEADER_LEN {
            return Ok(None);
        }
        let header = Header::parse(avail, self.max_body)?;
        let total = HEADER_LEN + header.body_len as usize;
        let Some(body) = avail.get(HEADER_LEN..total) else {
            return Ok(None);
        };
        if crc32c::crc32c(body) != header.body_crc32c {
            return Err(FrameError::BadCrc);
        }
        let frame = Frame {
            version: header.version,
            kind: header.kind,
            id: header.id,
            body: body.to_vec(),
        };
        self.start += total;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
        Ok(Some(frame))
    }

    /// Moves the unread bytes to the front and makes sure there is space to read into. Growth follows the bytes
    /// that arrived, never a header's announced length: the buffer's initialised (zero-filled) part is at most what
    /// is buffered plus one read of `READ_CHUNK`..=`MAX_READ_CHUNK`, and never more than one frame under the limit.
    /// (The `Vec`'s capacity may double ahead of that, but memory past its length is never written, so it costs
    /// address space, not RAM.)
    fn make_room(&mut self) {
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.end == 0 && self.buf.len() > 4 * READ_CHUNK {
            self.buf = Vec::new();
        }
        if self.end == self.buf.len() {
            let chunk = self.end.clamp(READ_CHUNK, MAX_READ_CHUNK);
            let len = (self.end + chunk).min(HEADER_LEN + self.max_body);
            self.buf.resize(len.max(self.end + 1), 0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::EngineError;
    use crate::ops::OpError;

    /// The hex bytes of the `n`th example block of docs/format.md's "Node RPC" section (`OFFSET: hex...   note`).
    fn doc_example(n: usize) -> Vec<u8> {
        crate::format_doc::example("Node RPC", n)
    }

    /// docs/format.md's three examples are what `encode` writes, and the reader takes them back.
    #[test]
    fn the_documented_examples_match_the_code() {
        let mut hello = Vec::new();
        let body = Hello {
            version: u32::from(VERSION),
            node: 2,
            token: "s3cret".into(),
        };
        encode(Kind::Handshake, 0, &body, 1 << 20, &mut hello).unwrap();
        assert_eq!(doc_example(0), hello, "the hello example");

        let mut request = Vec::new();
        let describe = Request::Describe("t".into());
        encode(Kind::Request, 7, &(1u32, &describe), 1 << 20, &mut request).unwrap();
        assert_eq!(doc_example(1), request, "the request example");

        let mut reply = Vec::new();
        let answer: ReplyBody = Err(OpError::Engine(EngineError::TopicNotFound("t".into())));
        encode(Kind::Reply, 7, &answer, 1 << 20, &mut reply).unwrap();
        assert_eq!(doc_example(2), reply, "the reply example");

        let mut all = hello.clone();
        all.extend_from_slice(&request);
        all.extend_from_slice(&reply);
        let mut reader = FrameReader::new(1 << 20);
        reader.buf = all;
        reader.end = reader.buf.len();
        let f = reader.cut().unwrap().unwrap();
        assert_eq!((f.kind, f.id), (Kind::Handshake, 0));
        assert_eq!(decode::<Hello>(&f.body).unwrap(), body);
        let f = reader.cut().unwrap().unwrap();
        assert_eq!((f.kind, f.id), (Kind::Request, 7));
        let (core, r): RequestBody = decode(&f.body).unwrap();
        assert_eq!((core, format!("{r:?}")), (1, format!("{describe:?}")));
        let f = reader.cut().unwrap().unwrap();
        assert_eq!((f.kind, f.id), (Kind::Reply, 7));
        assert_eq!(
            format!("{:?}", decode::<ReplyBody>(&f.body).unwrap()),
            format!("{answer:?}")
        );
        assert!(reader.cut().unwrap().is_none());

        let doc = include_str!("../../../docs/format.md");
        assert!(doc.contains(&format!("`0x{MAGIC:08X}`")));
        assert!(doc.contains(&format!("| 20..{HEADER_LEN} | u32 | body_crc32c")));
        let defaults = crate::cluster::rpc::RpcConfig::default();
        let doc = doc.split_whitespace().collect::<Vec<_>>().join(" ");
        for (name, default) in [
            ("max_hello_bytes", defaults.max_hello_bytes),
            ("max_handshaking", defaults.max_handshaking),
            ("max_connections", defaults.max_connections),
        ] {
            let stated = format!("`{name}` (default {default})");
            assert!(doc.contains(&stated), "docs/format.md says {stated}");
        }
    }

    fn read_all(bytes: &[u8], max_body: usize) -> (Vec<Frame>, Result<(), FrameError>) {
        futures_lite::future::block_on(async {
            let mut stream = futures_lite::io::Cursor::new(bytes.to_vec());
            let mut reader = FrameReader::new(max_body);
            let mut frames = Vec::new();
            loop {
                match reader.next(&mut stream).await {
                    Ok(Some(f)) => frames.push(f),
                    Ok(None) => return (frames, Ok(())),
                    Err(e) => return (frames, Err(e)),
                }
            }
        })
    }

    #[test]
    fn garbage_truncation_and_bad_crcs_are_errors_not_panics() {
        let mut good = Vec::new();
        for id in 0..3 {
            let body: RequestBody = (id as u32, Request::DeleteTopic(format!("topic{id}")));
            encode(Kind::Request, id, &body, 1 << 20, &mut good).unwrap();
        }
        let (frames, end) = read_all(&good, 1 << 20);
        assert_eq!(frames.len(), 3);
        assert!(end.is_ok());

        // Cut anywhere: the whole frames before the cut come out, then Truncated (or a clean end at a boundary).
        for cut in 0..good.len() {
            let (frames, end) = read_all(&good[..cut], 1 << 20);
            let at_boundary = frames
                .iter()
                .map(|f| HEADER_LEN + f.body.len())
                .sum::<usize>()
                == cut;
            assert_eq!(end.is_ok(), at_boundary, "cut at {cut}: {end:?}");
            if !at_boundary {
                assert!(matches!(end, Err(FrameError::Truncated)), "cut at {cut}");
            }
        }

        // Any flipped byte is caught: in the header by magic, kind, reserved or length checks, else by the CRC
        // (a flipped id or version byte passes the reader, and is the connection's business).
        let first_len = HEADER_LEN + frames[0].body.len();
        for i in 0..first_len {
            let mut bad = good.clone();
            bad[i] ^= 0x40;
            let (frames, end) = read_all(&bad, 1 << 20);
            if (4..5).contains(&i) || (8..16).contains(&i) {
                assert_eq!(frames.len(), 3, "byte {i}");
            } else {
                assert!(
                    end.is_err() || frames.len() < 3,
                    "byte {i} flipped went unnoticed"
                );
            }
        }
        let mut bad_crc = good.clone();
        bad_crc[HEADER_LEN] ^= 1;
        assert!(matches!(
            read_all(&bad_crc, 1 << 20).1,
            Err(FrameError::BadCrc)
        ));

        // A body over the limit is refused from its header alone.
        let (_, end) = read_all(&good, 4);
        assert!(matches!(end, Err(FrameError::TooLarge { limit: 4, .. })));

        // Random bytes, and random bytes after a valid magic: errors, never panics, and no frame is invented.
        let mut rng = crate::cluster::rpc::tests::Rng(0x9E37_79B9_7F4A_7C15);
        for round in 0..2000 {
            let len = (rng.next() % 200) as usize;
            let mut bytes = rng.bytes(len);
            if round % 2 == 0 && bytes.len() >= 4 {
                bytes[..4].copy_from_slice(&MAGIC.to_le_bytes());
            }
            let (frames, _) = read_all(&bytes, 1 << 16);
            for f in frames {
                // Whatever got through the CRC must still decode safely (or fail to) as any body.
                let _ = decode::<RequestBody>(&f.body);
                let _ = decode::<ReplyBody>(&f.body);
                let _ = decode::<Hello>(&f.body);
            }
        }
    }

    #[test]
    fn a_body_over_the_limit_is_not_encoded_and_leaves_the_buffer_alone() {
        let mut out = vec![1, 2, 3];
        let big = Request::DeleteTopic("x".repeat(100));
        let e = encode(Kind::Request, 1, &(0u32, &big), 50, &mut out).unwrap_err();
        assert!(matches!(e, EncodeError::TooLarge { limit: 50, .. }), "{e}");
        assert_eq!(out, vec![1, 2, 3]);
    }

    /// A header of `kind` announcing a `body_len`-byte body (its CRC 0).
    fn header_announcing(kind: Kind, body_len: u32) -> Vec<u8> {
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&MAGIC.to_le_bytes());
        bytes.extend_from_slice(&[VERSION, kind as u8, 0, 0]);
        bytes.extend_from_slice(&1u64.to_le_bytes());
        bytes.extend_from_slice(&body_len.to_le_bytes());
        bytes.extend_from_slice(&0u32.to_le_bytes());
        bytes
    }

    #[test]
    fn a_reader_grows_only_with_what_arrives() {
        // A header announcing a 60 MB body, then 10 bytes of it, then 5 MiB: the reader's buffer never holds more
        // than what it received and one bounded read, however large the announced body.
        for arrived in [10, 5 << 20] {
            let mut bytes = header_announcing(Kind::Request, 60_000_000);
            bytes.resize(HEADER_LEN + arrived, 0);
            futures_lite::future::block_on(async {
                let mut stream = futures_lite::io::Cursor::new(bytes);
                let mut reader = FrameReader::new(64 << 20);
                assert!(matches!(
                    reader.next(&mut stream).await,
                    Err(FrameError::Truncated)
                ));
                assert_eq!(reader.received(), (HEADER_LEN + arrived) as u64);
                let bound = HEADER_LEN + arrived + arrived.clamp(READ_CHUNK, MAX_READ_CHUNK);
                assert!(
                    reader.buf.len() <= bound,
                    "{} bytes initialised for {arrived} received",
                    reader.buf.len()
                );
            });
        }
    }

    #[test]
    fn a_small_limit_refuses_a_large_header_unread_and_a_raised_one_keeps_what_was_buffered() {
        futures_lite::future::block_on(async {
            // Under a 4 KiB limit, a header announcing 60 MiB is refused with its body still unread.
            let mut bytes = header_announcing(Kind::Handshake, 60 << 20);
            bytes.resize(HEADER_LEN + (1 << 20), 0);
            let mut stream = futures_lite::io::Cursor::new(bytes);
            let mut reader = FrameReader::new(4096);
            let refused = reader.next(&mut stream).await;
            assert!(
                matches!(refused, Err(FrameError::TooLarge { limit: 4096, .. })),
                "{refused:?}"
            );
            assert!(reader.received() <= (HEADER_LEN + 4096) as u64);
            assert!(reader.buf.len() <= HEADER_LEN + 4096);

            // A hello, and a 10 KiB request in the same bytes: the hello is cut under the small limit (having read
            // no more than a hello's worth), then the request under the raised one, nothing lost in between.
            let mut bytes = Vec::new();
            let hello = Hello {
                version: u32::from(VERSION),
                node: 2,
                token: "s3cret".into(),
            };
            encode(Kind::Handshake, 0, &hello, 4096, &mut bytes).unwrap();
            let big: RequestBody = (0, Request::DeleteTopic("x".repeat(10 << 10)));
            encode(Kind::Request, 9, &big, 1 << 20, &mut bytes).unwrap();
            let mut stream = futures_lite::io::Cursor::new(bytes);
            let mut reader = FrameReader::new(4096);
            let f = reader.next(&mut stream).await.unwrap().unwrap();
            assert_eq!(decode::<Hello>(&f.body).unwrap(), hello);
            assert!(reader.received() <= (HEADER_LEN + 4096) as u64);
            reader.set_max_body(1 << 20);
            let f = reader.next(&mut stream).await.unwrap().unwrap();
            assert_eq!((f.kind, f.id), (Kind::Request, 9));
            let (core, r): RequestBody = decode(&f.body).unwrap();
            assert_eq!((core, format!("{r:?}")), (0, format!("{:?}", big.1)));
            assert!(reader.next(&mut stream).await.unwrap().is_none());
        });
    }
}
