//! Routing: the table from method and path to operation ([`Route`]), the checks every request passes (method,
//! token, host and origin), and each route's handler: the operation's parse (`ops::<op>::parse`), its run
//! (`front::Front`), its reply (`ops::<op>::render`). A reader starts at an operation's file in `ops/`; the status of
//! every error is decided in `ops::status`. Called by `http::conn` for each parsed request.

use super::request::{query_pairs, Request};
use super::response::Response;
use super::status::{error_response, lookup_first};
use crate::engine::cluster::DrainAction;
use crate::engine::placement::NodeIndex;
use crate::engine::topic::validate_name;
use crate::front::Front;
use crate::ops::consume::ConsumeRequest;
use crate::ops::params::{BatchLimits, Query};
use crate::ops::settle::Verb;
use crate::ops::{self, OpResult};
use bytes::Bytes;
use serde_json::json;
use std::rc::Rc;

/// The batch limits of the server's configuration.
pub fn batch_limits(front: &Front) -> BatchLimits {
    let c = front.engine().config();
    BatchLimits {
        max_batch_records: c.max_batch_records,
        max_batch_bytes: c.max_batch_bytes,
        max_message_bytes: c.max_message_bytes,
    }
}

/// Serves one request. In cluster mode, a topic this node does not know yet (created through another node a moment
/// ago, its replica not there yet) is looked up in the metastore before the answer is `404`.
pub async fn handle(front: &Rc<Front>, mut req: Request) -> Response {
    if crate::sqs::is_sqs_request(&req) {
        // The SQS face: SigV4 when credentials are configured (checked there), else the same host and token checks
        // as any request; then its own protocols (`sqs/`).
        if front.engine().config().sqs_credentials.is_empty() {
            if let Some(refused) = refuse(front, &req) {
                return refused;
            }
        }
        let tls = front.engine().config().tls_cert_file.is_some();
        return Box::pin(crate::sqs::handle(front, req, tls)).await;
    }
    if !front.engine().clustered() || req.method == "PUT" {
        return handle_once(front, &mut req).await.0;
    }
    // Boxed, so the single-node path above holds one `handle_once` in place and no more (moving a future copies
    // all of it, at every level of the request's path).
    Box::pin(handle_clustered(front, req)).await
}

/// `handle` in cluster mode: the request once, then again after a metastore lookup when the answer says the topic
/// or group is missing here.
async fn handle_clustered(front: &Rc<Front>, mut req: Request) -> Response {
    let mut again = req.clone();
    let (response, lookup) = handle_once(front, &mut req).await;
    // A group created through another node a moment ago may not be in this node's replica either: then the
    // metastore itself is read (`fresh`).
    let Some(fresh) = lookup else {
        return response;
    };
    let name = match TopicRoute::of(&again.path) {
        Some(
            TopicRoute::Topic(name)
            | TopicRoute::Groups(name)
            | TopicRoute::Group(name, _)
            | TopicRoute::Purge(name, _)
            | TopicRoute::Redrive(name),
        ) => Some(name),
        None => query_pairs(&again.query)
            .into_iter()
            .find(|(k, _)| k == "topic")
            .map(|(_, v)| v),
    };
    match name {
        Some(name) if front.lookup_topic(&name, fresh).await => {
            handle_once(front, &mut again).await.0
        }
        _ => response,
    }
}

