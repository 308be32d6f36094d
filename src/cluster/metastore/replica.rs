//! This node's copy of the metastore: loaded with one range read, then kept current by a watch of the whole prefix
//! from the read's revision + 1. A broken watch resumes from the last applied revision, so nothing is missed; if
//! etcd compacted that revision away, everything is read again and the watch resumes after the new read. The
//! follow task and the copy live on core 0; other cores get `Arc<Snapshot>`s from it.
//!
//! The copy may lag etcd. A topic it does not know may exist already: `lookup_topic` asks etcd before answering
//! "not found" (docs/api.md: no `404` for a topic the cluster knows).

use super::keys::TopicRecord;
use super::snapshot::{Change, Snapshot};
use super::watched::Watched;
use super::{MetaError, Metastore, RETRY_MAX, RETRY_MIN};
use crate::cluster::etcd::{EtcdError, WatchBatch, WatchStream};
use std::cell::Cell;
use std::rc::Rc;
use std::sync::Arc;
use tracing::{info, warn};

/// How the replica is doing, for metrics and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReplicaStatus {
    /// A watch is open: changes arrive as etcd makes them.
    pub following: bool,
    /// Full range reads so far (1 at start; one more per compaction that outran the replica).
    pub full_reads: u64,
    /// Watches opened again after one broke.
    pub reconnects: u64,
}

/// The replica. Dropping it stops following.
pub struct Replica {
    shared: Rc<Shared>,
    /// The follow task; dropping it cancels it.
    _task: glommio::Task<()>,
}

struct Shared {
    store: Rc<Metastore>,
    snapshot: Watched<Arc<Snapshot>>,
    status: Cell<ReplicaStatus>,
    /// Tests: drop the watch and do not open another until released.
    #[cfg(test)]
    held: Cell<bool>,
    #[cfg(test)]
    held_changed: event_listener::Event,
}

impl Metastore {
    /// Reads everything once and starts following (a task on the calling executor). Fails if the first read does.
    pub async fn replica(self: &Rc<Self>) -> Result<Replica, MetaError> {
        let first = self.read_all().await?;
        let shared = Rc::new(Shared {
            store: self.clone(),
            snapshot: Watched::new(Arc::new(Snapshot::default())),
            status: Cell::new(ReplicaStatus {
                following: false,
                full_reads: 1,
                reconnects: 0,
            }),
            #[cfg(test)]
            held: Cell::new(false),
            #[cfg(test)]
            held_changed: event_listener::Event::new(),
        });
        shared.publish(first);
        let task = glommio::spawn_local(follow(shared.clone()));
        Ok(Replica {
            shared,
            _task: task,
        })
    }
}

impl Shared {
    fn publish(&self, mut snapshot: Snapshot) {
        snapshot.version = self.snapshot.version() + 1;
        self.snapshot.set(Arc::new(snapshot));
    }

    fn update(&self, f: impl FnOnce(&mut ReplicaStatus)) {
        let mut s = self.status.get();
        f(&mut s);
        self.status.set(s);
    }

    fn apply(&self, batch: &WatchBatch) {
        let mut next = (*self.snapshot.get()).clone();
        for event in &batch.events {
            next.apply(&self.store.keys, event);
        }
        self.publish(next);
    }

    /// The next batch of the watch; `None` when a test holds the replica.
    async fn next_batch(&self, watch: &mut WatchStream) -> Option<Result<WatchBatch, EtcdError>> {
        #[cfg(test)]
        {
            let held = self.held_changed.listen();
            if self.held.get() {
                return None;
            }
            futures_lite::future::or(async { Some(watch.next().await) }, async {
                held.await;
                None
            })
            .await
        }
        #[cfg(not(test))]
        {
            Some(watch.next().await)
        }
    }

    /// Waits while a test holds the replica.
    async fn wait_unheld(&self) {
        #[cfg(test)]
        loop {
            let changed = self.held_changed.listen();
            if !self.held.get() {
                return;
            }
            changed.await;
        }
    }
}

