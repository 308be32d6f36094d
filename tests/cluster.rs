//! End-to-end tests of cluster mode (design/api.md, "Cluster mode"; seed/consume-path.md, "Routing";
//! docs/cluster.md): real etcd, real `berth serve --cluster ...` nodes (tests/common/cluster.rs), one core each.
//!
//! * a topic created on one node is served by every node, its partitions spread, each with its `node`;
//! * messages produced through every node (keyless and keyed) are consumed exactly once through one node;
//! * a consumer parked on one node is woken within 100 ms by a produce, or a nack, on another node's partition;
//! * ack, nack, extend and replay through a node that does not own the partition;
//! * kill -9 of a node: `503 partition_unavailable` with `Retry-After` for requests naming its partitions, the rest
//!   keeps serving; after its restart its messages are delivered, nothing lost;
//! * a node started late sees the topics created before it joined;
//! * a node whose etcd session expires (SIGSTOP longer than the lease TTL, or cut off the network in a namespace)
//!   is reported dead and its partitions answer 503; continued or healed, it is served again;
//! * a crash loop: kill -9 a random node under produce and consume load, restart it, again; then drain: every
//!   acknowledged produce consumed at least once, nothing that was never sent; and the same on a replicated topic
//!   (three replicas, leaders often the ones killed), with the resurrected count printed.
//!
//! Every test prints `SKIP <test>: ...` and passes when etcd is not installed (or `BERTH_ETCD_BIN` names no file);
//! the namespace test also when `ip netns` does not work here. Tests hold `common::serial()` (two shared cores,
//! timing checks) and wait on conditions with deadlines. `BERTH_KEEP_LOGS=1` keeps every node's log and data dir;
//! a failing test prints the tail of each node's log. `BERTH_CLUSTER_SEED` / `BERTH_CLUSTER_ROUNDS` steer the
//! crash loop; `BERTH_CLUSTER_BIN` runs the nodes (and the CLI) from another build of berth.

mod common;

use berth::client::{Answer, Client};
use common::cluster::{tcp_reachable, wait_for, Cluster, Etcd, Net, Node, Opts};
use common::{assert_error, serial};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

// ---------------------------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------------------------

/// A leased (or replayed) message.
#[derive(Clone, Debug)]
struct Msg {
    partition: u64,
    offset: u64,
    handle: String,
    delivery_count: Option<u64>,
    body: String,
}

fn msg_of(a: &Answer) -> Msg {
    let num = |name: &str| -> u64 {
        a.header(name)
            .unwrap_or_else(|| panic!("no {name} header in {:?}", a.headers))
            .parse()
            .unwrap_or_else(|_| panic!("{name} is not a number: {:?}", a.headers))
    };
    Msg {
        partition: num("partition"),
        offset: num("offset"),
        handle: a.header("receipt-handle").unwrap_or("").to_string(),
        delivery_count: a.header("delivery-count").and_then(|v| v.parse().ok()),
        body: a.text(),
    }
}

/// One queue-style consume through `client`: Some on 200, None on 204, panics on anything else.
fn consume(client: &Client, topic: &str, extra: &str) -> Option<Msg> {
    try_consume(client, topic, extra)
        .unwrap_or_else(|a| panic!("consume {topic}{extra} answered {}: {}", a.status, a.text()))
}

/// [`consume`], with any answer but 200 and 204 returned as `Err` (a transport error still panics).
fn try_consume(client: &Client, topic: &str, extra: &str) -> Result<Option<Msg>, Answer> {
    let a = client
        .call("GET", &format!("/consume?topic={topic}{extra}"), &[])
        .unwrap_or_else(|e| panic!("consume {topic}: {e}"));
    match a.status {
        200 => Ok(Some(msg_of(&a))),
        204 => Ok(None),
        _ => Err(a),
    }
}

fn settle(node: &Node, op: &str, topic: &str, handle: &str, extra: &str) -> Answer {
    node.post(
        &format!("/{op}?topic={topic}&receipt_handle={handle}{extra}"),
        &[],
    )
}

/// Produces through `node`, asserting 200; returns (partition, offset).
fn produce(node: &Node, topic: &str, extra: &str, body: &str) -> (u64, u64) {
    let a = node.post(&format!("/produce?topic={topic}{extra}"), body.as_bytes());
    assert_eq!(
        a.status,
        200,
        "produce {body} through {}: {}",
        node.id,
        a.text()
    );
    let j = a.json();
    (
        j["partition"].as_u64().expect("partition"),
        j["offset"].as_u64().expect("offset"),
    )
}

fn create_topic(node: &Node, topic: &str, partitions: u64) {
    put_topic(node, &format!("/topics/{topic}?partitions={partitions}"));
}

/// `PUT path` through `node`, retried as a client retries a `503` (etcd out of reach for a moment: on this shared
/// 2-core machine its answer can take longer than the node's 5 s timeout), until `201`, or `200` after a retry (the
/// first try may have created the topic before its answer was lost). 30 s at most.
fn put_topic(node: &Node, path: &str) {
    let mut tries = 0;
    let a = wait_for(
        &format!("PUT {path} through {}", node.id),
        Duration::from_secs(30),
        || {
            tries += 1;
            match node.call("PUT", path, b"") {
                Ok(a) if a.status == 503 => Err(a.text()),
                Ok(a) => Ok(a),
                Err(e) => Err(e),
            }
        },
    );
    assert!(
        a.status == 201 || (tries > 1 && a.status == 200),
        "PUT {path} through {}: {} {}",
        node.id,
        a.status,
        a.text()
    );
}

/// Asserts `503 partition_unavailable` with a `Retry-After` of whole seconds.
fn assert_unavailable(a: &Answer, what: &str) {
    assert_error(a, 503, "partition_unavailable");
    let retry = a
        .header("retry-after")
        .unwrap_or_else(|| panic!("{what}: 503 without Retry-After: {:?}", a.headers));
    assert!(
        retry.trim().parse::<u64>().is_ok(),
        "{what}: Retry-After {retry:?} is not a number of seconds"
    );
}

/// Sends `method path` through `node` until it answers 503 (asserted `partition_unavailable` with `Retry-After`):
/// the node may need until the owner's lease expires to know it is gone. A 200 meanwhile fails the test (the
/// owner is down: nothing can have been served).
fn wait_unavailable(node: &Node, method: &str, path: &str, body: &[u8], what: &str) {
    let a = wait_for(what, Duration::from_secs(15), || {
        match node.call(method, path, body) {
            Ok(a) if a.status == 503 => Ok(a),
            Ok(a) if a.status == 200 => panic!(
                "{what}: {method} {path} through {} answered 200 while the owner is down: {}",
                node.id,
                a.text()
            ),
            Ok(a) => Err(format!("{} {}", a.status, a.text())),
            Err(e) => Err(e),
        }
    });
    assert_unavailable(&a, what);
}

/// Sends `method path` through `node` until it answers 200 (a returning owner is served again once the asking
/// node has seen it come back), and a description lists no partition as unavailable; returns that answer.
fn wait_ok(node: &Node, method: &str, path: &str, body: &[u8], what: &str) -> Answer {
    wait_for(what, Duration::from_secs(20), || {
        match node.call(method, path, body) {
            Ok(a) if a.status == 200 && !a.text().contains("\"available\":false") => Ok(a),
            Ok(a) => Err(format!("{} {}", a.status, a.text())),
            Err(e) => Err(e),
        }
    })
}

/// Produces to `topic` through `node` until one is answered 200 (20 s at most), each try with its own body
/// (`prefix-N`): a try answered otherwise may still have been written, and be served later. Returns the acknowledged
/// body and every body tried.
fn produce_until_ok(node: &Node, topic: &str, prefix: &str) -> (String, HashSet<String>) {
    let mut tried = HashSet::new();
    let acked = wait_for(
        &format!("a produce to '{topic}' through {} answered", node.id),
        Duration::from_secs(20),
        || {
            let body = format!("{prefix}-{}", tried.len());
            tried.insert(body.clone());
            match node.call("POST", &format!("/produce?topic={topic}"), body.as_bytes()) {
                Ok(a) if a.status == 200 => Ok(body),
                Ok(a) => Err(format!("{} {}", a.status, a.text())),
                Err(e) => Err(e),
            }
        },
    );
    (acked, tried)
}

/// Consumes through `node` (acking each through it) until a consume finds nothing (`wait=500ms`) after every body
/// of `want` was seen, or for at most 30 s. Returns every delivery, duplicates included.
fn drain(node: &Node, topic: &str, want: &HashSet<String>) -> Vec<Msg> {
    drain_group(node, topic, "", want)
}

/// [`drain`] for a consumer group: `extra` is `&group=NAME` (or empty for `default`).
fn drain_group(node: &Node, topic: &str, extra: &str, want: &HashSet<String>) -> Vec<Msg> {
    drain_with(node, topic, extra, want, false)
}

/// [`drain_group`]; with `retry_unavailable`, a consume answered `503 partition_unavailable` is tried again 100 ms
/// later, as a client would (until the deadline): after a failover, a partition whose new leader has not won its
/// fencing round yet answers so (design/api.md, "Replication"), and `GET /topics/T` does not show it unavailable.
/// Without it, only a new leader's wait for its predecessor's lease is retried.
fn drain_with(
    node: &Node,
    topic: &str,
    extra: &str,
    want: &HashSet<String>,
    retry_unavailable: bool,
) -> Vec<Msg> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut got = Vec::new();
    let mut seen = HashSet::new();
    let mut unavailable = 0;
    loop {
        let consumed = match try_consume(&node.client, topic, &format!("&wait=500ms{extra}")) {
            // A new leader hands out leases only once its predecessor's lease ran out, 1.125 s after its fencing
            // round (`partition/lease.rs`): longer than this consume's wait, so it answers 503, retried as a client
            // would, whatever `retry_unavailable` says.
            Err(a)
                if (retry_unavailable || a.text().contains("predecessor's lease"))
                    && a.status == 503
                    && a.json()["error"] == "partition_unavailable"
                    && Instant::now() < deadline =>
            {
                unavailable += 1;
                if unavailable == 1 {
                    eprintln!(
                        "drain: consume {topic} through {} answered {}: retried",
                        node.id,
                        a.text()
                    );
                }
                std::thread::sleep(ms(100));
                continue;
            }
            Err(a) => panic!(
                "consume {topic}&wait=500ms{extra} answered {}: {} ({unavailable} answered 503 partition_unavailable \
                 before it in this drain)",
                a.status,
                a.text()
            ),
            Ok(m) => m,
        };
        match consumed {
            Some(m) => {
                // A `503` (the owner unreachable for a moment, say while a session is replaced after an etcd
                // outage) is retried, as a client would; the retry may then find it applied (`410`).
                let mut a = settle(node, "ack", topic, &m.handle, extra);
                let mut retried = 0;
                while a.status == 503 && retried < 50 {
                    eprintln!(
                        "ack {} through {}: {}; retried",
                        m.handle,
                        node.id,
                        a.text()
                    );
                    std::thread::sleep(ms(100));
                    retried += 1;
                    a = settle(node, "ack", topic, &m.handle, extra);
                }
                assert!(
                    a.status == 200 || (retried > 0 && a.status == 410),
                    "ack {} through {}: {} {}",
                    m.handle,
                    node.id,
                    a.status,
                    a.text()
                );
                seen.insert(m.body.clone());
                got.push(m);
            }
            None => {
                if want.iter().all(|b| seen.contains(b)) || Instant::now() > deadline {
                    if unavailable > 0 {
                        eprintln!(
                            "drain: {unavailable} consumes answered 503 partition_unavailable"
                        );
                    }
                    return got;
                }
            }
        }
    }
}

/// The bodies of `msgs`, asserting no body came twice.
fn once(msgs: &[Msg]) -> HashSet<String> {
    let mut set = HashSet::new();
    for m in msgs {
        assert!(
            set.insert(m.body.clone()),
            "{} delivered twice (p{} o{})",
            m.body,
            m.partition,
            m.offset
        );
    }
    set
}

/// Partition entries of `GET /topics/{topic}` through `node`.
fn partitions(node: &Node, topic: &str) -> Vec<serde_json::Value> {
    let a = node.get(&format!("/topics/{topic}"));
    assert_eq!(
        a.status,
        200,
        "GET /topics/{topic} through {}: {}",
        node.id,
        a.text()
    );
    a.json()["partitions"]
        .as_array()
        .expect("partitions")
        .clone()
}

/// Waits (10 s at most) until every partition of `topic`, as `node` reports it, has committed to its end.
fn wait_all_committed(node: &Node, topic: &str) {
    wait_for(
        "every partition committed to its end",
        Duration::from_secs(10),
        || {
            let parts = partitions(node, topic);
            if parts.iter().all(|e| e["committed"] == e["end_offset"]) {
                Ok(())
            } else {
                Err(format!("{parts:?}"))
            }
        },
    );
}

/// `berth ARGS` run to its end (bounded: 15 s): exit code and stdout.
fn berth_cli(args: &[&str]) -> (Option<i32>, String, String) {
    use std::io::Read;
    let mut child = std::process::Command::new(common::cluster::berth_bin())
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn berth");
    let status = wait_for("berth cli to exit", Duration::from_secs(15), || {
        child
            .try_wait()
            .unwrap()
            .ok_or_else(|| "running".to_string())
    });
    let (mut out, mut err) = (String::new(), String::new());
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    (status.code(), out, err)
}

/// A parked consumer: answers (when it answered, what) on the channel.
fn park(
    client: Client,
    topic: &str,
    extra: &str,
) -> (
    thread::JoinHandle<()>,
    mpsc::Receiver<(Instant, Option<Msg>)>,
) {
    let (tx, rx) = mpsc::channel();
    let topic = topic.to_string();
    let extra = extra.to_string();
    let h = thread::spawn(move || {
        let got = consume(&client, &topic, &extra);
        let _ = tx.send((Instant::now(), got));
    });
    (h, rx)
}

fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v[v.len() / 2]
}

// ---------------------------------------------------------------------------------------------------------------
// Harness self-check (no cluster needed): etcd starts and answers; namespaces connect and cut
// ---------------------------------------------------------------------------------------------------------------

#[test]
fn harness_self_check_etcd_and_network() {
    let _g = serial();
    let test = "harness_self_check_etcd_and_network";
    let Some(etcd) = Etcd::start(test) else {
        return;
    };
    assert_eq!(etcd.list("/berth/").unwrap(), vec![]);
    assert_eq!(etcd.get("/berth/none").unwrap(), None);
    drop(etcd);

    let mut net = match Net::new() {
        Ok(net) => net,
        Err(why) => {
            println!("SKIP {test} (network part): network namespaces unavailable here ({why})");
            return;
        }
    };
    let a = net.add_slot(0).unwrap().ns.clone();
    let (b, b_ip) = {
        let s = net.add_slot(1).unwrap();
        (s.ns.clone(), s.ip.clone())
    };
    let etcd = Etcd::start_on(test, &[net.gateway.clone()]).unwrap();
    let etcd_addr: SocketAddr = format!("{}:{}", net.gateway, etcd.port).parse().unwrap();
    let listener =
        common::cluster::in_netns(&b, || TcpListener::bind(format!("{b_ip}:0")).unwrap());
    let b_addr = listener.local_addr().unwrap();
    let short = ms(300);
    let reach = |from: Option<&str>, to: SocketAddr| tcp_reachable(from, to, short);
    wait_for("namespaces connected", Duration::from_secs(5), || {
        let seen = [
            reach(Some(&a), etcd_addr),
            reach(Some(&b), etcd_addr),
            reach(Some(&a), b_addr),
            reach(None, b_addr),
        ];
        if seen.iter().all(|&r| r) {
            Ok(())
        } else {
            Err(format!("{seen:?}"))
        }
    });
    net.cut(1);
    assert!(
        !reach(None, b_addr),
        "the test still reaches a cut namespace"
    );
    assert!(
        !reach(Some(&a), b_addr),
        "a namespace still reaches a cut one"
    );
    assert!(
        !reach(Some(&b), etcd_addr),
        "a cut namespace still reaches etcd"
    );
    assert!(
        reach(Some(&a), etcd_addr),
        "cutting one namespace cut another"
    );
    net.heal(1);
    wait_for("healed namespace reachable", Duration::from_secs(5), || {
        if reach(None, b_addr) && reach(Some(&a), b_addr) && reach(Some(&b), etcd_addr) {
            Ok(())
        } else {
            Err("not yet".into())
        }
    });
    let names: Vec<String> = net.slots.iter().map(|s| s.ns.clone()).collect();
    drop(listener);
    drop(net);
    drop(etcd);
    assert_no_namespace_left(&names);
}

/// Node processes (plain single-node servers: this checks the harness, not cluster mode), in namespaces when they
/// work here: started, served, killed, restarted on the same data, paused and continued, cut off and healed.
#[test]
fn harness_self_check_nodes() {
    let _g = serial();
    let netns = Net::probe().is_ok();
    let opts = Opts {
        netns,
        plain: true,
        ttl_s: Some(2),
        ..Opts::default()
    };
    let Some(mut c) = Cluster::launch("harness_self_check_nodes", 2, opts) else {
        return;
    };
    create_topic(c.node(1), "t", 1);
    produce(c.node(1), "t", "", "kept");
    c.kill9(1);
    assert!(!c.node(1).running());
    c.restart(1);
    assert_eq!(c.node(1).starts, 2);
    assert!(c.node(1).log_text().contains("=== harness: start #2 of n2"));
    let m = consume(&c.node(1).client, "t", "").expect("the record survived the restart");
    assert_eq!(m.body, "kept");
    c.pause(0);
    assert_eq!(c.node(0).process_state(), Some('T'));
    c.resume(0);
    assert_eq!(c.node(0).get("/health").status, 200);
    if !netns {
        println!(
            "SKIP harness_self_check_nodes (cut and heal): network namespaces unavailable here"
        );
        return;
    }
    let addr: SocketAddr = c.node(1).addr().parse().unwrap();
    c.cut(1);
    assert!(!tcp_reachable(None, addr, ms(300)), "cut node reachable");
    c.heal(1);
    wait_for("healed node reachable", Duration::from_secs(5), || {
        c.node(1).call("GET", "/health", &[]).map(|_| ())
    });
    let ns: Vec<String> = c.nodes().iter().filter_map(|n| n.netns.clone()).collect();
    assert_eq!(ns.len(), 2);
    drop(c);
    assert_no_namespace_left(&ns);
}