/// Every route: method and path to the operation it runs (and the file that holds that operation). Paths under
/// `/topics/` carry percent-decoded names ([`TopicRoute`]).
enum Route {
    /// `GET /`: the status page (`http/page.html`), no data of its own: it reads `/status`.
    Page,
    /// `GET /status`: the node in one JSON document (`ops/overview.rs`).
    Status,
    /// `GET /health`: readiness (here).
    Health,
    /// `GET /metrics`: Prometheus text (`engine::metrics`).
    Metrics,
    /// `GET /topics`: topic names.
    ListTopics,
    /// `GET /cluster`: nodes and placement (`front::Front::cluster`).
    Cluster,
    /// `POST /produce` (`ops/produce.rs`).
    Produce,
    /// `GET /consume`: queue consume (`ops/consume.rs`) or replay (`ops/replay.rs`).
    Consume,
    /// `POST /ack`, `/nack`, `/extend` (`ops/settle.rs`).
    Settle(Verb),
    /// `PUT`, `PATCH`, `GET`, `DELETE /topics/T` (`ops/topics.rs`).
    CreateTopic(String),
    ChangeTopic(String),
    DescribeTopic(String),
    DeleteTopic(String),
    /// `GET /topics/T/groups`; `PUT`, `GET`, `DELETE /topics/T/groups/G` (`ops/groups.rs`).
    ListGroups(String),
    CreateGroup(String, String),
    DescribeGroup(String, String),
    DeleteGroup(String, String),
    /// `POST /topics/T/groups/G/purge` (`ops/groups.rs`).
    PurgeGroup(String, String),
    /// `POST /topics/T/redrive` (`ops/redrive.rs`).
    Redrive(String),
    /// `POST /cluster/nodes/ID/drain`, `DELETE /cluster/nodes/ID` (the node's replicas move to other nodes:
    /// `front::mover`) and `DELETE /cluster/nodes/ID/drain`.
    DrainNode(String, DrainAction),
}

impl Route {
    /// The route of `method` on `path`: `404` for a path with no route, `405` (with `Allow`) for a method the path
    /// does not take.
    fn of(method: &str, path: &str) -> Result<Route, Response> {
        use TopicRoute as T;
        let topic_route = TopicRoute::of(path);
        let (allowed, route): (&str, Option<Route>) = match (path, topic_route) {
            ("/", _) => ("GET", (method == "GET").then_some(Route::Page)),
            ("/status", _) => ("GET", (method == "GET").then_some(Route::Status)),
            ("/health", _) => ("GET", (method == "GET").then_some(Route::Health)),
            ("/metrics", _) => ("GET", (method == "GET").then_some(Route::Metrics)),
            ("/topics", _) => ("GET", (method == "GET").then_some(Route::ListTopics)),
            ("/cluster", _) => ("GET", (method == "GET").then_some(Route::Cluster)),
            ("/consume", _) => ("GET", (method == "GET").then_some(Route::Consume)),
            ("/produce", _) => ("POST", (method == "POST").then_some(Route::Produce)),
            ("/ack", _) => (
                "POST",
                (method == "POST").then_some(Route::Settle(Verb::Ack)),
            ),
            ("/nack", _) => (
                "POST",
                (method == "POST").then_some(Route::Settle(Verb::Nack)),
            ),
            ("/extend", _) => (
                "POST",
                (method == "POST").then_some(Route::Settle(Verb::Extend)),
            ),
            (_, Some(T::Topic(t))) => (
                "GET, PUT, PATCH, DELETE",
                match method {
                    "PUT" => Some(Route::CreateTopic(t)),
                    "PATCH" => Some(Route::ChangeTopic(t)),
                    "GET" => Some(Route::DescribeTopic(t)),
                    "DELETE" => Some(Route::DeleteTopic(t)),
                    _ => None,
                },
            ),
            (_, Some(T::Groups(t))) => ("GET", (method == "GET").then_some(Route::ListGroups(t))),
            (_, Some(T::Group(t, g))) => (
                "GET, PUT, DELETE",
                match method {
                    "PUT" => Some(Route::CreateGroup(t, g)),
                    "GET" => Some(Route::DescribeGroup(t, g)),
                    "DELETE" => Some(Route::DeleteGroup(t, g)),
                    _ => None,
                },
            ),
            (_, Some(T::Purge(t, g))) => (
                "POST",
                (method == "POST").then_some(Route::PurgeGroup(t, g)),
            ),
            (_, Some(T::Redrive(t))) => ("POST", (method == "POST").then_some(Route::Redrive(t))),
            (p, None) if p.starts_with("/cluster/nodes/") => {
                let rest = &p["/cluster/nodes/".len()..];
                match rest.split_once('/') {
                    Some((id, "drain")) if !id.is_empty() => (
                        "POST, DELETE",
                        match method {
                            "POST" => {
                                Some(Route::DrainNode(percent_decode(id), DrainAction::Drain))
                            }
                            "DELETE" => {
                                Some(Route::DrainNode(percent_decode(id), DrainAction::End))
                            }
                            _ => None,
                        },
                    ),
                    None if !rest.is_empty() => (
                        "DELETE",
                        (method == "DELETE")
                            .then(|| Route::DrainNode(percent_decode(rest), DrainAction::Remove)),
                    ),
                    _ => {
                        return Err(Response::error(
                            404,
                            "not_found",
                            &format!("no route for {path}"),
                        ))
                    }
                }
            }
            _ => {
                return Err(Response::error(
                    404,
                    "not_found",
                    &format!("no route for {path}"),
                ))
            }
        };
        route.ok_or_else(|| {
            Response::error(
                405,
                "method_not_allowed",
                &format!("{path} allows {allowed}"),
            )
            .with_header("allow", allowed)
        })
    }
}

