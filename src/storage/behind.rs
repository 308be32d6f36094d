//! Write-behind of a partition's segment frames under the per-core journal.
//!
//! With a journal, a batch's frames are durable once their journal entry is synced; the segment file only has to
//! hold them by the time the journal file that carries them is checkpointed (deleted). So a partition's log keeps
//! the frames of its active segment in this buffer and writes them to the segment file in one `pwrite` when the
//! buffer would pass `write_behind_bytes`, when the segment rolls, when the log closes, and when the journal
//! checkpoints or closes (it flushes the buffer of every log whose entries the journal file holds, before it syncs
//! their segments). Hundreds of partitions on a core then cost a segment write per 16 KiB each, not per batch
//! (at 256 partitions, each `pwrite` of one record also paid an inode time update, and each frontier flush's
//! `syncfs` wrote back a page of every segment).
//!
//! Readers look here before the file: the bytes at and after `pos` are not in the file yet. A crash loses the
//! buffer, never the data: replay rewrites into the segments whatever the journal holds that they do not.
//!
//! Lives on the partition's core (`Rc`, shared by its log and its core's journal).

use super::backend::SegmentFile;
use std::cell::RefCell;
use std::rc::Rc;

/// The frames of one segment not yet written to its file: `bytes` belong at `pos..pos + bytes.len()` of the
/// segment whose first offset is `base`.
#[derive(Default)]
struct State {
    file: Option<Rc<dyn SegmentFile>>,
    base: u64,
    pos: u64,
    bytes: Vec<u8>,
}

/// A log's write-behind buffer (see the module header).
#[derive(Default)]
pub struct Behind {
    state: RefCell<State>,
}

impl Behind {
    pub fn new() -> Rc<Behind> {
        Rc::new(Behind::default())
    }

    /// Writes the buffered frames to their segment file. On an error they stay buffered (a later flush tries
    /// again; a crash leaves them to the journal's replay).
    pub fn flush(&self) -> std::io::Result<()> {
        let mut st = self.state.borrow_mut();
        if st.bytes.is_empty() {
            return Ok(());
        }
        let file = st.file.clone().expect("buffered frames have their file");
        file.write_at(&st.bytes, st.pos)?;
        let len = st.bytes.len() as u64;
        st.pos += len;
        st.bytes.clear();
        if st.bytes.capacity() > MAX_IDLE_CAPACITY {
            st.bytes = Vec::new();
        }
        Ok(())
    }

    /// Bytes buffered now.
    pub fn len(&self) -> usize {
        self.state.borrow().bytes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether frames written at `pos` of segment `base` would follow the buffered ones (or the buffer is empty).
    pub fn continues(&self, base: u64, pos: u64) -> bool {
        let st = self.state.borrow();
        st.bytes.is_empty() || (st.base == base && st.pos + st.bytes.len() as u64 == pos)
    }

    /// Buffers `frames`, written at `pos` of segment `base` (`file`). The caller flushed first unless
    /// [`Behind::continues`] holds.
    pub fn push(&self, file: &Rc<dyn SegmentFile>, base: u64, pos: u64, frames: &[u8]) {
        let mut st = self.state.borrow_mut();
        if st.bytes.is_empty() {
            st.file = Some(file.clone());
            st.base = base;
            st.pos = pos;
        }
        assert!(
            st.base == base && st.pos + st.bytes.len() as u64 == pos,
            "write-behind frames must follow the buffered ones"
        );
        st.bytes.extend_from_slice(frames);
    }

    /// Drops the buffered bytes at and after `pos` of segment `base` (a batch the journal refused). Returns false
    /// when they are no longer buffered (a flush wrote them meanwhile): the caller cuts the file instead.
    pub fn take_back(&self, base: u64, pos: u64) -> bool {
        let mut st = self.state.borrow_mut();
        if st.bytes.is_empty() || st.base != base || pos < st.pos {
            return false;
        }
        let keep = ((pos - st.pos) as usize).min(st.bytes.len());
        st.bytes.truncate(keep);
        true
    }

    /// The buffered frame bytes at `pos..pos + len` of segment `base`, if they are here.
    pub fn get(&self, base: u64, pos: u64, len: u64) -> Option<Vec<u8>> {
        let st = self.state.borrow();
        if st.bytes.is_empty() || st.base != base || pos < st.pos {
            return None;
        }
        let from = (pos - st.pos) as usize;
        st.bytes
            .get(from..from.checked_add(len as usize)?)
            .map(<[u8]>::to_vec)
    }

    /// Where the unwritten bytes of segment `base` start, if it has any: a read of the file must stop there.
    pub fn unwritten_from(&self, base: u64) -> Option<u64> {
        let st = self.state.borrow();
        (!st.bytes.is_empty() && st.base == base).then_some(st.pos)
    }
}

/// A flushed buffer larger than this gives its memory back (a large batch passed through). 1 MiB.
const MAX_IDLE_CAPACITY: usize = 1 << 20;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::backend::Storage;
    use crate::storage::sim::{Sim, SimStorage};
    use std::path::Path;