/// None of `names` is still among the network namespaces.
fn assert_no_namespace_left(names: &[String]) {
    let left = common::cluster::ip(&["netns", "list"]).unwrap();
    for n in names {
        assert!(
            !left.contains(n.as_str()),
            "namespace {n} left behind: {left}"
        );
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Topics across nodes
// ---------------------------------------------------------------------------------------------------------------

#[test]
fn topic_created_on_one_node_is_served_by_all() {
    let _g = serial();
    let Some(c) = Cluster::start("topic_created_on_one_node_is_served_by_all", 3) else {
        return;
    };
    let ids: Vec<String> = c.nodes().iter().map(|n| n.id.clone()).collect();

    // GET /cluster: every node, with its advertised address.
    for (i, node) in c.nodes().iter().enumerate() {
        let view = c.view(i).unwrap();
        for other in c.nodes() {
            let v = view
                .iter()
                .find(|v| v.id == other.id)
                .unwrap_or_else(|| panic!("{} does not list {}: {view:?}", node.id, other.id));
            assert_eq!(
                v.advertise,
                other.addr(),
                "advertise of {} per {}",
                other.id,
                node.id
            );
            assert!(v.alive);
        }
    }
    // Each node shows its own data directory's incarnation: the id in DATA/incarnation (docs/format.md).
    for (i, node) in c.nodes().iter().enumerate() {
        let file = std::fs::read(node.data_dir.join("incarnation")).expect("DATA/incarnation");
        assert_eq!(file.len(), 20);
        let want = format!(
            "{:032x}",
            u128::from_le_bytes(file[..16].try_into().unwrap())
        );
        let j = c.node(i).get("/cluster").json();
        let me = j["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["self"] == true)
            .unwrap_or_else(|| panic!("no self entry: {j}"))
            .clone();
        assert_eq!(me["incarnation"], want.as_str(), "{}: {j}", node.id);
    }

    create_topic(c.node(1), "spread", 6);
    // Every node serves it at once (a lagging replica asks etcd before answering 404), with the same placement.
    let mut placements = Vec::new();
    for node in c.nodes() {
        let a = node.get("/topics/spread");
        assert_eq!(
            a.status,
            200,
            "GET /topics/spread through {}: {}",
            node.id,
            a.text()
        );
        let j = a.json();
        assert_eq!(j["name"], "spread");
        let parts = j["partitions"].as_array().expect("partitions");
        assert_eq!(parts.len(), 6, "{}", a.text());
        let owners: Vec<String> = parts
            .iter()
            .enumerate()
            .map(|(p, e)| {
                assert_eq!(e["partition"].as_u64(), Some(p as u64), "{e}");
                let owner = e["node"]
                    .as_str()
                    .unwrap_or_else(|| panic!("no node in {e}"));
                assert!(ids.iter().any(|id| id == owner), "unknown node {owner}");
                // R = 1: the owner is the partition's one replica and its leader, at the topic's first epoch.
                assert_eq!(e["replicas"], serde_json::json!([owner]), "{e}");
                assert_eq!(e["leader"], owner, "{e}");
                assert!(e["epoch"].as_u64().is_some_and(|n| n > 0), "{e}");
                assert_eq!(j["config"]["replicas"], 1);
                format!("{owner}@{}", e["epoch"])
            })
            .collect();
        placements.push(owners);
    }
    assert!(
        placements.windows(2).all(|w| w[0] == w[1]),
        "nodes disagree on placement: {placements:?}"
    );
    let placements: Vec<Vec<String>> = placements
        .into_iter()
        .map(|p| {
            p.into_iter()
                .map(|o| o.split('@').next().unwrap().to_string())
                .collect()
        })
        .collect();
    // More replicas than live nodes, and (without --replication-preview) any R above 1: refused, nothing created.
    for (query, why) in [
        ("replicas=4", "4 but 3 nodes are live"),
        ("replicas=2", "--replication-preview"),
    ] {
        let a = c.node(0).put(&format!("/topics/more?partitions=2&{query}"));
        assert_eq!(a.status, 400, "{query}: {}", a.text());
        assert!(a.text().contains(why), "{query}: {}", a.text());
    }
    assert_eq!(c.node(0).get("/topics/more").status, 404);
    for id in &ids {
        let n = placements[0].iter().filter(|o| *o == id).count();
        assert_eq!(
            n, 2,
            "6 partitions over 3 nodes, {id} owns {n}: {:?}",
            placements[0]
        );
    }
    // GET /cluster counts them (each replica, once it caught up): 2 served and led per node, none followed (R = 1).
    for i in 0..c.len() {
        c.wait_view(i, "2 partitions per node, each led by it", |v| {
            v.iter()
                .all(|n| n.partitions == 2 && n.leads == 2 && n.follows == 0)
        });
    }
    // GET /topics lists it everywhere.
    for node in c.nodes() {
        wait_for(
            &format!("{} to list spread", node.id),
            Duration::from_secs(10),
            || {
                let a = node.get("/topics");
                if a.json()
                    .as_array()
                    .is_some_and(|l| l.iter().any(|t| t == "spread"))
                {
                    Ok(())
                } else {
                    Err(a.text())
                }
            },
        );
    }
    // Creation is cluster-wide: the same again elsewhere is 200, another partition count 409.
    let a = c.node(2).put("/topics/spread?partitions=6");
    assert_eq!(a.status, 200, "{}", a.text());
    assert_error(
        &c.node(0).put("/topics/spread?partitions=3"),
        409,
        "topic_exists",
    );

    // One record per partition through node 0; every node reports the owners' offsets.
    for p in 0..6u64 {
        assert_eq!(
            produce(
                c.node(0),
                "spread",
                &format!("&partition={p}"),
                &format!("m{p}")
            ),
            (p, 0)
        );
    }
    for node in c.nodes() {
        wait_for(
            &format!("{} to report end_offset 1 everywhere", node.id),
            Duration::from_secs(10),
            || {
                let parts = partitions(node, "spread");
                if parts.iter().all(|e| e["end_offset"] == 1) {
                    Ok(())
                } else {
                    Err(format!("{parts:?}"))
                }
            },
        );
    }

    // The CLI lists the nodes.
    let url = c.node(2).url();
    let mut args = vec!["cluster", "status", "--server", &url];
    let ca = c.node(2).ca.as_ref().map(|p| p.display().to_string());
    if let Some(ca) = &ca {
        args.extend(["--cacert", ca]);
    }
    let (code, out, err) = berth_cli(&args);
    assert_eq!(code, Some(0), "berth cluster status: {err}");
    for node in c.nodes() {
        assert!(
            out.contains(&node.id) && out.contains(&node.addr()),
            "{} missing from:\n{out}",
            node.id
        );
    }

    // The SQS face: a queue created through one node is usable at once through every other (a node whose
    // metastore replica has not seen it yet asks the metastore, as the native routes do).
    let sqs = |node: usize, action: &str, body: serde_json::Value| -> serde_json::Value {
        let a = c
            .node(node)
            .client
            .call_with(
                "POST",
                "/",
                &[
                    ("X-Amz-Target", &format!("AmazonSQS.{action}")),
                    ("Content-Type", "application/x-amz-json-1.0"),
                ],
                body.to_string().as_bytes(),
            )
            .unwrap();
        assert_eq!(a.status, 200, "{action} through node {node}: {}", a.text());
        a.json()
    };
    for round in 0..5 {
        let name = format!("sqs-{round}");
        let url = sqs(
            round % 3,
            "CreateQueue",
            serde_json::json!({"QueueName": name}),
        )["QueueUrl"]
            .as_str()
            .unwrap()
            .to_string();
        for node in 0..3 {
            let sent = sqs(
                node,
                "SendMessage",
                serde_json::json!({"QueueUrl": url, "MessageBody": "x"}),
            );
            assert!(sent["MessageId"].is_string(), "{sent}");
        }
    }
}

#[test]
fn produced_through_every_node_consumed_exactly_once_through_one() {
    let _g = serial();
    let Some(c) = Cluster::start(
        "produced_through_every_node_consumed_exactly_once_through_one",
        3,
    ) else {
        return;
    };
    create_topic(c.node(0), "everywhere", 6);
    let mut sent: HashMap<String, (u64, u64)> = HashMap::new();
    let mut key_partition: HashMap<String, u64> = HashMap::new();
    for node in c.nodes() {
        for n in 0..20 {
            let body = format!("{}-keyless-{n}", node.id);
            sent.insert(body.clone(), produce(node, "everywhere", "", &body));
        }
        for n in 0..20 {
            let key = format!("k{}", n % 8);
            let body = format!("{}-keyed-{n}", node.id);
            let (p, o) = produce(node, "everywhere", &format!("&key={key}"), &body);
            // One key, one partition, whichever node took the request.
            let first = *key_partition.entry(key.clone()).or_insert(p);
            assert_eq!(
                p, first,
                "key {key} went to {p} through {}, to {first} before",
                node.id
            );
            sent.insert(body, (p, o));
        }
    }
    // Distinct (partition, offset), and per partition the offsets 0..n without gaps.
    let mut per_partition: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for &(p, o) in sent.values() {
        per_partition.entry(p).or_default().push(o);
    }
    for (p, offsets) in &mut per_partition {
        offsets.sort();
        assert!(
            offsets.iter().enumerate().all(|(i, &o)| i as u64 == o),
            "partition {p}: offsets {offsets:?}"
        );
    }

    let want: HashSet<String> = sent.keys().cloned().collect();
    let got = drain(c.node(2), "everywhere", &want);
    let bodies = once(&got);
    assert_eq!(bodies, want, "delivered set differs from produced set");
    for m in &got {
        assert_eq!(
            sent[&m.body],
            (m.partition, m.offset),
            "{} delivered from another place",
            m.body
        );
    }
    // Everything settled: each partition's frontier reaches its end (on its owner, reported by any node).
    wait_all_committed(c.node(1), "everywhere");
}

#[test]
fn with_tls_everywhere_messages_cross_nodes_and_a_plain_peer_is_refused() {
    let _g = serial();
    let opts = Opts {
        tls: true,
        ..Opts::default()
    };
    let Some(c) = Cluster::start_with(
        "with_tls_everywhere_messages_cross_nodes_and_a_plain_peer_is_refused",
        2,
        opts,
    ) else {
        return;
    };
    // Every node's client listener speaks HTTPS (the harness's clients trust only the cluster's CA), and the
    // nodes found each other over node RPC with TLS and client certificates.
    assert!(c.node(0).url().starts_with("https://"));
    create_topic(c.node(0), "sealed", 4);
    let owners: HashSet<String> = partitions(c.node(1), "sealed")
        .iter()
        .map(|p| p["node"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(owners.len(), 2, "partitions on both nodes: {owners:?}");
    let mut want = HashSet::new();
    for node in c.nodes() {
        for n in 0..20 {
            let body = format!("{}-{n}", node.id);
            produce(node, "sealed", "", &body);
            want.insert(body);
        }
    }
    // Consumed and acked through one node: half of it over node RPC to the other.
    let got = drain(c.node(1), "sealed", &want);
    assert_eq!(once(&got), want);
    wait_all_committed(c.node(0), "sealed");

    // Plain HTTP to the HTTPS port: a readable refusal, not a TLS alert.
    let plain = Client::new(&format!("http://{}", c.node(0).addr()));
    let a = plain.call("GET", "/health", &[]).expect("an answer");
    assert_error(&a, 400, "https_required");
    // A plain-text hello on node RPC: closed without a welcome.
    use std::io::{Read, Write};
    let peer = format!("{}:{}", c.node(1).ip, c.node(1).peer_port);
    let mut raw = std::net::TcpStream::connect(&peer).expect("connect to node RPC");
    raw.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    // A well-formed hello (with no token: the cluster runs without one), which plain-text node RPC would answer.
    let hello = berth::cluster::rpc::frame::Hello {
        version: berth::cluster::rpc::frame::VERSION as u32,
        node: 7,
        token: String::new(),
    };
    let mut frame = Vec::new();
    berth::cluster::rpc::frame::encode(
        berth::cluster::rpc::frame::Kind::Handshake,
        1,
        &hello,
        usize::MAX,
        &mut frame,
    )
    .expect("encodes");
    let _ = raw.write_all(&frame);
    let mut answer = Vec::new();
    let started = Instant::now();
    let _ = raw.read_to_end(&mut answer);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "node RPC held a plain-text hello for {:?} instead of closing it",
        started.elapsed()
    );
    assert!(
        !answer.windows(4).any(|w| w == b"BRPC"),
        "node RPC answered plain text: {answer:?}"
    );
}

// ---------------------------------------------------------------------------------------------------------------
// Wake-ups across nodes
// ---------------------------------------------------------------------------------------------------------------

#[test]
fn parked_consumer_is_woken_by_produce_and_nack_on_another_node() {
    let _g = serial();
    let Some(c) = Cluster::start(
        "parked_consumer_is_woken_by_produce_and_nack_on_another_node",
        3,
    ) else {
        return;
    };
    create_topic(c.node(0), "wake", 3);
    // One partition per node; the consumer parks on node 0 (A), the record lands in node 1's (B).
    let (a, b, other) = (c.node(0), c.node(1), c.node(2));
    let pb = c.partitions_of(0, "wake", 1)[0];

    let mut lags = Vec::new();
    for t in 0..3 {
        let (h, rx) = park(a.client.clone(), "wake", "&wait=5s");
        thread::sleep(ms(300));
        assert!(
            rx.try_recv().is_err(),
            "the consumer on {} should be parked",
            a.id
        );
        let body = format!("wake-{t}");
        produce(b, "wake", &format!("&partition={pb}"), &body);
        let produced = Instant::now();
        let (at, got) = rx
            .recv_timeout(ms(6000))
            .expect("the parked consumer never answered");
        h.join().unwrap();
        let m = got.expect("woken with the record, not a 204");
        assert_eq!((m.partition, m.body.as_str()), (pb, body.as_str()));
        lags.push(at.saturating_duration_since(produced));
        assert_eq!(settle(a, "ack", "wake", &m.handle, "").status, 200);
    }
    eprintln!(
        "produce on {} → consumer parked on {}: {lags:?}",
        b.id, a.id
    );
    let worst = *lags.iter().max().unwrap();
    let med = median(&mut lags);
    assert!(
        med <= ms(100),
        "median wake-up after a remote produce {med:?} (all: {lags:?})"
    );
    assert!(worst < ms(1000), "a wake-up took {worst:?}");

    // Nack: the record on B's partition is leased through the third node, a consumer parks on A, the nack (sent
    // to B, then to the third node, then to B) wakes it with the same record; its new lease is nacked next round.
    produce(b, "wake", &format!("&partition={pb}"), "nack-me");
    let mut held = consume(&other.client, "wake", "&wait=2s").expect("the record");
    assert_eq!((held.partition, held.body.as_str()), (pb, "nack-me"));
    let mut lags = Vec::new();
    for (t, via) in [b, other, b].into_iter().enumerate() {
        let (h, rx) = park(a.client.clone(), "wake", "&wait=5s");
        thread::sleep(ms(300));
        assert!(
            rx.try_recv().is_err(),
            "the consumer on {} should be parked",
            a.id
        );
        let ans = settle(via, "nack", "wake", &held.handle, "");
        assert_eq!(ans.status, 200, "nack through {}: {}", via.id, ans.text());
        let nacked = Instant::now();
        let (at, got) = rx
            .recv_timeout(ms(6000))
            .expect("the parked consumer never answered");
        h.join().unwrap();
        let m = got.expect("woken with the nacked record, not a 204");
        assert_eq!(
            (m.partition, m.offset, m.body.as_str()),
            (held.partition, held.offset, "nack-me")
        );
        assert_ne!(m.handle, held.handle);
        assert_eq!(m.delivery_count, Some(t as u64 + 2), "delivery count");
        lags.push(at.saturating_duration_since(nacked));
        held = m;
    }
    eprintln!("nack → consumer parked on {}: {lags:?}", a.id);
    let worst = *lags.iter().max().unwrap();
    let med = median(&mut lags);
    assert!(
        med <= ms(100),
        "median wake-up after a remote nack {med:?} (all: {lags:?})"
    );
    assert!(worst < ms(1000), "a wake-up took {worst:?}");
    assert_eq!(settle(a, "ack", "wake", &held.handle, "").status, 200);
}

// ---------------------------------------------------------------------------------------------------------------
// Requests naming a partition, through a node that does not own it
// ---------------------------------------------------------------------------------------------------------------

#[test]
fn ack_nack_extend_and_replay_through_a_non_owner() {
    let _g = serial();
    let Some(c) = Cluster::start("ack_nack_extend_and_replay_through_a_non_owner", 3) else {
        return;
    };
    create_topic(c.node(0), "settle", 3);
    // The partition lives on node 1; everything goes through nodes 0 and 2.
    let (x, owner, y) = (c.node(0), c.node(1), c.node(2));
    let p = c.partitions_of(0, "settle", 1)[0];
    assert_eq!(
        produce(x, "settle", &format!("&partition={p}"), "s0"),
        (p, 0)
    );

    // Leased through y with a 1 s visibility, extended through x to 30 s: not redelivered after 1 s.
    let m1 = consume(&y.client, "settle", "&visibility=1s&wait=2s").expect("the record");
    assert_eq!((m1.partition, m1.offset, m1.body.as_str()), (p, 0, "s0"));
    let a = settle(x, "extend", "settle", &m1.handle, "&visibility=30s");
    assert_eq!(a.status, 200, "extend through {}: {}", x.id, a.text());
    assert!(
        consume(&y.client, "settle", "&wait=1500ms").is_none(),
        "redelivered although extended"
    );

    // Nacked through x: deliverable again at once, with a new handle; the old one is gone everywhere.
    let a = settle(x, "nack", "settle", &m1.handle, "");
    assert_eq!(a.status, 200, "nack through {}: {}", x.id, a.text());
    let m2 = consume(&y.client, "settle", "&wait=2s").expect("redelivered after the nack");
    assert_eq!((m2.partition, m2.offset), (p, 0));
    assert_ne!(m2.handle, m1.handle);
    assert_eq!(m2.delivery_count, Some(2));
    for (op, via) in [("ack", x), ("extend", y), ("nack", owner)] {
        assert_error(
            &settle(via, op, "settle", &m1.handle, ""),
            410,
            "lease_gone",
        );
    }

    // Acked through x; a second ack (through y) is 410; the frontier moves on the owner.
    assert_eq!(settle(x, "ack", "settle", &m2.handle, "").status, 200);
    assert_error(
        &settle(y, "ack", "settle", &m2.handle, ""),
        410,
        "lease_gone",
    );
    wait_for("committed 1 on the owner", Duration::from_secs(5), || {
        let e = partitions(y, "settle")[p as usize].clone();
        if e["committed"] == 1 {
            Ok(())
        } else {
            Err(e.to_string())
        }
    });

    // Replay through y: the record, no lease; past the end, 204 at once, or the record once it is written.
    let a = y.get(&format!("/consume?topic=settle&partition={p}&offset=0"));
    assert_eq!(a.status, 200, "replay: {}", a.text());
    let r = msg_of(&a);
    assert_eq!(
        (r.partition, r.offset, r.body.as_str(), r.handle.as_str()),
        (p, 0, "s0", "")
    );
    assert_eq!(
        y.get(&format!("/consume?topic=settle&partition={p}&offset=1"))
            .status,
        204
    );
    let (h, rx) = park(
        y.client.clone(),
        "settle",
        &format!("&partition={p}&offset=1&wait=5s"),
    );
    thread::sleep(ms(300));
    assert!(rx.try_recv().is_err(), "the replay should wait");
    produce(x, "settle", &format!("&partition={p}"), "s1");
    let (_, got) = rx
        .recv_timeout(ms(6000))
        .expect("the waiting replay never answered");
    h.join().unwrap();
    let r = got.expect("the record written while it waited");
    assert_eq!((r.offset, r.body.as_str()), (1, "s1"));
    // Replay changed nothing: s1 is still deliverable, once.
    let m = consume(&x.client, "settle", "&wait=2s").expect("s1 after its replay");
    assert_eq!((m.partition, m.offset), (p, 1));
    assert_eq!(settle(y, "ack", "settle", &m.handle, "").status, 200);
}

#[test]
fn auth_token_guards_clients_and_node_rpc() {
    let _g = serial();
    const TOKEN: &str = "cluster-t0ken-0123456789abcdefXYZ";
    let opts = Opts {
        token: Some(TOKEN.into()),
        peer_token: Some("peer-secret-0123456789abcdef".into()),
        ..Opts::default()
    };
    let Some(c) = Cluster::start_with("auth_token_guards_clients_and_node_rpc", 2, opts) else {
        return;
    };
    for node in c.nodes() {
        let anonymous = node.anonymous_client();
        assert_eq!(anonymous.call("GET", "/health", &[]).unwrap().status, 200);
        for (method, path) in [
            ("GET", "/cluster"),
            ("PUT", "/topics/sneaky"),
            ("GET", "/topics"),
        ] {
            let a = anonymous.call(method, path, &[]).unwrap();
            assert_error(&a, 401, "unauthorized");
        }
    }
    create_topic(c.node(0), "guarded", 2);
    // Through node 0 to node 1's partition and back: node RPC works with the cluster secret.
    let p = c.partitions_of(0, "guarded", 1)[0];
    assert_eq!(
        produce(c.node(0), "guarded", &format!("&partition={p}"), "g"),
        (p, 0)
    );
    let m =
        consume(&c.node(0).client, "guarded", "&wait=2s").expect("the record, through node RPC");
    assert_eq!((m.partition, m.body.as_str()), (p, "g"));
    assert_eq!(
        settle(c.node(0), "ack", "guarded", &m.handle, "").status,
        200
    );
}

// ---------------------------------------------------------------------------------------------------------------
// Failures
// ---------------------------------------------------------------------------------------------------------------

#[test]
fn killed_node_partitions_unavailable_others_serve_and_nothing_is_lost() {
    let _g = serial();
    let test = "killed_node_partitions_unavailable_others_serve_and_nothing_is_lost";
    let Some(mut c) = Cluster::start_with(test, 3, Opts::short_ttl()) else {
        return;
    };
    create_topic(c.node(0), "down", 6);
    let dead = 2;
    let dead_id = c.node(dead).id.clone();
    let dead_parts = c.partitions_of(0, "down", dead);
    assert_eq!(dead_parts.len(), 2);
    let mut sent: HashMap<String, u64> = HashMap::new();
    for p in 0..6u64 {
        for n in 0..5 {
            let body = format!("pre-{p}-{n}");
            produce(c.node(0), "down", &format!("&partition={p}"), &body);
            sent.insert(body, p);
        }
    }
    let mut dead_key = None;
    for k in 0..32 {
        let body = format!("key-{k}");
        let (p, _) = produce(c.node(1), "down", &format!("&key=key{k}"), &body);
        sent.insert(body, p);
        if dead_parts.contains(&p) {
            dead_key = Some(format!("key{k}"));
        }
    }
    let dead_key = dead_key.expect("one of 32 keys hashes to the dead node's partitions");

    c.kill9(dead);
    // Requests naming its partitions: 503 partition_unavailable with Retry-After, through both survivors.
    for &p in &dead_parts {
        for via in [0, 1] {
            wait_unavailable(
                c.node(via),
                "POST",
                &format!("/produce?topic=down&partition={p}"),
                b"never",
                &format!(
                    "produce to partition {p} (owner {dead_id} killed) through {}",
                    c.node(via).id
                ),
            );
        }
    }
    wait_unavailable(
        c.node(1),
        "POST",
        &format!("/produce?topic=down&key={dead_key}"),
        b"never",
        "keyed produce to a dead partition",
    );
    wait_unavailable(
        c.node(0),
        "GET",
        &format!("/consume?topic=down&partition={}&offset=0", dead_parts[0]),
        &[],
        "replay of a dead partition",
    );
    for on in [0, 1] {
        c.wait_alive(on, &dead_id, false);
    }

    // The rest keeps serving: keyless produces land on live partitions; consumes deliver the live partitions.
    for n in 0..20 {
        let body = format!("during-{n}");
        let (p, _) = produce(c.node(n % 2), "down", "", &body);
        assert!(
            !dead_parts.contains(&p),
            "keyless produce went to dead partition {p}"
        );
        sent.insert(body, p);
    }
    let live_want: HashSet<String> = sent
        .iter()
        .filter(|(_, p)| !dead_parts.contains(p))
        .map(|(b, _)| b.clone())
        .collect();
    let got_live = drain(c.node(1), "down", &live_want);
    assert_eq!(
        once(&got_live),
        live_want,
        "live partitions while {dead_id} is down"
    );

    // Back: its partitions are served again, with everything they held.
    c.restart(dead);
    c.wait_all_live();
    let p = dead_parts[0];
    wait_ok(
        c.node(0),
        "POST",
        &format!("/produce?topic=down&partition={p}"),
        b"post",
        "produce to the returned node's partition",
    );
    sent.insert("post".into(), p);
    let dead_want: HashSet<String> = sent
        .iter()
        .filter(|(_, p)| dead_parts.contains(p))
        .map(|(b, _)| b.clone())
        .collect();
    let got_dead = drain(c.node(0), "down", &dead_want);
    let all: Vec<Msg> = got_live.into_iter().chain(got_dead).collect();
    let delivered = once(&all);
    let want: HashSet<String> = sent.keys().cloned().collect();
    let lost: Vec<&String> = want.difference(&delivered).collect();
    let unexpected: Vec<&String> = delivered.difference(&want).collect();
    assert!(
        lost.is_empty() && unexpected.is_empty(),
        "lost {lost:?}, unexpected {unexpected:?}"
    );
    for m in &all {
        assert_eq!(
            sent[&m.body], m.partition,
            "{} from partition {}",
            m.body, m.partition
        );
    }
}

/// A clean stop (SIGTERM) gives the node's etcd lease back (docs/cluster.md, "Liveness": `Session::close` revokes
/// it): the alive key is gone as soon as the process has exited, the others see the node dead at once, and the node
/// started again right away rejoins under its id instead of being refused for a TTL as "held by another live node".
#[test]
fn sigterm_gives_the_lease_back_so_a_restart_rejoins_at_once() {
    let _g = serial();
    // A TTL far longer than the test waits: only a revoked lease lets the key go in time.
    let opts = Opts {
        ttl_s: Some(60),
        ..Opts::default()
    };
    let Some(mut c) = Cluster::start_with(
        "sigterm_gives_the_lease_back_so_a_restart_rejoins_at_once",
        2,
        opts,
    ) else {
        return;
    };
    let id = c.node(1).id.clone();
    let alive_key = format!("/berth/{}/alive/{id}", c.name);
    assert!(c.etcd.get(&alive_key).unwrap().is_some());
    let status = c.terminate(1);
    assert!(status.success(), "SIGTERM exit: {status:?}");
    assert_eq!(
        c.etcd.get(&alive_key).unwrap(),
        None,
        "the alive key outlived a clean stop\n{}",
        c.node(1).log_text()
    );
    c.wait_alive(0, &id, false);
    let started = Instant::now();
    c.start_again(1);
    c.wait_all_live();
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "rejoining took {:?}",
        started.elapsed()
    );
    let log = c.node(1).log_text();
    let second_run = log
        .rsplit("=== harness: start #2")
        .next()
        .unwrap_or_default();
    assert!(
        !second_run.contains("held by another live node"),
        "the restarted node was refused its id\n{second_run}"
    );
}

#[test]
fn node_started_late_catches_up() {
    let _g = serial();
    let Some(mut c) = Cluster::start("node_started_late_catches_up", 2) else {
        return;
    };
    create_topic(c.node(0), "early-a", 4);
    create_topic(c.node(1), "early-b", 2);
    let mut a_bodies = HashSet::new();
    for n in 0..8 {
        let body = format!("a-{n}");
        produce(c.node(n % 2), "early-a", "", &body);
        a_bodies.insert(body);
    }

    let late = c.add_node();
    c.wait_all_live();
    let node = c.node(late);
    wait_for(
        "the late node to list both topics",
        Duration::from_secs(10),
        || {
            let a = node.get("/topics");
            let l = a.json();
            let has = |t: &str| l.as_array().is_some_and(|l| l.iter().any(|x| x == t));
            if has("early-a") && has("early-b") {
                Ok(())
            } else {
                Err(a.text())
            }
        },
    );
    let owners = c.owners(late, "early-a");
    assert_eq!(owners.len(), 4);
    for id in ["n1", "n2"] {
        assert_eq!(owners.iter().filter(|o| *o == id).count(), 2, "{owners:?}");
    }
    assert!(
        c.owners(late, "early-b").iter().all(|o| o != &node.id),
        "placement moved"
    );
    c.wait_view(late, "n1, n2 with 3 partitions, the late node none", |v| {
        v.iter()
            .all(|n| n.partitions == if n.id == node.id { 0 } else { 3 })
    });

    // It serves them: produces through it land on the old nodes; it delivers what was written before it came.
    let mut b_bodies = HashSet::new();
    for n in 0..4 {
        let body = format!("b-{n}");
        produce(node, "early-b", "", &body);
        b_bodies.insert(body);
    }
    assert_eq!(once(&drain(node, "early-a", &a_bodies)), a_bodies);
    assert_eq!(once(&drain(node, "early-b", &b_bodies)), b_bodies);

    // A topic created now is spread over all three, the late node included.
    create_topic(node, "late-c", 3);
    let owners = c.owners(0, "late-c");
    let mut sorted = owners.clone();
    sorted.sort();
    assert_eq!(sorted, ["n1", "n2", "n3"], "{owners:?}");
    let p = c.partitions_of(0, "late-c", late)[0];
    produce(c.node(0), "late-c", &format!("&partition={p}"), "on-late");
    let m = consume(&c.node(1).client, "late-c", "&wait=2s").expect("the record on the late node");
    assert_eq!((m.partition, m.body.as_str()), (p, "on-late"));
}

/// The followers of each partition of a replicated topic as `node` reports them: (partition, leader, end offset,
/// [(follower, its end, lagging)]).
type Replication = Vec<(u64, String, u64, Vec<(String, u64, bool)>)>;

fn replication(node: &Node, topic: &str) -> Result<Replication, String> {
    let a = node.get(&format!("/topics/{topic}"));
    // A partition whose node is not answering is described as unavailable, without offsets: not yet.
    if a.status != 200 || a.text().contains("\"available\":false") {
        return Err(a.text());
    }
    Ok(a.json()["partitions"]
        .as_array()
        .ok_or_else(|| a.text())?
        .iter()
        .map(|p| {
            let followers = p["followers"]
                .as_array()
                .map(|f| {
                    f.iter()
                        .map(|f| {
                            (
                                f["node"].as_str().unwrap().to_string(),
                                f["end_offset"].as_u64().unwrap(),
                                f["lagging"].as_bool().unwrap(),
                            )
                        })
                        .collect()
                })
                .unwrap_or_default();
            (
                p["partition"].as_u64().unwrap(),
                p["leader"].as_str().unwrap().to_string(),
                p["end_offset"].as_u64().unwrap(),
                followers,
            )
        })
        .collect())
}

/// Waits (15 s at most) until every follower of every partition of `topic` has it to the leader's end.
fn wait_replicated(node: &Node, topic: &str, followers: usize) -> Replication {
    wait_for(
        &format!("every follower of '{topic}' at its leader's end"),
        Duration::from_secs(15),
        || {
            let r = replication(node, topic)?;
            let done = r.iter().all(|(_, leader, end, f)| {
                (*end == 0 || f.len() == followers)
                    && f.iter()
                        .all(|(n, e, lagging)| n != leader && e == end && !lagging)
            });
            if done {
                Ok(r)
            } else {
                Err(format!("{r:?}"))
            }
        },
    )
}

/// Every segment file of partition `p` of `topic` in a node's data directory, concatenated in name order.
fn segments(node: &Node, topic: &str, p: u64) -> Vec<u8> {
    let dir = node.data_dir.join("topics").join(topic).join(p.to_string());
    let mut names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .collect();
    names.sort();
    names
        .iter()
        .flat_map(|n| std::fs::read(n).unwrap())
        .collect()
}

#[test]
fn a_replicated_topic_ships_every_batch_to_its_followers_byte_for_byte_across_a_follower_crash_and_a_leader_restart(
) {
    let _g = serial();
    let opts = Opts {
        extra: vec!["--replication-preview".into()],
        cores: Some(2),
        ..Opts::short_ttl()
    };
    let Some(mut c) = Cluster::start_with("replicated_topic_ships_every_batch", 3, opts) else {
        return;
    };
    let a = c.node(0).put("/topics/r3?partitions=4&replicas=3");
    assert_eq!(a.status, 201, "{}", a.text());
    assert_eq!(a.json()["config"]["replicas"], 3);
    // Each partition: three distinct replicas, its leader first.
    for p in partitions(c.node(1), "r3") {
        let replicas: Vec<&str> = p["replicas"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r.as_str().unwrap())
            .collect();
        let mut distinct = replicas.clone();
        distinct.sort();
        distinct.dedup();
        assert_eq!((replicas.len(), distinct.len()), (3, 3), "{p}");
        assert_eq!(replicas[0], p["leader"].as_str().unwrap(), "{p}");
    }
    let batch: String = (0..50)
        .map(|i| format!("{{\"body\":\"batch-{i}\"}}\n"))
        .collect();
    for i in 0..3 {
        for n in 0..12 {
            produce(
                c.node(i),
                "r3",
                &format!("&partition={}", n % 4),
                &format!("one-{i}-{n}"),
            );
        }
        let a = c
            .node(i)
            .client
            .call_with(
                "POST",
                "/produce?topic=r3",
                &[("content-type", "application/x-ndjson")],
                batch.as_bytes(),
            )
            .expect("batch produce");
        assert_eq!(a.status, 200, "batch produce: {}", a.text());
    }
    let before = wait_replicated(c.node(2), "r3", 2);
    assert_eq!(before.iter().map(|r| r.2).sum::<u64>(), 186);
    assert!(before.iter().all(|r| r.2 > 0), "{before:?}");

    // A follower killed: the leaders keep what it misses and resend it once it is back. (What it leads is
    // unavailable meanwhile: failover is not built yet.)
    c.kill9(1);
    let served: Vec<u64> = before
        .iter()
        .filter(|r| r.1 != c.node(1).id)
        .map(|r| r.0)
        .collect();
    assert!(!served.is_empty(), "{before:?}");
    for n in 0..20 {
        let p = served[n % served.len()];
        produce(
            c.node(0),
            "r3",
            &format!("&partition={p}"),
            &format!("while-down-{n}"),
        );
    }
    c.restart(1);
    c.wait_all_live();
    // (Through it, to every partition: those it leads ship from its new process. Retried while the other nodes
    // reconnect to it.)
    for n in 0..12 {
        let path = format!("/produce?topic=r3&partition={}", n % 4);
        wait_ok(
            c.node(1),
            "POST",
            &path,
            b"after",
            "a produce after the restart",
        );
    }
    wait_replicated(c.node(0), "r3", 2);

    // A leader stopped (SIGTERM) right after its last produces waits for its followers to take them: started again,
    // it finds them at its end, and what it ships next continues their logs (nothing to catch up).
    for p in 0..4 {
        produce(
            c.node(0),
            "r3",
            &format!("&partition={p}"),
            &format!("last-{p}"),
        );
    }
    assert!(c.terminate(0).success());
    c.start_again(0);
    c.wait_all_live();
    for p in 0..4 {
        let path = format!("/produce?topic=r3&partition={p}");
        // (Retried while the other nodes reconnect to it.)
        wait_ok(
            c.node(2),
            "POST",
            &path,
            b"again",
            "a produce after the restart",
        );
    }
    let after = wait_replicated(c.node(0), "r3", 2);
    assert_eq!(after.iter().map(|r| r.2).sum::<u64>(), 226);

    // Stopped (each log's tail goes to its segment), every replica of a partition holds the leader's bytes.
    for i in 0..3 {
        assert!(c.terminate(i).success());
    }
    for (p, leader, end, _) in &after {
        let lead = segments(c.node(c.index_of(leader)), "r3", *p);
        assert!(
            !lead.is_empty(),
            "partition {p} ({end} records) has no bytes on its leader"
        );
        for i in 0..3 {
            assert!(
                segments(c.node(i), "r3", *p) == lead,
                "partition {p}: {}'s segments differ from its leader {leader}'s",
                c.node(i).id
            );
        }
        // And the same epoch history (docs/format.md, "replica.epochs"): from offset 0, one entry per leadership
        // (a leader's clean stop, and a follower's crash after it led, hand its partitions to elected followers).
        let epochs = |i: usize| {
            let path = c
                .node(i)
                .data_dir
                .join(format!("topics/r3/{p}/replica.epochs"));
            std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        };
        let lead = epochs(c.index_of(leader));
        assert!(
            lead.len() >= 24 && (lead.len() - 8) % 16 == 0,
            "partition {p}: entries: {lead:?}"
        );
        assert_eq!(
            lead[12..20],
            [0; 8],
            "partition {p}: from offset 0: {lead:?}"
        );
        for i in 0..3 {
            assert_eq!(
                epochs(i),
                lead,
                "partition {p}: {}'s epoch history",
                c.node(i).id
            );
        }
    }
}

/// A leader whose metadata names another node at a newer epoch is deposed (docs/replication.md, step 4): a produce
/// it holds waiting for a majority is answered `503 partition_unavailable` at once, not after `replica_timeout`, and
/// it says so in its log. (The partition key is written by hand here, as the election will write it.)
#[test]
fn a_leader_deposed_by_a_newer_partition_key_answers_its_waiting_produce_at_once() {
    let _g = serial();
    let opts = Opts {
        extra: vec![
            "--replication-preview".into(),
            "--replica-timeout-ms".into(),
            "60000".into(),
        ],
        ..Opts::default()
    };
    let Some(mut c) = Cluster::start_with("deposed_leader", 3, opts) else {
        return;
    };
    let a = c.node(0).put("/topics/dp?partitions=1&replicas=3");
    assert_eq!(a.status, 201, "{}", a.text());
    let p = partitions(c.node(0), "dp").remove(0);
    let topic_id = p["epoch"].as_u64().expect("an epoch");
    let replicas: Vec<usize> = replica_indices(&c, &p);
    let (leader, f1, f2) = (replicas[0], replicas[1], replicas[2]);
    assert_eq!(produce(c.node(leader), "dp", "", "a").1, 0);

    // Both followers paused: a produce waits for a majority (up to a minute).
    c.pause(f1);
    c.pause(f2);
    let waiting = {
        let client = c.node(leader).new_client();
        std::thread::spawn(move || {
            let started = Instant::now();
            let a = client
                .call("POST", "/produce?topic=dp", b"b")
                .expect("an answer");
            (a.status, a.text(), started.elapsed())
        })
    };
    std::thread::sleep(ms(300));
    // A new leadership.
    let put_at = Instant::now();
    name_first_follower_leader(&c, "dp", topic_id);
    let (status, text, _) = waiting.join().unwrap();
    let answered_after = put_at.elapsed();
    assert_eq!(status, 503, "{text}");
    assert!(text.contains("partition_unavailable"), "{text}");
    assert!(
        answered_after < Duration::from_secs(20),
        "answered {answered_after:?} after the new key, not at the replica timeout"
    );
    assert!(
        c.node(leader)
            .log_text()
            .contains("a newer leadership began"),
        "{}",
        c.node(leader).log_text()
    );
    c.resume(f1);
    c.resume(f2);
}

/// A move of leadership (docs/replication.md, step 4: the role change on a core): a partition key naming a
/// follower as leader at a newer epoch (written by hand here, as the election will write it) makes that replica
/// lead where it followed, with its log as it stands, and the old leader follow on its core. Produces and
/// consumes through any node reach the new leader, every record is served once, and the three logs (the old
/// leader's included, fed by the new leader now) end the same bytes.
#[test]
fn a_follower_named_leader_by_a_newer_partition_key_serves_and_the_old_leader_follows() {
    let _g = serial();
    let opts = Opts {
        extra: vec!["--replication-preview".into()],
        ..Opts::default()
    };
    let Some(mut c) = Cluster::start_with("leadership_moves", 3, opts) else {
        return;
    };
    let a = c.node(0).put("/topics/lm?partitions=1&replicas=3");
    assert_eq!(a.status, 201, "{}", a.text());
    let p = partitions(c.node(0), "lm").remove(0);
    let topic_id = p["epoch"].as_u64().expect("an epoch");
    let replicas: Vec<usize> = replica_indices(&c, &p);
    let (leader, f1, f2) = (replicas[0], replicas[1], replicas[2]);
    for (i, body) in ["a", "b", "c"].iter().enumerate() {
        assert_eq!(produce(c.node(i), "lm", "", body).1, i as u64);
    }
    wait_replicated(c.node(leader), "lm", 2);

    // Node f1 leads from now on.
    name_first_follower_leader(&c, "lm", topic_id);
    wait_for(
        "the new leader in GET /topics",
        Duration::from_secs(15),
        || {
            let p = partitions(c.node(leader), "lm").remove(0);
            if p["leader"].as_str() == Some(c.node(f1).id.as_str())
                && p["epoch"].as_u64() > Some(topic_id)
            {
                Ok(())
            } else {
                Err(format!("{p}"))
            }
        },
    );
    let a = wait_ok(
        c.node(leader),
        "POST",
        "/produce?topic=lm",
        b"d",
        "a produce through the old leader, led by the new one",
    );
    assert_eq!(a.json()["offset"].as_u64(), Some(3), "{}", a.text());
    assert_eq!(produce(c.node(f2), "lm", "", "e").1, 4);
    // The old leader follows: the new leader has every replica at its end.
    let r = wait_replicated(c.node(f2), "lm", 2);
    assert_eq!(
        (r[0].1.as_str(), r[0].2),
        (c.node(f1).id.as_str(), 5),
        "{r:?}"
    );
    assert!(
        c.node(f1)
            .log_text()
            .contains("this replica leads the partition now"),
        "{}",
        c.node(f1).log_text()
    );
    assert!(
        c.node(leader)
            .log_text()
            .contains("a newer leadership began"),
        "{}",
        c.node(leader).log_text()
    );
    // Every record is served once, through the old leader too.
    let want: HashSet<String> = ["a", "b", "c", "d", "e"]
        .iter()
        .map(|b| b.to_string())
        .collect();
    let got = drain(c.node(leader), "lm", &want);
    let mut bodies: Vec<String> = got.iter().map(|m| m.body.clone()).collect();
    bodies.sort();
    assert_eq!(bodies, ["a", "b", "c", "d", "e"]);
    stop_and_compare_segments(&mut c, "lm", f1, &[leader, f2]);
}

#[test]
fn a_fencing_round_goes_on_with_a_majority_and_does_not_wait_out_a_paused_replica() {
    let _g = serial();
    let opts = Opts {
        extra: vec!["--replication-preview".into()],
        ..Opts::default()
    };
    let Some(mut c) = Cluster::start_with("round_paused_replica", 3, opts) else {
        return;
    };
    let a = c.node(0).put("/topics/rp?partitions=1&replicas=3");
    assert_eq!(a.status, 201, "{}", a.text());
    let p = partitions(c.node(0), "rp").remove(0);
    let topic_id = p["epoch"].as_u64().expect("an epoch");
    let replicas: Vec<usize> = replica_indices(&c, &p);
    let (leader, f1, f2) = (replicas[0], replicas[1], replicas[2]);
    assert_eq!(produce(c.node(leader), "rp", "", "a").1, 0);
    wait_replicated(c.node(leader), "rp", 2);

    // f2 paused (its session still live: calls to it end only at the 2 s node RPC timeout), then f1 named leader
    // at a newer epoch. Its round has the old leader's answer and its own, a majority: it goes on after a short
    // grace for f2 (`front/round.rs`, `fence_others`), not after f2's call times out. (Waiting for f2 cannot take
    // less than 2 s from the naming: its call starts after the etcd write and the watch, and ends 2 s later.)
    c.pause(f2);
    let won = "fencing round won: this node leads the partition";
    let before = c.node(f1).log_text().matches(won).count();
    let started = Instant::now();
    name_first_follower_leader(&c, "rp", topic_id);
    wait_for("f1's round won", Duration::from_secs(15), || {
        match c.node(f1).log_text().matches(won).count() > before {
            true => Ok(()),
            false => Err("not yet".into()),
        }
    });
    let waited = started.elapsed();
    assert!(
        waited < ms(1800),
        "the round took {waited:?}: it waited out the paused replica"
    );
    assert!(
        c.node(f1)
            .log_text()
            .contains("a fencing round goes on with a majority"),
        "{}",
        c.node(f1).log_text()
    );
    // It serves what was acknowledged, and takes new produces with the old leader as its majority.
    let a = wait_ok(
        c.node(f1),
        "POST",
        "/produce?topic=rp",
        b"b",
        "a produce through the new leader",
    );
    assert_eq!(a.json()["offset"].as_u64(), Some(1), "{}", a.text());
    c.resume(f2);
    c.wait_all_live();
    let want: HashSet<String> = ["a", "b"].iter().map(|b| b.to_string()).collect();
    let got = drain(c.node(f1), "rp", &want);
    let mut bodies: Vec<String> = got.iter().map(|m| m.body.clone()).collect();
    bodies.sort();
    assert_eq!(bodies, ["a", "b"]);
    let r = wait_replicated(c.node(f1), "rp", 2);
    assert_eq!(
        (r[0].1.as_str(), r[0].2),
        (c.node(f1).id.as_str(), 2),
        "{r:?}"
    );
}

/// Stops every running node, then checks that each of `replicas` holds the segment bytes of partition 0 of
/// `topic` that its leader `leader` holds.
fn stop_and_compare_segments(c: &mut Cluster, topic: &str, leader: usize, replicas: &[usize]) {
    for i in 0..c.len() {
        if c.node(i).running() {
            assert!(c.terminate(i).success());
        }
    }
    let lead = segments(c.node(leader), topic, 0);
    for &f in replicas {
        assert!(
            segments(c.node(f), topic, 0) == lead,
            "{}'s segments differ from the leader's",
            c.node(f).id
        );
    }
}

/// Failover (`docs/replication.md`, step 4): a leader killed with -9 loses its metastore session; a live follower
/// elects itself with an etcd transaction, runs its fencing round over the surviving majority, and serves every
/// acknowledged record, within the node TTL and a few seconds; the old leader, started again, follows the new one
/// and ends with the same log.
#[test]
fn a_leader_killed_with_9_is_replaced_by_an_elected_follower_that_serves_everything_acknowledged() {
    let _g = serial();
    let opts = Opts {
        extra: vec!["--replication-preview".into()],
        ..Opts::short_ttl()
    };
    let Some(mut c) = Cluster::start_with("election", 3, opts) else {
        return;
    };
    let a = c.node(0).put("/topics/el?partitions=1&replicas=3");
    assert_eq!(a.status, 201, "{}", a.text());
    let p = partitions(c.node(0), "el").remove(0);
    let topic_id = p["epoch"].as_u64().expect("an epoch");
    let replicas: Vec<usize> = replica_indices(&c, &p);
    let leader = replicas[0];
    let survivors: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    let mut want = HashSet::new();
    for i in 0..20 {
        let body = format!("m{i}");
        assert_eq!(produce(c.node(i % 3), "el", "", &body).1, i as u64);
        want.insert(body);
    }
    // A lease the old leader hands out, never settled; four more above it, of which two are acknowledged: above
    // the frontier (0), so they stay settled after the failover only as acked-ahead ranges its followers took.
    let old = consume(&c.node(survivors[0]).new_client(), "el", "&visibility=60s")
        .expect("a record to lease");
    assert_eq!(old.offset, 0, "{old:?}");
    let client = c.node(survivors[0]).new_client();
    let above: Vec<Msg> = (1..5)
        .map(|_| consume(&client, "el", "&visibility=60s").expect("a record to lease"))
        .collect();
    for m in above.iter().filter(|m| m.offset % 2 == 0) {
        let a = settle(c.node(survivors[1]), "ack", "el", &m.handle, "");
        assert_eq!(a.status, 200, "{}", a.text());
        want.remove(&m.body);
    }
    // Both survivors hold them durably (the record of the group at 0 with 2..3 and 4..5, in their journals or
    // their frontier files) before the leader is killed.
    wait_for(
        "the acks above the frontier on both survivors",
        Duration::from_secs(15),
        || {
            let missing: Vec<&str> = survivors
                .iter()
                .filter(|&&i| !holds_acked(c.node(i), "el", 0, &[(2, 3), (4, 5)]))
                .map(|&i| c.node(i).id.as_str())
                .collect();
            if missing.is_empty() {
                Ok(())
            } else {
                Err(format!("not yet on {missing:?}"))
            }
        },
    );
    let nonce_of = |handle: &str| -> u64 {
        handle
            .rsplit(':')
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("a receipt handle: {handle}"))
    };
    c.kill9(leader);
    let killed = Instant::now();
    // A produce through a survivor is answered once a follower leads (TTL 2 s, then the election and the round).
    let a = wait_ok(
        c.node(survivors[0]),
        "POST",
        "/produce?topic=el",
        b"after",
        "a produce once a follower leads",
    );
    let failover = killed.elapsed();
    eprintln!("failover: a produce answered {failover:?} after the kill");
    assert_eq!(a.json()["offset"].as_u64(), Some(20), "{}", a.text());
    want.insert("after".to_string());
    assert!(
        failover < Duration::from_secs(2 + 5),
        "failover took {failover:?}"
    );
    let now = partitions(c.node(survivors[1]), "el").remove(0);
    let new_leader = c.index_of(now["leader"].as_str().expect("a leader"));
    assert!(survivors.contains(&new_leader), "{now}");
    assert!(now["epoch"].as_u64() > Some(topic_id), "{now}");
    assert!(
        c.node(new_leader).log_text().contains("fencing round won"),
        "{}",
        c.node(new_leader).log_text()
    );
    // The old leader's handle meets no lease of the new one: the new leader's nonces start above every ceiling a
    // majority promised the old one (`partition/nonces.rs`), whatever the clocks.
    let a = settle(c.node(survivors[1]), "ack", "el", &old.handle, "");
    assert_eq!(
        (a.status, a.json()["error"].as_str()),
        (410, Some("lease_gone")),
        "{}",
        a.text()
    );
    // Everything acknowledged before the kill is served, through either survivor (the records leased by the old
    // leader again), and nothing acked above the frontier comes back.
    let got = drain(c.node(survivors[1]), "el", &want);
    let bodies: HashSet<String> = got.iter().map(|m| m.body.clone()).collect();
    assert_eq!(
        bodies, want,
        "every acknowledged record once the follower leads, and none of those acked above the frontier"
    );
    for m in &got {
        assert!(
            nonce_of(&m.handle) > nonce_of(&old.handle),
            "the new leader's handle {} is not above the old leader's {}",
            m.handle,
            old.handle
        );
    }
    // The old leader comes back as a follower of the new one and catches up.
    c.start_again(leader);
    assert_eq!(produce(c.node(leader), "el", "", "back").1, 21);
    let r = wait_replicated(c.node(new_leader), "el", 2);
    assert_eq!(
        (r[0].1.as_str(), r[0].2),
        (c.node(new_leader).id.as_str(), 22),
        "{r:?}"
    );
    let others: Vec<usize> = (0..3).filter(|&i| i != new_leader).collect();
    stop_and_compare_segments(&mut c, "el", new_leader, &others);
}

/// The fencing round hands the leadership on: the follower that stands first (down while its leader took more
/// records with the other follower) finds the other follower's log greater, names it leader, and that one serves
/// every acknowledged record; the first follower's own log would have lost them.
#[test]
fn an_elected_follower_with_a_shorter_log_hands_the_leadership_to_the_greater_one() {
    let _g = serial();
    let opts = Opts {
        extra: vec!["--replication-preview".into()],
        ..Opts::short_ttl()
    };
    let Some(mut c) = Cluster::start_with("handover", 3, opts) else {
        return;
    };
    let a = c.node(0).put("/topics/ho?partitions=1&replicas=3");
    assert_eq!(a.status, 201, "{}", a.text());
    let p = partitions(c.node(0), "ho").remove(0);
    let replicas: Vec<usize> = replica_indices(&c, &p);
    let (leader, first, second) = (replicas[0], replicas[1], replicas[2]);
    let mut want = HashSet::new();
    for i in 0..5 {
        let body = format!("m{i}");
        produce(c.node(leader), "ho", "", &body);
        want.insert(body);
    }
    wait_replicated(c.node(leader), "ho", 2);
    // The first follower misses five acknowledged records (killed: a paused one would still find them in its
    // socket's buffer); the leader dies; the follower comes back and stands first.
    c.kill9(first);
    for i in 5..10 {
        let body = format!("m{i}");
        assert_eq!(produce(c.node(leader), "ho", "", &body).1, i);
        want.insert(body);
    }
    c.kill9(leader);
    c.start_again(first);
    let a = wait_ok(
        c.node(first),
        "POST",
        "/produce?topic=ho",
        b"after",
        "a produce once a follower leads",
    );
    assert_eq!(a.json()["offset"].as_u64(), Some(10), "{}", a.text());
    want.insert("after".to_string());
    let now = partitions(c.node(first), "ho").remove(0);
    for i in [first, second] {
        for line in c.node(i).log_text().lines().filter(|l| {
            l.contains("round")
                || l.contains("elect")
                || l.contains("leadership")
                || l.contains("leads")
        }) {
            eprintln!("{}: {line}", c.node(i).id);
        }
    }
    assert_eq!(
        now["leader"].as_str(),
        Some(c.node(second).id.as_str()),
        "{now}"
    );
    assert!(
        c.node(first)
            .log_text()
            .contains("a replica's log is greater: the leadership goes to it"),
        "{}",
        c.node(first).log_text()
    );
    let got = drain(c.node(first), "ho", &want);
    let bodies: HashSet<String> = got.iter().map(|m| m.body.clone()).collect();
    assert_eq!(
        bodies, want,
        "every acknowledged record, from the greater log"
    );
    stop_and_compare_segments(&mut c, "ho", second, &[first]);
}

/// Three nodes (`--node-ttl 2`, `--replica-timeout-ms 500`, replication on; each in its own network namespace
/// with `netns`) and topic `topic` of one partition with `replicas=3`: five records `m0`..`m4` produced through its
/// leader and on both followers. Returns the cluster, partition 0's (leader, first follower, second follower) and
/// the bodies.
fn five_replicated(
    name: &str,
    topic: &str,
    netns: bool,
) -> Option<(Cluster, [usize; 3], HashSet<String>)> {
    let (c, r, want) = replicated_with_five(name, topic, 3, netns)?;
    Some((c, [r[0], r[1], r[2]], want))
}

/// `nodes` nodes (`--replication-preview`, a 500 ms replica timeout, a 2 s TTL), a topic of one partition with
/// three replicas, and five records acknowledged through its leader and on both followers: the cluster, the
/// replicas in order (the leader first), and the records.
fn replicated_with_five(
    name: &str,
    topic: &str,
    nodes: usize,
    netns: bool,
) -> Option<(Cluster, Vec<usize>, HashSet<String>)> {
    let opts = Opts {
        netns,
        extra: vec![
            "--replication-preview".into(),
            "--replica-timeout-ms".into(),
            "500".into(),
        ],
        ..Opts::short_ttl()
    };
    let c = Cluster::start_with(name, nodes, opts)?;
    put_topic(
        c.node(0),
        &format!("/topics/{topic}?partitions=1&replicas=3"),
    );
    let p = partitions(c.node(0), topic).remove(0);
    let replicas: Vec<usize> = replica_indices(&c, &p);
    let mut want = HashSet::new();
    for i in 0..5 {
        let body = format!("m{i}");
        assert_eq!(produce(c.node(replicas[0]), topic, "", &body).1, i);
        want.insert(body);
    }
    wait_replicated(c.node(replicas[0]), topic, 2);
    Some((c, replicas, want))
}

/// Truncation by epoch: a leader that wrote records no follower took (its produces answered `503
/// not_enough_replicas`) and was then killed comes back as a follower of the leader elected meanwhile, whose log
/// holds other records at those offsets: it cuts its unacknowledged tail where the new leader's history says, is
/// caught up, serves none of the cut records, and ends with the new leader's segments byte for byte.
#[test]
fn an_old_leaders_unacknowledged_tail_is_cut_when_it_returns_as_a_follower() {
    let _g = serial();
    let Some((mut c, [leader, f1, f2], mut want)) = five_replicated("truncation", "tr", false)
    else {
        return;
    };
    // Both followers killed: two records reach the leader's disk alone, never acknowledged.
    c.kill9(f1);
    c.kill9(f2);
    for body in ["u0", "u1"] {
        let a = c.node(leader).post("/produce?topic=tr", body.as_bytes());
        assert_eq!(a.status, 503, "{}", a.text());
        assert_eq!(a.json()["error"], "not_enough_replicas", "{}", a.text());
    }
    c.kill9(leader);
    c.start_again(f1);
    c.start_again(f2);
    // The followers elect one of them; it serves from offset 5, with records of its own there.
    let a = wait_ok(
        c.node(f1),
        "POST",
        "/produce?topic=tr",
        b"n0",
        "a produce once a follower leads",
    );
    assert_eq!(a.json()["offset"].as_u64(), Some(5), "{}", a.text());
    want.insert("n0".to_string());
    for body in ["n1", "n2"] {
        produce(c.node(f2), "tr", "", body);
        want.insert(body.to_string());
    }
    let now = partitions(c.node(f1), "tr").remove(0);
    let new_leader = c.index_of(now["leader"].as_str().expect("a leader"));
    assert_ne!(new_leader, leader, "{now}");
    // The old leader comes back as a follower: its tail is cut at 5, and it is caught up.
    c.start_again(leader);
    let r = wait_replicated(c.node(new_leader), "tr", 2);
    assert_eq!(r[0].2, 8, "{r:?}");
    assert!(
        c.node(leader).log_text().contains("cut a diverged tail"),
        "{}",
        c.node(leader).log_text()
    );
    assert_eq!(produce(c.node(leader), "tr", "", "n3").1, 8);
    want.insert("n3".to_string());
    let got = drain(c.node(leader), "tr", &want);
    let bodies: HashSet<String> = got.iter().map(|m| m.body.clone()).collect();
    assert_eq!(
        bodies, want,
        "every acknowledged record, and none of the cut ones"
    );
    let others: Vec<usize> = (0..3).filter(|&i| i != new_leader).collect();
    stop_and_compare_segments(&mut c, "tr", new_leader, &others);
}

/// Drains `topic` through `node` and checks what came: every body of `want` (acknowledged) once, and beside them only
/// bodies of `tried` (produces not answered 200, which may have been written).
fn assert_served(node: &Node, topic: &str, want: &HashSet<String>, tried: &HashSet<String>) {
    let got = once(&drain(node, topic, want));
    assert!(got.is_superset(want), "{got:?} lacks some of {want:?}");
    assert!(
        got.difference(want).all(|b| tried.contains(b)),
        "only tries not answered 200 beside them: {got:?}"
    );
}

/// Partition 0 of `topic`'s leader as node `via` names it: once its followers have its log, every node is stopped
/// and their segments compared with the leader's, byte for byte.
fn assert_logs_are_the_leaders(c: &mut Cluster, topic: &str, via: usize) {
    let now = partitions(c.node(via), topic).remove(0);
    let current = c.index_of(now["leader"].as_str().expect("a leader"));
    wait_replicated(c.node(current), topic, 2);
    let others: Vec<usize> = (0..3).filter(|&i| i != current).collect();
    stop_and_compare_segments(c, topic, current, &others);
}

/// Waits (20 s at most) until node `i` has opened partition 0 of `topic` as a learner.
fn wait_learner(c: &Cluster, i: usize, topic: &str) {
    wait_for(
        "the wiped follower to open its replica as a learner",
        Duration::from_secs(20),
        || {
            let file = c
                .node(i)
                .data_dir
                .join(format!("topics/{topic}/0/replica.learner"));
            if file.exists() && c.node(i).log_text().contains("a replica on a new disk") {
                Ok(())
            } else {
                Err(c.node(i).log_text())
            }
        },
    );
}

/// Waits (20 s at most) until the leader `leader` reports learner `i` promoted at its end of partition 0 of
/// `topic`, and its `replica.learner` file is gone.
fn wait_promoted(c: &Cluster, leader: usize, i: usize, topic: &str) {
    wait_for("the learner promoted", Duration::from_secs(20), || {
        let p = partitions(c.node(leader), topic).remove(0);
        let promoted = p["followers"].as_array().is_some_and(|fs| {
            fs.iter().any(|f| {
                f["node"] == c.node(i).id.as_str()
                    && f["learner"] == false
                    && f["end_offset"] == p["end_offset"]
            })
        });
        let file = c
            .node(i)
            .data_dir
            .join(format!("topics/{topic}/0/replica.learner"));
        if promoted && !file.exists() {
            Ok(())
        } else {
            Err(p.to_string())
        }
    });
}

/// Stops node `i` (it writes its frontier files at its stop, a follower's from what its leader shipped) and checks
/// the default group's frontier of partition 0 of `topic` there; then starts it again.
fn assert_frontier_at_stop(c: &mut Cluster, i: usize, topic: &str, want: u64) {
    assert!(c.terminate(i).success());
    assert_eq!(
        frontier_file(c.node(i), topic, 0, "default").map(|b| frontier_value(&b)),
        Some(want),
        "the learner holds its leader's frontier"
    );
    c.start_again(i);
}

/// Acknowledges the first `n` records of partition 0 of `topic` through `node` (removed from `want`) and waits
/// until its leader holds that frontier durably.
fn ack_first(c: &Cluster, node: usize, topic: &str, n: u64, want: &mut HashSet<String>) {
    for _ in 0..n {
        let m = consume(&c.node(node).client, topic, "").expect("a record");
        let a = settle(c.node(node), "ack", topic, &m.handle, "");
        assert_eq!(a.status, 200, "{}", a.text());
        want.remove(&m.body);
    }
    wait_for(
        "the frontier durable on the leader",
        Duration::from_secs(10),
        || {
            let p = partitions(c.node(node), topic).remove(0);
            if p["durable"] == n {
                Ok(())
            } else {
                Err(p.to_string())
            }
        },
    );
}

/// A follower wiped and started again while its leader runs on: a learner, caught up from the leader's log and
/// sent every group's frontier (nothing moves them, so nothing else would), then promoted.
#[test]
fn a_wiped_follower_rejoining_a_running_leader_gets_its_groups_frontiers_before_it_is_promoted() {
    let _g = serial();
    let Some((mut c, [leader, _, f2], mut want)) =
        five_replicated("learner_frontiers", "lf", false)
    else {
        return;
    };
    ack_first(&c, leader, "lf", 3, &mut want);
    c.kill9(f2);
    std::fs::remove_dir_all(&c.node(f2).data_dir).expect("wipe f2's data directory");
    c.start_again(f2);
    wait_learner(&c, f2, "lf");
    wait_promoted(&c, leader, f2, "lf");
    assert_frontier_at_stop(&mut c, f2, "lf", 3);
    let got = once(&drain(c.node(leader), "lf", &want));
    assert_eq!(got, want);
    stop_and_compare_segments(&mut c, "lf", leader, &[f2]);
}

/// A leader paused (SIGSTOP) past its node TTL, then continued: a follower is elected meanwhile and serves; the old
/// leader wakes believing it leads at its old epoch, but a produce it takes then finds no follower that answers that
/// epoch (each was fenced by the new leader's round), so it is never acknowledged there; the old leader follows the
/// new one, every acknowledged record is served once, and the three logs end byte for byte the same.
#[test]
fn a_leader_paused_past_its_ttl_and_continued_follows_the_leader_elected_meanwhile() {
    let _g = serial();
    let Some((mut c, [leader, f1, f2], mut want)) = five_replicated("sigstop", "ss", false) else {
        return;
    };
    c.pause(leader);
    let paused = Instant::now();
    let (acked, mut tried) = produce_until_ok(c.node(f1), "ss", "during");
    eprintln!(
        "a produce through a follower answered {:?} after the pause",
        paused.elapsed()
    );
    want.insert(acked);
    let now = partitions(c.node(f2), "ss").remove(0);
    let new_leader = c.index_of(now["leader"].as_str().expect("a leader"));
    assert_ne!(new_leader, leader, "{now}");
    c.resume(leader);
    // At once, through the old leader itself: answered only once it is on a majority of the new leadership.
    let (acked, more) = produce_until_ok(c.node(leader), "ss", "resumed");
    want.insert(acked);
    tried.extend(more);
    assert_served(c.node(leader), "ss", &want, &tried);
    assert_logs_are_the_leaders(&mut c, "ss", f2);
}

/// A leader cut off from etcd only (network namespaces, a blackhole route to etcd's address in its namespace): its
/// session expires, a follower is elected and fences it (the old leader still reaches its peers), and serves; a
/// produce through the old leader meanwhile is never answered on its old leadership alone. Healed, it registers
/// again and follows; every acknowledged record is served once, and the three logs end byte for byte the same.
#[test]
fn a_leader_cut_from_etcd_only_is_replaced_and_follows_once_healed() {
    let _g = serial();
    let Some((mut c, [leader, f1, f2], mut want)) = five_replicated("etcd_cut", "ec", true) else {
        return;
    };
    c.net().block_etcd(leader);
    let cut = Instant::now();
    let old = c.node(leader).id.clone();
    wait_for(
        "a follower elected in the cut leader's place",
        Duration::from_secs(20),
        || {
            let now = partitions(c.node(f2), "ec").remove(0);
            if now["leader"].as_str().is_some_and(|l| l != old) {
                Ok(())
            } else {
                Err(now.to_string())
            }
        },
    );
    let (acked, mut tried) = produce_until_ok(c.node(f1), "ec", "during");
    eprintln!(
        "a produce through a follower answered {:?} after the cut",
        cut.elapsed()
    );
    want.insert(acked);
    // Through the old leader while it is still cut: 200 only on the new leadership's majority.
    for n in 0..5 {
        let body = format!("cut-{n}");
        tried.insert(body.clone());
        let a = c.node(leader).post("/produce?topic=ec", body.as_bytes());
        if a.status == 200 {
            want.insert(body);
        }
    }
    c.net().unblock_etcd(leader);
    let (acked, more) = produce_until_ok(c.node(leader), "ec", "healed");
    want.insert(acked);
    tried.extend(more);
    assert_served(c.node(f2), "ec", &want, &tried);
    assert_logs_are_the_leaders(&mut c, "ec", f2);
}

/// Disk loss of a leader: all three replicas down, the leader's data directory wiped, all three back. Still named
/// leader (nobody was elected), it opens its replica as a learner, so it runs a fencing round, which hands the
/// leadership to the greatest log; every acknowledged record is served, and the wiped replica ends with its new
/// leader's log. (Leading from its empty log instead, it writes other records at the same offsets in the same epoch,
/// which no truncation by epoch can tell apart: seen failing without the round, the wiped replica lagging for good
/// once CheckQuorum had moved the leadership.)
#[test]
fn a_leader_back_on_a_wiped_disk_hands_its_leadership_to_the_greatest_log() {
    let _g = serial();
    let Some((mut c, [leader, f1, f2], want)) = five_replicated("learner_leader", "ll", false)
    else {
        return;
    };
    c.kill9(f1);
    c.kill9(f2);
    c.kill9(leader);
    std::fs::remove_dir_all(&c.node(leader).data_dir).expect("wipe the leader's data directory");
    c.start_again(leader);
    c.start_again(f1);
    c.start_again(f2);
    wait_learner(&c, leader, "ll");
    let (acked, tried) = produce_until_ok(c.node(leader), "ll", "n");
    let now = partitions(c.node(leader), "ll").remove(0);
    assert_ne!(
        now["leader"].as_str(),
        Some(c.node(leader).id.as_str()),
        "a learner leads: {now}"
    );
    let mut want = want;
    want.insert(acked);
    assert_served(c.node(leader), "ll", &want, &tried);
    // The wiped replica ends with its new leader's log, byte for byte.
    assert_logs_are_the_leaders(&mut c, "ll", leader);
}

/// Disk loss: a follower whose data directory is wiped comes back as a learner (`replica.learner`). While it is one, a
/// fencing round neither counts nor ranks it: with the old leader down, the wiped follower and the one that missed
/// the last records make no majority, so nothing is served and the records only the old leader and the wiped disk
/// had are not lost (without learners the two would elect the shorter log and serve other records at those
/// offsets; seen failing so, with `Began::learner` forced false). The old leader back, every acknowledged record is served; the learner is caught up, sent its groups'
/// frontiers and promoted, and then leads with nothing acknowledged missing.
#[test]
fn a_follower_on_a_wiped_disk_is_a_learner_until_caught_up_and_then_can_lead() {
    let _g = serial();
    let Some((mut c, [leader, f1, f2], mut want)) = five_replicated("learner", "ln", false) else {
        return;
    };
    let topic_id = partitions(c.node(leader), "ln")[0]["epoch"]
        .as_u64()
        .expect("an epoch");
    // Settled: the default group's frontier at 2.
    ack_first(&c, leader, "ln", 2, &mut want);
    // f1 down: two records acknowledged by the leader and f2 alone.
    c.kill9(f1);
    for body in ["a0", "a1"] {
        let (_, offset) = produce(c.node(leader), "ln", "", body);
        assert!(offset >= 5, "{offset}");
        want.insert(body.to_string());
    }
    // f2's disk is lost, then the leader dies: a0 and a1 are on the dead leader only.
    c.kill9(f2);
    std::fs::remove_dir_all(&c.node(f2).data_dir).expect("wipe f2's data directory");
    c.kill9(leader);
    c.start_again(f1);
    c.start_again(f2);
    wait_learner(&c, f2, "ln");
    // No majority of replicas that are not learners: nothing leads. (Without learners f1, the first follower,
    // is elected and its round over f1 and f2 finds its own log the greatest: it serves offsets 5 and 6 anew.)
    // Watched for 3 stagger turns and two replica timeouts past the old leader's session.
    let until = Instant::now() + Duration::from_secs(8);
    while Instant::now() < until {
        let a = c.node(f1).post("/produce?topic=ln", b"never");
        assert_ne!(
            a.status,
            200,
            "a produce answered with a0 and a1 on the dead leader only: {}",
            a.text()
        );
        std::thread::sleep(ms(250));
    }
    // The old leader back: it has the greatest log of a majority that counts; everything acknowledged is served.
    c.start_again(leader);
    let (b0, mut tried) = produce_until_ok(c.node(f1), "ln", "b0");
    want.insert(b0);
    // The learner is caught up, given the default group's frontier, and promoted.
    let now = partitions(c.node(f1), "ln").remove(0);
    let current = c.index_of(now["leader"].as_str().expect("a leader"));
    assert_ne!(current, f2, "a learner never leads: {now}");
    wait_promoted(&c, current, f2, "ln");
    assert_frontier_at_stop(&mut c, f2, "ln", 2);
    // It can lead: named leader, its round finds its log the greatest, and it serves every acknowledged record
    // and none settled.
    name_leader(&c, "ln", topic_id, 2);
    let (c0, more) = produce_until_ok(c.node(f2), "ln", "c0");
    want.insert(c0);
    tried.extend(more);
    let now = partitions(c.node(f2), "ln").remove(0);
    assert_eq!(
        now["leader"].as_str(),
        Some(c.node(f2).id.as_str()),
        "{now}"
    );
    assert_served(c.node(f2), "ln", &want, &tried);
    let others: Vec<usize> = (0..3).filter(|&i| i != f2).collect();
    stop_and_compare_segments(&mut c, "ln", f2, &others);
}

/// Three replicas of one partition on four nodes, with five records acknowledged: the cluster, the topic's
/// replicas in order (the leader first) and the node that holds none.
fn four_nodes_three_replicas(
    name: &str,
    topic: &str,
) -> Option<(Cluster, Vec<usize>, usize, HashSet<String>)> {
    let (c, replicas, want) = replicated_with_five(name, topic, 4, false)?;
    let spare = (0..4)
        .find(|i| !replicas.contains(i))
        .expect("a node without a replica");
    Some((c, replicas, spare, want))
}

/// Node `id`'s entry in `GET /cluster` through node `via`.
fn cluster_entry(c: &Cluster, via: usize, id: &str) -> serde_json::Value {
    let a = c.node(via).get("/cluster");
    assert_eq!(a.status, 200, "{}", a.text());
    a.json()["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .find(|n| n["id"] == id)
        .unwrap_or_else(|| panic!("{id} in {}", a.text()))
        .clone()
}

/// Produces through node `via` until partition 0 of `topic` is on three replicas, none of them `gone`, its followers
/// at the leader's end and none a learner, and `GET /cluster` shows `gone` drained; every body answered `200` goes
/// into `want`, every one tried into `tried`. Returns the replicas, the leader first, and how long it took.
fn produce_until_moved_off(
    c: &Cluster,
    via: usize,
    topic: &str,
    gone: usize,
    want: &mut HashSet<String>,
    tried: &mut HashSet<String>,
) -> (Vec<usize>, Duration) {
    let started = Instant::now();
    let replicas = wait_for(
        &format!("{}'s replicas moved to other nodes", c.node(gone).id),
        Duration::from_secs(60),
        || {
            let body = format!("during-{}", tried.len());
            tried.insert(body.clone());
            if let Ok(a) =
                c.node(via)
                    .call("POST", &format!("/produce?topic={topic}"), body.as_bytes())
            {
                if a.status == 200 {
                    want.insert(body);
                }
            }
            std::thread::sleep(ms(50));
            let entry = cluster_entry(c, via, &c.node(gone).id);
            let p = partitions(c.node(via), topic).remove(0);
            let replicas = replica_indices(c, &p);
            let leader = c.index_of(p["leader"].as_str().unwrap_or("?"));
            let lp = partitions(c.node(leader), topic).remove(0);
            let followers = lp["followers"].as_array().cloned().unwrap_or_default();
            let caught_up = followers.len() == 2
                && followers.iter().all(|f| {
                    f["learner"] == false
                        && f["lagging"] == false
                        && f["end_offset"] == lp["end_offset"]
                });
            if entry["drained"] == true
                && replicas.len() == 3
                && !replicas.contains(&gone)
                && caught_up
            {
                let mut ordered = vec![leader];
                ordered.extend(replicas.iter().copied().filter(|&r| r != leader));
                Ok(ordered)
            } else {
                Err(format!("{entry} {lp}"))
            }
        },
    );
    (replicas, started.elapsed())
}

/// Drain (`POST /cluster/nodes/ID/drain`, `docs/replication.md` step 5) of the node that leads a partition of three
/// replicas, under produces: the leadership goes to an in-sync follower, a replica is added on the fourth node (a
/// learner until caught up and promoted), and the drained node's replica is removed, one change at a time, each at
/// a new epoch; the drained node ends holding nothing (its directory trashed), every acknowledged record is served
/// once, and the three replicas' logs are the same bytes.
#[test]
fn a_drained_leader_hands_its_partition_to_other_nodes_one_replica_at_a_time_under_load() {
    let _g = serial();
    let Some((mut c, replicas, spare, mut want)) = four_nodes_three_replicas("drain", "dr") else {
        return;
    };
    let (leader, f1) = (replicas[0], replicas[1]);
    let first_epoch = partitions(c.node(f1), "dr")[0]["epoch"].as_u64().unwrap();
    // And an unreplicated topic with a partition on every node: the drained node's moves too (a learner added,
    // promoted, given the leadership, then the drained one removed).
    let a = c.node(f1).put("/topics/single?partitions=4&replicas=1");
    assert_eq!(a.status, 201, "{}", a.text());
    let mut single = HashSet::new();
    for i in 0..16 {
        let body = format!("s{i}");
        produce(c.node(f1), "single", &format!("&key=k{i}"), &body);
        single.insert(body);
    }
    let mut tried = want.clone();
    let a = c
        .node(f1)
        .post(&format!("/cluster/nodes/{}/drain", c.node(leader).id), b"");
    assert_eq!(a.status, 202, "{}", a.text());
    assert_eq!(a.json()["draining"], true);
    let (now, took) = produce_until_moved_off(&c, f1, "dr", leader, &mut want, &mut tried);
    eprintln!(
        "drained {} in {took:?}; replicas now {now:?}",
        c.node(leader).id
    );
    assert!(
        now.contains(&spare),
        "the fourth node took a replica: {now:?}"
    );
    let entry = cluster_entry(&c, f1, &c.node(leader).id);
    assert_eq!(
        (entry["leads"].as_u64(), entry["follows"].as_u64()),
        (Some(0), Some(0)),
        "{entry}"
    );
    assert_eq!(entry["removed"], false);
    let p = partitions(c.node(f1), "dr").remove(0);
    assert!(p["epoch"].as_u64().unwrap() > first_epoch, "{p}");
    wait_for(
        "the drained node's replica trashed",
        Duration::from_secs(10),
        || {
            let dir = c.node(leader).data_dir.join("topics/dr/0");
            if dir.exists() {
                Err(format!("{} still exists", dir.display()))
            } else {
                Ok(())
            }
        },
    );
    // A new topic is not placed on the drained node.
    let a = c.node(f1).put("/topics/after?partitions=4&replicas=3");
    assert_eq!(a.status, 201, "{}", a.text());
    for p in partitions(c.node(f1), "after") {
        assert!(!replica_indices(&c, &p).contains(&leader), "{p}");
    }
    // The drain ends: the node is listed as before (it gets replicas again only as partitions need them).
    let a = c
        .node(f1)
        .call(
            "DELETE",
            &format!("/cluster/nodes/{}/drain", c.node(leader).id),
            b"",
        )
        .expect("DELETE");
    assert_eq!(a.status, 200, "{}", a.text());
    wait_for(
        "the drain ended in GET /cluster",
        Duration::from_secs(10),
        || {
            let entry = cluster_entry(&c, f1, &c.node(leader).id);
            if entry.get("draining").is_none() {
                Ok(())
            } else {
                Err(entry.to_string())
            }
        },
    );
    assert_served(c.node(f1), "dr", &want, &tried);
    assert_eq!(once(&drain(c.node(f1), "single", &single)), single);
    for p in partitions(c.node(f1), "single") {
        assert_eq!(replica_indices(&c, &p).len(), 1, "{p}");
    }
    let new_leader = now[0];
    stop_and_compare_segments(&mut c, "dr", new_leader, &now[1..]);
}

/// Removal (`DELETE /cluster/nodes/ID`) of a follower gone for good: refused for a live node (`409 node_alive`) and
/// an unknown one (`404 node_not_found`); for the dead one, its replica is removed first and one is added on the
/// fourth node, caught up and promoted, so the partition is back at three in-sync replicas; the removed node may not
/// come back under its id.
#[test]
fn a_removed_dead_follower_is_replaced_and_may_not_come_back() {
    let _g = serial();
    let Some((mut c, replicas, spare, mut want)) = four_nodes_three_replicas("remove", "rm") else {
        return;
    };
    let (leader, f1, f2) = (replicas[0], replicas[1], replicas[2]);
    let a = c
        .node(leader)
        .call("DELETE", &format!("/cluster/nodes/{}", c.node(f1).id), b"")
        .expect("DELETE");
    assert_eq!(
        (a.status, a.json()["error"].clone()),
        (409, serde_json::json!("node_alive")),
        "{}",
        a.text()
    );
    let a = c
        .node(leader)
        .call("DELETE", "/cluster/nodes/nobody", b"")
        .expect("DELETE");
    assert_eq!(
        (a.status, a.json()["error"].clone()),
        (404, serde_json::json!("node_not_found")),
        "{}",
        a.text()
    );
    // A topic of one replica per partition, one of them on f2 alone: f2 may not be removed while it holds it.
    let a = c.node(leader).put("/topics/solo?partitions=4&replicas=1");
    assert_eq!(a.status, 201, "{}", a.text());
    c.kill9(f2);
    let f2_id = c.node(f2).id.clone();
    c.wait_alive(leader, &f2_id, false);
    let a = c
        .node(leader)
        .call("DELETE", &format!("/cluster/nodes/{f2_id}"), b"")
        .expect("DELETE");
    assert_eq!(
        (a.status, a.json()["error"].clone()),
        (409, serde_json::json!("only_copy")),
        "{}",
        a.text()
    );
    let a = c
        .node(leader)
        .call("DELETE", "/topics/solo", b"")
        .expect("DELETE");
    assert!(a.status == 200 || a.status == 204, "{}", a.text());
    // Once this node's copy of the metastore has the topic gone.
    let a = wait_for("the removal accepted", Duration::from_secs(10), || {
        let a = c
            .node(leader)
            .call("DELETE", &format!("/cluster/nodes/{f2_id}"), b"")?;
        if a.status == 202 {
            Ok(a)
        } else {
            Err(a.text())
        }
    });
    assert_eq!(a.json()["removed"], true);
    let mut tried = want.clone();
    let (now, took) = produce_until_moved_off(&c, leader, "rm", f2, &mut want, &mut tried);
    eprintln!("replaced {f2_id} in {took:?}; replicas now {now:?}");
    assert!(now.contains(&spare) && now.contains(&f1), "{now:?}");
    assert_eq!(cluster_entry(&c, leader, &f2_id)["removed"], true);
    let a = c
        .node(leader)
        .call("DELETE", &format!("/cluster/nodes/{f2_id}/drain"), b"")
        .expect("DELETE");
    assert_eq!(
        (a.status, a.json()["error"].clone()),
        (409, serde_json::json!("node_removed")),
        "{}",
        a.text()
    );
    let (acked, tries) = produce_until_ok(c.node(spare), "rm", "after");
    want.insert(acked);
    tried.extend(tries);
    let log = c.start_refused(f2);
    assert!(log.contains("was removed from the cluster"), "{log}");
    assert_served(c.node(leader), "rm", &want, &tried);
    let current = now[0];
    stop_and_compare_segments(&mut c, "rm", current, &now[1..]);
}

/// CheckQuorum: a leader cut off from both its followers, not from etcd, keeps its session, so no follower is
/// elected; once its records have waited for a majority long enough (`stuck_for`: 5 s here), it gives the
/// leadership to a live follower, which runs its round with the other and serves every acknowledged record. Healed,
/// the old leader follows: its unacknowledged record is cut, and the three logs end byte for byte the same.
#[test]
fn a_leader_cut_off_from_its_followers_only_gives_its_leadership_to_one_that_can_reach_the_other() {
    let _g = serial();
    let Some((mut c, [leader, f1, f2], mut want)) = five_replicated("check_quorum", "cq", true)
    else {
        return;
    };
    c.block(leader, f1);
    c.block(leader, f2);
    let cut = Instant::now();
    let a = c.node(leader).post("/produce?topic=cq", b"u0");
    assert_eq!(a.status, 503, "{}", a.text());
    assert_eq!(a.json()["error"], "not_enough_replicas", "{}", a.text());
    // Served again through a follower once one of them leads (the leader's session never lapsed).
    let a = wait_ok(
        c.node(f1),
        "POST",
        "/produce?topic=cq",
        b"n0",
        "a produce once a follower leads",
    );
    eprintln!(
        "CheckQuorum: a produce through a follower answered {:?} after the cut",
        cut.elapsed()
    );
    assert_eq!(a.json()["offset"].as_u64(), Some(5), "{}", a.text());
    want.insert("n0".to_string());
    assert!(
        c.node(leader).log_text().contains("CheckQuorum"),
        "{}",
        c.node(leader).log_text()
    );
    let now = partitions(c.node(f2), "cq").remove(0);
    let new_leader = c.index_of(now["leader"].as_str().expect("a leader"));
    assert!([f1, f2].contains(&new_leader), "{now}");
    c.unblock(leader, f1);
    c.unblock(leader, f2);
    let r = wait_replicated(c.node(new_leader), "cq", 2);
    assert_eq!(r[0].2, 6, "{r:?}");
    let got = drain(c.node(leader), "cq", &want);
    let bodies: HashSet<String> = got.iter().map(|m| m.body.clone()).collect();
    assert_eq!(bodies, want, "every acknowledged record, and not u0");
    let others: Vec<usize> = (0..3).filter(|&i| i != new_leader).collect();
    stop_and_compare_segments(&mut c, "cq", new_leader, &others);
}

/// A replicated leader whose log refuses appends until a restart (a refused fdatasync: strace fails every one of its
/// syncs for a moment) while one of its two followers is down keeps the partition, serving what is committed
/// (produces `503`), since the one follower up could win no fencing round without it; once the other is back, the
/// leadership goes to a healthy follower, and every acknowledged record is served once. Handing it over at once (as
/// before) left the partition with a leader that could serve nothing, reads included.
#[test]
fn a_poisoned_leader_with_a_follower_down_keeps_serving_reads_and_hands_over_once_it_returns() {
    let _g = serial();
    let Some((mut c, [leader, down, up], mut want)) = five_replicated("poisoned", "po", false)
    else {
        return;
    };
    let mut tried: HashSet<String> = HashSet::new();
    c.kill9(down);
    c.wait_alive(leader, &c.node(down).id.clone(), false);
    poison_leader(&c, leader, "po", &mut want, &mut tried);
    assert_keeps_and_serves(&c, leader, up, "po", &want);
    let a = c.node(up).post("/produce?topic=po", b"refused");
    assert_eq!(a.status, 503, "{}", a.text());
    tried.insert("refused".to_string());
    // The follower back: the leadership goes to a healthy one, which serves everything acknowledged.
    c.start_again(down);
    hands_over_and_serves(&c, leader, [down, up], "po", &mut want, &mut tried);
}

/// A follower whose log refuses appends (its fdatasyncs fail) answers so, and its leader records it
/// (`followers[].poisoned`); when the leader's own log then refuses appends, it does not hand the partition to that
/// follower (whose round could not win: it counts for nothing in its own round, nor does the leader) but keeps it,
/// serving what is committed; once the follower's node restarts (its log recovers), the leadership goes on.
#[test]
fn a_follower_whose_log_refuses_appends_is_not_handed_the_leadership_until_its_node_restarts() {
    let _g = serial();
    let Some((mut c, [leader, sick, well], mut want)) =
        five_replicated("poisoned_follower", "pf", false)
    else {
        return;
    };
    let mut tried: HashSet<String> = HashSet::new();
    {
        let mut tracer = fail_every_fdatasync(c.node(sick));
        let sick_id = c.node(sick).id.clone();
        wait_for(
            "the leader to record its follower's log refusing appends",
            Duration::from_secs(20),
            || {
                tracer.check();
                let body = format!("s{}", tried.len() + want.len());
                let a = c.node(leader).post("/produce?topic=pf", body.as_bytes());
                if a.status == 200 {
                    want.insert(body);
                } else {
                    tried.insert(body);
                }
                let p = partitions(c.node(leader), "pf").remove(0);
                let sick_record = p["followers"]
                    .as_array()
                    .and_then(|fs| fs.iter().find(|f| f["node"] == sick_id.as_str()).cloned());
                match sick_record {
                    Some(f) if f["poisoned"] == true => Ok(()),
                    other => Err(format!("{other:?}")),
                }
            },
        );
    }
    // Still a majority (the leader and the other follower).
    let (body, tries) = produce_until_ok(c.node(leader), "pf", "majority");
    want.insert(body);
    tried.extend(tries);
    poison_leader(&c, leader, "pf", &mut want, &mut tried);
    assert_keeps_and_serves(&c, leader, well, "pf", &want);
    // The follower's node restarted: its log recovers, and the leadership goes to a healthy follower.
    c.kill9(sick);
    c.start_again(sick);
    hands_over_and_serves(&c, leader, [sick, well], "pf", &mut want, &mut tried);
}

/// A follower whose log starts refusing appends AFTER its last answer to its leader (its node's journal poisoned
/// through a partition of another topic on the same core: every log of a core shares its journal, so every one of
/// them refuses appends) has said nothing of it to the leader, which ships it nothing meanwhile. When the leader's
/// own log then refuses appends (its journal poisoned the same way, with nothing produced to the replicated topic in
/// between), it hands the partition over only on answers given since it asked (`Shipper::ask_status`,
/// `Shipper::answered_since`): the follower's fresh answer says its log refuses appends, so the leader keeps the
/// partition, serving what is committed (produces `503 log_unavailable`), until the follower's node restarts; then
/// the leadership goes to a healthy follower, and every acknowledged record is served once. Deciding on what each
/// follower last said handed the partition to a follower whose fencing round could not win (two of the three replicas
/// refuse appends, and count for nothing in it), and nobody served it.
#[test]
fn a_follower_whose_log_refuses_appends_since_its_last_answer_is_not_handed_the_leadership() {
    poisoned_since_its_last_answer("poisoned_since", "ps", false);
}

/// [`a_follower_whose_log_refuses_appends_since_its_last_answer_is_not_handed_the_leadership`], with the follower cut
/// off from its leader only (it keeps its etcd session) before the leader's log refuses appends: it cannot answer
/// the leader's ask, so it is not counted healthy although what it last said is (it is not handed the leadership);
/// healed, it answers that its log refuses appends, and the leader still keeps the partition until its node restarts.
#[test]
fn a_follower_cut_off_from_its_poisoned_leader_is_not_counted_healthy_on_what_it_last_said() {
    poisoned_since_its_last_answer("poisoned_since_cut", "pk", true);
}

/// The two tests above: three nodes (each in its own network namespace with `cut`), topic `topic` replicated on all
/// three; follower `sick`'s journal refuses appends, unknown to leader `leader`, then the leader's (with `cut`, the
/// leader and `sick` cut off each other in between, and healed once the leader has kept the partition).
fn poisoned_since_its_last_answer(name: &str, topic: &str, cut: bool) {
    let _g = serial();
    let Some((mut c, [leader, sick, well], mut want)) = five_replicated(name, topic, cut) else {
        return;
    };
    let mut tried: HashSet<String> = HashSet::new();
    // A topic of one replica per partition, spread over the nodes: one of its partitions on the follower's node, one
    // on the leader's (each node runs one core, so one journal).
    put_topic(c.node(0), "/topics/own?partitions=3&replicas=1");
    let owned_by = |i: usize| -> u64 {
        let parts = partitions(c.node(0), "own");
        parts
            .iter()
            .find(|e| e["node"].as_str().is_some_and(|n| c.index_of(n) == i))
            .and_then(|e| e["partition"].as_u64())
            .unwrap_or_else(|| panic!("no partition of 'own' on {}: {parts:?}", c.node(i).id))
    };
    let (on_sick, on_leader) = (owned_by(sick), owned_by(leader));
    let sick_id = c.node(sick).id.clone();
    let sick_record = |c: &Cluster| -> serde_json::Value {
        let p = partitions(c.node(leader), topic).remove(0);
        p["followers"]
            .as_array()
            .and_then(|fs| fs.iter().find(|f| f["node"] == sick_id.as_str()).cloned())
            .unwrap_or_else(|| panic!("no record of {sick_id} in {p}"))
    };
    // The follower's node's journal refuses appends, through its own partition of 'own': nothing of `topic` moves,
    // so its leader sends it nothing and still has it healthy, at its end.
    poison_journal(&c, sick, "own", on_sick);
    let f = sick_record(&c);
    assert_eq!(f["poisoned"], false, "{f}");
    assert_eq!(f["end_offset"].as_u64(), Some(5), "{f}");
    if cut {
        c.block(leader, sick);
    }
    // The leader's too, through its own partition of 'own': its log of `topic` refuses appends as well.
    poison_journal(&c, leader, "own", on_leader);
    // Its next looks ask its followers where they stand and count the answers: it keeps the partition.
    let decided = wait_for(
        "the poisoned leader to decide on its followers' fresh answers",
        Duration::from_secs(10),
        || {
            let log = c.node(leader).log_text();
            if log.contains("the leadership goes to a live follower") {
                Ok(false)
            } else if log.contains("too few healthy followers are up to lead instead") {
                Ok(true)
            } else {
                Err("neither handed over nor held yet".to_string())
            }
        },
    );
    if !decided {
        // Handed to the follower whose log refuses appends (its round counts neither it nor the leader), or to the
        // other one (whose round has no majority either): the partition is served by nobody.
        let log = c.node(leader).log_text();
        let moved = log
            .lines()
            .find(|l| l.contains("the leadership goes to a live follower"))
            .unwrap_or_default();
        // What the partition serves for 5 s after (for the failure message only).
        let since = Instant::now();
        let mut answers = BTreeMap::new();
        while since.elapsed() < Duration::from_secs(5) {
            let a = c
                .node(well)
                .post(&format!("/produce?topic={topic}"), b"after-the-move");
            *answers
                .entry(format!("{} {}", a.status, a.text()))
                .or_insert(0) += 1;
            thread::sleep(ms(100));
        }
        panic!(
            "the poisoned leader handed the partition over although {sick_id}'s log refuses appends since its last \
             answer (it logged: {moved}); produces through {} for 5 s after were answered {answers:#?}",
            c.node(well).id
        );
    }
    if cut {
        // It has not answered since: what it last said stands in the leader's record, and counts for nothing.
        assert_keeps_and_serves(&c, leader, well, topic, &want);
        let f = sick_record(&c);
        assert_eq!(f["poisoned"], false, "{f}");
        c.unblock(leader, sick);
    }
    wait_for(
        "the leader to record its follower's log refusing appends (its fresh answer)",
        Duration::from_secs(20),
        || {
            let f = sick_record(&c);
            if f["poisoned"] == true {
                Ok(())
            } else {
                Err(f.to_string())
            }
        },
    );
    assert_keeps_and_serves(&c, leader, well, topic, &want);
    let a = c
        .node(leader)
        .post(&format!("/produce?topic={topic}"), b"refused");
    assert_eq!(a.status, 503, "{}", a.text());
    assert_eq!(a.json()["error"], "log_unavailable", "{}", a.text());
    tried.insert("refused".to_string());
    // The follower's node restarted: its log recovers, and the leadership goes to a healthy follower.
    c.kill9(sick);
    c.start_again(sick);
    hands_over_and_serves(&c, leader, [sick, well], topic, &mut want, &mut tried);
}

/// Fails every fdatasync of node `i` (strace) until a produce to its partition `p` of `topic` (of one replica) is
/// answered `503 log_unavailable`: its core's journal, and so every log of that core, refuses appends until a
/// restart. strace is detached on return.
fn poison_journal(c: &Cluster, i: usize, topic: &str, p: u64) {
    let mut tracer = fail_every_fdatasync(c.node(i));
    let mut n = 0;
    wait_for(
        &format!("{}'s journal to refuse appends", c.node(i).id),
        Duration::from_secs(20),
        || {
            tracer.check();
            n += 1;
            let a = c.node(i).post(
                &format!("/produce?topic={topic}&partition={p}"),
                format!("x{n}").as_bytes(),
            );
            match (a.status, a.json()["error"].as_str()) {
                (503, Some("log_unavailable")) => Ok(()),
                _ => Err(format!("{} {}", a.status, a.text())),
            }
        },
    );
}

/// Fails every fdatasync of node `leader` (strace) until its log refuses appends (`503 log_unavailable`), producing
/// through it meanwhile: a `200` (before the tracer attached) joins `want`, anything else `tried`.
fn poison_leader(
    c: &Cluster,
    leader: usize,
    topic: &str,
    want: &mut HashSet<String>,
    tried: &mut HashSet<String>,
) {
    let mut tracer = fail_every_fdatasync(c.node(leader));
    wait_for(
        "the leader's log to refuse appends",
        Duration::from_secs(20),
        || {
            tracer.check();
            let body = format!("r{}", tried.len() + want.len());
            let a = c
                .node(leader)
                .post(&format!("/produce?topic={topic}"), body.as_bytes());
            match (a.status, a.json()["error"].as_str()) {
                (200, _) => {
                    want.insert(body);
                    Err("answered before the tracer attached".to_string())
                }
                (503, Some("log_unavailable")) => Ok(()),
                _ => {
                    tried.insert(body);
                    Err(format!("{} {}", a.status, a.text()))
                }
            }
        },
    );
}

/// For four of CheckQuorum's looks (once a second), node `leader` (poisoned) still leads `topic`'s partition 0, as
/// node `up` sees it; then it serves a committed record through either, and has logged why it keeps it.
fn assert_keeps_and_serves(
    c: &Cluster,
    leader: usize,
    up: usize,
    topic: &str,
    want: &HashSet<String>,
) {
    let since = Instant::now();
    while since.elapsed() < Duration::from_secs(4) {
        let now = partitions(c.node(up), topic).remove(0);
        assert_eq!(
            c.index_of(now["leader"].as_str().expect("a leader")),
            leader,
            "{now}"
        );
        thread::sleep(ms(250));
    }
    for via in [leader, up] {
        let m = consume(&c.node(via).new_client(), topic, "&visibility=1s")
            .expect("a committed record served by the poisoned leader");
        assert!(want.contains(&m.body), "{m:?}");
    }
    assert!(
        c.node(leader)
            .log_text()
            .contains("too few healthy followers are up to lead instead"),
        "{}",
        c.node(leader).log_text()
    );
}

/// Once a produce through `healthy[1]` is answered, one of `healthy` leads (the poisoned `leader` handed the
/// partition over), and every acknowledged record is served.
fn hands_over_and_serves(
    c: &Cluster,
    leader: usize,
    healthy: [usize; 2],
    topic: &str,
    want: &mut HashSet<String>,
    tried: &mut HashSet<String>,
) {
    let since = Instant::now();
    let (after, tries) = produce_until_ok(c.node(healthy[1]), topic, "after");
    eprintln!(
        "a poisoned leader's partition served again {:?} after its follower returned",
        since.elapsed()
    );
    tried.extend(tries);
    want.insert(after);
    let now = partitions(c.node(healthy[1]), topic).remove(0);
    let new_leader = c.index_of(now["leader"].as_str().expect("a leader"));
    assert!(healthy.contains(&new_leader), "{now}");
    assert!(
        c.node(leader)
            .log_text()
            .contains("the leadership goes to a live follower"),
        "{}",
        c.node(leader).log_text()
    );
    assert_served(c.node(healthy[1]), topic, want, tried);
}

/// strace attached to a node, failing every fdatasync of every thread of it with EIO; detached when dropped.
struct Tracer(std::process::Child);

impl Tracer {
    /// Panics if strace exited (it could not attach: ptrace refused here).
    fn check(&mut self) {
        if let Ok(Some(status)) = self.0.try_wait() {
            panic!("strace exited ({status}): it could not attach to the node");
        }
    }
}

impl Drop for Tracer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn fail_every_fdatasync(node: &Node) -> Tracer {
    let out = std::process::Command::new("which")
        .arg("strace")
        .output()
        .expect("which");
    assert!(
        out.status.success(),
        "strace is needed (.ci/run installs it)"
    );
    let strace = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let pid = node.pid().expect("the node runs");
    Tracer(
        std::process::Command::new(strace)
            .args(["-f", "-qq", "-o", "/dev/null", "-e", "trace=fdatasync"])
            .args(["-e", "inject=fdatasync:error=EIO", "-p", &pid.to_string()])
            .spawn()
            .expect("strace"),
    )
}

/// Writes partition 0's key of `topic` (created with id `topic_id`) naming its first follower leader, in the
/// metastore's node indices (the topic record's placement and followers), as the election will write it.
fn name_first_follower_leader(c: &Cluster, topic: &str, topic_id: u64) {
    name_leader(c, topic, topic_id, 1)
}

/// [`name_first_follower_leader`] for the replica at place `k` of the creation's order (0: the first leader).
fn name_leader(c: &Cluster, topic: &str, topic_id: u64, k: usize) {
    let prefix = format!("/berth/{}/", c.name);
    let record: serde_json::Value = serde_json::from_str(
        &c.etcd
            .get(&format!("{prefix}topics/{topic}"))
            .expect("etcd")
            .expect("the topic record"),
    )
    .unwrap();
    let mut indices = vec![record["placement"][0].clone()];
    indices.extend(record["followers"][0].as_array().unwrap().iter().cloned());
    let key =
        serde_json::json!({ "topic_id": topic_id, "replicas": indices, "leader": indices[k] });
    c.etcd
        .put(&format!("{prefix}partitions/{topic}/0"), &key.to_string())
        .expect("put");
}

/// A partition's replicas (from `GET /topics/T`: node ids, the leader first until a leadership moves) as the cluster's
/// node indices.
fn replica_indices(c: &Cluster, partition: &serde_json::Value) -> Vec<usize> {
    partition["replicas"]
        .as_array()
        .expect("replicas")
        .iter()
        .map(|r| c.index_of(r.as_str().expect("a node id")))
        .collect()
}

/// A partition's frontier file of `group` in a node's data directory (None: there is none).
fn frontier_file(node: &Node, topic: &str, p: u64, group: &str) -> Option<Vec<u8>> {
    let name = if group == "default" {
        "consumer.offset".to_string()
    } else {
        format!("consumer.{group}.offset")
    };
    let path = node
        .data_dir
        .join("topics")
        .join(topic)
        .join(p.to_string())
        .join(name);
    std::fs::read(path).ok()
}

/// Whether a node holds durably that partition `p` of `topic`'s default group acked `ranges` above its frontier 0.
fn holds_acked(node: &Node, topic: &str, p: u64, ranges: &[(u64, u64)]) -> bool {
    common::holds_acked(&node.data_dir, topic, p, "default", 0, ranges)
}

/// The frontier a frontier file holds (its first 8 bytes, little-endian: `docs/format.md`).
fn frontier_value(bytes: &[u8]) -> u64 {
    u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"))
}

#[test]
fn a_replicated_topics_group_frontiers_and_group_starts_reach_its_followers_frontier_files() {
    let _g = serial();
    let opts = Opts {
        extra: vec!["--replication-preview".into()],
        cores: Some(2),
        ..Opts::default()
    };
    let Some(mut c) = Cluster::start_with("replicated_frontiers", 3, opts) else {
        return;
    };
    let a = c.node(0).put("/topics/fr?partitions=6&replicas=3");
    assert_eq!(a.status, 201, "{}", a.text());
    for n in 0..40 {
        produce(c.node(n % 3), "fr", "", &format!("m-{n}"));
    }
    // 25 consumed and acknowledged one by one (so every frontier is exactly what its partition had acked).
    let client = c.node(0).new_client();
    for n in 0..25 {
        let m = consume(&client, "fr", "&visibility=60")
            .unwrap_or_else(|| panic!("message {n} of 40 not delivered"));
        let a = settle(c.node(0), "ack", "fr", &m.handle, "");
        assert_eq!(a.status, 200, "{}", a.text());
    }
    // A group that starts at the end: its followers must start it where the leader did, not at their own ends.
    let a = c.node(1).put("/topics/fr/groups/late?start=latest");
    assert!(a.status == 201 || a.status == 200, "{}", a.text());
    for n in 0..6 {
        produce(c.node(0), "fr", "", &format!("after-{n}"));
    }
    // A group purged through one node: every leader's purge reaches its followers as an ack's frontier does (a
    // purge whose frontier was written to the leader's file only came back after a failover).
    assert_eq!(c.node(1).put("/topics/fr/groups/purged").status, 201);
    let a = c.node(2).post("/topics/fr/groups/purged/purge", b"");
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(a.json()["purged"], 46, "{}", a.text());
    // Every leader has made its frontiers durable (so they are on their way to its followers).
    wait_for(
        "every frontier durable on its leader",
        Duration::from_secs(15),
        || {
            let parts = partitions(c.node(2), "fr");
            let acked: u64 = parts.iter().map(|p| p["committed"].as_u64().unwrap()).sum();
            if acked == 25 && parts.iter().all(|p| p["durable"] == p["committed"]) {
                Ok(())
            } else {
                Err(format!("{parts:?}"))
            }
        },
    );
    let leaders: Vec<(u64, usize, Vec<usize>)> = partitions(c.node(0), "fr")
        .iter()
        .map(|p| {
            let replicas: Vec<usize> = replica_indices(&c, p);
            (p["partition"].as_u64().unwrap(), replicas[0], replicas)
        })
        .collect();
    // Stopped one by one: a leader stopping waits for its running followers to take what it shipped, and each
    // node writes its frontier files at its stop (followers from what their leaders shipped).
    for i in 0..3 {
        assert!(c.terminate(i).success());
    }
    let (mut acked, mut late, mut purged, mut checked) = (0, 0, 0, 0);
    for (p, leader, replicas) in &leaders {
        let lead_purged = frontier_file(c.node(*leader), "fr", *p, "purged");
        purged += lead_purged.as_deref().map_or(0, frontier_value);
        // (A partition nothing was acked on may have no file of the default group: its frontier is 0.)
        let lead = frontier_file(c.node(*leader), "fr", *p, "default");
        let lead_late = frontier_file(c.node(*leader), "fr", *p, "late")
            .unwrap_or_else(|| panic!("partition {p} has no 'late' file on its leader"));
        acked += lead.as_deref().map_or(0, frontier_value);
        late += frontier_value(&lead_late);
        // The followers still running when their leader stopped (nodes stop in index order). (No file is 0.)
        for &f in replicas.iter().filter(|&&f| f != *leader && f > *leader) {
            let value = |file: Option<Vec<u8>>| file.as_deref().map_or(0, frontier_value);
            assert_eq!(
                value(frontier_file(c.node(f), "fr", *p, "default")),
                value(lead.clone()),
                "partition {p}: the default group's frontier on follower {} differs from its leader's",
                c.node(f).id
            );
            // (A follower that learned of the group from the metastore before the leader's start arrived holds it
            // without a file when the start is 0, which is what no file means: nothing raised it.)
            assert_eq!(
                value(frontier_file(c.node(f), "fr", *p, "late")),
                frontier_value(&lead_late),
                "partition {p}: the 'late' group's start on follower {} differs from its leader's",
                c.node(f).id
            );
            assert_eq!(
                frontier_file(c.node(f), "fr", *p, "purged").as_deref().map_or(0, frontier_value),
                lead_purged.as_deref().map_or(0, frontier_value),
                "partition {p}: the purged group's frontier on follower {} differs from its leader's",
                c.node(f).id
            );
            checked += 1;
        }
    }
    assert_eq!((acked, late, purged), (25, 40, 46), "{leaders:?}");
    assert!(checked >= 4, "too few followers checked: {leaders:?}");
}

#[test]
fn a_follower_that_missed_frontiers_gets_them_from_its_leader_started_again() {
    let _g = serial();
    let opts = Opts {
        extra: vec!["--replication-preview".into()],
        ..Opts::short_ttl()
    };
    let Some(mut c) = Cluster::start_with("replicated_frontiers_resent", 3, opts) else {
        return;
    };
    let a = c.node(0).put("/topics/fx?partitions=1&replicas=3");
    assert_eq!(a.status, 201, "{}", a.text());
    let replicas: Vec<usize> = replica_indices(&c, &partitions(c.node(0), "fx")[0]);
    let (leader, missed, other) = (replicas[0], replicas[1], replicas[2]);
    for n in 0..10 {
        produce(c.node(leader), "fx", "", &format!("m-{n}"));
    }
    wait_replicated(c.node(leader), "fx", 2);
    // One follower down while 6 are acknowledged (the leader and the other follower are a majority).
    c.kill9(missed);
    let client = c.node(leader).new_client();
    for n in 0..6 {
        let m = consume(&client, "fx", "&visibility=60")
            .unwrap_or_else(|| panic!("message {n} not delivered"));
        let a = settle(c.node(leader), "ack", "fx", &m.handle, "");
        assert_eq!(a.status, 200, "{}", a.text());
    }
    wait_for(
        "the frontier durable on the leader",
        Duration::from_secs(15),
        || {
            let p = partitions(c.node(leader), "fx").remove(0);
            if p["committed"] == 6 && p["durable"] == 6 {
                Ok(())
            } else {
                Err(format!("{p}"))
            }
        },
    );
    // The leader dies with the frontier still waiting for the missing follower; the follower comes back first.
    c.kill9(leader);
    c.restart(missed);
    c.restart(leader);
    c.wait_all_live();
    // The leader, opening the partition again, sends its groups' durable frontiers; stopping, it waits for its
    // followers to take them.
    assert!(c.terminate(leader).success());
    assert!(c.terminate(missed).success());
    assert!(c.terminate(other).success());
    let lead =
        frontier_file(c.node(leader), "fx", 0, "default").expect("the leader's frontier file");
    assert_eq!(frontier_value(&lead), 6);
    for f in [missed, other] {
        assert_eq!(
            frontier_file(c.node(f), "fx", 0, "default"),
            Some(lead.clone()),
            "follower {}'s frontier file",
            c.node(f).id
        );
    }
}

#[test]
fn followers_behind_what_a_restarted_leader_keeps_are_caught_up_from_its_log() {
    let _g = serial();
    let opts = Opts {
        extra: vec![
            "--replication-preview".into(),
            "--replica-timeout-ms".into(),
            "500".into(),
        ],
        ..Opts::short_ttl()
    };
    let Some(mut c) = Cluster::start_with("replicated_catch_up", 3, opts) else {
        return;
    };
    let a = c.node(0).put("/topics/cu?partitions=1&replicas=3");
    assert_eq!(a.status, 201, "{}", a.text());
    let first = partitions(c.node(0), "cu")[0].clone();
    let replicas: Vec<usize> = replica_indices(&c, &first);
    let (leader, f1, f2) = (replicas[0], replicas[1], replicas[2]);
    let epoch = first["epoch"].as_u64().expect("an epoch");
    for n in 0..5 {
        produce(c.node(leader), "cu", "", &format!("m-{n}"));
    }
    wait_replicated(c.node(leader), "cu", 2);
    // Both followers down: three records reach the leader's log alone (503 not_enough_replicas), and the leader
    // dies before its followers get them. Started again, it keeps nothing of its old stream: its followers are
    // behind what it keeps, and only its log can bring them up (before, they lagged for good, and with both of them
    // lagging every produce was 503). (Killed, not paused: a paused follower would find the batches in its
    // socket when it continues.)
    c.kill9(f1);
    c.kill9(f2);
    let batch = "{\"body\":\"x-0\"}\n{\"body\":\"x-1\"}\n{\"body\":\"x-2\"}\n";
    let a = c
        .node(leader)
        .client
        .call_with(
            "POST",
            "/produce?topic=cu",
            &[("content-type", "application/x-ndjson")],
            batch.as_bytes(),
        )
        .expect("batch produce");
    // (A batch answers per record.)
    assert_eq!(
        (a.status, a.json()["failed"].as_u64()),
        (200, Some(3)),
        "{}",
        a.text()
    );
    assert_eq!(
        a.json()["results"][0]["error"],
        "not_enough_replicas",
        "{}",
        a.text()
    );
    // The leader comes back first, so no follower is elected meanwhile (with both followers back before it, one of
    // them would lead with 5 records, and the leader's 3 unacknowledged ones would be dropped: see
    // a_leader_killed_with_9_is_replaced_by_an_elected_follower_that_serves_everything_acknowledged).
    c.kill9(leader);
    c.restart(leader);
    c.restart(f1);
    c.restart(f2);
    c.wait_all_live();
    let r = wait_replicated(c.node(leader), "cu", 2);
    assert_eq!(r[0].2, 8, "{r:?}");
    // Named leader still (nobody was elected while it was down), it leads again only at a newer epoch, after a
    // fencing round: what it shipped before its own sync may be on its followers and not on its disk, and its new
    // records must not take those offsets at the same epoch (`Ship::Renew`).
    let now = partitions(c.node(leader), "cu")[0].clone();
    assert_eq!(replica_indices(&c, &now)[0], leader, "{now}");
    assert!(
        now["epoch"].as_u64().is_some_and(|e| e > epoch),
        "the restarted leader's epoch: {now} (it was {epoch})"
    );
    wait_ok(
        c.node(leader),
        "POST",
        "/produce?topic=cu",
        b"after",
        "a produce once the followers are caught up",
    );
    let r = wait_replicated(c.node(leader), "cu", 2);
    assert_eq!(r[0].2, 9, "{r:?}");
    // Everything is served, and the three logs are the same bytes. (A long poll: the restarted leader hands out
    // leases only once a lease and an eighth passed since its round, `partition/lease.rs`.)
    let client = c.node(leader).new_client();
    let mut bodies = Vec::new();
    while let Some(m) = consume(&client, "cu", "&visibility=60&wait=1500ms") {
        bodies.push(m.body);
    }
    bodies.sort();
    assert_eq!(
        bodies,
        ["after", "m-0", "m-1", "m-2", "m-3", "m-4", "x-0", "x-1", "x-2"]
    );
    for i in 0..3 {
        assert!(c.terminate(i).success());
    }
    let lead = segments(c.node(leader), "cu", 0);
    for f in [f1, f2] {
        assert!(
            segments(c.node(f), "cu", 0) == lead,
            "{}'s segments differ from its leader's",
            c.node(f).id
        );
    }
}

/// Whole-segment copy (`docs/replication.md`, step 5): a follower down while its leader's retention removed the
/// segments it lacks (and more than the leader keeps in memory went by) is started anew at the leader's start and
/// filled with its sealed segments, then its stream: the three logs the same files, byte for byte, and the follower
/// can lead: with the leader killed, every record the leader kept is served by the new one. (Before, the follower
/// stayed lagging for good.)
#[test]
fn a_follower_behind_its_leaders_retention_is_filled_with_its_segments_and_can_then_lead() {
    let _g = serial();
    let conf = std::env::temp_dir().join(format!(
        "berth-cluster-small-segments-{}.toml",
        std::process::id()
    ));
    // Small segments and a quick retention sweep, so retention removes some in a second; the least the leader
    // keeps in memory for a follower (1 MiB: the flags set the rest of the table).
    std::fs::write(
        &conf,
        "max_message_bytes = 8192\nsegment_bytes = 65536\npurge_interval_ms = 200\n\
         [cluster]\netcd = []\nnode_id = \"\"\nadvertise = \"\"\nreplica_window_bytes = 1048576\n",
    )
    .expect("config written");
    let opts = Opts {
        extra: vec![
            "--replication-preview".into(),
            "--replica-timeout-ms".into(),
            "1000".into(),
            "--config".into(),
            conf.display().to_string(),
        ],
        ..Opts::short_ttl()
    };
    let Some(mut c) = Cluster::start_with("replicated_retention_copy", 3, opts) else {
        return;
    };
    let a = c
        .node(0)
        .put("/topics/rc?partitions=1&replicas=3&retention=1s");
    assert_eq!(a.status, 201, "{}", a.text());
    let replicas: Vec<usize> = replica_indices(&c, &partitions(c.node(0), "rc")[0]);
    let (leader, f1, f2) = (replicas[0], replicas[1], replicas[2]);
    let mut bodies: Vec<String> = Vec::new();
    let mut produce_batch = |c: &Cluster, n: usize| {
        let mut batch = String::new();
        let first = bodies.len();
        for i in first..first + n {
            let body = format!("r-{i:05}-{}", "x".repeat(6000));
            batch.push_str(&format!("{{\"body\":\"{body}\"}}\n"));
            bodies.push(body);
        }
        let a = c
            .node(leader)
            .client
            .call_with(
                "POST",
                "/produce?topic=rc",
                &[("content-type", "application/x-ndjson")],
                batch.as_bytes(),
            )
            .expect("batch produce");
        assert_eq!(
            (a.status, a.json()["failed"].as_u64()),
            (200, Some(0)),
            "{}",
            a.text()
        );
    };
    produce_batch(&c, 5);
    wait_replicated(c.node(leader), "rc", 2);
    // f2 down; 1.5 MB more (past the 1 MiB the leader keeps in memory for it, in 23 segments of 64 KiB), which then
    // ages past the retention.
    c.kill9(f2);
    for _ in 0..10 {
        produce_batch(&c, 25);
    }
    thread::sleep(Duration::from_millis(1100));
    for _ in 0..3 {
        produce_batch(&c, 10);
    }
    let start = wait_for(
        "the leader's retention removes the segments f2 lacks",
        Duration::from_secs(10),
        || {
            let p = partitions(c.node(leader), "rc").remove(0);
            match p["start_offset"].as_u64() {
                Some(s) if s > 5 => Ok(s),
                _ => Err(format!("{p}")),
            }
        },
    );
    c.restart(f2);
    c.wait_all_live();
    let r = wait_replicated(c.node(leader), "rc", 2);
    assert_eq!(r[0].2, bodies.len() as u64, "{r:?}");
    assert!(
        c.node(f2).log_text().contains("starts anew there"),
        "{}",
        c.node(f2).log_text()
    );
    // The same files on the three nodes (retention on each removed the same ones), byte for byte.
    let files = |node: &Node| -> Vec<(String, Vec<u8>)> {
        let dir = node.data_dir.join("topics").join("rc").join("0");
        let mut out: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "log"))
            .map(|p| {
                let name = p.file_name().unwrap().to_string_lossy().to_string();
                (name, std::fs::read(&p).unwrap())
            })
            .collect();
        out.sort();
        out
    };
    wait_for(
        "the three replicas hold the same segment files",
        Duration::from_secs(10),
        || {
            let lead = files(c.node(leader));
            for f in [f1, f2] {
                let theirs = files(c.node(f));
                let names =
                    |v: &[(String, Vec<u8>)]| v.iter().map(|x| x.0.clone()).collect::<Vec<_>>();
                if names(&theirs) != names(&lead) {
                    return Err(format!(
                        "{}: {:?} against {:?}",
                        c.node(f).id,
                        names(&theirs),
                        names(&lead)
                    ));
                }
                // (The active segment is zero-filled ahead of its end: compared up to the leader's length.)
                for ((name, x), (_, y)) in lead.iter().zip(&theirs) {
                    if y.len() < x.len() || x[..] != y[..x.len()] {
                        return Err(format!("{}: {name} differs", c.node(f).id));
                    }
                }
            }
            Ok(())
        },
    );
    // f2 can lead: the leader killed, one of the two is elected and serves every record the leader kept.
    c.kill9(leader);
    let survivor = c.node(f2).new_client();
    let mut served: Vec<String> = Vec::new();
    wait_for(
        "every retained record served by the new leader",
        Duration::from_secs(20),
        || loop {
            match try_consume(&survivor, "rc", "&visibility=60") {
                Ok(Some(m)) => served.push(m.body),
                Ok(None) if !served.is_empty() => return Ok(()),
                Ok(None) => return Err(format!("{} served", served.len())),
                Err(a) => return Err(format!("{}: {}", a.status, a.text())),
            }
        },
    );
    // (Retention goes on meanwhile, 1 s: what is served is every record from where the log then started.)
    served.sort();
    let now = partitions(c.node(f2), "rc").remove(0);
    let first = now["start_offset"].as_u64().expect("start") as usize;
    assert!(first >= start as usize, "{now}");
    assert!(
        served.len() >= bodies.len() - first && served[..] == bodies[bodies.len() - served.len()..],
        "each retained record once: {} served from {first} of {}",
        served.len(),
        bodies.len()
    );
    let _ = std::fs::remove_file(&conf);
}

#[test]
fn a_replicated_produce_is_answered_at_a_majority_and_503_not_enough_replicas_without_one() {
    let _g = serial();
    let opts = Opts {
        extra: vec![
            "--replication-preview".into(),
            "--replica-timeout-ms".into(),
            "700".into(),
            "--replica-lease-ms".into(),
            "300".into(),
        ],
        ..Opts::default()
    };
    let Some(mut c) = Cluster::start_with("replicated_produce_majority", 3, opts) else {
        return;
    };
    let a = c.node(0).put("/topics/m?partitions=1&replicas=3");
    assert_eq!(a.status, 201, "{}", a.text());
    let p = partitions(c.node(0), "m").remove(0);
    let replicas: Vec<usize> = replica_indices(&c, &p);
    let (leader, f1, f2) = (replicas[0], replicas[1], replicas[2]);
    let client = c.node(leader).new_client();

    // All three up, then one follower paused: the leader and the other follower are a majority.
    assert_eq!(produce(c.node(leader), "m", "", "a").1, 0);
    c.pause(f1);
    assert_eq!(produce(c.node(leader), "m", "", "b").1, 1);
    // Only what a majority has is served, while a majority answers the leader (its lease on its takes). b stays
    // for later.
    let m = consume(&client, "m", "").expect("a is committed");
    assert_eq!((m.body.as_str(), m.offset), ("a", 0));
    let a = settle(c.node(leader), "ack", "m", &m.handle, "");
    assert_eq!(a.status, 200, "{}", a.text());

    // Both followers paused: the leader alone is no majority. The produce waits replica_timeout, then 503.
    c.pause(f2);
    let started = Instant::now();
    let a = c.node(leader).post("/produce?topic=m", b"c");
    let waited = started.elapsed();
    assert_eq!(a.status, 503, "{}", a.text());
    assert_eq!(a.json()["error"], "not_enough_replicas", "{}", a.text());
    assert!(a.header("retry-after").is_some(), "{:?}", a.headers);
    assert!(waited >= ms(700), "answered after {waited:?}");
    // Without a majority answering it, the leader hands out no lease once its own has run out
    // (`partition/lease.rs`; it is shorter than the produce's wait here): a consume answers 503, b committed or
    // not (and c, on its disk alone, was never servable).
    match try_consume(&client, "m", "") {
        Err(a) => {
            assert_eq!(a.status, 503, "{}", a.text());
            assert!(a.text().contains("within its lease"), "{}", a.text());
        }
        Ok(m) => panic!("served without a lease: {:?}", m.map(|m| m.body)),
    }
    assert_eq!(
        c.node(leader)
            .get("/consume?topic=m&partition=0&offset=2")
            .status,
        204
    );
    // GET /topics/T shows it: c is in the leader's log, below its end, above the commit offset.
    let p = partitions(c.node(leader), "m").remove(0);
    assert_eq!(
        (p["end_offset"].as_u64(), p["commit_offset"].as_u64()),
        (Some(3), Some(2)),
        "{p}"
    );

    // One follower back: the leader's lease is renewed, which serves the consumer parked meanwhile (the 503 said
    // the partition may be served again soon) b; the follower takes c, which is then on a majority.
    let parked = {
        let client = c.node(leader).new_client();
        std::thread::spawn(move || consume(&client, "m", "&wait=20s"))
    };
    std::thread::sleep(ms(200));
    c.resume(f2);
    let m = parked.join().unwrap().expect("b once the lease is renewed");
    assert_eq!((m.body.as_str(), m.offset), ("b", 1));
    let a = settle(c.node(leader), "ack", "m", &m.handle, "");
    assert_eq!(a.status, 200, "{}", a.text());
    let m = consume(&client, "m", "&wait=20s").expect("c once a majority has it");
    assert_eq!((m.body.as_str(), m.offset), ("c", 2));
    let a = settle(c.node(leader), "ack", "m", &m.handle, "");
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(
        c.node(leader)
            .get("/consume?topic=m&partition=0&offset=2")
            .status,
        200
    );
    c.resume(f1);
    // (A paused node may have lost its session: produces are retried while it rejoins.)
    c.wait_all_live();
    wait_ok(
        c.node(leader),
        "POST",
        "/produce?topic=m",
        b"d",
        "a produce with every replica back",
    );
    wait_replicated(c.node(leader), "m", 2);
    // (Everything the leader has: d, and any copy of it a retry above wrote after a 503.)
    let p = partitions(c.node(leader), "m").remove(0);
    assert_eq!(p["commit_offset"], p["end_offset"], "{p}");
    assert!(p["commit_offset"].as_u64() >= Some(4), "{p}");

    // A leader started again knows no commit offset: it serves nothing above its log's start until a majority has
    // answered the probes it sends its followers as it opens the partition, then everything they have (d, with
    // no produce to carry it).
    assert!(c.terminate(leader).success());
    c.start_again(leader);
    c.wait_all_live();
    let client = c.node(leader).new_client();
    let m = consume(&client, "m", "&wait=20s").expect("d, committed before the restart");
    assert_eq!((m.body.as_str(), m.offset), ("d", 3));
}

/// Shared by the SIGSTOP and the netns variants: node 2 loses its etcd session (`lose`), the others report it dead
/// and answer 503 for its partition while serving the rest; after `regain` it is served again, nothing lost.
fn session_expiry(c: &mut Cluster, lose: impl Fn(&mut Cluster), regain: impl Fn(&mut Cluster)) {
    let gone = 2;
    let gone_id = c.node(gone).id.clone();
    create_topic(c.node(0), "expiry", 3);
    let p = c.partitions_of(0, "expiry", gone)[0];
    produce(c.node(0), "expiry", &format!("&partition={p}"), "before");

    lose(c);
    c.wait_alive(0, &gone_id, false);
    c.wait_alive(1, &gone_id, false);
    for via in [0, 1] {
        wait_unavailable(
            c.node(via),
            "POST",
            &format!("/produce?topic=expiry&partition={p}"),
            b"never",
            &format!(
                "produce to {gone_id}'s partition through {}",
                c.node(via).id
            ),
        );
    }
    let mut during = HashSet::new();
    for n in 0..6 {
        let body = format!("during-{n}");
        let (q, _) = produce(c.node(n % 2), "expiry", "", &body);
        assert_ne!(q, p, "keyless produce went to the expired node's partition");
        during.insert(body);
    }
    assert_eq!(once(&drain(c.node(0), "expiry", &during)), during);

    regain(c);
    c.wait_alive(0, &gone_id, true);
    c.wait_all_live();
    wait_ok(
        c.node(0),
        "POST",
        &format!("/produce?topic=expiry&partition={p}"),
        b"after",
        "produce to the returned node's partition",
    );
    let want: HashSet<String> = ["before", "after"].map(String::from).into();
    assert_eq!(once(&drain(c.node(1), "expiry", &want)), want);
}

#[test]
fn session_expiry_by_sigstop() {
    let _g = serial();
    let Some(mut c) = Cluster::start_with("session_expiry_by_sigstop", 3, Opts::short_ttl()) else {
        return;
    };
    session_expiry(&mut c, |c| c.pause(2), |c| c.resume(2));
}

#[test]
fn session_expiry_by_network_cut() {
    let _g = serial();
    let opts = Opts {
        netns: true,
        ..Opts::short_ttl()
    };
    let Some(mut c) = Cluster::start_with("session_expiry_by_network_cut", 3, opts) else {
        return;
    };
    session_expiry(
        &mut c,
        |c| {
            c.cut(2);
            let addr = c.node(2).addr().parse().unwrap();
            assert!(
                !tcp_reachable(None, addr, ms(300)),
                "cut node still reachable"
            );
        },
        |c| c.heal(2),
    );
}

// ---------------------------------------------------------------------------------------------------------------
// Crash loop across nodes
// ---------------------------------------------------------------------------------------------------------------

/// xorshift64*, seeded through splitmix64.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        Rng((z ^ (z >> 31)) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
}

