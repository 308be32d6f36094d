//! A replica's epoch floor (`storage/epoch_floor.rs`, `replica.epoch`): the lowest leadership epoch whose requests
//! it takes. Raised durably before the replica answers a request of a higher epoch, never lowered, so that what it
//! promised a new leader survives its crash (`docs/replication.md`, step 4).

use super::{Partition, PartitionError};

impl Partition {
    /// The epoch floor its file holds (0: none).
    pub fn epoch_floor(&self) -> u64 {
        self.epoch_floor.get()
    }

    /// Raises the durable floor to `epoch`; returns once `replica.epoch` holds it (or a higher one). At or below
    /// the floor it writes nothing. One write at a time: a call that finds one running waits for it and then looks
    /// again, so the file only ever moves up.
    pub async fn raise_epoch_floor(&self, epoch: u64) -> Result<(), PartitionError> {
        self.assert_owner();
        loop {
            if self.epoch_floor.get() >= epoch {
                return Ok(());
            }
            if !self.raising_floor.get() {
                break;
            }
            let raised = self.floor_raised.listen();
            if self.raising_floor.get() {
                raised.await;
            }
        }
        if self.closed.get() {
            // Its directory may already belong to a new topic of the same name.
            return Err(PartitionError::Closed);
        }
        self.raising_floor.set(true);
        let _turn = FloorTurn(self);
        crate::storage::epoch_floor::write(&*self.storage, &self.dir, epoch)
            .await
            .map_err(|e| PartitionError::Storage(format!("cannot raise its epoch floor: {e}")))?;
        assert!(
            self.epoch_floor.get() < epoch,
            "one raise of the epoch floor at a time"
        );
        self.epoch_floor.set(epoch);
        Ok(())
    }
}

/// The running raise's turn: however it ends (a failed write, a dropped task), the next caller may write.
struct FloorTurn<'a>(&'a Partition);

impl Drop for FloorTurn<'_> {
    fn drop(&mut self) {
        self.0.raising_floor.set(false);
        self.0.floor_raised.notify(usize::MAX);
    }
}
