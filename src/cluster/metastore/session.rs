//! This node's registration: a lease, the permanent member record with the node's index, and the lease-bound alive
//! key, all written in one transaction that refuses an id another live node holds; then a keep-alive task on core 0
//! that refreshes the lease, notices when the session is lost, and registers again once etcd answers.
//!
//! "Lost" is decided locally: the session counts as lost once the grace (at least the TTL, default 15 s) has run
//! out since the send time of the last refresh etcd acknowledged, or when etcd says the lease is gone and the id is
//! then held by another live lease. A lease etcd expired (a paused etcd expires leases when it resumes) is
//! replaced at once without a loss when nobody else took the id. While `Lost`, the node must not claim its
//! partitions until the state is `Live` again. The rule and its safety argument: docs/cluster.md.

use super::keys::{
    decode_counter, decode_member, encode_alive, encode_counter, encode_member, Keys, MemberRecord,
};
use super::watched::Watched;
use super::{ranges, MetaError, Metastore, MAX_TXN_ATTEMPTS, RETRY_MAX, RETRY_MIN};
use crate::cluster::etcd::{Compare, EtcdError, KeyValue, TxnOp};
use crate::cluster::within;
use crate::engine::placement::NodeIndex;
use crate::engine::topic::validate_name;
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::{Duration, Instant};
use tracing::{debug, error, info, warn};

/// What a node publishes about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSpec {
    /// `--node-id`; follows the topic-name rule.
    pub id: String,
    /// Client HTTP address as others should reach it (`--advertise`).
    pub advertise: String,
    /// Node RPC address (`--peer-listen`).
    pub peer_addr: String,
    /// Executor cores of this node.
    pub cores: u32,
    /// The data directory's incarnation id (`storage::incarnation`), empty where none is known (tests).
    pub incarnation: String,
}

/// Where a session stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionState {
    /// The alive key is held by `lease`: the node may serve its partitions.
    Live { lease: i64 },
    /// `session_lost`: the lease expired or could not be refreshed in time. Stop claiming partitions; the session
    /// registers again by itself (new lease, same index) when etcd answers.
    Lost,
    /// [`Session::close`] ended it.
    Closed,
}

/// A registered node's session. Lives on core 0; dropping it stops the keep-alive (the lease then expires within
/// its TTL), [`Session::close`] revokes the lease at once.
pub struct Session {
    shared: Rc<Shared>,
    /// The keep-alive and re-registration task; dropping it cancels it.
    task: RefCell<Option<glommio::Task<()>>>,
}

struct Shared {
    store: Rc<Metastore>,
    spec: NodeSpec,
    index: NodeIndex,
    state: Watched<SessionState>,
    /// Sessions lost so far.
    losses: Cell<u64>,
    /// Tests stop refreshing (and re-registering) to let the lease expire.
    #[cfg(test)]
    suspended: Cell<bool>,
}

impl Shared {
    fn suspended(&self) -> bool {
        #[cfg(test)]
        {
            self.suspended.get()
        }
        #[cfg(not(test))]
        {
            false
        }
    }
}

/// A successful registration.
struct Registered {
    index: NodeIndex,
    lease: i64,
    /// When the lease counts as expired unless refreshed: the grant's send time + TTL.
    deadline: Instant,
    /// The revision that wrote the member record: a later one means someone else registered under this id.
    member_revision: i64,
}

impl Metastore {
    /// Registers this node and starts keeping its session alive (a task on the calling executor). Fails with
    /// [`MetaError::NodeIdInUse`] when another live node holds `spec.id`. The first registration of an id gets the
    /// next node index; later ones keep it (and update the addresses and core count).
    pub async fn register(self: &Rc<Self>, spec: NodeSpec) -> Result<Session, MetaError> {
        validate_name(&spec.id).map_err(|e| MetaError::Invalid(format!("node id: {e}")))?;
        if spec.advertise.is_empty() || spec.peer_addr.is_empty() || spec.cores == 0 {
            return Err(MetaError::Invalid(
                "a node needs an advertise address, a peer address and at least one core".into(),
            ));
        }
        let r = self.try_register(&spec, None, None, None).await?;
        info!(node = %spec.id, index = r.index, lease = format_args!("{:x}", r.lease), "metastore: node registered");
        let shared = Rc::new(Shared {
            store: self.clone(),
            spec,
            index: r.index,
            state: Watched::new(SessionState::Live { lease: r.lease }),
            losses: Cell::new(0),
            #[cfg(test)]
            suspended: Cell::new(false),
        });
        let task = glommio::spawn_local(keep(shared.clone(), r));
        Ok(Session {
            shared,
            task: RefCell::new(Some(task)),
        })
    }