/// The answer, and for an error that says a topic or group is missing, whether to look it up and run the request
/// again (`status::lookup_first`).
async fn handle_once(front: &Rc<Front>, req: &mut Request) -> (Response, Option<bool>) {
    let route = match Route::of(req.method, &req.path) {
        Ok(route) => route,
        Err(refused) => return (refused, None),
    };
    if let Some(refused) = refuse(front, req) {
        return (refused, None);
    }
    let query = std::mem::take(&mut req.query);
    let limits = batch_limits(front);
    // The data path is awaited in place; administration is boxed, so a connection's future stays as small as
    // the data path needs (moving a future copies all of it).
    let result = match route {
        Route::Health => Ok(health(front)),
        Route::Produce => {
            produce(
                front,
                &query,
                ops::produce::ProduceHeaders {
                    content_type: req.content_type.as_deref(),
                    attributes: req.attributes.as_deref(),
                    now_wall_ms: &|| front.engine().clock().wall_ms(),
                },
                std::mem::take(&mut req.body),
                &limits,
            )
            .await
        }
        Route::Consume => consume(front, &query, req.accept.as_deref(), &limits).await,
        Route::Settle(verb) => settle(front, verb, &query, &req.body, &limits).await,
        admin_route => Box::pin(admin(front, admin_route, &query)).await,
    };
    match result {
        Ok(response) => (response, None),
        Err(e) => (error_response(&e), lookup_first(&e)),
    }
}

/// The routes off the data path: metrics, listings and topic and group administration.
async fn admin(front: &Front, route: Route, query: &Query) -> OpResult<Response> {
    match route {
        Route::Page => Ok(Response::bytes(
            200,
            "text/html; charset=utf-8",
            Bytes::from_static(PAGE.as_bytes()),
        )
        .with_header("cache-control", "no-store")
        .with_header("content-security-policy", page_policy())),
        Route::Status => status(front).await,
        Route::Metrics => metrics(front).await,
        Route::ListTopics => Ok(Response::json(200, &json!(front.engine().topic_names()))),
        Route::Cluster => Ok(Response::json(200, &front.cluster())),
        Route::CreateTopic(t) => create_topic(front, &t, query).await,
        Route::ChangeTopic(t) => change_topic(front, &t, query).await,
        Route::DescribeTopic(t) => describe_topic(front, &t).await,
        Route::DeleteTopic(t) => delete_topic(front, &t).await,
        Route::ListGroups(t) => list_groups(front, &t).await,
        Route::CreateGroup(t, g) => create_group(front, &t, &g, query).await,
        Route::DescribeGroup(t, g) => describe_group(front, &t, &g).await,
        Route::DeleteGroup(t, g) => delete_group(front, &t, &g).await,
        Route::PurgeGroup(t, g) => purge_group(front, &t, &g).await,
        Route::Redrive(t) => redrive(front, &t, query).await,
        Route::DrainNode(id, action) => drain_node(front, id, action).await,
        Route::Health | Route::Produce | Route::Consume | Route::Settle(_) => {
            unreachable!("data-path routes are served in place")
        }
    }
}

/// A request whose body is still to come, checked on its head alone (`http::conn`): what `refuse` refuses, and with
/// a token configured, any body without the token, `/health` included (it is open, but a body is not waited for
/// on anyone's behalf but an authenticated client's).
pub(crate) fn refuse_body(front: &Front, head: &Request) -> Option<Response> {
    if crate::sqs::is_sqs_request(head) && !front.engine().config().sqs_credentials.is_empty() {
        // A credential of a known key is required now; its SigV4 signature covers the body, checked once the body
        // is read (`sqs::handle`).
        return crate::sqs::refuse_head(head, &front.engine().config().sqs_credentials);
    }
    if let Some(refusal) = refuse(front, head) {
        return Some(refusal);
    }
    let token = front.engine().config().auth_token.as_deref()?;
    (!authorized(token, head.authorization.as_deref())).then(unauthorized)
}

