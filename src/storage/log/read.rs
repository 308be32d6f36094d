//! The log's read path: one record, or a run of frames read ahead for a consume; sealed segments opened once
//! per reader.

use super::*;

/// A record read back from the log.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Record {
    /// Its offset in the partition.
    pub offset: u64,
    /// Append time, Unix ms.
    pub timestamp_ms: u64,
    /// The message bytes (the body: without the record's meta block).
    pub payload: Bytes,
    /// What the record carries besides its body (attributes, a delay, ...), if anything.
    pub meta: Option<Box<crate::storage::meta::RecordMeta>>,
}

/// Longest run of frames [`Log::read_ahead`] reads with one call: 256 KiB.
pub const READ_AHEAD_BYTES: u64 = 256 << 10;

/// Frames read ahead by one consume call (see [`Log::read_ahead`]). It lives on that call's stack, on the
/// partition's core, and is dropped with it; the records handed out share its buffer (no copy per record).
#[derive(Default)]
pub struct ReadAhead {
    segment_base: u64,
    start: u64,
    bytes: Bytes,
}

/// Why a read failed.
#[derive(Debug)]
pub enum ReadError {
    /// Below the oldest retained offset.
    OutOfRetention { start: u64 },
    /// At or past the readable end.
    NotYet,
    /// The frame for this offset cannot be read intact (failed check at recovery or now).
    Corrupt,
    /// The read itself failed.
    Io(std::io::Error),
}

impl Log {
    /// Reads the record at `offset` and verifies it.
    pub async fn read(&self, offset: u64) -> Result<Record, ReadError> {
        self.read_ahead(offset, offset + 1, &mut ReadAhead::default())
            .await
    }

    /// Reads the record at `offset` and verifies it, as [`Log::read`] does; when the caller will read the offsets
    /// up to `until` next (a consume batch), the frames up to there (at most [`READ_AHEAD_BYTES`], within one
    /// segment) are read with the same call and kept in `ra`, so a batch of consecutive deliveries costs one read
    /// instead of one per record. Only bytes of frames already in the log are read ahead (a segment's `len` and
    /// `positions` grow after the frames are written), so what `ra` holds never changes under it.
    pub async fn read_ahead(
        &self,
        offset: u64,
        until: u64,
        ra: &mut ReadAhead,
    ) -> Result<Record, ReadError> {
        let (file, base, pos, len, span_end) = {
            let st = self.state.borrow();
            let start = st.segments.first().map_or(0, |s| s.base);
            if offset < start {
                return Err(ReadError::OutOfRetention { start });
            }
            if offset >= st.next_offset {
                return Err(ReadError::NotYet);
            }
            if st.corrupt.contains(offset) {
                return Err(ReadError::Corrupt);
            }
            let idx = st.segments.partition_point(|s| s.base <= offset);
            let Some(seg) = idx.checked_sub(1).map(|i| &st.segments[i]) else {
                return Err(ReadError::Corrupt);
            };
            let slot = (offset - seg.base) as usize;
            let Some(&pos) = seg.positions.get(slot) else {
                return Err(ReadError::Corrupt);
            };
            if pos == NO_POSITION {
                return Err(ReadError::Corrupt);
            }
            let next_position = |from: usize| {
                seg.positions
                    .get(from..)
                    .and_then(|rest| rest.iter().find(|&&p| p != NO_POSITION))
                    .map_or(seg.len, |&p| p as u64)
            };
            let end = next_position(slot + 1);
            let len = end.saturating_sub(pos as u64);
            let span_end = if until > offset + 1 {
                let wanted = next_position((until - seg.base) as usize);
                wanted.min(pos as u64 + READ_AHEAD_BYTES.max(len)).max(end)
            } else {
                end
            };
            (
                seg.file.clone().ok_or(seg.base),
                seg.base,
                pos as u64,
                len,
                span_end,
            )
        };
        if let Some(frame) = self.tail.borrow().get(base, pos, len) {
            return self.decode(frame, offset, Bytes::copy_from_slice);
        }
        // Frames not yet written to the file are read from the write-behind buffer, and a read of the file stops
        // where they start.
        let mut span_end = span_end;
        if let Some(unwritten) = self.behind.unwritten_from(base) {
            if let Some(frame) = self.behind.get(base, pos, len) {
                let frame = Bytes::from(frame);
                return self.decode(&frame, offset, |payload| frame.slice_ref(payload));
            }
            if pos + len > unwritten {
                error!(dir = %self.dir.display(), offset, "a frame is neither written nor behind");
                // The simulation and the unit tests stop here; a server answers the read as corrupt.
                if cfg!(test) {
                    panic!("offset {offset}: a frame is neither written nor behind");
                }
                return Err(ReadError::Corrupt);
            }
            span_end = span_end.min(unwritten);
        }
        let held = ra.segment_base == base
            && ra.start <= pos
            && pos + len <= ra.start + ra.bytes.len() as u64;
        if !held {
            let file = match file {
                Ok(file) => file,
                Err(base) => self.sealed_file(base).await.map_err(ReadError::Io)?,
            };
            let span = (span_end - pos) as usize;
            let bytes = match file.read_cached(pos, span) {
                Some(bytes) => bytes,
                None => file.read_at(pos, span).await.map_err(ReadError::Io)?,
            };
            *ra = ReadAhead {
                segment_base: base,
                start: pos,
                bytes: Bytes::from(bytes),
            };
        }
        let from = (pos - ra.start) as usize;
        let to = (from + len as usize).min(ra.bytes.len());
        let frame = ra.bytes.slice(from..to);
        self.decode(&frame, offset, |payload| frame.slice_ref(payload))
    }

    /// Verifies the frame read for `offset`; `keep` turns its payload into the record's bytes.
    fn decode(
        &self,
        frame: &[u8],
        offset: u64,
        keep: impl FnOnce(&[u8]) -> Bytes,
    ) -> Result<Record, ReadError> {
        match frame::decode_frame(frame, offset, self.opts.max_payload) {
            Ok((header, payload)) if !header.meta => Ok(Record {
                offset,
                timestamp_ms: header.timestamp_ms,
                payload: keep(payload),
                meta: None,
            }),
            Ok((header, payload)) => match crate::storage::meta::RecordMeta::decode(&keep(payload))
            {
                Ok((meta, body)) => Ok(Record {
                    offset,
                    timestamp_ms: header.timestamp_ms,
                    payload: body,
                    meta: Some(Box::new(meta)),
                }),
                Err(e) => {
                    error!(dir = %self.dir.display(), offset, error = ?e, "a record's meta block does not parse");
                    Err(ReadError::Corrupt)
                }
            },
            Err(e) => {
                error!(dir = %self.dir.display(), offset, error = ?e, "frame failed its check on read");
                Err(ReadError::Corrupt)
            }
        }
    }

    /// The file of the sealed segment at `base`, opened for this read (and kept for the next one, so a consumer
    /// reading through a sealed segment opens it once).
    pub(super) async fn sealed_file(&self, base: u64) -> std::io::Result<Rc<dyn SegmentFile>> {
        if let Some((cached, file)) = &*self.sealed_cache.borrow() {
            if *cached == base {
                return Ok(file.clone());
            }
        }
        let file = self
            .storage
            .open(&self.dir.join(segment_name(base)), false)
            .await?;
        *self.sealed_cache.borrow_mut() = Some((base, file.clone()));
        Ok(file)
    }
}