/// What a crash loop's load saw.
#[derive(Default)]
struct History {
    /// body → (partition, offset) of produces answered 200.
    acked: HashMap<String, (u64, u64)>,
    /// Bodies whose produce got no answer, or an error answer: written or not, either is allowed.
    uncertain: HashSet<String>,
    /// Error answers to produces, by status and code.
    refused: BTreeMap<String, u64>,
    /// Error answers other than the allowed ones (`Load::start`): which node, when (since the load started), what.
    odd: Vec<String>,
    /// Every error answer to a produce: when (since the load started), through which node, status and code.
    refusals: Vec<(Duration, String, String)>,
    /// Every delivery, the drain's too.
    delivered: Vec<Delivery>,
    transport_errors: u64,
}

/// One delivery: the body, where it was read from, and when its consume was sent (since the load started).
struct Delivery {
    body: String,
    partition: u64,
    offset: u64,
    asked: Duration,
}

/// `BERTH_CLUSTER_SEED` (default: the clock) and `BERTH_CLUSTER_ROUNDS` (default `rounds`), printed.
fn crash_loop_params(what: &str, rounds: u64) -> (u64, u64) {
    let seed = std::env::var("BERTH_CLUSTER_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    let rounds: u64 = std::env::var("BERTH_CLUSTER_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(rounds);
    eprintln!("{what}: BERTH_CLUSTER_SEED={seed} BERTH_CLUSTER_ROUNDS={rounds}");
    (seed, rounds)
}

/// A crash loop's load on one topic: producers and consumers on their own threads, every one going through every
/// node in turn, recording a [`History`].
struct Load {
    stop: Arc<AtomicBool>,
    history: Arc<Mutex<History>>,
    workers: Vec<thread::JoinHandle<()>>,
    started: Instant,
}

impl Load {
    /// `producers` threads producing keyless bodies `TOPIC-T-N`, and `consumers` threads consuming (`wait=200ms`,
    /// a 2 s lease) and acking each delivery through the node that leased it. `allowed`: the error answers to a
    /// produce (`"STATUS code"`) that only make it uncertain; any other is recorded in `odd` too.
    fn start(
        c: &Cluster,
        topic: &str,
        producers: usize,
        consumers: usize,
        allowed: &[&str],
    ) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let history = Arc::new(Mutex::new(History::default()));
        let mut workers = Vec::new();
        let started = Instant::now();
        let ids: Vec<String> = c.nodes().iter().map(|n| n.id.clone()).collect();
        let allowed: Vec<String> = allowed.iter().map(|s| s.to_string()).collect();
        for t in 0..producers {
            let (stop, history, ids, allowed) =
                (stop.clone(), history.clone(), ids.clone(), allowed.clone());
            let clients: Vec<Client> = c.nodes().iter().map(Node::new_client).collect();
            let path = format!("/produce?topic={topic}");
            let prefix = topic.to_string();
            workers.push(thread::spawn(move || {
                let mut seq = 0u64;
                while !stop.load(SeqCst) {
                    let body = format!("{prefix}-{t}-{seq}");
                    let j = (seq as usize + t) % clients.len();
                    let via = &clients[j];
                    seq += 1;
                    let answer = via.call("POST", &path, body.as_bytes());
                    let mut h = history.lock().unwrap();
                    match answer {
                        Ok(a) if a.status == 200 => {
                            let j = a.json();
                            let at = (
                                j["partition"].as_u64().unwrap(),
                                j["offset"].as_u64().unwrap(),
                            );
                            h.acked.insert(body, at);
                            continue;
                        }
                        Ok(a) => {
                            let code = a.json()["error"].as_str().unwrap_or("?").to_string();
                            let kind = format!("{} {code}", a.status);
                            let when = started.elapsed();
                            if !allowed.contains(&kind) {
                                h.odd
                                    .push(format!("{} at {when:?}: {kind}: {}", ids[j], a.text()));
                            }
                            h.refusals.push((when, ids[j].clone(), kind.clone()));
                            *h.refused.entry(kind).or_default() += 1;
                            h.uncertain.insert(body);
                        }
                        Err(_) => {
                            h.transport_errors += 1;
                            h.uncertain.insert(body);
                        }
                    }
                    drop(h);
                    thread::sleep(ms(20)); // a node down: do not spin on it
                }
            }));
        }
        for k in 0..consumers {
            let (stop, history) = (stop.clone(), history.clone());
            let clients: Vec<Client> = c.nodes().iter().map(Node::new_client).collect();
            // A short lease: one whose ack is lost with a node comes back soon, for the drain.
            let path = format!("/consume?topic={topic}&wait=200ms&visibility=2s");
            let topic = topic.to_string();
            workers.push(thread::spawn(move || {
                let mut n = k;
                while !stop.load(SeqCst) {
                    n += 1;
                    let via = &clients[n % clients.len()];
                    let asked = started.elapsed();
                    let a = match via.call("GET", &path, &[]) {
                        Ok(a) if a.status == 200 => a,
                        Ok(a) if a.status == 204 => continue,
                        _ => {
                            thread::sleep(ms(20));
                            continue;
                        }
                    };
                    let m = msg_of(&a);
                    history.lock().unwrap().delivered.push(Delivery {
                        body: m.body.clone(),
                        partition: m.partition,
                        offset: m.offset,
                        asked,
                    });
                    // Acked or not (the node may die meanwhile): unacked records come back in the drain.
                    let _ = via.call(
                        "POST",
                        &format!("/ack?topic={topic}&receipt_handle={}", m.handle),
                        &[],
                    );
                }
            }));
        }
        Load {
            stop,
            history,
            workers,
            started,
        }
    }

    /// Time since the load started.
    fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// Stops the load, waits for its threads, and returns what it saw.
    fn stop(self) -> History {
        self.stop.store(true, SeqCst);
        for w in self.workers {
            w.join().unwrap();
        }
        Arc::try_unwrap(self.history)
            .ok()
            .unwrap()
            .into_inner()
            .unwrap()
    }
}