/// `401` for a missing or wrong token; the connection closes.
fn unauthorized() -> Response {
    Response::error(401, "unauthorized", "missing or wrong bearer token")
        .with_header("www-authenticate", "Bearer")
        .closing()
}

/// The checks before any operation: the bearer token when one is configured; without one, only loopback (or
/// configured) host names and no cross-origin browser requests, so a web page cannot reach the broker through DNS
/// rebinding. A refusal closes the connection.
pub(crate) fn refuse(front: &Front, req: &Request) -> Option<Response> {
    let config = front.engine().config();
    match &config.auth_token {
        Some(token) => {
            // `/health` and the page (which holds no data: it asks for the token, then reads `/status` with it)
            // are open.
            let open = req.path == "/health" || (req.path == "/" && req.method == "GET");
            if !open && !authorized(token, req.authorization.as_deref()) {
                return Some(unauthorized());
            }
        }
        None => {
            if let Some(host) = req.host.as_deref() {
                // An address is not a name a rebinding page can use; names must be loopback or configured.
                let name = host_name(host);
                // The common loopback spellings first: parsing an address costs more than the request's routing.
                let loopback = name == "127.0.0.1" || name.eq_ignore_ascii_case("localhost");
                if !loopback
                    && name.parse::<std::net::IpAddr>().is_err()
                    && !host_allowed(name, &config.allowed_hosts)
                {
                    return Some(
                        Response::error(
                            403,
                            "host_not_allowed",
                            "the Host header names a host this server does not answer for without a token (allowed_hosts)",
                        )
                        .closing(),
                    );
                }
            }
            if let Some(origin) = req.origin.as_deref() {
                let host = origin.split_once("://").map_or("", |(_, rest)| rest);
                if !host_allowed(host_name(host), &config.allowed_hosts) {
                    return Some(
                        Response::error(
                            403,
                            "cross_origin_refused",
                            "cross-origin browser requests are refused without a token",
                        )
                        .closing(),
                    );
                }
            }
        }
    }
    None
}

/// The routes under `/topics/`: a topic, its groups, one group, its redrive. Names are percent-decoded (and
/// validated by the operation: a decoded `/` is an invalid name, never another path).
enum TopicRoute {
    Topic(String),
    Groups(String),
    Group(String, String),
    Purge(String, String),
    Redrive(String),
}

impl TopicRoute {
    fn of(path: &str) -> Option<TopicRoute> {
        let rest = path.strip_prefix("/topics/")?;
        let parts: Vec<&str> = rest.split('/').collect();
        Some(match parts.as_slice() {
            [t] if !t.is_empty() => TopicRoute::Topic(percent_decode(t)),
            [t, "groups"] if !t.is_empty() => TopicRoute::Groups(percent_decode(t)),
            [t, "groups", g] if !t.is_empty() && !g.is_empty() => {
                TopicRoute::Group(percent_decode(t), percent_decode(g))
            }
            [t, "groups", g, "purge"] if !t.is_empty() && !g.is_empty() => {
                TopicRoute::Purge(percent_decode(t), percent_decode(g))
            }
            [t, "redrive"] if !t.is_empty() => TopicRoute::Redrive(percent_decode(t)),
            // Any other shape is a topic name with a slash in it: refused by name validation (400), not a 404.
            _ if !rest.is_empty() => TopicRoute::Topic(percent_decode(rest)),
            _ => return None,
        })
    }
}

/// `Authorization: Bearer TOKEN`, compared in constant time over SHA-256 digests, so neither the content nor the
/// length of the token leaks through timing.
fn authorized(token: &str, header: Option<&str>) -> bool {
    use sha2::{Digest, Sha256};
    use subtle::ConstantTimeEq;
    let presented = header
        .and_then(|h| h.strip_prefix("Bearer "))
        .map(str::trim)
        .unwrap_or("");
    let want = Sha256::digest(token.as_bytes());
    let got = Sha256::digest(presented.as_bytes());
    let equal: bool = want.ct_eq(&got).into();
    equal && header.is_some()
}

