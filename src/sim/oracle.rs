//! The oracle: what clients were told (acknowledged produces, deliveries, live leases, settled offsets) and the
//! checks each new answer must pass against it.

use super::*;

/// What the oracle knows of one produced body.
#[derive(Debug, Clone)]
pub(super) struct Produced {
    pub(super) topic: String,
    pub(super) topic_id: u64,
    /// Where the server said it is (acknowledged), or where it was first seen (indeterminate).
    pub(super) place: Option<(u32, u64)>,
    pub(super) acked: bool,
}

/// Everything clients were told, and the checks against it.
#[derive(Default)]
pub(super) struct Oracle {
    pub(super) seed: u64,
    pub(super) produced: BTreeMap<String, Produced>,
    /// (body, group) → deliveries.
    pub(super) delivered: BTreeMap<(String, String), u32>,
    /// (topic, body, group) a client's ack of was answered `200`, in any process.
    pub(super) client_acked: BTreeSet<(String, String, String)>,
    /// (topic, body) delivered to a client of that topic (a dead-letter or redriven copy is seen in its topic).
    pub(super) seen_in: BTreeSet<(String, String)>,
    /// Where copies were seen in the copy topics: (topic id, partition, offset) → body (a bit flip there excuses it).
    pub(super) copy_places: BTreeMap<(u64, u32, u64), String>,
    /// Handles clients were given, newest last (at most 64): presented again later as stale handles.
    pub(super) old_handles: std::collections::VecDeque<OldHandle>,
    /// Until when leases the server took for itself (a redrive's) may hold messages back.
    pub(super) internal_leases_until: u64,
    /// Bodies whose record was damaged on purpose: their loss is excused (not that of a record written at the same
    /// offset later).
    pub(super) excused: BTreeSet<String>,
    /// Live leases as clients hold them: (topic id, group, partition, offset) → (nonce, expiry).
    pub(super) leases: BTreeMap<(u64, String, u32, u64), (u64, u64)>,
    /// Nacks sent and not answered yet: the server may already have released the lease (and leased the offset
    /// again) before the client hears back.
    pub(super) nacking: BTreeSet<((u64, String, u32, u64), u64)>,
    /// Settled (acked) in this process: never handed out again by it.
    pub(super) settled: BTreeSet<(u64, String, u32, u64)>,
    /// Highest committed frontier seen in this process.
    pub(super) frontier_mem: BTreeMap<(u64, String, u32), u64>,
    /// Highest frontier seen on disk, ever.
    pub(super) frontier_disk: BTreeMap<(u64, String, u32), u64>,
    /// Highest frontier a process held durable (in its file or its journal): after a restart's replay, the file
    /// holds at least that much.
    pub(super) frontier_durable: BTreeMap<(u64, String, u32), u64>,
    /// Everything a process held durable as settled, the acked-ahead ranges above the frontier included (what a
    /// restart starts from), merged over every process (acks of records a crash took dropped at each restart:
    /// `check_durable_frontiers`).
    pub(super) settled_durable:
        BTreeMap<(u64, String, u32), crate::partition::frontier::FrontierValue>,
    /// Topic ids deleted (their records need no delivery).
    pub(super) deleted: BTreeSet<u64>,
    /// Current id per topic name.
    pub(super) ids: BTreeMap<String, u64>,
    pub(super) next_body: u64,
    pub(super) log: Vec<String>,
}

/// A handle a client was once given.
#[derive(Debug, Clone)]
pub(super) struct OldHandle {
    pub(super) topic: &'static str,
    pub(super) topic_id: u64,
    pub(super) group: &'static str,
    pub(super) delivery: Delivery,
}

impl Oracle {
    pub(super) fn fail(&self, what: String) -> ! {
        let tail: Vec<&String> = self
            .log
            .iter()
            .rev()
            .take(
                std::env::var("BERTH_SIM_TAIL")
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(25),
            )
            .collect();
        panic!(
            "simulation seed {} found: {what}\nreplay: BERTH_SIM_SEED={} cargo test --release --lib sim::\nlast events (newest first):\n{}",
            self.seed,
            self.seed,
            tail.iter().map(|s| format!("  {s}")).collect::<Vec<_>>().join("\n")
        );
    }