/// The acked bodies of `h` not delivered yet, drained through `node` (`drain_with`: until all of them came or for
/// 30 s, consumes answered `503 partition_unavailable` retried with `retry_unavailable`) and added to `h.delivered`
/// as asked `at`; returns how many deliveries the drain made.
fn drain_the_rest(
    node: &Node,
    topic: &str,
    h: &mut History,
    at: Duration,
    retry_unavailable: bool,
) -> usize {
    let seen: HashSet<&str> = h.delivered.iter().map(|d| d.body.as_str()).collect();
    let missing: HashSet<String> = h
        .acked
        .keys()
        .filter(|b| !seen.contains(b.as_str()))
        .cloned()
        .collect();
    let drained = drain_with(node, topic, "", &missing, retry_unavailable);
    h.delivered.extend(drained.iter().map(|m| Delivery {
        body: m.body.clone(),
        partition: m.partition,
        offset: m.offset,
        asked: at,
    }));
    drained.len()
}

/// The total-queue check of a crash loop's history, drained (`drained`: how many deliveries the drain made):
/// prints the figures, then asserts that every acknowledged produce was delivered (lost = 0), from the (partition,
/// offset) its answer named, no two of them at the same place, nothing delivered that was never sent, and no produce
/// answer outside the allowed ones. Duplicates are reported only.
fn check_history(what: &str, seed: u64, h: &History, drained: usize) {
    let mut count: HashMap<&str, u64> = HashMap::new();
    for d in &h.delivered {
        *count.entry(d.body.as_str()).or_default() += 1;
    }
    let lost: Vec<&String> = h
        .acked
        .keys()
        .filter(|b| !count.contains_key(b.as_str()))
        .collect();
    let unexpected: Vec<&str> = count
        .keys()
        .copied()
        .filter(|b| !h.acked.contains_key(*b) && !h.uncertain.contains(*b))
        .collect();
    let duplicates = count.values().filter(|&&n| n > 1).count();
    eprintln!(
        "{what}: {} acked, {} uncertain (refused {:?}, {} transport errors), {} deliveries ({drained} in the drain), \
         {duplicates} bodies delivered more than once, {} lost, {} unexpected",
        h.acked.len(),
        h.uncertain.len(),
        h.refused,
        h.transport_errors,
        h.delivered.len(),
        lost.len(),
        unexpected.len()
    );
    assert!(
        h.acked.len() >= 50,
        "the load hardly ran: {} acked produces",
        h.acked.len()
    );
    assert!(
        lost.is_empty(),
        "acknowledged produces never delivered (seed {seed}): {lost:?}"
    );
    assert!(
        unexpected.is_empty(),
        "delivered but never sent (seed {seed}): {unexpected:?}"
    );
    // A delivered acked body comes from where its produce said it was written.
    for d in &h.delivered {
        if let Some(&at) = h.acked.get(&d.body) {
            assert_eq!(
                at,
                (d.partition, d.offset),
                "{} delivered from p{} o{}, written at {at:?} (seed {seed})",
                d.body,
                d.partition,
                d.offset
            );
        }
    }
    // Distinct acked places.
    let places: HashSet<(u64, u64)> = h.acked.values().copied().collect();
    assert_eq!(
        places.len(),
        h.acked.len(),
        "two acked produces share a (partition, offset) (seed {seed})"
    );
    // Error answers to keyless produces: only the allowed ones (a leader just died, a majority out of reach).
    assert!(
        h.odd.is_empty(),
        "produce answers the contract does not allow here ({:?}, seed {seed}):\n{}",
        h.refused,
        h.odd.join("\n")
    );
}

