//! `drains/<id>`: the nodes whose replicas move to other nodes (`POST /cluster/nodes/ID/drain` before maintenance,
//! `DELETE /cluster/nodes/ID` for a node gone for good). The key says only that; the moves themselves are each
//! partition's leader's (`front::mover`), one replica at a time, and a node is drained once no partition names it.

use super::keys::{decode_drain, decode_member, encode_drain, DrainRecord};
use super::{ranges, MetaError, Metastore};
use crate::cluster::etcd::{Compare, TxnOp};
use tracing::info;

/// Node `id`'s drain as read with its member record: the record (a damaged one reads as none) and the key's mod
/// revision (0: absent).
type Read = (Option<DrainRecord>, i64);

impl Metastore {
    /// Node `id`'s member and drain keys, read together: None when no node of that id ever registered.
    async fn read_drain(&self, id: &str) -> Result<Option<Read>, MetaError> {
        let read = self
            .etcd
            .txn(
                &[],
                &[
                    TxnOp::get(self.keys.member(id)),
                    TxnOp::get(self.keys.drain(id)),
                ],
                &[],
            )
            .await?;
        let got = ranges(&read, 2)?;
        let Some(kv) = got[0].kvs.first() else {
            return Ok(None);
        };
        decode_member(id, kv)?;
        Ok(Some(match got[1].kvs.first() {
            Some(kv) => (decode_drain(kv).ok(), kv.mod_revision),
            None => (None, 0),
        }))
    }

    /// Marks node `id` drained, or (`removed`) removed for good, as of `now_ms`. None: no node of that id ever
    /// registered. A removal is never turned back into a drain: the record written is the one that holds.
    pub async fn set_drain(
        &self,
        id: &str,
        removed: bool,
        now_ms: u64,
    ) -> Result<Option<DrainRecord>, MetaError> {
        let drain = self.keys.drain(id);
        for _ in 0..super::MAX_TXN_ATTEMPTS {
            let Some((existing, revision)) = self.read_drain(id).await? else {
                return Ok(None);
            };
            if let Some(existing) = existing.filter(|e| e.removed || !removed) {
                return Ok(Some(existing));
            }
            let record = DrainRecord {
                removed,
                since_ms: now_ms,
            };
            let unchanged = if revision == 0 {
                Compare::absent(drain.clone())
            } else {
                Compare::mod_revision_is(drain.clone(), revision)
            };
            let t = self
                .etcd
                .txn(
                    &[unchanged],
                    &[TxnOp::put(drain.clone(), encode_drain(&record), None)],
                    &[],
                )
                .await?;
            if t.succeeded {
                info!(
                    node = id,
                    removed, "metastore: the node's replicas move to other nodes"
                );
                return Ok(Some(record));
            }
        }
        Err(MetaError::Contended("drain"))
    }

    /// Ends node `id`'s drain (its record deleted) unless it is a removal. Returns what held before (a record with
    /// `since_ms` 0 when there was none), None when no node of that id ever registered.
    pub async fn end_drain(&self, id: &str) -> Result<Option<DrainRecord>, MetaError> {
        let drain = self.keys.drain(id);
        let none = DrainRecord {
            removed: false,
            since_ms: 0,
        };
        for _ in 0..super::MAX_TXN_ATTEMPTS {
            let Some((existing, revision)) = self.read_drain(id).await? else {
                return Ok(None);
            };
            let existing = existing.unwrap_or(none);
            if revision == 0 || existing.removed {
                return Ok(Some(existing));
            }
            let t = self
                .etcd
                .txn(
                    &[Compare::mod_revision_is(drain.clone(), revision)],
                    &[TxnOp::delete(drain.clone())],
                    &[],
                )
                .await?;
            if t.succeeded {
                info!(node = id, "metastore: the node's drain ended");
                return Ok(Some(existing));
            }
        }
        Err(MetaError::Contended("end of a drain"))
    }

    /// Node `id`'s drain or removal, as etcd holds it now.
    pub async fn drain_of(&self, id: &str) -> Result<Option<DrainRecord>, MetaError> {
        let read = self
            .etcd
            .txn(&[], &[TxnOp::get(self.keys.drain(id))], &[])
            .await?;
        match ranges(&read, 1)?[0].kvs.first() {
            Some(kv) => Ok(Some(decode_drain(kv)?)),
            None => Ok(None),
        }
    }
}