    pub(super) fn note(&mut self, event: String) {
        if std::env::var_os("BERTH_SIM_TRACE").is_some() {
            eprintln!("  {event}");
        }
        if self.log.len() > 4000 {
            self.log.drain(..2000);
        }
        self.log.push(event);
    }

    pub(super) fn new_body(&mut self, topic: &str, topic_id: u64) -> String {
        self.next_body += 1;
        let body = format!("{topic}#{topic_id}#{}", self.next_body);
        self.produced.insert(
            body.clone(),
            Produced {
                topic: topic.to_string(),
                topic_id,
                place: None,
                acked: false,
            },
        );
        body
    }

    pub(super) fn acked(&mut self, body: &str, partition: u32, offset: u64) {
        let Some(p) = self.produced.get_mut(body) else {
            self.fail(format!("an acknowledgement for an unknown body {body}"));
        };
        if let Some(seen) = p.place {
            if seen != (partition, offset) {
                let what = format!(
                    "body {body} acknowledged at {partition}:{offset} but delivered at {}:{}",
                    seen.0, seen.1
                );
                self.fail(what);
            }
        }
        p.place = Some((partition, offset));
        p.acked = true;
    }

    /// A delivery, as a client got it at `now` (its lease ends at the owner's `expires_at_ms`).
    pub(super) fn delivery(
        &mut self,
        topic: &str,
        topic_id: u64,
        group: &str,
        d: &Delivery,
        now: u64,
    ) {
        let body = String::from_utf8_lossy(&d.payload).to_string();
        self.note(format!(
            "t={now} delivered {topic}/{group} {}:{}:{} count {} body {body}",
            d.partition, d.offset, d.nonce, d.delivery_count
        ));
        let Some(p) = self.produced.get(&body).cloned() else {
            self.fail(format!(
                "{topic}/{group} delivered {}:{} with a body nobody produced: {body:?}",
                d.partition, d.offset
            ));
        };
        if topic == DLQ || topic == REDRIVEN {
            if p.topic != SOURCE {
                self.fail(format!("{topic} delivered {body}, produced to {}", p.topic));
            }
            self.copy_places
                .insert((topic_id, d.partition, d.offset), body.clone());
        } else {
            if p.topic != topic || p.topic_id != topic_id {
                self.fail(format!(
                    "{topic} (id {topic_id}) delivered {body}, produced to {} (id {})",
                    p.topic, p.topic_id
                ));
            }
            match p.place {
                Some(place) if place != (d.partition, d.offset) => self.fail(format!(
                    "{body} was at {}:{} and is now delivered at {}:{}",
                    place.0, place.1, d.partition, d.offset
                )),
                Some(_) => {}
                None => {
                    self.produced.get_mut(&body).expect("known").place =
                        Some((d.partition, d.offset))
                }
            }
        }
        let key = (topic_id, group.to_string(), d.partition, d.offset);
        if let Some(v) = self
            .settled_durable
            .get(&(topic_id, group.to_string(), d.partition))
        {
            // Below the durable frontier, or acknowledged above it and durable with it (as much of that as a
            // restart takes back: `inflight::seedable`): never delivered again, by any process.
            let seeded =
                crate::partition::inflight::seedable(v.committed, &v.acked, u64::MAX, SIM_LIMITS);
            if d.offset < v.committed || seeded.iter().any(|&(s, e)| (s..e).contains(&d.offset)) {
                self.fail(format!(
                    "{topic}/{group} {}:{} delivered again though settled durably (committed {}, acked above it {:?})",
                    d.partition, d.offset, v.committed, v.acked
                ));
            }
        }
        if self.settled.contains(&key) {
            self.fail(format!(
                "{topic}/{group} {}:{} was acknowledged as settled in this process and is delivered again",
                d.partition, d.offset
            ));
        }
        if let Some(&(nonce, expiry)) = self.leases.get(&key) {
            if expiry > now && !self.nacking.contains(&(key.clone(), nonce)) {
                self.fail(format!(
                    "{topic}/{group} {}:{} leased twice: nonce {nonce} lives until {expiry}, nonce {} granted at {now}",
                    d.partition, d.offset, d.nonce
                ));
            }
        }
        if d.expires_at_ms <= now {
            self.fail(format!(
                "{key:?} handed out with a lease already over ({} at {now})",
                d.expires_at_ms
            ));
        }
        self.leases.insert(key, (d.nonce, d.expires_at_ms));
        self.seen_in.insert((topic.to_string(), body.clone()));
        *self.delivered.entry((body, group.to_string())).or_insert(0) += 1;
    }