/// A crash loop's node `victim`, killed, started again after 200 to 800 ms; returns once every node is live.
fn return_after_a_while(
    c: &mut Cluster,
    victim: usize,
    rng: &mut Rng,
    round: impl std::fmt::Display,
    load: &Load,
) {
    thread::sleep(ms(rng.range(200, 800)));
    c.restart(victim);
    c.wait_all_live();
    eprintln!(
        "round {round}: {} back at {:?}",
        c.node(victim).id,
        load.elapsed()
    );
}

#[test]
fn crash_loop_across_nodes() {
    let _g = serial();
    let Some(mut c) = Cluster::start_with("crash_loop_across_nodes", 3, Opts::short_ttl()) else {
        return;
    };
    let (seed, rounds) = crash_loop_params("crash loop", 5);
    let mut rng = Rng::new(seed);
    create_topic(c.node(0), "chaos", 6);

    let load = Load::start(&c, "chaos", 2, 1, &["503 partition_unavailable"]);
    for round in 0..rounds {
        thread::sleep(ms(rng.range(300, 800)));
        let victim = rng.range(0, 2) as usize;
        eprintln!(
            "round {round}: kill -9 {} at {:?}",
            c.node(victim).id,
            load.elapsed()
        );
        c.kill9(victim);
        return_after_a_while(&mut c, victim, &mut rng, round, &load);
    }
    thread::sleep(ms(500));
    let at = load.elapsed();
    let mut h = load.stop();
    let drained = drain_the_rest(c.node(0), "chaos", &mut h, at, false);
    check_history("crash loop", seed, &h, drained);
}