    #[test]
    fn buffered_frames_are_read_from_memory_and_reach_the_file_at_a_flush() {
        glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
            .make()
            .expect("executor")
            .run(async {
                let sim = Sim::new();
                let storage = SimStorage(sim.clone());
                let path = Path::new("/sim/seg");
                let file = storage.open(path, true).await.expect("open");
                let behind = Behind::new();
                assert!(behind.continues(0, 0));
                behind.push(&file, 0, 0, b"abc");
                behind.push(&file, 0, 3, b"def");
                assert!(behind.continues(0, 6));
                assert!(!behind.continues(0, 7));
                assert!(!behind.continues(10, 6));
                assert_eq!(behind.get(0, 3, 3).as_deref(), Some(&b"def"[..]));
                assert_eq!(behind.get(0, 4, 3), None, "past the buffered bytes");
                assert_eq!(behind.get(10, 3, 3), None, "another segment");
                assert_eq!(behind.unwritten_from(0), Some(0));
                assert_eq!(sim.contents(path).unwrap_or_default(), b"");
                // A refused batch is taken back while buffered.
                behind.push(&file, 0, 6, b"xyz");
                assert!(behind.take_back(0, 6));
                assert!(behind.continues(0, 6));
                behind.flush().expect("flush");
                assert_eq!(sim.contents(path).expect("file"), b"abcdef");
                assert!(behind.is_empty());
                assert_eq!(behind.unwritten_from(0), None);
                assert_eq!(
                    behind.get(0, 0, 3),
                    None,
                    "written frames are read from the file"
                );
                // Once flushed, a batch cannot be taken back here (the caller cuts the file).
                behind.push(&file, 0, 6, b"ghi");
                behind.flush().expect("flush");
                assert!(!behind.take_back(0, 6));
                // (Nor at or past where the written ones end: nothing is buffered.)
                assert!(!behind.take_back(0, 9));
                assert!(!behind.take_back(0, 12));
                // A failed write keeps the frames buffered for the next flush.
                behind.push(&file, 0, 9, b"jkl");
                // A batch that started below the buffered frames was written: not taken back here.
                assert!(!behind.take_back(0, 6));
                assert_eq!(behind.len(), 3);
                sim.fail_writes(libc::EIO, 1);
                assert!(behind.flush().is_err());
                assert_eq!(behind.get(0, 9, 3).as_deref(), Some(&b"jkl"[..]));
                behind.flush().expect("flush");
                assert_eq!(sim.contents(path).expect("file"), b"abcdefghijkl");
                // A batch after others is taken back alone; one that is all the buffer, whole.
                behind.push(&file, 0, 12, b"mno");
                behind.push(&file, 0, 15, b"pqr");
                assert!(behind.take_back(0, 15));
                assert_eq!(behind.get(0, 12, 3).as_deref(), Some(&b"mno"[..]));
                assert_eq!(behind.len(), 3);
                assert!(behind.take_back(0, 12));
                assert!(behind.is_empty());
            });
    }
}