    /// A nack is on its way: if its lease lives now, the server may release the lease (and lease the offset again)
    /// before the client hears back.
    pub(super) fn sending_nack(&mut self, key: (u64, String, u32, u64), nonce: u64, now: u64) {
        if self
            .leases
            .get(&key)
            .is_some_and(|&(n, expiry)| n == nonce && expiry > now)
        {
            self.nacking.insert((key, nonce));
        }
    }

    /// Remembers a handle a client was given, to present it again later (stale, or still live).
    pub(super) fn remember(
        &mut self,
        topic: &'static str,
        topic_id: u64,
        group: &'static str,
        d: &Delivery,
    ) {
        if self.old_handles.len() >= 64 {
            self.old_handles.pop_front();
        }
        self.old_handles.push_back(OldHandle {
            topic,
            topic_id,
            group,
            delivery: d.clone(),
        });
    }

    /// The answer to a settle of a lease the client held.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn settled_answer(
        &mut self,
        topic: &str,
        body: &str,
        key: (u64, String, u32, u64),
        nonce: u64,
        op: SettleOp,
        result: &Result<(), OpError>,
        now: u64,
        extend_ms: u64,
    ) {
        let was_nacking = self.nacking.remove(&(key.clone(), nonce));
        let current = self.leases.get(&key).is_some_and(|&(n, _)| n == nonce);
        let live = self
            .leases
            .get(&key)
            .is_some_and(|&(n, expiry)| n == nonce && expiry > now)
            // A nack sent while its lease lived and answered after the offset was leased again was applied while its
            // lease lived.
            || (matches!(op, SettleOp::Nack(_)) && !current && result.is_ok() && was_nacking);
        self.note(format!(
            "t={now} {op:?} {key:?} nonce {nonce} live {live} → {result:?}"
        ));
        match result {
            Ok(()) => {
                if !live {
                    // The server may accept a lease the client thinks expired only if it had not purged it yet,
                    // which cannot happen: both purge at the deadline.
                    let what =
                        format!("{op:?} of {key:?} nonce {nonce} accepted after its lease ended");
                    self.fail(what);
                }
                match op {
                    SettleOp::Ack => {
                        self.client_acked.insert((
                            topic.to_string(),
                            body.to_string(),
                            key.1.clone(),
                        ));
                        self.leases.remove(&key);
                        self.settled.insert(key);
                    }
                    // The offset may have been leased again meanwhile: only this nack's lease ends.
                    SettleOp::Nack(_) if current => {
                        self.leases.remove(&key);
                    }
                    SettleOp::Nack(_) => {}
                    SettleOp::Extend(_) => {
                        self.leases.insert(key, (nonce, now + extend_ms));
                    }
                }
            }
            Err(OpError::Engine(crate::engine::EngineError::Partition(
                PartitionError::LeaseGone,
            ))) => {
                if live {
                    self.fail(format!(
                        "{op:?} of a live lease {key:?} nonce {nonce} answered 410"
                    ));
                }
            }
            Err(_) => {}
        }
    }
}