/// The host name of a `Host` header or an origin's authority: the port and IPv6 brackets removed.
fn host_name(authority: &str) -> &str {
    // Bytes, not chars: read on every request, and `:`, `[`, `]` are ASCII (a cut next to one is a char boundary).
    // Only ASCII spaces are trimmed: a name with another space left on it matches no allowed name.
    let authority = authority.trim_ascii();
    if let Some(rest) = authority.strip_prefix('[') {
        return rest.split(']').next().unwrap_or("");
    }
    match authority.bytes().rposition(|b| b == b':') {
        Some(colon)
            if authority.as_bytes()[colon + 1..]
                .iter()
                .all(u8::is_ascii_digit) =>
        {
            &authority[..colon]
        }
        _ => authority,
    }
}

/// Loopback names and addresses, and the configured `allowed_hosts`.
fn host_allowed(host: &str, allowed: &[String]) -> bool {
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
        || allowed.iter().any(|a| a.eq_ignore_ascii_case(host))
}

fn percent_decode(text: &str) -> String {
    form_urlencoded::parse(format!("n={text}").as_bytes())
        .next()
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default()
}

fn health(front: &Front) -> Response {
    let engine = front.engine();
    let ready = engine
        .shared()
        .ready
        .load(std::sync::atomic::Ordering::Acquire);
    if ready >= engine.cores() && !engine.is_stopping() {
        Response::json(200, &json!({"status": "ok", "cores": engine.cores()}))
    } else {
        Response::error(
            503,
            "not_ready",
            &format!("{ready} of {} cores serving", engine.cores()),
        )
    }
}

/// The status page: self-contained (inline style and script, no external assets), it reads `/status` each second.
const PAGE: &str = include_str!("page.html");

/// The page's Content-Security-Policy: its one inline script by hash (nothing else may run, should some text ever
/// slip through its escaping), its inline style, requests to this origin only.
fn page_policy() -> &'static str {
    static POLICY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    POLICY.get_or_init(|| {
        use base64::Engine as _;
        use sha2::{Digest, Sha256};
        let script = PAGE
            .split_once("<script>")
            .and_then(|(_, rest)| rest.split_once("</script>"))
            .map_or("", |(script, _)| script);
        let hash = base64::engine::general_purpose::STANDARD.encode(Sha256::digest(script));
        format!(
            "default-src 'none'; script-src 'sha256-{hash}'; style-src 'unsafe-inline'; img-src data:; \
             connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
        )
    })
}

async fn status(front: &Front) -> OpResult<Response> {
    let stats = front.stats().await?;
    let engine = front.engine();
    let node = ops::overview::Node::new(engine.config(), front.cluster(), engine.clustered());
    Ok(Response::json(200, &ops::overview::render(&node, &stats)))
}

async fn metrics(front: &Front) -> OpResult<Response> {
    let stats = front.stats().await?;
    let text = crate::engine::metrics::render(&stats);
    Ok(Response::bytes(
        200,
        "text/plain; version=0.0.4",
        text.into(),
    ))
}

// ---- Each route's handler: parse (`ops::<op>::parse`), run (`Front`), render (`ops::<op>::render`) ----

/// `POST /cluster/nodes/ID/drain`, `DELETE /cluster/nodes/ID`: `202`, the moves under way (`GET /cluster` shows
/// them: the node's `leads` and `follows` fall to 0). `DELETE /cluster/nodes/ID/drain`: `200`.
async fn drain_node(front: &Front, id: String, action: DrainAction) -> OpResult<Response> {
    validate_name(&id).map_err(|e| ops::OpError::InvalidParameter(format!("node id: {e}")))?;
    let engine = front.engine();
    let preview = engine
        .config()
        .cluster
        .as_ref()
        .is_some_and(|c| c.replication_preview);
    if !preview {
        return Err(ops::OpError::InvalidParameter(
            "moving a node's replicas needs a cluster started with --replication-preview".into(),
        ));
    }
    front
        .router()
        .call(
            front.router().core(0),
            ops::Request::DrainNode(id.clone(), action),
        )
        .await?;
    Ok(match action {
        DrainAction::End => Response::json(200, &json!({"node": id, "draining": false})),
        _ => Response::json(
            202,
            &json!({"node": id, "draining": true, "removed": action == DrainAction::Remove}),
        ),
    })
}

