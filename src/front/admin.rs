//! Topic administration and observation at the front: creations, changes and deletions go to core 0, which
//! serialises them and has every core apply them; describe and metrics gather every core's part.

use super::Front;
use crate::engine::metrics::CoreStats;
use crate::engine::placement::PartitionState;
use crate::engine::topic::TopicConfig;
use crate::join::join_all;
use crate::ops::topics::Settings;
use crate::ops::{OpError, OpResult, Reply, Request};
use crate::partition::PartitionInfo;

impl Front {
    /// Creates a topic: (created, its settings).
    pub async fn create_topic(&self, config: TopicConfig) -> OpResult<(bool, TopicConfig)> {
        match self
            .router()
            .call(
                self.router().core(0),
                Request::CreateTopic(Box::new(config)),
            )
            .await?
        {
            Reply::Created(created, config) => Ok((created, *config)),
            other => unreachable!("a create answered {other:?}"),
        }
    }

    /// Changes a topic's settings: the new settings.
    pub async fn change_topic(&self, name: String, settings: Settings) -> OpResult<TopicConfig> {
        match self
            .router()
            .call(
                self.router().core(0),
                Request::ChangeTopic(name, Box::new(settings)),
            )
            .await?
        {
            Reply::Changed(config) => Ok(*config),
            other => unreachable!("a change answered {other:?}"),
        }
    }

    /// Creates a consumer group: true if created, false if it existed.
    pub async fn create_group(&self, topic: String, group: String, latest: bool) -> OpResult<bool> {
        match self
            .router()
            .call(
                self.router().core(0),
                Request::CreateGroup(topic, group, latest),
            )
            .await?
        {
            Reply::GroupCreated(created) => Ok(created),
            other => unreachable!("a group creation answered {other:?}"),
        }
    }

    pub async fn delete_group(&self, topic: String, group: String) -> OpResult<()> {
        self.router()
            .call(self.router().core(0), Request::DeleteGroup(topic, group))
            .await
            .map(|_| ())
    }

    pub async fn delete_topic(&self, name: String) -> OpResult<()> {
        self.router()
            .call(self.router().core(0), Request::DeleteTopic(name))
            .await
            .map(|_| ())
    }

    /// Purges a consumer group on every partition (at each partition's leader, on every node): how many messages
    /// were unsettled. Any owner that cannot be reached fails the purge (`503`), the reached ones purged.
    pub async fn purge_group(&self, name: &str, group: &str) -> OpResult<u64> {
        let topic = self.engine().topic(name)?;
        if !topic.config().has_group(group) {
            return Err(OpError::Engine(crate::engine::EngineError::GroupNotFound {
                topic: name.to_string(),
                group: group.to_string(),
            }));
        }
        let owners = topic
            .owner_cores()
            .iter()
            .map(|&core| self.router().core(core as usize))
            .chain(topic.remote_owners().iter().copied())
            .collect::<Vec<_>>();
        let calls: Vec<_> = owners
            .into_iter()
            .map(|to| {
                let router = self.router().clone();
                let request = Request::Purge(name.to_string(), group.to_string());
                async move { router.call(to, request).await }
            })
            .collect();
        let mut purged = 0;
        for reply in join_all(calls).await {
            match reply? {
                Reply::Purged(n) => purged = n.saturating_add(purged),
                other => unreachable!("a purge answered {other:?}"),
            }
        }
        Ok(purged)
    }

    /// A topic's settings and every partition, from every core, in partition order.
    pub async fn describe_topic(&self, name: &str) -> OpResult<(TopicConfig, Vec<PartitionInfo>)> {
        let topic = self.engine().topic(name)?;
        let remote = topic.remote_owners();
        let owner_cores = topic.owner_cores();
        let owners = owner_cores
            .iter()
            .map(|&core| (self.router().core(core as usize), false))
            .chain(remote.iter().map(|&to| (to, true)));
        let calls: Vec<_> = owners
            .map(|(to, remote)| {
                let router = self.router().clone();
                let name = name.to_string();
                async move { (remote, router.call(to, Request::Describe(name)).await) }
            })
            .collect();
        let mut all = Vec::with_capacity(topic.partition_count() as usize);
        for (remote, reply) in join_all(calls).await {
            match reply {
                Ok(Reply::Described(part)) => all.extend(part),
                Ok(other) => unreachable!("a describe answered {other:?}"),
                // Another node that cannot be reached (dead, cut off, restarting): its partitions are left out,
                // and the description says they are unavailable, rather than the whole answer being a 503. So
                // are those of a node that does not know the topic yet (created a moment ago through another node,
                // its metastore watch behind): this node knows it, so it is no `404`.
                Err(OpError::PartitionUnavailable(_))
                | Err(OpError::Engine(crate::engine::EngineError::TopicNotFound(_)))
                    if remote => {}
                Err(e) => return Err(e),
            }
        }
        all.sort_by_key(|p| p.partition);
        Ok(((*topic.config()).clone(), all))
    }