    /// Node `id`'s member record as etcd holds it now (None: it never registered), with etcd's revision at the
    /// read: a node reads it before it registers, to tell whether its data directory is the one the cluster knew
    /// (`storage::learner`).
    pub async fn member(&self, id: &str) -> Result<(Option<MemberRecord>, i64), MetaError> {
        let read = self
            .etcd
            .txn(&[], &[TxnOp::get(self.keys.member(id))], &[])
            .await?;
        let record = match ranges(&read, 1)?[0].kvs.first() {
            Some(kv) => Some(decode_member(id, kv)?),
            None => None,
        };
        Ok((record, read.revision))
    }

    /// One registration: read the member, alive and counter keys; grant a lease; write member (and counter, the
    /// first time) and alive key in a txn comparing what was read. `previous` is this session's own lost lease:
    /// if etcd still holds the alive key under it, it is revoked first. `keep_index` re-registers a known node:
    /// a missing member record is written again with that index rather than a new one.
    async fn try_register(
        &self,
        spec: &NodeSpec,
        previous: Option<i64>,
        keep_index: Option<NodeIndex>,
        unchanged_since: Option<i64>,
    ) -> Result<Registered, MetaError> {
        let (member_key, alive_key) = (self.keys.member(&spec.id), self.keys.alive(&spec.id));
        for _ in 0..MAX_TXN_ATTEMPTS {
            let read = self
                .etcd
                .txn(
                    &[],
                    &[
                        TxnOp::get(member_key.clone()),
                        TxnOp::get(alive_key.clone()),
                        TxnOp::get(self.keys.node_counter()),
                    ],
                    &[],
                )
                .await?;
            let r = ranges(&read, 3)?;
            if let Some(alive) = r[1].kvs.first() {
                if alive.lease != 0 && previous == Some(alive.lease) {
                    match self.etcd.lease_revoke(alive.lease).await {
                        Ok(()) | Err(EtcdError::LeaseNotFound(_)) => continue,
                        Err(e) => return Err(e.into()),
                    }
                }
                return Err(MetaError::NodeIdInUse {
                    id: spec.id.clone(),
                });
            }
            // Renewing without a loss: the member record must be the one this session wrote. Rewritten since, it
            // means another process registered under this id while this one could not reach etcd.
            if let Some(revision) = unchanged_since {
                if r[0].kvs.first().map(|kv| kv.mod_revision) != Some(revision) {
                    return Err(MetaError::NodeIdInUse {
                        id: spec.id.clone(),
                    });
                }
            }
            let member = match r[0].kvs.first() {
                Some(kv) => Some((decode_member(&spec.id, kv)?, kv.mod_revision)),
                None => None,
            };
            let (index, mut compares, mut ops) =
                plan(&self.keys, spec, member, r[2].kvs.first(), keep_index)?;
            let sent = Instant::now();
            let lease = self.etcd.lease_grant(self.lease_ttl_s).await?;
            let alive = encode_alive(lease, crate::clock::wall_clock_ms());
            compares.push(Compare::absent(alive_key.clone()));
            ops.push(TxnOp::put(alive_key.clone(), alive, Some(lease)));
            match self.etcd.txn(&compares, &ops, &[]).await {
                Ok(t) if t.succeeded => {
                    return Ok(Registered {
                        index,
                        lease,
                        deadline: sent + Duration::from_secs(self.lease_ttl_s as u64),
                        member_revision: t.revision,
                    })
                }
                // Someone else registered or allocated in between: read again. The lease goes either way (if the
                // txn did apply unseen, revoking it removes the alive key it wrote).
                outcome => {
                    if let Err(e) = self.etcd.lease_revoke(lease).await {
                        debug!(error = %e, "metastore: revoking an unused lease");
                    }
                    outcome?;
                }
            }
        }
        Err(MetaError::Contended("register"))
    }
}