async fn create_topic(front: &Front, name: &str, query: &Query) -> OpResult<Response> {
    validate_name(name)?;
    let settings = ops::topics::parse_settings(query)?;
    let (created, config) = front.create_topic(settings.new_topic(name)).await?;
    Ok(ops::topics::render_created(created, &config))
}

async fn change_topic(front: &Front, name: &str, query: &Query) -> OpResult<Response> {
    validate_name(name)?;
    let settings = ops::topics::parse_settings(query)?;
    let config = front.change_topic(name.to_string(), settings).await?;
    Ok(ops::topics::render_changed(&config))
}

async fn describe_topic(front: &Front, name: &str) -> OpResult<Response> {
    validate_name(name)?;
    let (config, partitions) = front.describe_topic(name).await?;
    let engine = front.engine();
    let topic = engine.topic(name).ok().filter(|_| engine.clustered());
    let node_of = |partition: u32| {
        let node = topic.as_ref()?.location(partition).node;
        Some(engine.node_id(node).unwrap_or_else(|| node.to_string()))
    };
    let holders = front.holders(name).await?;
    let id_of = |node: NodeIndex| match engine.clustered() {
        true => engine.node_id(node).unwrap_or_else(|| node.to_string()),
        false => "local".to_string(),
    };
    let holders_of = |partition: u32| {
        let s = holders.get(partition as usize)?;
        Some(ops::topics::Holders {
            replicas: s.replicas.iter().map(|&n| id_of(n)).collect(),
            leader: id_of(s.leader),
            epoch: s.epoch,
            learners: s.learners.iter().map(|&n| id_of(n)).collect(),
        })
    };
    Ok(ops::topics::render_described(
        &config,
        &partitions,
        node_of,
        holders_of,
        id_of,
    ))
}

async fn delete_topic(front: &Front, name: &str) -> OpResult<Response> {
    validate_name(name)?;
    front.delete_topic(name.to_string()).await?;
    Ok(Response::empty(204))
}

async fn list_groups(front: &Front, name: &str) -> OpResult<Response> {
    validate_name(name)?;
    let (config, partitions) = front.describe_topic(name).await?;
    Ok(Response::json(
        200,
        &ops::groups::groups_json(&config, &partitions),
    ))
}

async fn describe_group(front: &Front, name: &str, group: &str) -> OpResult<Response> {
    validate_name(name)?;
    validate_name(group)?;
    let (config, partitions) = front.describe_topic(name).await?;
    if !config.has_group(group) {
        return Err(crate::engine::EngineError::GroupNotFound {
            topic: name.to_string(),
            group: group.to_string(),
        }
        .into());
    }
    Ok(Response::json(
        200,
        &ops::groups::group_json(group, &partitions),
    ))
}

async fn create_group(front: &Front, name: &str, group: &str, query: &Query) -> OpResult<Response> {
    validate_name(name)?;
    validate_name(group)?;
    let latest = ops::groups::parse_start(query)?;
    let created = front
        .create_group(name.to_string(), group.to_string(), latest)
        .await?;
    Ok(ops::groups::render_created(name, group, created))
}

async fn delete_group(front: &Front, name: &str, group: &str) -> OpResult<Response> {
    validate_name(name)?;
    validate_name(group)?;
    front
        .delete_group(name.to_string(), group.to_string())
        .await?;
    Ok(Response::empty(204))
}

async fn purge_group(front: &Front, name: &str, group: &str) -> OpResult<Response> {
    validate_name(name)?;
    validate_name(group)?;
    let purged = front.purge_group(name, group).await?;
    Ok(ops::groups::render_purged(name, group, purged))
}

async fn redrive(front: &Front, name: &str, query: &Query) -> OpResult<Response> {
    let params = ops::redrive::parse(name, query)?;
    let moved = front.redrive(params).await?;
    Ok(ops::redrive::render(moved))
}

async fn produce(
    front: &Front,
    query: &Query,
    headers: ops::produce::ProduceHeaders<'_>,
    body: Bytes,
    limits: &BatchLimits,
) -> OpResult<Response> {
    let params = ops::produce::parse(query, headers, body, limits)?;
    let batch = params.batch;
    let results = front.produce_from_client(params).await?;
    ops::produce::render(batch, results)
}