    /// Each partition's replicas, leader and epoch: on a single node the node itself (`0`) at epoch 1 (its only
    /// leadership); in a cluster as core 0's metastore replica has them (or, while the replica does not have this
    /// topic yet, where this core serves each partition, at the topic's id: its first epoch).
    pub async fn holders(&self, name: &str) -> OpResult<Vec<PartitionState>> {
        let topic = self.engine().topic(name)?;
        let id = topic.id();
        let served = |epoch: u64| {
            (0..topic.partition_count())
                .map(|p| PartitionState::initial(topic.location(p).node, epoch))
                .collect()
        };
        if !self.engine().clustered() {
            return Ok(served(1));
        }
        let reply = self
            .router()
            .call(self.router().core(0), Request::Partitions(name.to_string()))
            .await?;
        Ok(match reply {
            Reply::Partitions(Some((known, states)))
                if known == id && states.len() == topic.partition_count() as usize =>
            {
                states
            }
            Reply::Partitions(_) => served(id),
            other => unreachable!("a partitions request answered {other:?}"),
        })
    }

    /// Cluster mode: asks core 0 to look a topic up in the metastore (and open it here); true if it exists now and
    /// the request that failed for want of it may be run again.
    pub async fn lookup_topic(&self, name: &str, fresh: bool) -> bool {
        let router = self.router();
        router
            .call(
                router.core(0),
                Request::LookupTopic(name.to_string(), fresh),
            )
            .await
            .is_ok()
    }

    /// Cluster mode: the nodes, their liveness and how many partitions each owns (dead nodes included).
    pub fn cluster(&self) -> serde_json::Value {
        let engine = self.engine();
        let view = engine.cluster_view();
        let mut owned: std::collections::BTreeMap<u32, usize> = Default::default();
        for name in engine.topic_names() {
            if let Ok(topic) = engine.topic(&name) {
                for l in topic.locations().iter() {
                    *owned.entry(l.node).or_default() += 1;
                }
            }
        }
        if !engine.clustered() {
            let config = engine.config();
            return serde_json::json!({"nodes": [{
                "id": "local",
                "advertise": config.listen.to_string(),
                "alive": true,
                "partitions": owned.get(&0).copied().unwrap_or(0),
                "leads": owned.get(&0).copied().unwrap_or(0),
                "follows": 0,
                "incarnation": config.incarnation,
            }]});
        }
        let mut nodes: Vec<serde_json::Value> = view
            .nodes
            .iter()
            .map(|n| {
                let mut v = serde_json::json!({
                    "id": n.id,
                    "advertise": n.advertise,
                    "alive": engine.node_alive(n.index),
                    "partitions": owned.get(&n.index).copied().unwrap_or(0),
                    "leads": n.leads,
                    "follows": n.follows,
                    "self": n.index == view.node,
                });
                if n.draining {
                    // Its replicas are moving off it: drained once it leads and follows nothing.
                    v["draining"] = serde_json::json!(true);
                    v["removed"] = serde_json::json!(n.removed);
                    v["drained"] = serde_json::json!(n.leads + n.follows == 0);
                }
                // Its own data directory's incarnation (others' are in their `nodes/<id>` records in etcd).
                if n.index == view.node {
                    v["incarnation"] = serde_json::json!(engine.config().incarnation);
                }
                v
            })
            .collect();
        // In the order of their ids, whatever the order they joined in.
        nodes.sort_by(|a, b| a["id"].as_str().cmp(&b["id"].as_str()));
        // Topics of the cluster this node could not open (its caps, a failure on some core): retried by core 0.
        serde_json::json!({ "nodes": nodes, "unopened": view.unopened })
    }

    /// Every core's counters, in core order.
    pub async fn stats(&self) -> OpResult<Vec<CoreStats>> {
        let calls: Vec<_> = (0..self.engine().cores())
            .map(|core| {
                let router = self.router().clone();
                async move { router.call(router.core(core), Request::Stats).await }
            })
            .collect();
        let mut all = Vec::new();
        for reply in join_all(calls).await {
            match reply? {
                Reply::Stats(stats) => all.push(*stats),
                other => unreachable!("a stats request answered {other:?}"),
            }
        }
        Ok(all)
    }
}