/// The member part of a registration, from what was read: the node's index, the compares that make sure nothing
/// changed since, and the writes (member record; the counter too when a new index is handed out). `member` is the
/// decoded member record with its mod revision.
fn plan(
    keys: &Keys,
    spec: &NodeSpec,
    member: Option<(MemberRecord, i64)>,
    counter: Option<&KeyValue>,
    keep_index: Option<NodeIndex>,
) -> Result<(NodeIndex, Vec<Compare>, Vec<TxnOp>), MetaError> {
    let member_key = keys.member(&spec.id);
    let mut compares = Vec::new();
    let mut ops = Vec::new();
    let index = match (member, keep_index) {
        (Some((m, _)), Some(keep)) if m.index != keep => {
            return Err(MetaError::Corrupt {
                key: String::from_utf8_lossy(&member_key).into_owned(),
                reason: format!(
                    "index changed from {keep} to {} under a running node",
                    m.index
                ),
            });
        }
        (Some((m, revision)), _) => {
            if !m.incarnation.is_empty() && m.incarnation != spec.incarnation {
                warn!(node = %spec.id, was = %m.incarnation, now = %spec.incarnation, "metastore: this node's data directory is a new incarnation (a replaced or wiped disk): what it held before is gone from it");
            }
            compares.push(Compare::mod_revision_is(member_key.clone(), revision));
            m.index
        }
        (None, Some(keep)) => {
            compares.push(Compare::absent(member_key.clone()));
            keep
        }
        (None, None) => {
            // An absent counter has mod revision 0, which the compare checks just as well.
            let (next, revision) = match counter {
                Some(kv) => (decode_counter(kv)?, kv.mod_revision),
                None => (0, 0),
            };
            let after = next.checked_add(1).ok_or(MetaError::NodeIndexExhausted)?;
            compares.push(Compare::absent(member_key.clone()));
            compares.push(Compare::mod_revision_is(keys.node_counter(), revision));
            ops.push(TxnOp::put(keys.node_counter(), encode_counter(after), None));
            next
        }
    };
    let record = MemberRecord {
        id: spec.id.clone(),
        index,
        advertise: spec.advertise.clone(),
        peer_addr: spec.peer_addr.clone(),
        cores: spec.cores,
        incarnation: spec.incarnation.clone(),
    };
    ops.push(TxnOp::put(member_key, encode_member(&record), None));
    Ok((index, compares, ops))
}

/// Refreshes every third of the TTL (at least this often).
fn refresh_interval(ttl: Duration) -> Duration {
    (ttl / 3).max(RETRY_MIN)
}

/// How holding a lease ended.
enum Held {
    /// Not acknowledged within the grace, or etcd said the id is held by another live lease: fence.
    Lost,
    /// etcd no longer knew the lease (it expired there, e.g. while etcd itself was paused) and a new registration
    /// went through at once, within the grace, with the member record still the one this session wrote: nobody
    /// registered under the id in between, so no fence.
    Renewed(Registered),
}

/// The session task: hold the lease until it is lost, publish `Lost`, register again, publish `Live`, repeat.
async fn keep(shared: Rc<Shared>, mut registered: Registered) {
    loop {
        let lease = registered.lease;
        match hold(&shared, &registered).await {
            Held::Renewed(r) => {
                info!(node = %shared.spec.id, old = format_args!("{lease:x}"), lease = format_args!("{:x}", r.lease), "metastore: the lease expired in etcd; registered again within the grace, still serving");
                shared.state.set(SessionState::Live { lease: r.lease });
                registered = r;
                continue;
            }
            Held::Lost => {}
        }
        shared.losses.set(shared.losses.get() + 1);
        warn!(node = %shared.spec.id, lease = format_args!("{lease:x}"), "metastore: session lost; not claiming partitions until registered again");
        shared.state.set(SessionState::Lost);
        registered = reregister(&shared, lease).await;
        info!(node = %shared.spec.id, lease = format_args!("{:x}", registered.lease), "metastore: node registered again");
        shared.state.set(SessionState::Live {
            lease: registered.lease,
        });
    }
}