async fn consume(
    front: &Front,
    query: &Query,
    accept: Option<&str>,
    limits: &BatchLimits,
) -> OpResult<Response> {
    match ops::consume::parse(query, accept, limits)? {
        ConsumeRequest::Replay(params) => {
            let partition = params.partition;
            let record = front.replay(params).await?;
            Ok(ops::replay::render(partition, record))
        }
        ConsumeRequest::Queue(params) => {
            let media = params.media;
            let parked_us = std::cell::Cell::new(0);
            let deliveries = front.consume_parked(params, &parked_us).await?;
            let mut response = ops::consume::render(media, deliveries);
            response.parked_us = parked_us.get();
            Ok(response)
        }
    }
}

async fn settle(
    front: &Front,
    verb: Verb,
    query: &Query,
    body: &[u8],
    limits: &BatchLimits,
) -> OpResult<Response> {
    let params = ops::settle::parse(verb, query, body, limits)?;
    let batch = params.batch;
    // The handles' text is needed for a batch's answer only.
    let handles: Vec<String> = if batch {
        params.handles.iter().map(|(h, _)| h.clone()).collect()
    } else {
        Vec::new()
    };
    let results = front.settle(params).await?;
    ops::settle::render(batch, &handles, results)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_names_lose_port_and_brackets_and_only_loopback_or_configured_names_pass() {
        assert_eq!(host_name("localhost:7070"), "localhost");
        assert_eq!(host_name("[::1]:7070"), "::1");
        assert_eq!(host_name("127.0.0.1"), "127.0.0.1");
        assert_eq!(host_name("broker.internal:80"), "broker.internal");
        // A port that is not digits is part of the name (refused below); spaces around it go; the last colon cuts.
        assert_eq!(host_name("evil.example:x80"), "evil.example:x80");
        assert_eq!(host_name(" localhost:7070 "), "localhost");
        assert_eq!(host_name("localhost:"), "localhost");
        assert_eq!(host_name("a:b:80"), "a:b");
        assert_eq!(host_name("localhost\u{a0}:80"), "localhost\u{a0}");
        assert!(!host_allowed(host_name("localhost\u{a0}"), &[]));
        let allowed = vec!["broker.internal".to_string()];
        for ok in [
            "localhost",
            "LOCALHOST",
            "127.0.0.1",
            "127.1.2.3",
            "::1",
            "broker.internal",
        ] {
            assert!(host_allowed(ok, &allowed), "{ok}");
        }
        for bad in ["evil.example", "localhost.evil.example", "10.0.0.1", ""] {
            assert!(!host_allowed(bad, &allowed), "{bad}");
        }
    }

    #[test]
    fn bearer_tokens_must_match_exactly() {
        let token = "0123456789abcdef";
        assert!(authorized(token, Some("Bearer 0123456789abcdef")));
        for bad in [
            None,
            Some(""),
            Some("Bearer "),
            Some("Bearer 0123456789abcde"),
            Some("Basic 0123456789abcdef"),
            Some("Bearer 0123456789abcdefX"),
        ] {
            assert!(!authorized(token, bad), "{bad:?}");
        }
    }

    /// The future a connection's task holds for every request, and moves (copies) at each level of its path: the
    /// cluster's retry and the SQS face are boxed, so it is not much larger than one `handle_once`; and a
    /// consume's dead-letter diversion is boxed where it is used, so it is not held in place either.
    #[test]
    fn a_requests_future_holds_one_handle_once_and_no_diversion() {
        fn size<'a, T: 'a, A, Fut: std::future::Future>(_: impl Fn(&'a T, A) -> Fut) -> usize {
            std::mem::size_of::<Fut>()
        }
        let once = size(handle_once);
        let whole = size(handle);
        // `handle` holds one `handle_once` and its request (twice: the argument, and where it is moved from; the
        // compiler lays out both), little more.
        assert!(
            whole <= once + 2 * std::mem::size_of::<Request>() + 64,
            "routes::handle's future is {whole} bytes against {once} for handle_once"
        );
        fn size3<'a, T: 'a, A, B, Fut: std::future::Future>(
            _: impl Fn(&'a T, A, B) -> Fut,
        ) -> usize {
            std::mem::size_of::<Fut>()
        }
        let consume = size3(Front::consume_parked);
        let settle = size(Front::settle);
        assert!(
            consume <= settle + 768,
            "a consume's future is {consume} bytes against {settle} for a settle's"
        );
    }
}