/// The follow task: watch from the snapshot's revision + 1, apply batches, resume after breaks, read everything
/// again after a compaction.
async fn follow(shared: Rc<Shared>) {
    let store = shared.store.clone();
    let prefix = store.keys.prefix().as_bytes().to_vec();
    let mut backoff = RETRY_MIN;
    let mut quiet = false; // a failure has been logged; log again only after a success
    loop {
        shared.wait_unheld().await;
        let from = shared.snapshot.get().revision + 1;
        let error = match store.etcd.watch(&prefix, from).await {
            Ok(mut watch) => {
                shared.update(|s| s.following = true);
                if quiet {
                    info!(revision = from - 1, "metastore replica: following again");
                    quiet = false;
                }
                backoff = RETRY_MIN;
                let error = loop {
                    match shared.next_batch(&mut watch).await {
                        Some(Ok(batch)) => shared.apply(&batch),
                        Some(Err(e)) => break Some(e),
                        None => break None,
                    }
                };
                shared.update(|s| {
                    s.following = false;
                    s.reconnects += 1;
                });
                error
            }
            Err(e) => Some(e),
        };
        match error {
            Some(EtcdError::Compacted { compact_revision }) => {
                warn!(
                    from,
                    compact_revision,
                    "metastore replica: history compacted; reading everything again"
                );
                match store.read_all().await {
                    Ok(snapshot) => {
                        shared.update(|s| s.full_reads += 1);
                        shared.publish(snapshot);
                        continue;
                    }
                    Err(e) => warn!(error = %e, "metastore replica: full read failed"),
                }
            }
            Some(e) if !quiet => {
                warn!(error = %e, "metastore replica: watch broken; resuming from the last revision");
                quiet = true;
            }
            _ => {}
        }
        glommio::timer::sleep(backoff).await;
        backoff = (backoff * 2).min(RETRY_MAX);
    }
}

/// Waits for the replica's changes: each `next()` returns the newest snapshot and what differs from the one the
/// previous call returned (starting from the snapshot current when `changes()` was called).
pub struct Changes {
    shared: Rc<Shared>,
    seen: Arc<Snapshot>,
}

impl Changes {
    pub async fn next(&mut self) -> (Arc<Snapshot>, Vec<Change>) {
        loop {
            let (_, now) = self.shared.snapshot.newer_than(self.seen.version).await;
            let changes = now.changes_since(&self.seen);
            self.seen = now.clone();
            if !changes.is_empty() {
                return (now, changes);
            }
        }
    }
}

impl Replica {
    /// The newest snapshot (cheap: an `Arc`).
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.shared.snapshot.get()
    }

    pub fn status(&self) -> ReplicaStatus {
        self.shared.status.get()
    }

    pub fn changes(&self) -> Changes {
        Changes {
            shared: self.shared.clone(),
            seen: self.snapshot(),
        }
    }

    /// Waits until the replica has applied every change up to `revision` (a write's revision: read your writes).
    /// Wrap it in a timeout: a replica cut off from etcd waits for as long as that lasts.
    pub async fn caught_up(&self, revision: i64) -> Arc<Snapshot> {
        let mut seen = 0;
        loop {
            let (version, snapshot) = self.shared.snapshot.newer_than(seen).await;
            if snapshot.revision >= revision {
                return snapshot;
            }
            seen = version;
        }
    }

    /// A topic from the replica or, when the replica does not know it (yet), straight from etcd.
    pub async fn lookup_topic(&self, name: &str) -> Result<Option<Arc<TopicRecord>>, MetaError> {
        if let Some(topic) = self.snapshot().topic(name) {
            return Ok(Some(topic.clone()));
        }
        Ok(self.shared.store.topic(name).await?.map(Arc::new))
    }

    /// Tests: drop the watch now and open none until released (the replica falls behind).
    #[cfg(test)]
    pub(crate) fn hold(&self, held: bool) {
        self.shared.held.set(held);
        self.shared.held_changed.notify(usize::MAX);
    }
}