/// Refreshes `lease` until the session must fence or has a new lease. `deadline` is when etcd may expire the lease
/// (the send time of the last acknowledged refresh + TTL); the session stays `Live` until that send time + the
/// grace (`Metastore::grace`, at least the TTL) while etcd does not answer, because the partitions this node owns
/// can be served by nobody else (see docs/cluster.md, "Riding out an etcd outage").
async fn hold(shared: &Shared, registered: &Registered) -> Held {
    let (lease, mut deadline) = (registered.lease, registered.deadline);
    let member_revision = registered.member_revision;
    let etcd = &shared.store.etcd;
    let ttl = Duration::from_secs(shared.store.lease_ttl_s as u64);
    let beyond_ttl = shared.store.grace.saturating_sub(ttl);
    let mut wait = refresh_interval(ttl);
    loop {
        let fence_at = deadline + beyond_ttl;
        let left = fence_at.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Held::Lost;
        }
        glommio::timer::sleep(wait.min(left)).await;
        if shared.suspended() {
            wait = RETRY_MIN;
            continue;
        }
        let sent = Instant::now();
        let left = fence_at.saturating_duration_since(sent);
        match within(left, etcd.lease_keepalive_once(lease)).await {
            None => return Held::Lost,
            Some(Err(EtcdError::LeaseNotFound(_))) => {
                // etcd answers, and the lease is gone: register again now. If another live lease holds the id by
                // now, someone else may serve as this node: fence.
                match within(
                    left,
                    shared.store.try_register(
                        &shared.spec,
                        Some(lease),
                        Some(shared.index),
                        Some(member_revision),
                    ),
                )
                .await
                {
                    Some(Ok(r)) => return Held::Renewed(r),
                    Some(Err(e @ (MetaError::NodeIdInUse { .. } | MetaError::Corrupt { .. }))) => {
                        error!(node = %shared.spec.id, error = %e, "metastore: the lease expired and the id is taken");
                        return Held::Lost;
                    }
                    // etcd went away again or the write's outcome is unknown: the old lease is gone for good, so
                    // the usual lost path (fence, register again) takes over.
                    Some(Err(e)) => {
                        debug!(error = %e, "metastore: cannot register again at once");
                        return Held::Lost;
                    }
                    None => return Held::Lost,
                }
            }
            Some(Ok(ttl_s)) => {
                // etcd may grant more than was asked (its minimum); counting only what was asked loses the session
                // early rather than late, and keeps a wild answer from overflowing the clock.
                let ttl = Duration::from_secs(ttl_s.min(shared.store.lease_ttl_s) as u64);
                deadline = sent + ttl;
                wait = refresh_interval(ttl);
            }
            Some(Err(e)) => {
                debug!(error = %e, "metastore: lease refresh failed; retrying");
                wait = RETRY_MIN;
            }
        }
    }
}

/// Registers again after a loss, retrying with backoff until it works.
async fn reregister(shared: &Shared, lost: i64) -> Registered {
    let mut backoff = RETRY_MIN;
    loop {
        if !shared.suspended() {
            match shared
                .store
                .try_register(&shared.spec, Some(lost), Some(shared.index), None)
                .await
            {
                Ok(r) => return r,
                Err(e @ (MetaError::NodeIdInUse { .. } | MetaError::Corrupt { .. })) => {
                    error!(node = %shared.spec.id, error = %e, "metastore: cannot register again")
                }
                Err(e) => debug!(error = %e, "metastore: cannot register again yet"),
            }
        }
        glommio::timer::sleep(backoff).await;
        backoff = (backoff * 2).min(RETRY_MAX);
    }
}

impl Session {
    pub fn id(&self) -> &str {
        &self.shared.spec.id
    }

    /// This node's index (`Location.node`), stable across sessions and restarts.
    pub fn index(&self) -> NodeIndex {
        self.shared.index
    }

    pub fn state(&self) -> SessionState {
        self.shared.state.get()
    }

    /// Sessions lost so far. A watcher that sees a new lease without having seen `Lost` learns of the loss here.
    pub fn losses(&self) -> u64 {
        self.shared.losses.get()
    }