/// The partitions of `topic` as `node` describes them once every one is served (20 s at most: a failover takes
/// the TTL and a fencing round).
fn served_partitions(node: &Node, topic: &str) -> Vec<serde_json::Value> {
    let path = format!("/topics/{topic}");
    let a = wait_ok(
        node,
        "GET",
        &path,
        &[],
        &format!("every partition of '{topic}' served"),
    );
    a.json()["partitions"]
        .as_array()
        .expect("partitions")
        .clone()
}

/// The crash loop on a replicated topic (`docs/replication.md`, step 6; design/api.md, "Replication"): three nodes,
/// a topic of three partitions with three replicas each, producers and consumers through every node; each round
/// kill -9 a node (the leader of a partition about half the time), start it again on its data directory, wait for it
/// to be live. Then the drain through one node (a consume answered `503 partition_unavailable` is retried: a
/// partition whose new leader's fencing round is still running answers so), the total-queue check (`check_history`;
/// `503 not_enough_replicas` is allowed besides `503 partition_unavailable`: both leave a produce uncertain), and the
/// resurrected count: deliveries, asked after a kill, of an offset below the default group's frontier its leader
/// reported durable before that kill. `BERTH_CLUSTER_ROUNDS` defaults to 4 here (about 13 s on two cores).
///
/// That count is printed, not asserted: the `durable` that `GET /topics/T` shows is the leader's own (journaled on
/// its disk, `Partition::info`), which it ships to its followers only afterwards (`engine/timers.rs`,
/// `journal_moved`) without waiting for them, whereas the contract is about the replicated frontier (a majority's:
/// what the fencing round's winner raises its groups to, `front/round.rs`, `raise_frontiers`). No answer shows that
/// one. The frontiers are read between 300 and 800 ms before the kill, so that what the leader had made durable by
/// then has almost surely reached a follower too.
#[test]
fn replicated_crash_loop_loses_nothing_acknowledged() {
    let _g = serial();
    // With the leaders' gather on (`replica_gather_us`: a batch held for its predecessor's majority), so that a
    // kill -9 also lands while a leader holds one.
    let conf =
        std::env::temp_dir().join(format!("berth-cluster-gather-{}.toml", std::process::id()));
    std::fs::write(
        &conf,
        "[cluster]\netcd = []\nnode_id = \"\"\nadvertise = \"\"\nreplica_gather_us = 2000\n",
    )
    .expect("config written");
    let opts = Opts {
        extra: vec![
            "--replication-preview".into(),
            "--config".into(),
            conf.display().to_string(),
        ],
        ..Opts::short_ttl()
    };
    let Some(mut c) = Cluster::start_with("replicated_crash_loop", 3, opts) else {
        return;
    };
    let (seed, rounds) = crash_loop_params("replicated crash loop", 4);
    let mut rng = Rng::new(seed);
    let topic = "rchaos";
    put_topic(
        c.node(0),
        &format!("/topics/{topic}?partitions=3&replicas=3"),
    );
    served_partitions(c.node(0), topic);

    let load = Load::start(
        &c,
        topic,
        2,
        2,
        &["503 partition_unavailable", "503 not_enough_replicas"],
    );
    // Per kill: when (since the load started), each partition's durable default-group frontier read before it, and
    // the partitions the node killed led.
    let mut kills: Vec<(Duration, Vec<u64>, Vec<usize>)> = Vec::new();
    for round in 0..rounds {
        let via = rng.range(0, 2) as usize;
        let parts = served_partitions(c.node(via), topic);
        let frontiers: Vec<u64> = parts
            .iter()
            .map(|p| p["durable"].as_u64().unwrap_or_else(|| panic!("{p}")))
            .collect();
        let leaders: Vec<usize> = parts
            .iter()
            .map(|p| c.index_of(p["leader"].as_str().unwrap_or_else(|| panic!("{p}"))))
            .collect();
        // A partition's leader half the time; otherwise a node leading none, if there is one.
        let idle: Vec<usize> = (0..c.len()).filter(|i| !leaders.contains(i)).collect();
        let victim = if rng.next().is_multiple_of(2) || idle.is_empty() {
            leaders[rng.range(0, leaders.len() as u64 - 1) as usize]
        } else {
            idle[rng.range(0, idle.len() as u64 - 1) as usize]
        };
        let leads: Vec<usize> = (0..leaders.len())
            .filter(|&p| leaders[p] == victim)
            .collect();
        thread::sleep(ms(rng.range(300, 800)));
        let at = load.elapsed();
        eprintln!(
            "round {round}: kill -9 {} (it led partitions {leads:?}; durable frontiers {frontiers:?}) at {at:?}",
            c.node(victim).id,
        );
        c.kill9(victim);
        kills.push((at, frontiers, leads));
        return_after_a_while(&mut c, victim, &mut rng, round, &load);
    }
    thread::sleep(ms(500));
    let at = load.elapsed();
    let mut h = load.stop();
    let parts = served_partitions(c.node(0), topic);
    let drained = drain_the_rest(c.node(0), topic, &mut h, at, true);
    let short: Vec<String> = h
        .refusals
        .iter()
        .filter(|(_, _, kind)| kind == "503 not_enough_replicas")
        .map(|(when, node, _)| format!("{node} at {when:?}"))
        .collect();
    if !short.is_empty() {
        eprintln!(
            "replicated crash loop: 503 not_enough_replicas: {}",
            short.join(", ")
        );
    }
    let leaders: Vec<&str> = parts
        .iter()
        .map(|p| p["leader"].as_str().unwrap_or("?"))
        .collect();
    eprintln!("replicated crash loop: leaders at the end {leaders:?}");

    // Resurrected: asked after a kill, from below a frontier read before it.
    let mut resurrected = Vec::new();
    let (mut after_kill, mut after_failover) = (0, 0);
    for d in &h.delivered {
        let Some((k, (_, frontiers, leads))) = kills
            .iter()
            .enumerate()
            .rev()
            .find(|(_, (t, _, _))| *t <= d.asked)
        else {
            continue;
        };
        after_kill += 1;
        if leads.contains(&(d.partition as usize)) {
            after_failover += 1;
        }
        let below = frontiers.get(d.partition as usize).copied().unwrap_or(0);
        if d.offset < below {
            resurrected.push(format!(
                "{} (p{} o{}, asked at {:?}, below {below} read before kill {k})",
                d.body, d.partition, d.offset, d.asked
            ));
        }
    }
    eprintln!(
        "replicated crash loop: {} resurrected (delivered after a kill from below a frontier its leader reported durable \
         before it; of {after_kill} deliveries asked after a kill, {after_failover} on a partition whose leader it \
         killed){}{}",
        resurrected.len(),
        if resurrected.is_empty() { "" } else { ": " },
        resurrected.iter().take(10).cloned().collect::<Vec<_>>().join("; ")
    );
    let _ = std::fs::remove_file(&conf);
    check_history("replicated crash loop", seed, &h, drained);
}

#[test]
fn batches_split_by_owner_and_merge_in_order() {
    let _g = serial();
    let Some(c) = Cluster::start("batches_split_by_owner_and_merge_in_order", 3) else {
        return;
    };
    create_topic(c.node(0), "bat", 6);
    let (x, y, z) = (c.node(0), c.node(1), c.node(2));
    // One ndjson batch through x naming every partition (so every node owns some of it), keyed and keyless records
    // mixed in: results come back in request order, each at the partition it named.
    let mut lines = String::new();
    for i in 0..12u32 {
        match i % 3 {
            0 => lines += &format!("{{\"body\": \"b{i}\", \"partition\": {}}}\n", i % 6),
            1 => lines += &format!("{{\"body\": \"b{i}\", \"key\": \"k{i}\"}}\n"),
            _ => lines += &format!("{{\"body\": \"b{i}\"}}\n"),
        }
    }
    let a = x
        .client
        .call_with(
            "POST",
            "/produce?topic=bat",
            &[("content-type", "application/x-ndjson")],
            lines.as_bytes(),
        )
        .expect("batch produce");
    assert_eq!(a.status, 200, "batch produce: {}", a.text());
    let j = a.json();
    assert_eq!(j["failed"], 0, "{j}");
    let results = j["results"].as_array().expect("results").clone();
    assert_eq!(results.len(), 12);
    for (i, r) in results.iter().enumerate() {
        if i % 3 == 0 {
            assert_eq!(r["partition"], (i % 6) as u64, "record {i} in order: {r}");
        }
    }
    let nodes: HashSet<String> = partitions(x, "bat")
        .iter()
        .map(|p| p["node"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(nodes.len(), 3, "the topic spans the three nodes");

    // A batch consume through y gathers from every node (its own partitions first).
    let mut handles = Vec::new();
    let mut bodies = HashSet::new();
    wait_for("all 12 leased through y", Duration::from_secs(10), || {
        let a = y
            .client
            .call("GET", "/consume?topic=bat&max=12&wait=1s", &[])
            .map_err(|e| e.to_string())?;
        if a.status == 200 {
            for line in a.text().lines() {
                let m: serde_json::Value = serde_json::from_str(line).map_err(|e| e.to_string())?;
                bodies.insert(m["body"].as_str().unwrap_or_default().to_string());
                handles.push(m["receipt_handle"].as_str().unwrap_or_default().to_string());
            }
        }
        if bodies.len() == 12 {
            Ok(())
        } else {
            Err(format!("{} leased", bodies.len()))
        }
    });
    assert_eq!(handles.len(), 12, "each message leased once");

    // One batch ack through z, with a stale handle in the middle: per-handle results in request order.
    let mut body = handles[..6].join("\n");
    body += "\n0:0:1\n";
    body += &handles[6..].join("\n");
    let a = z
        .client
        .call_with(
            "POST",
            "/ack?topic=bat",
            &[("content-type", "text/plain")],
            body.as_bytes(),
        )
        .expect("batch ack");
    assert_eq!(a.status, 200, "batch ack: {}", a.text());
    let results = a.json()["results"].as_array().expect("results").clone();
    assert_eq!(results.len(), 13);
    for (i, r) in results.iter().enumerate() {
        let want = if i == 6 { 410 } else { 200 };
        assert_eq!(r["status"], want, "handle {i}: {r}");
    }
    // Everything settled: nothing left to lease anywhere.
    let a = x
        .client
        .call("GET", "/consume?topic=bat&max=12", &[])
        .expect("consume");
    assert_eq!(a.status, 204, "left after the acks: {}", a.text());
}

#[test]
fn a_group_created_at_latest_starts_at_the_end_on_every_node() {
    let _g = serial();
    let Some(c) = Cluster::start(
        "a_group_created_at_latest_starts_at_the_end_on_every_node",
        3,
    ) else {
        return;
    };
    create_topic(c.node(0), "lat", 6);
    for p in 0..6 {
        produce(
            c.node(p % 3),
            "lat",
            &format!("&partition={p}"),
            &format!("old{p}"),
        );
    }
    let a = c
        .node(1)
        .client
        .call("PUT", "/topics/lat/groups/late?start=latest", &[])
        .expect("create group");
    assert_eq!(a.status, 201, "group create: {}", a.text());
    // Nothing from before the group, through any node, on any node's partitions.
    for i in 0..3 {
        let a = c
            .node(i)
            .client
            .call("GET", "/consume?topic=lat&group=late&max=20", &[])
            .expect("consume");
        assert_eq!(
            a.status,
            204,
            "old messages through {}: {}",
            c.node(i).id,
            a.text()
        );
    }
    for p in 0..6 {
        produce(
            c.node(p % 3),
            "lat",
            &format!("&partition={p}"),
            &format!("new{p}"),
        );
    }
    let mut seen = HashSet::new();
    wait_for(
        "the 6 new messages for the group",
        Duration::from_secs(10),
        || {
            let a = c
                .node(2)
                .client
                .call("GET", "/consume?topic=lat&group=late&max=20&wait=1s", &[])
                .map_err(|e| e.to_string())?;
            for line in a.text().lines() {
                let m: serde_json::Value = serde_json::from_str(line).map_err(|e| e.to_string())?;
                seen.insert(m["body"].as_str().unwrap_or_default().to_string());
            }
            if seen.len() >= 6 {
                Ok(())
            } else {
                Err(format!("{seen:?}"))
            }
        },
    );
    assert!(seen.iter().all(|b| b.starts_with("new")), "{seen:?}");
}

/// Two nodes and `topic` with 4 partitions, created through the first; returns the partitions the second owns
/// (some: the tests that use this kill it). None where the cluster cannot be started (etcd missing).
fn two_nodes_and_a_topic(test: &str, topic: &str) -> Option<(Cluster, Vec<u64>)> {
    let c = Cluster::start(test, 2)?;
    create_topic(c.node(0), topic, 4);
    let second = c.partitions_of(0, topic, 1);
    assert!(!second.is_empty(), "node 2 owns none of {topic}");
    Some((c, second))
}

/// A group deleted and created again while a node is down starts afresh on that node too. The node still holds the
/// old group's frontier files (at the end of its partitions, everything acked) and a `topic.json` naming a group of
/// the same name: without the group's creation id it would take the new group for the old one and skip what its
/// partitions hold.
#[test]
fn a_group_recreated_while_a_node_is_down_starts_afresh_there() {
    let _g = serial();
    let test = "a_group_recreated_while_a_node_is_down_starts_afresh_there";
    let Some((mut c, down_parts)) = two_nodes_and_a_topic(test, "rg") else {
        return;
    };
    let down = 1;
    let group = |c: &Cluster, method: &str, status: u16| {
        let a = c
            .node(0)
            .client
            .call(method, "/topics/rg/groups/g", &[])
            .unwrap_or_else(|e| panic!("{method} g: {e}"));
        assert_eq!(a.status, status, "{method} g: {}", a.text());
    };
    group(&c, "PUT", 201);
    let mut bodies = HashSet::new();
    for p in 0..4 {
        let body = format!("m{p}");
        produce(c.node(0), "rg", &format!("&partition={p}"), &body);
        bodies.insert(body);
    }
    // Group g takes and acks all four, through every partition; then the acks are on disk (`durable`) on every
    // partition, so that node 2's frontier files for g are at the end when it is killed.
    let take_all = |c: &Cluster, when: &str| {
        let delivered = once(&drain_group(c.node(0), "rg", "&group=g", &bodies));
        let lost: Vec<&String> = bodies.difference(&delivered).collect();
        assert!(
            lost.is_empty(),
            "{when}: g never got {lost:?} (node 2 owns partitions {down_parts:?})"
        );
        wait_for("g's frontiers durable", Duration::from_secs(10), || {
            let parts = partitions(c.node(0), "rg");
            let settled = parts.iter().all(|p| {
                p["groups"].as_array().is_some_and(|gs| {
                    gs.iter()
                        .any(|g| g["group"] == "g" && g["durable"] == 1 && g["committed"] == 1)
                })
            });
            if settled {
                Ok(())
            } else {
                Err(format!("{parts:?}"))
            }
        });
    };
    take_all(&c, "the first g");

    // Deleted and created again while node 2 is down: the new g gets all four again.
    c.kill9(down);
    group(&c, "DELETE", 204);
    group(&c, "PUT", 201);
    c.restart(down);
    c.wait_all_live();
    take_all(&c, "g created again while node 2 was down");
    assert!(
        c.node(down).log_text().contains("starting them afresh"),
        "the returned node did not say it restarted the group"
    );

    // Deleted while node 2 is down: it returns, forgets g and removes g's frontier files (nothing would ever open
    // them again). Then created again while it is down again: the group is new to node 2.
    let g_files = |c: &Cluster| -> Vec<std::path::PathBuf> {
        down_parts
            .iter()
            .map(|p| {
                c.node(down)
                    .data_dir
                    .join("topics/rg")
                    .join(p.to_string())
                    .join("consumer.g.offset")
            })
            .filter(|f| f.exists())
            .collect()
    };
    assert!(
        !g_files(&c).is_empty(),
        "node 2 holds no frontier file of g: the check below would prove nothing"
    );
    c.kill9(down);
    group(&c, "DELETE", 204);
    c.restart(down);
    c.wait_all_live();
    assert_eq!(
        g_files(&c),
        Vec::<std::path::PathBuf>::new(),
        "a group deleted while node 2 was down left its frontier files there"
    );
    assert!(
        c.node(down).log_text().contains("their frontier files go"),
        "the returned node did not say it removed the deleted group's files"
    );
    c.kill9(down);
    group(&c, "PUT", 201);
    c.restart(down);
    c.wait_all_live();
    take_all(
        &c,
        "g deleted, then created again, each while node 2 was down",
    );
}

/// A topic deleted and created again (a new id) while a node is down: the returned node puts its old data in the
/// trash instead of serving it as the new topic's.
#[test]
fn a_topic_recreated_while_a_node_is_down_does_not_serve_the_old_data() {
    let _g = serial();
    let test = "a_topic_recreated_while_a_node_is_down_does_not_serve_the_old_data";
    let Some((mut c, _)) = two_nodes_and_a_topic(test, "rt") else {
        return;
    };
    let down = 1;
    for p in 0..4 {
        produce(
            c.node(0),
            "rt",
            &format!("&partition={p}"),
            &format!("old{p}"),
        );
    }
    c.kill9(down);
    let a = c
        .node(0)
        .client
        .call("DELETE", "/topics/rt", &[])
        .expect("delete rt");
    assert_eq!(a.status, 204, "delete rt: {}", a.text());
    create_topic(c.node(0), "rt", 4);
    c.restart(down);
    c.wait_all_live();
    let now_down = c.partitions_of(0, "rt", down);
    assert!(!now_down.is_empty(), "the new rt has nothing on node 2");
    for p in 0..4 {
        produce(
            c.node(0),
            "rt",
            &format!("&partition={p}"),
            &format!("new{p}"),
        );
    }
    let want: HashSet<String> = (0..4).map(|p| format!("new{p}")).collect();
    let got = once(&drain(c.node(0), "rt", &want));
    assert_eq!(
        got, want,
        "node 2 owns partitions {now_down:?} of the new rt"
    );
    assert!(
        c.node(down)
            .log_text()
            .contains("its old data goes to the trash"),
        "the returned node did not say it trashed the old rt"
    );
}

/// Issue 23, finding 9: etcd paused about 4 s stopped the whole data plane (every node 503), though placement never
/// moves. Now a node keeps serving its partitions while etcd is silent for less than the grace (default 15 s;
/// docs/cluster.md, "Riding out an etcd outage"): under a 10 s pause, every produce through every node, to every
/// partition (a local owner or one on the other node), answers 200, and everything produced is delivered after.
#[test]
fn an_etcd_pause_under_load_leaves_the_data_plane_serving() {
    let _g = serial();
    let Some(c) = Cluster::start("an_etcd_pause_under_load_leaves_the_data_plane_serving", 2)
    else {
        return;
    };
    create_topic(c.node(0), "steady", 4);
    // Every node knows the topic before etcd stops: one that has not heard of it yet would read etcd for a
    // request naming it (and wait out the pause), which is not what this test is about.
    for i in 0..2 {
        wait_for("the topic on every node", Duration::from_secs(10), || {
            let a = c.node(i).get("/topics/steady");
            if a.status == 200 {
                Ok(())
            } else {
                Err(a.text())
            }
        });
    }
    let pause = Duration::from_secs(10);
    c.etcd.pause();
    let paused = Instant::now();
    let mut sent = HashSet::new();
    let mut n = 0u64;
    while paused.elapsed() < pause {
        for via in 0..2 {
            for p in 0..4 {
                let body = format!("m{n}");
                n += 1;
                let a = c.node(via).post(
                    &format!("/produce?topic=steady&partition={p}"),
                    body.as_bytes(),
                );
                assert_eq!(
                    a.status,
                    200,
                    "produce to partition {p} through {} {:?} into the etcd pause: {}",
                    c.node(via).id,
                    paused.elapsed(),
                    a.text()
                );
                sent.insert(body);
            }
        }
        std::thread::sleep(ms(100));
    }
    c.etcd.resume();
    assert!(sent.len() >= 80, "{} produces in the pause", sent.len());
    c.wait_all_live();
    assert_eq!(once(&drain(c.node(1), "steady", &sent)), sent);
}

/// `GET /topics/{topic}` config through `node`: (visibility_ms, max_in_flight).
fn settings_of(node: &Node, topic: &str) -> Result<(u64, u64), String> {
    let a = node
        .client
        .call("GET", &format!("/topics/{topic}"), &[])
        .map_err(|e| e.to_string())?;
    if a.status != 200 {
        return Err(format!("{} {}", a.status, a.text()));
    }
    let j = a.json();
    match (
        j["config"]["visibility_ms"].as_u64(),
        j["config"]["max_in_flight"].as_u64(),
    ) {
        (Some(v), Some(m)) => Ok((v, m)),
        _ => Err(a.text()),
    }
}

/// Issue 23, finding 5: two settings changed at the same moment through two nodes both land. Each node's change is
/// applied again to the settings etcd holds on every compare-and-set round; writing the node's own (stale) copy
/// instead lost one of the two changes while both answered 200.
#[test]
fn concurrent_settings_changes_through_two_nodes_both_land() {
    let _g = serial();
    let test = "concurrent_settings_changes_through_two_nodes_both_land";
    let Some(c) = Cluster::start(test, 2) else {
        return;
    };
    create_topic(c.node(0), "cs", 2);
    wait_for("node 2 to know cs", Duration::from_secs(10), || {
        settings_of(c.node(1), "cs")
    });
    for round in 0..20u64 {
        let visibility_s = 10 + round;
        let max_in_flight = 100 + round;
        let start = Arc::new(std::sync::Barrier::new(2));
        let change = |i: usize, query: String| {
            let client = c.node(i).new_client();
            let start = start.clone();
            thread::spawn(move || {
                start.wait();
                client
                    .call("PATCH", &format!("/topics/cs?{query}"), &[])
                    .map(|a| (a.status, a.text()))
            })
        };
        let through_0 = change(0, format!("visibility={visibility_s}s"));
        let through_1 = change(1, format!("max_in_flight={max_in_flight}"));
        for (i, h) in [through_0, through_1].into_iter().enumerate() {
            let (status, text) = h
                .join()
                .unwrap()
                .unwrap_or_else(|e| panic!("round {round}: PATCH through node {}: {e}", i + 1));
            assert_eq!(
                status,
                200,
                "round {round}: PATCH through node {}: {text}",
                i + 1
            );
        }
        let want = (visibility_s * 1000, max_in_flight);
        for i in 0..2 {
            wait_for(
                &format!(
                    "round {round}: both changes in GET /topics/cs through node {}",
                    i + 1
                ),
                Duration::from_secs(10),
                || match settings_of(c.node(i), "cs")? {
                    got if got == want => Ok(()),
                    got => Err(format!(
                        "(visibility_ms, max_in_flight) = {got:?}, want {want:?}"
                    )),
                },
            );
        }
    }
}

/// The group names `GET /topics/{topic}/groups` lists through `node`.
fn group_names(node: &Node, topic: &str) -> Result<Vec<String>, String> {
    let a = node
        .client
        .call("GET", &format!("/topics/{topic}/groups"), &[])
        .map_err(|e| e.to_string())?;
    if a.status != 200 {
        return Err(format!("{} {}", a.status, a.text()));
    }
    Ok(a.json()
        .as_array()
        .ok_or_else(|| a.text())?
        .iter()
        .filter_map(|g| g["group"].as_str().map(str::to_string))
        .collect())
}

/// Issue 23, finding 6: a group deleted through one node while a consume of it is parked on another stays deleted.
/// The parked consume answers `404 group_not_found` at once; nothing creates the group again (a consume run again
/// after the 404 used to, at the oldest offset, and got the whole backlog delivered again); an explicit creation
/// afterwards starts where it asks.
#[test]
fn a_group_deleted_under_a_parked_consume_stays_deleted() {
    let _g = serial();
    let test = "a_group_deleted_under_a_parked_consume_stays_deleted";
    let Some((c, _)) = two_nodes_and_a_topic(test, "dg") else {
        return;
    };
    let a = c.node(0).put("/topics/dg/groups/g");
    assert_eq!(a.status, 201, "create g: {}", a.text());
    wait_for("node 2 to know g", Duration::from_secs(10), || {
        let names = group_names(c.node(1), "dg")?;
        if names.iter().any(|n| n == "g") {
            Ok(())
        } else {
            Err(format!("{names:?}"))
        }
    });
    let backlog = 8;
    for n in 0..backlog {
        produce(
            c.node(0),
            "dg",
            &format!("&partition={}", n % 4),
            &format!("b{n}"),
        );
    }
    // Three acked, the other five leased for a minute: nothing is deliverable to g, so a consume of g parks.
    let mut taken = Vec::new();
    wait_for(
        "g to take the whole backlog",
        Duration::from_secs(20),
        || {
            if let Some(m) = consume(&c.node(0).client, "dg", "&group=g&visibility=60s&wait=1s") {
                if taken.len() < 3 {
                    let a = settle(c.node(0), "ack", "dg", &m.handle, "&group=g");
                    assert_eq!(a.status, 200, "ack {}: {}", m.handle, a.text());
                }
                taken.push(m.body);
            }
            if taken.len() >= backlog {
                Ok(())
            } else {
                Err(format!("{taken:?}"))
            }
        },
    );

    let parked_on = c.node(1).new_client();
    let (tx, rx) = mpsc::channel();
    let h = thread::spawn(move || {
        let a = parked_on.call("GET", "/consume?topic=dg&group=g&wait=10s", &[]);
        let _ = tx.send((Instant::now(), a));
    });
    thread::sleep(ms(500));
    assert!(
        rx.try_recv().is_err(),
        "the consume of g on node 2 should be parked"
    );
    let a = c
        .node(0)
        .client
        .call("DELETE", "/topics/dg/groups/g", &[])
        .expect("delete g");
    assert_eq!(a.status, 204, "delete g: {}", a.text());
    let deleted = Instant::now();
    let (at, answer) = rx
        .recv_timeout(Duration::from_secs(12))
        .expect("the parked consume never answered");
    h.join().unwrap();
    let answer = answer.expect("the parked consume's call");
    assert!(
        answer.status == 404,
        "the consume parked on g answered {} after g's deletion (a redelivery of the backlog?): {} {:?}",
        answer.status,
        answer.text(),
        answer.headers
    );
    assert_error(&answer, 404, "group_not_found");
    let lag = at.saturating_duration_since(deleted);
    assert!(
        lag < Duration::from_secs(3),
        "the parked consume answered {lag:?} after the deletion"
    );

    // Gone on both nodes, and it stays gone (the one poll for absence: nothing may bring it back).
    for i in 0..2 {
        wait_for("g gone", Duration::from_secs(10), || {
            let names = group_names(c.node(i), "dg")?;
            if names.iter().any(|n| n == "g") {
                Err(format!("node {} lists {names:?}", i + 1))
            } else {
                Ok(())
            }
        });
    }
    let until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < until {
        for i in 0..2 {
            let names = group_names(c.node(i), "dg").expect("list groups");
            assert!(
                !names.iter().any(|n| n == "g"),
                "g came back on node {}: {names:?}",
                i + 1
            );
        }
        thread::sleep(ms(100));
    }

    // Created again explicitly at the end: none of the backlog, through either node; a new message is its first.
    let a = c.node(1).put("/topics/dg/groups/g?start=latest");
    assert_eq!(a.status, 201, "create g again: {}", a.text());
    for i in 0..2 {
        let a = c
            .node(i)
            .client
            .call("GET", "/consume?topic=dg&group=g&max=20", &[])
            .expect("consume");
        assert_eq!(
            a.status,
            204,
            "the backlog again through node {}: {}",
            i + 1,
            a.text()
        );
    }
    produce(c.node(0), "dg", "&partition=1", "new");
    let m = wait_for("the new message for g", Duration::from_secs(10), || {
        consume(&c.node(1).client, "dg", "&group=g&wait=1s").ok_or_else(|| "204".to_string())
    });
    assert_eq!(m.body, "new");
}

/// Issue 23, finding 4: a node restarted with another core count has its partitions on other cores of its own now.
/// The other nodes compute those cores again from its new record, without a restart of theirs: produce, consume,
/// ack and describe through them all answer 200 (before: 400 "this node has no core 1" until they restarted).
#[test]
fn a_node_back_with_another_core_count_is_routed_to_its_new_cores() {
    let _g = serial();
    let opts = Opts {
        cores: Some(2),
        ..Opts::default()
    };
    let Some(mut c) = Cluster::start_with("a_node_back_with_another_core_count", 2, opts) else {
        return;
    };
    create_topic(c.node(0), "recored", 8);
    let on_1 = c.partitions_of(0, "recored", 1);
    assert_eq!(on_1.len(), 4, "node 1's share: {on_1:?}");

    c.set_flag(1, "--cores", "1");
    c.restart(1);
    let id1 = c.node(1).id.clone();
    c.wait_alive(0, &id1, true);

    // Node 0 learns node 1's new core count through its watch: describe through it comes back to 200.
    let x = c.node(0);
    wait_ok(x, "GET", "/topics/recored", &[], "describe through node 0");
    let mut want = HashSet::new();
    for p in 0..8u64 {
        let body = format!("m{p}");
        assert_eq!(
            produce(x, "recored", &format!("&partition={p}"), &body).0,
            p
        );
        want.insert(body);
    }
    // Consumed and acked through node 0 (`drain` asserts every ack is 200), each message once.
    let got = drain(x, "recored", &want);
    assert_eq!(once(&got), want);
    wait_for(
        "every partition committed, described through node 0",
        Duration::from_secs(10),
        || {
            let ps = partitions(x, "recored");
            match ps.iter().find(|e| e["committed"] != 1) {
                None => Ok(()),
                Some(e) => Err(e.to_string()),
            }
        },
    );
}

/// Issue 23, finding 11: a topic created through another node counts against this node's caps too. Over them, it
/// is not opened here; the node stays up, lists it under `unopened` in GET /cluster and counts it in /metrics, and
/// retries it on a timer with backoff until it opens or, as here, the topic goes away.
#[test]
fn a_learnt_topic_over_this_nodes_caps_is_refused_listed_and_retried() {
    let _g = serial();
    let Some(mut c) = Cluster::start("a_learnt_topic_over_this_nodes_caps", 2) else {
        return;
    };
    let config = c.dir().join("small.toml");
    std::fs::write(&config, "max_partitions = 2\n").expect("config file");
    c.terminate(1);
    c.set_flag(1, "--config", &config.display().to_string());
    c.start_again(1);
    let id1 = c.node(1).id.clone();
    c.wait_alive(0, &id1, true);

    // One partition of two lands on node 1: within its cap.
    create_topic(c.node(0), "fits", 2);
    // Four of eight would land on node 1: over it.
    create_topic(c.node(0), "big", 8);
    let unopened = |c: &Cluster| -> Vec<serde_json::Value> {
        let a = c.node(1).get("/cluster");
        assert_eq!(a.status, 200, "GET /cluster through node 1: {}", a.text());
        a.json()["unopened"].as_array().cloned().unwrap_or_default()
    };
    let listed = wait_for(
        "node 1 lists big as unopened",
        Duration::from_secs(10),
        || {
            let list = unopened(&c);
            match list.iter().find(|u| u["topic"] == "big") {
                Some(u) if u["attempts"].as_u64() >= Some(2) => Ok(u.clone()),
                _ => Err(format!("{list:?}")),
            }
        },
    );
    assert!(
        listed["reason"]
            .as_str()
            .is_some_and(|r| r.contains("max_partitions")),
        "{listed}"
    );
    assert_eq!(unopened(&c).len(), 1, "fits opened: {:?}", unopened(&c));
    assert_eq!(c.node(1).get("/topics/fits").status, 200);
    let metrics = c.node(1).get("/metrics").text();
    assert!(
        metrics.contains("berth_cluster_topics_unopened{core=\"0\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.lines().any(|l| l
            .starts_with("berth_cluster_topic_open_failures_total{core=\"0\"} ")
            && !l.ends_with(" 0")),
        "{metrics}"
    );

    // The topic goes away: nothing left to retry.
    let a = c
        .node(0)
        .client
        .call("DELETE", "/topics/big", &[])
        .expect("delete big");
    assert_eq!(a.status, 204, "delete big: {}", a.text());
    wait_for("node 1 lists nothing", Duration::from_secs(10), || {
        let list = unopened(&c);
        if list.is_empty() {
            Ok(())
        } else {
            Err(format!("{list:?}"))
        }
    });
}

/// The README's cluster examples (its ```` ```sh cluster ```` blocks), run as written by bash: `scripts/cluster.sh`
/// starts etcd and three nodes, on free ports instead of 2379 and 7071-7073 (the script's `BERTH_ETCD_PORT` and
/// `BERTH_PORT_BASE`), with this build's `berth`. Each block must run to its end under `set -eo pipefail` and print
/// the HTTP statuses its comments show; whatever happens, the cluster is stopped.
#[test]
fn the_readme_cluster_examples_run_as_written() {
    let _g = serial();
    let Some(etcd) = common::etcd::etcd_binary() else {
        eprintln!("SKIP the_readme_cluster_examples_run_as_written: no etcd");
        return;
    };
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    let blocks = common::readme::fenced_blocks(&text, "sh cluster");
    assert!(!blocks.is_empty(), "the README has no ```sh cluster block");
    let bindable =
        |port: u32| port < 65_000 && TcpListener::bind(("127.0.0.1", port as u16)).is_ok();
    // A base whose client (base + 1..3) and peer (base + 101..103) ports are free, and etcd's two.
    let base = loop {
        let base = u32::from(common::free_port()) - 1;
        if [2, 3, 101, 102, 103].iter().all(|d| bindable(base + d)) {
            break base;
        }
    };
    let etcd_port = loop {
        let port = u32::from(common::free_port());
        if bindable(port + 1) && !(base..=base + 103).contains(&port) {
            break port;
        }
    };
    let state = tempfile::tempdir().expect("a temp dir");
    let env = [
        ("BERTH_BIN", env!("CARGO_BIN_EXE_berth").to_string()),
        ("ETCD_BIN", etcd.display().to_string()),
        (
            "BERTH_CLUSTER_STATE",
            state.path().join("s").display().to_string(),
        ),
        ("BERTH_PORT_BASE", base.to_string()),
        ("BERTH_ETCD_PORT", etcd_port.to_string()),
    ];
    let bash = |script: &str| {
        // Bounded: a block that hangs fails the test (and the cluster is stopped below) instead of the suite.
        let mut cmd = std::process::Command::new("timeout");
        cmd.args(["180", "bash", "-c"])
            .arg(format!("set -eo pipefail\n{script}"))
            .current_dir(root);
        // The developer's own settings of the script stay out of it.
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("BERTH_") {
                cmd.env_remove(k);
            }
        }
        for (k, v) in &env {
            cmd.env(k, v);
        }
        cmd.output().expect("run bash")
    };
    struct Stop<'a>(&'a dyn Fn(&str) -> std::process::Output);
    impl Drop for Stop<'_> {
        fn drop(&mut self) {
            let out = (self.0)("scripts/cluster.sh stop");
            if !out.status.success() {
                eprintln!("cluster.sh stop: {}", String::from_utf8_lossy(&out.stderr));
            }
        }
    }
    let _stop = Stop(&bash);
    for (i, block) in blocks.iter().enumerate() {
        let mut script = block.clone();
        for n in 1..=3 {
            script = script.replace(
                &format!("localhost:707{n}"),
                &format!("localhost:{}", base + n),
            );
        }
        let started = Instant::now();
        let out = bash(&script);
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        eprintln!(
            "README cluster block {} ran in {:?}",
            i + 1,
            started.elapsed()
        );
        assert!(
            out.status.success(),
            "README cluster block {}: exited {}\n--- block\n{block}\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
            i + 1,
            out.status
        );
        assert_eq!(
            common::readme::statuses(&stdout),
            common::readme::statuses(&common::readme::expected(block)),
            "README cluster block {}: the statuses it printed are not the ones its comments show\n--- stdout\n{stdout}",
            i + 1
        );
    }
}