    /// Waits for a state change after version `seen` (start from 0), updates `seen`, returns the new state.
    /// Changes coalesce: a slow watcher may see `Live` with a new lease instead of `Lost` then `Live`.
    pub async fn next_state(&self, seen: &mut u64) -> SessionState {
        let (version, state) = self.shared.state.newer_than(*seen).await;
        *seen = version;
        state
    }

    /// Ends the session: stops the keep-alive and revokes the lease, so other nodes see this one dead at once.
    pub async fn close(&self) -> Result<(), MetaError> {
        drop(self.task.borrow_mut().take());
        let state = self.shared.state.get();
        self.shared.state.set(SessionState::Closed);
        if let SessionState::Live { lease } = state {
            match self.shared.store.etcd.lease_revoke(lease).await {
                Ok(()) | Err(EtcdError::LeaseNotFound(_)) => {}
                Err(e) => return Err(e.into()),
            }
        }
        info!(node = %self.shared.spec.id, "metastore: session closed");
        Ok(())
    }

    /// Tests: stop (or restart) refreshing and re-registering, as a node whose keep-alives cannot get through.
    #[cfg(test)]
    pub(crate) fn suspend_keepalive(&self, suspended: bool) {
        self.shared.suspended.set(suspended);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::etcd::CompareTarget;

    fn spec() -> NodeSpec {
        NodeSpec {
            id: "n1".into(),
            advertise: "a:1".into(),
            peer_addr: "a:2".into(),
            cores: 4,
            incarnation: String::new(),
        }
    }

    fn counter(next: NodeIndex, revision: i64) -> KeyValue {
        KeyValue {
            value: encode_counter(next),
            mod_revision: revision,
            ..KeyValue::default()
        }
    }

    fn written_keys(ops: &[TxnOp]) -> Vec<String> {
        ops.iter()
            .map(|op| match op {
                TxnOp::Put { key, .. } => String::from_utf8_lossy(key).into_owned(),
                other => panic!("not a put: {other:?}"),
            })
            .collect()
    }

    #[test]
    fn a_first_registration_takes_the_next_index_and_bumps_the_counter() {
        let k = Keys::for_cluster("c").unwrap();
        let (index, compares, ops) = plan(&k, &spec(), None, None, None).unwrap();
        assert_eq!(index, 0);
        assert_eq!(
            compares,
            [
                Compare::absent(k.member("n1")),
                Compare::mod_revision_is(k.node_counter(), 0)
            ]
        );
        assert_eq!(
            written_keys(&ops),
            ["/berth/c/node-counter", "/berth/c/nodes/n1"]
        );
        let (index, compares, _) = plan(&k, &spec(), None, Some(&counter(7, 40)), None).unwrap();
        assert_eq!(index, 7);
        assert!(compares.contains(&Compare::mod_revision_is(k.node_counter(), 40)));
        assert!(matches!(
            plan(&k, &spec(), None, Some(&counter(NodeIndex::MAX, 1)), None),
            Err(MetaError::NodeIndexExhausted)
        ));
    }

    #[test]
    fn a_known_node_keeps_its_index_whatever_the_counter_holds() {
        let k = Keys::for_cluster("c").unwrap();
        let old = MemberRecord {
            id: "n1".into(),
            index: 3,
            advertise: "old:1".into(),
            peer_addr: "old:2".into(),
            cores: 1,
            incarnation: String::new(),
        };
        let garbage = KeyValue {
            value: b"?".to_vec(),
            ..KeyValue::default()
        };
        let (index, compares, ops) =
            plan(&k, &spec(), Some((old.clone(), 12)), Some(&garbage), None).unwrap();
        assert_eq!(index, 3);
        assert_eq!(compares, [Compare::mod_revision_is(k.member("n1"), 12)]);
        assert_eq!(written_keys(&ops), ["/berth/c/nodes/n1"]);
        // A running node whose member record vanished writes it back under its index.
        let (index, compares, _) = plan(&k, &spec(), None, None, Some(3)).unwrap();
        assert_eq!(index, 3);
        assert_eq!(
            compares[0],
            Compare::new(
                k.member("n1"),
                crate::cluster::etcd::CompareOp::Equal,
                CompareTarget::CreateRevision(0)
            )
        );
        assert!(matches!(
            plan(&k, &spec(), Some((old, 12)), None, Some(5)),
            Err(MetaError::Corrupt { .. })
        ));
    }
}
