//! An etcd v3 client over etcd's JSON gRPC-gateway (HTTP/1.1, `POST /v3/...`), for the cluster metastore.
//!
//! Wire facts this relies on (checked against etcd 3.4.23):
//! - Keys and values are base64 in JSON; int64 fields (revisions, lease ids, TTLs, counts) come back as JSON
//!   strings. Fields at their default value are left out (`kvs` when empty, `succeeded` when false, `lease` when 0,
//!   an event's `type` when `PUT`); this client reads a missing field as its default.
//! - Errors are a non-2xx status with `{"error": "...", "message": "...", "code": N}` (gRPC code); on streams a
//!   failure arrives as `{"error": {"grpc_code": N, "message": "..."}}`.
//! - `/v3/watch` answers with a chunked body that never ends on its own: one `{"result": {...}}` object per chunk,
//!   each followed by a newline. The first has `"created": true`; when the start revision was compacted the next is
//!   `{"result": {"canceled": true, "compact_revision": "C"}}`.
//! - `/v3/lease/keepalive` answers one `{"result": {"ID", "TTL"}}` per request object in the request body and ends
//!   the response when the request body ends; a lease that does not exist (expired or revoked) comes back with no
//!   `TTL` (that is, 0). A long-lived keepalive over one connection would need a streamed (chunked) request body,
//!   which the 3.4 gateway does not answer until the body ends, so this client refreshes with one short request per
//!   keepalive ([`Etcd::lease_keepalive_once`]).
//!
//! Endpoints are tried in order starting from the last one that worked. A call moves to the next endpoint when
//! the connection cannot be made (the request was never sent). Reads, keepalives and watches also move on when the
//! connection breaks mid-request or the member answers "unavailable" (gRPC code 14); writes do not, because their
//! outcome is then unknown: they fail with [`EtcdError::Transport`] and the caller decides.

use super::http_client::{excerpt, within, HttpClient, HttpConfig, HttpError, JsonStream};
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
use base64::Engine;
use serde_json::{json, Map, Value};
use std::cell::Cell;
use std::fmt;

/// gRPC status code NOT_FOUND, which etcd uses for "requested lease not found".
const GRPC_NOT_FOUND: i64 = 5;
/// gRPC status code UNAVAILABLE (no leader, member stopping, ...).
const GRPC_UNAVAILABLE: i64 = 14;

/// One key-value pair as etcd stores it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct KeyValue {
    pub key: Vec<u8>,
    pub value: Vec<u8>,
    pub create_revision: i64,
    pub mod_revision: i64,
    pub version: i64,
    /// Lease id the key is attached to, 0 if none.
    pub lease: i64,
}

/// The answer to a range (get) request.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RangeResponse {
    /// Store revision at which the range was read (header revision).
    pub revision: i64,
    pub kvs: Vec<KeyValue>,
    /// Number of keys in the range.
    pub count: i64,
    /// More keys exist than were returned (only with a limit; this client sets none).
    pub more: bool,
}

/// The answer to a delete.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DeleteResponse {
    pub revision: i64,
    pub deleted: i64,
}

/// What a transaction compare looks at, with the operand.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CompareTarget {
    /// Number of modifications since creation (0 = absent).
    Version(i64),
    /// Revision of the key's creation (0 = absent).
    CreateRevision(i64),
    /// Revision of the key's last modification.
    ModRevision(i64),
    Value(Vec<u8>),
    Lease(i64),
}

/// The comparison of a transaction compare.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompareOp {
    Equal,
    Greater,
    Less,
    NotEqual,
}

/// One condition of a transaction: `target(key) op operand`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compare {
    pub key: Vec<u8>,
    pub op: CompareOp,
    pub target: CompareTarget,
}

impl Compare {
    pub fn new(key: impl Into<Vec<u8>>, op: CompareOp, target: CompareTarget) -> Compare {
        Compare {
            key: key.into(),
            op,
            target,
        }
    }

    /// The key does not exist ("create only if absent").
    pub fn absent(key: impl Into<Vec<u8>>) -> Compare {
        Compare::new(key, CompareOp::Equal, CompareTarget::CreateRevision(0))
    }

    /// The key was last modified at `revision` ("update only if unchanged since read").
    pub fn mod_revision_is(key: impl Into<Vec<u8>>, revision: i64) -> Compare {
        Compare::new(key, CompareOp::Equal, CompareTarget::ModRevision(revision))
    }

    /// The key holds `value`.
    pub fn value_is(key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) -> Compare {
        Compare::new(key, CompareOp::Equal, CompareTarget::Value(value.into()))
    }

    /// The key's version is `version`.
    pub fn version_is(key: impl Into<Vec<u8>>, version: i64) -> Compare {
        Compare::new(key, CompareOp::Equal, CompareTarget::Version(version))
    }

    fn to_json(&self) -> Value {
        let mut m = Map::new();
        m.insert("key".into(), b64(&self.key));
        let op = match self.op {
            CompareOp::Equal => "EQUAL",
            CompareOp::Greater => "GREATER",
            CompareOp::Less => "LESS",
            CompareOp::NotEqual => "NOT_EQUAL",
        };
        m.insert("result".into(), op.into());
        let (target, field, operand) = match &self.target {
            CompareTarget::Version(v) => ("VERSION", "version", int_json(*v)),
            CompareTarget::CreateRevision(v) => ("CREATE", "create_revision", int_json(*v)),
            CompareTarget::ModRevision(v) => ("MOD", "mod_revision", int_json(*v)),
            CompareTarget::Value(v) => ("VALUE", "value", b64(v)),
            CompareTarget::Lease(v) => ("LEASE", "lease", int_json(*v)),
        };
        m.insert("target".into(), target.into());
        m.insert(field.into(), operand);
        Value::Object(m)
    }
}

/// One operation of a transaction branch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TxnOp {
    Put {
        key: Vec<u8>,
        value: Vec<u8>,
        lease: Option<i64>,
    },
    Range {
        key: Vec<u8>,
        range_end: Option<Vec<u8>>,
    },
    Delete {
        key: Vec<u8>,
        range_end: Option<Vec<u8>>,
    },
}

impl TxnOp {
    pub fn put(key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>, lease: Option<i64>) -> TxnOp {
        TxnOp::Put {
            key: key.into(),
            value: value.into(),
            lease,
        }
    }

    pub fn get(key: impl Into<Vec<u8>>) -> TxnOp {
        TxnOp::Range {
            key: key.into(),
            range_end: None,
        }
    }

    pub fn delete(key: impl Into<Vec<u8>>) -> TxnOp {
        TxnOp::Delete {
            key: key.into(),
            range_end: None,
        }
    }

    fn to_json(&self) -> Value {
        match self {
            TxnOp::Put { key, value, lease } => {
                json!({ "request_put": put_json(key, value, *lease) })
            }
            TxnOp::Range { key, range_end } => {
                json!({ "request_range": range_json(key, range_end.as_deref()) })
            }
            TxnOp::Delete { key, range_end } => {
                json!({ "request_delete_range": range_json(key, range_end.as_deref()) })
            }
        }
    }
}

/// The result of one transaction operation, in the order of the branch that ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TxnOpResponse {
    Put { revision: i64 },
    Range(RangeResponse),
    Delete(DeleteResponse),
}

/// The answer to a transaction.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TxnResponse {
    pub revision: i64,
    /// The compares held and the success branch ran (else the failure branch ran).
    pub succeeded: bool,
    pub responses: Vec<TxnOpResponse>,
}

/// What happened to a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    Put,
    Delete,
}

/// One change seen by a watch. For a delete, `kv` carries the key and `mod_revision` (the deletion revision) only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub kind: EventKind,
    pub kv: KeyValue,
}

impl Event {
    /// The revision of this change.
    pub fn revision(&self) -> i64 {
        self.kv.mod_revision
    }
}

/// The events of one watch message, in revision order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchBatch {
    /// Header revision of the message: the store revision when it was sent (at least the last event's).
    pub revision: i64,
    pub events: Vec<Event>,
}

/// Everything an etcd call can fail with.
#[derive(Debug)]
pub enum EtcdError {
    /// The endpoint list or an argument is unusable.
    Config(String),
    /// No endpoint could be reached: each endpoint with its error. Nothing was applied.
    Unavailable(Vec<(String, HttpError)>),
    /// The connection to `endpoint` failed or timed out after the request was sent: a write may or may not have
    /// been applied; a watch stream is broken (re-read and re-watch).
    Transport { endpoint: String, error: HttpError },
    /// etcd refused the request (gRPC status code and message, as relayed by the gateway).
    Server {
        code: i64,
        message: String,
        http_status: u16,
    },
    /// A non-2xx answer that is not an etcd error body (e.g. a proxy, or an unknown path).
    Http { status: u16, body: String },
    /// The answer did not have the expected shape.
    Decode(String),
    /// A watch's start revision was compacted away: re-read with `range` and re-watch from its revision + 1.
    Compacted { compact_revision: i64 },
    /// etcd canceled the watch for another reason.
    WatchCanceled(String),
    /// The watch stream ended (or was already broken by an earlier error).
    WatchClosed,
    /// The lease does not exist (expired or revoked).
    LeaseNotFound(i64),
}

impl fmt::Display for EtcdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EtcdError::Config(s) => write!(f, "etcd client configuration: {s}"),
            EtcdError::Unavailable(errs) => {
                write!(f, "no etcd endpoint reachable")?;
                for (ep, e) in errs {
                    write!(f, "; {ep}: {e}")?;
                }
                Ok(())
            }
            EtcdError::Transport { endpoint, error } => write!(f, "etcd {endpoint}: {error}"),
            EtcdError::Server {
                code,
                message,
                http_status,
            } => write!(f, "etcd error (code {code}, http {http_status}): {message}"),
            EtcdError::Http { status, body } => write!(f, "etcd gateway http {status}: {body}"),
            EtcdError::Decode(s) => write!(f, "unexpected etcd answer: {s}"),
            EtcdError::Compacted { compact_revision } => write!(
                f,
                "watch start revision compacted (compact revision {compact_revision})"
            ),
            EtcdError::WatchCanceled(s) => write!(f, "watch canceled by etcd: {s}"),
            EtcdError::WatchClosed => write!(f, "watch stream closed"),
            EtcdError::LeaseNotFound(id) => write!(f, "lease {id:x} not found"),
        }
    }
}

impl std::error::Error for EtcdError {}

impl EtcdError {
    /// Worth trying another endpoint for a request that may be repeated.
    fn retryable_elsewhere(&self) -> bool {
        matches!(self, EtcdError::Server { code, .. } if *code == GRPC_UNAVAILABLE)
    }

    fn lease_not_found(self, id: i64) -> EtcdError {
        match self {
            EtcdError::Server { code, message, .. }
                if code == GRPC_NOT_FOUND && message.contains("lease not found") =>
            {
                EtcdError::LeaseNotFound(id)
            }
            other => other,
        }
    }
}

type Result<T> = std::result::Result<T, EtcdError>;

/// The end of the key range holding every key that starts with `prefix` (etcd's `WithPrefix`).
pub fn prefix_range_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0] // "\0": every key from `key` on
}

/// `(key, range_end)` selecting every key under `prefix` (the empty prefix selects everything).
fn prefix_range(prefix: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let key = if prefix.is_empty() {
        vec![0]
    } else {
        prefix.to_vec()
    };
    (key, prefix_range_end(prefix))
}

fn b64(bytes: &[u8]) -> Value {
    Value::String(STANDARD.encode(bytes))
}

fn int_json(v: i64) -> Value {
    Value::String(v.to_string())
}

fn range_json(key: &[u8], range_end: Option<&[u8]>) -> Value {
    let mut m = Map::new();
    m.insert("key".into(), b64(key));
    if let Some(end) = range_end {
        m.insert("range_end".into(), b64(end));
    }
    Value::Object(m)
}

fn put_json(key: &[u8], value: &[u8], lease: Option<i64>) -> Value {
    let mut m = Map::new();
    m.insert("key".into(), b64(key));
    m.insert("value".into(), b64(value));
    if let Some(id) = lease {
        m.insert("lease".into(), int_json(id));
    }
    Value::Object(m)
}

// ---- decoding: lenient about representation (string or number), strict about type ----

fn decode_err(what: &str, v: &Value) -> EtcdError {
    let text = v.to_string();
    EtcdError::Decode(format!("{what}: {}", excerpt(text.as_bytes())))
}

fn field<'a>(v: &'a Value, name: &str) -> Option<&'a Value> {
    v.get(name).filter(|x| !x.is_null())
}

fn int(v: &Value, name: &str) -> Result<i64> {
    match field(v, name) {
        None => Ok(0),
        Some(Value::String(s)) => s
            .parse()
            .map_err(|_| decode_err(&format!("{name} is not an integer"), v)),
        Some(Value::Number(n)) => n
            .as_i64()
            .ok_or_else(|| decode_err(&format!("{name} is not an int64"), v)),
        Some(_) => Err(decode_err(&format!("{name} is not an integer"), v)),
    }
}

fn boolean(v: &Value, name: &str) -> Result<bool> {
    match field(v, name) {
        None => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(decode_err(&format!("{name} is not a boolean"), v)),
    }
}

fn bytes(v: &Value, name: &str) -> Result<Vec<u8>> {
    match field(v, name) {
        None => Ok(Vec::new()),
        Some(Value::String(s)) => [&STANDARD, &STANDARD_NO_PAD, &URL_SAFE, &URL_SAFE_NO_PAD]
            .iter()
            .find_map(|e| e.decode(s).ok())
            .ok_or_else(|| decode_err(&format!("{name} is not base64"), v)),
        Some(_) => Err(decode_err(&format!("{name} is not a string"), v)),
    }
}

fn text(v: &Value, name: &str) -> String {
    field(v, name)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

fn array<'a>(v: &'a Value, name: &str) -> Result<&'a [Value]> {
    match field(v, name) {
        None => Ok(&[]),
        Some(Value::Array(a)) => Ok(a),
        Some(_) => Err(decode_err(&format!("{name} is not an array"), v)),
    }
}

fn object<'a>(v: &'a Value, name: &str) -> Result<&'a Value> {
    match field(v, name) {
        Some(o @ Value::Object(_)) => Ok(o),
        _ => Err(decode_err(&format!("missing object {name}"), v)),
    }
}

fn header_revision(v: &Value) -> Result<i64> {
    match field(v, "header") {
        Some(h) => int(h, "revision"),
        None => Ok(0),
    }
}

fn parse_kv(v: &Value) -> Result<KeyValue> {
    if !v.is_object() {
        return Err(decode_err("key-value is not an object", v));
    }
    Ok(KeyValue {
        key: bytes(v, "key")?,
        value: bytes(v, "value")?,
        create_revision: int(v, "create_revision")?,
        mod_revision: int(v, "mod_revision")?,
        version: int(v, "version")?,
        lease: int(v, "lease")?,
    })
}

fn parse_range(v: &Value) -> Result<RangeResponse> {
    Ok(RangeResponse {
        revision: header_revision(v)?,
        kvs: array(v, "kvs")?
            .iter()
            .map(parse_kv)
            .collect::<Result<_>>()?,
        count: int(v, "count")?,
        more: boolean(v, "more")?,
    })
}

fn parse_delete(v: &Value) -> Result<DeleteResponse> {
    Ok(DeleteResponse {
        revision: header_revision(v)?,
        deleted: int(v, "deleted")?,
    })
}

fn parse_txn(v: &Value) -> Result<TxnResponse> {
    let mut responses = Vec::new();
    for r in array(v, "responses")? {
        let op = if let Some(p) = field(r, "response_put") {
            TxnOpResponse::Put {
                revision: header_revision(p)?,
            }
        } else if let Some(g) = field(r, "response_range") {
            TxnOpResponse::Range(parse_range(g)?)
        } else if let Some(d) = field(r, "response_delete_range") {
            TxnOpResponse::Delete(parse_delete(d)?)
        } else {
            return Err(decode_err("unknown txn response", r));
        };
        responses.push(op);
    }
    Ok(TxnResponse {
        revision: header_revision(v)?,
        succeeded: boolean(v, "succeeded")?,
        responses,
    })
}

fn parse_event(v: &Value) -> Result<Event> {
    let kind = match field(v, "type") {
        None => EventKind::Put,
        Some(Value::String(s)) if s == "PUT" => EventKind::Put,
        Some(Value::String(s)) if s == "DELETE" => EventKind::Delete,
        Some(Value::Number(n)) if n.as_i64() == Some(0) => EventKind::Put,
        Some(Value::Number(n)) if n.as_i64() == Some(1) => EventKind::Delete,
        Some(_) => return Err(decode_err("unknown event type", v)),
    };
    Ok(Event {
        kind,
        kv: parse_kv(object(v, "kv")?)?,
    })
}

/// An error carried in a body: unary `{"error": "...", "message": "...", "code": N}` or stream
/// `{"error": {"grpc_code": N, "message": "..."}}`.
fn body_error(v: &Value, http_status: u16) -> Option<EtcdError> {
    let err = field(v, "error")?;
    let (code, message) = match err {
        Value::Object(_) => (int(err, "grpc_code").unwrap_or(0), text(err, "message")),
        Value::String(s) => {
            let m = text(v, "message");
            (
                int(v, "code").unwrap_or(0),
                if m.is_empty() { s.clone() } else { m },
            )
        }
        _ => (0, err.to_string()),
    };
    Some(EtcdError::Server {
        code,
        message,
        http_status,
    })
}

fn decode_json(body: &[u8]) -> Result<Value> {
    serde_json::from_slice(body)
        .map_err(|e| EtcdError::Decode(format!("{e} in {:?}", excerpt(body))))
}

/// Turns a whole gateway response into its JSON, or the error it carries.
fn decode_reply(status: u16, body: &[u8]) -> Result<Value> {
    if (200..300).contains(&status) {
        let v = decode_json(body)?;
        if let Some(Value::String(e)) = field(&v, "error") {
            // LeaseGrantResponse carries its failure this way.
            if !e.is_empty() {
                return Err(EtcdError::Server {
                    code: 0,
                    message: e.clone(),
                    http_status: status,
                });
            }
        }
        if !v.is_object() {
            return Err(decode_err("answer is not an object", &v));
        }
        return Ok(v);
    }
    match serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| body_error(&v, status))
    {
        Some(e) => Err(e),
        None => Err(EtcdError::Http {
            status,
            body: excerpt(body),
        }),
    }
}

/// A client for one etcd cluster. Use it from one executor (it is not `Send`); calls may run concurrently.
#[derive(Debug)]
pub struct Etcd {
    endpoints: Vec<HttpClient>,
    /// Index of the endpoint to try first: the last one that answered.
    current: Cell<usize>,
    config: HttpConfig,
}

impl Etcd {
    /// A client for `endpoints` (`http://host:port`), with default timeouts and limits. Connects lazily.
    pub fn new(endpoints: Vec<String>) -> Result<Etcd> {
        Etcd::with_config(endpoints, HttpConfig::default())
    }

    pub fn with_config(endpoints: Vec<String>, config: HttpConfig) -> Result<Etcd> {
        if endpoints.is_empty() {
            return Err(EtcdError::Config("no endpoints".into()));
        }
        let endpoints = endpoints
            .iter()
            .map(|e| {
                HttpClient::new(e, config.clone()).map_err(|err| EtcdError::Config(err.to_string()))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Etcd {
            endpoints,
            current: Cell::new(0),
            config,
        })
    }

    /// The endpoint URLs, in configured order.
    pub fn endpoints(&self) -> Vec<&str> {
        self.endpoints.iter().map(HttpClient::base_url).collect()
    }

    /// The endpoint the next call tries first.
    pub fn current_endpoint(&self) -> &str {
        self.endpoints[self.current.get() % self.endpoints.len()].base_url()
    }

    /// One request/response call with failover.
    async fn call(&self, path: &str, body: Value, idempotent: bool) -> Result<Value> {
        let bytes = body.to_string().into_bytes();
        let n = self.endpoints.len();
        let start = self.current.get();
        let mut failures = Vec::new();
        for i in 0..n {
            let idx = (start + i) % n;
            let ep = &self.endpoints[idx];
            match ep.post_json(path, &bytes).await {
                Ok(resp) => match decode_reply(resp.status, &resp.body) {
                    Err(e) if idempotent && e.retryable_elsewhere() && i + 1 < n => {
                        failures.push((
                            ep.base_url().to_string(),
                            HttpError::Status {
                                status: resp.status,
                                body: resp.body,
                            },
                        ));
                    }
                    result => {
                        self.current.set(idx);
                        return result;
                    }
                },
                Err(e) if e.is_connect() || idempotent => {
                    failures.push((ep.base_url().to_string(), e));
                }
                Err(error) => {
                    return Err(EtcdError::Transport {
                        endpoint: ep.base_url().to_string(),
                        error,
                    })
                }
            }
        }
        Err(EtcdError::Unavailable(failures))
    }

    /// Opens a streaming call with failover, and reads its first message (within the request timeout).
    async fn open_stream(&self, path: &str, body: Value) -> Result<(JsonStream, Value, String)> {
        let bytes = body.to_string().into_bytes();
        let n = self.endpoints.len();
        let start = self.current.get();
        let mut failures = Vec::new();
        for i in 0..n {
            let idx = (start + i) % n;
            let ep = &self.endpoints[idx];
            let endpoint = ep.base_url().to_string();
            let timeout = self.config.request_timeout;
            let attempt = within(timeout, async {
                let mut stream = ep.post_stream(path, &bytes).await?;
                let first = stream.next().await?;
                Ok::<_, HttpError>((stream, first))
            })
            .await
            .unwrap_or(Err(HttpError::Timeout(timeout)));
            match attempt {
                Ok((stream, Some(first))) => {
                    let v = decode_json(&first)?;
                    if let Some(e) = body_error(&v, 200) {
                        if e.retryable_elsewhere() && i + 1 < n {
                            failures.push((endpoint, HttpError::Closed));
                            continue;
                        }
                        return Err(e);
                    }
                    self.current.set(idx);
                    return Ok((stream, v, endpoint));
                }
                Ok((_, None)) => failures.push((endpoint, HttpError::Closed)),
                Err(HttpError::Status { status, body }) => {
                    let e = decode_reply(status, &body)
                        .err()
                        .unwrap_or(EtcdError::Http {
                            status,
                            body: excerpt(&body),
                        });
                    if e.retryable_elsewhere() && i + 1 < n {
                        failures.push((endpoint, HttpError::Status { status, body }));
                        continue;
                    }
                    return Err(e);
                }
                Err(e) => failures.push((endpoint, e)),
            }
        }
        Err(EtcdError::Unavailable(failures))
    }

    /// Keys in `[key, range_end)`, or just `key` when `range_end` is `None`.
    pub async fn range(&self, key: &[u8], range_end: Option<&[u8]>) -> Result<RangeResponse> {
        let v = self
            .call("/v3/kv/range", range_json(key, range_end), true)
            .await?;
        parse_range(&v)
    }

    /// Every key starting with `prefix`, in key order.
    pub async fn get_prefix(&self, prefix: &[u8]) -> Result<RangeResponse> {
        let (key, end) = prefix_range(prefix);
        self.range(&key, Some(&end)).await
    }

    /// Sets `key` to `value`, attached to `lease` if given. Returns the revision of the write.
    pub async fn put(&self, key: &[u8], value: &[u8], lease: Option<i64>) -> Result<i64> {
        let v = self
            .call("/v3/kv/put", put_json(key, value, lease), false)
            .await?;
        header_revision(&v)
    }

    /// Deletes `key`.
    pub async fn delete(&self, key: &[u8]) -> Result<DeleteResponse> {
        let v = self
            .call("/v3/kv/deleterange", range_json(key, None), false)
            .await?;
        parse_delete(&v)
    }

    /// Deletes every key starting with `prefix`.
    pub async fn delete_prefix(&self, prefix: &[u8]) -> Result<DeleteResponse> {
        let (key, end) = prefix_range(prefix);
        let v = self
            .call("/v3/kv/deleterange", range_json(&key, Some(&end)), false)
            .await?;
        parse_delete(&v)
    }

    /// Runs `success` if every compare holds, else `failure`, atomically.
    pub async fn txn(
        &self,
        compares: &[Compare],
        success: &[TxnOp],
        failure: &[TxnOp],
    ) -> Result<TxnResponse> {
        let body = json!({
            "compare": compares.iter().map(Compare::to_json).collect::<Vec<_>>(),
            "success": success.iter().map(TxnOp::to_json).collect::<Vec<_>>(),
            "failure": failure.iter().map(TxnOp::to_json).collect::<Vec<_>>(),
        });
        let read_only = success
            .iter()
            .chain(failure)
            .all(|op| matches!(op, TxnOp::Range { .. }));
        let v = self.call("/v3/kv/txn", body, read_only).await?;
        parse_txn(&v)
    }

    /// Compacts the history up to `revision` (watches from before it then fail with `Compacted`).
    pub async fn compact(&self, revision: i64, physical: bool) -> Result<()> {
        let body = json!({ "revision": int_json(revision), "physical": physical });
        self.call("/v3/kv/compaction", body, false).await?;
        Ok(())
    }

    /// Grants a lease of `ttl_s` seconds (etcd may raise it to its minimum); returns its id.
    pub async fn lease_grant(&self, ttl_s: i64) -> Result<i64> {
        if ttl_s <= 0 {
            return Err(EtcdError::Config(format!("lease ttl {ttl_s}")));
        }
        let body = json!({ "TTL": int_json(ttl_s), "ID": "0" });
        let v = self.call("/v3/lease/grant", body, false).await?;
        let id = int(&v, "ID")?;
        if id == 0 {
            return Err(decode_err("lease grant without an ID", &v));
        }
        Ok(id)
    }

    /// Refreshes lease `id` once; returns its TTL in seconds from now. An expired or revoked lease is
    /// [`EtcdError::LeaseNotFound`]. Call it every TTL/3 or so to keep a lease.
    pub async fn lease_keepalive_once(&self, id: i64) -> Result<i64> {
        let body = json!({ "ID": int_json(id) });
        let (mut stream, first, _endpoint) = self
            .open_stream("/v3/lease/keepalive", body)
            .await
            .map_err(|e| e.lease_not_found(id))?;
        let result = object(&first, "result")?;
        let ttl = int(result, "TTL")?;
        // The response ends now that the request body has; finish it so the connection can be reused. Best effort.
        let _ = within(self.config.request_timeout, async {
            while let Ok(Some(_)) = stream.next().await {}
        })
        .await;
        if ttl <= 0 {
            return Err(EtcdError::LeaseNotFound(id));
        }
        Ok(ttl)
    }

    /// Revokes lease `id`, deleting every key attached to it.
    pub async fn lease_revoke(&self, id: i64) -> Result<()> {
        let body = json!({ "ID": int_json(id) });
        self.call("/v3/lease/revoke", body, false)
            .await
            .map_err(|e| e.lease_not_found(id))?;
        Ok(())
    }

    /// Watches every key starting with `prefix`, from `start_revision` (0: from now). See [`WatchStream`].
    pub async fn watch(&self, prefix: &[u8], start_revision: i64) -> Result<WatchStream> {
        let (key, end) = prefix_range(prefix);
        self.watch_range(&key, Some(&end), start_revision).await
    }

    /// Watches `[key, range_end)` (or just `key`) from `start_revision` (0: from now).
    pub async fn watch_range(
        &self,
        key: &[u8],
        range_end: Option<&[u8]>,
        start_revision: i64,
    ) -> Result<WatchStream> {
        let mut create = range_json(key, range_end);
        if start_revision > 0 {
            if let Value::Object(m) = &mut create {
                m.insert("start_revision".into(), int_json(start_revision));
            }
        }
        let body = json!({ "create_request": create });
        let (stream, first, endpoint) = self.open_stream("/v3/watch", body).await?;
        let result = object(&first, "result")?;
        let mut watch = WatchStream {
            stream: Some(stream),
            endpoint,
            created_revision: header_revision(result)?,
            pending: None,
        };
        if !boolean(result, "created")? {
            return Err(decode_err("first watch message is not `created`", &first));
        }
        // Should etcd ever fold the cancellation or events into the first message, keep them for `next`.
        watch.pending = watch.interpret(result).transpose();
        Ok(watch)
    }
}

/// A live watch. `next()` yields event batches in revision order until an error; after an error the stream is
/// finished and every further `next()` returns [`EtcdError::WatchClosed`].
///
/// On [`EtcdError::Compacted`], a broken connection ([`EtcdError::Transport`], [`EtcdError::WatchClosed`]) or
/// [`EtcdError::WatchCanceled`], the caller re-reads with `range`/`get_prefix` and watches again from that read's
/// revision + 1. A quiet watch sends nothing; a dead peer is noticed by TCP keepalive (see `http_client`).
/// `next()` is not cancellation safe: a `next()` dropped before completing poisons the stream.
#[derive(Debug)]
pub struct WatchStream {
    stream: Option<JsonStream>,
    endpoint: String,
    created_revision: i64,
    pending: Option<Result<WatchBatch>>,
}

impl WatchStream {
    /// Header revision of the `created` message: the store revision when the watch was set up.
    pub fn created_revision(&self) -> i64 {
        self.created_revision
    }

    /// The endpoint serving this watch.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// A batch, an error, or nothing worth reporting (created/progress messages).
    fn interpret(&self, result: &Value) -> Result<Option<WatchBatch>> {
        let compact_revision = int(result, "compact_revision")?;
        if compact_revision > 0 {
            return Err(EtcdError::Compacted { compact_revision });
        }
        if boolean(result, "canceled")? {
            return Err(EtcdError::WatchCanceled(text(result, "cancel_reason")));
        }
        let events = array(result, "events")?
            .iter()
            .map(parse_event)
            .collect::<Result<Vec<_>>>()?;
        if events.is_empty() {
            return Ok(None);
        }
        Ok(Some(WatchBatch {
            revision: header_revision(result)?,
            events,
        }))
    }

    /// The next batch of events.
    pub async fn next(&mut self) -> Result<WatchBatch> {
        if let Some(p) = self.pending.take() {
            if p.is_err() {
                self.stream = None;
            }
            return p;
        }
        loop {
            let Some(stream) = self.stream.as_mut() else {
                return Err(EtcdError::WatchClosed);
            };
            let outcome = match stream.next().await {
                Ok(Some(msg)) => decode_json(&msg).and_then(|v| {
                    if let Some(e) = body_error(&v, 200) {
                        return Err(e);
                    }
                    self.interpret(object(&v, "result")?)
                }),
                Ok(None) => Err(EtcdError::WatchClosed),
                Err(error) => Err(EtcdError::Transport {
                    endpoint: self.endpoint.clone(),
                    error,
                }),
            };
            match outcome {
                Ok(Some(batch)) => return Ok(batch),
                Ok(None) => continue,
                Err(e) => {
                    self.stream = None;
                    return Err(e);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::test_etcd::{free_port, run, start_etcd, EtcdProcess};
    use std::time::{Duration, Instant};

    #[test]
    fn prefix_ends() {
        assert_eq!(prefix_range_end(b"a/"), b"a0".to_vec());
        assert_eq!(prefix_range_end(b"a\xff"), b"b".to_vec());
        assert_eq!(prefix_range_end(b"\xff\xff"), vec![0]);
        assert_eq!(prefix_range(b""), (vec![0], vec![0]));
    }

    #[test]
    fn decodes_gateway_shapes() {
        // Captured from etcd 3.4.23.
        let range = br#"{"header":{"cluster_id":"324952591200643719","member_id":"3319814642761637952","revision":"2","raft_term":"2"},"kvs":[{"key":"Zm9v","create_revision":"2","mod_revision":"2","version":"1","value":"YmFy"}],"count":"1"}"#;
        let r = parse_range(&decode_reply(200, range).unwrap()).unwrap();
        assert_eq!(r.revision, 2);
        assert_eq!(r.kvs[0].key, b"foo");
        assert_eq!(r.kvs[0].value, b"bar");
        assert_eq!(r.kvs[0].lease, 0);
        let empty = br#"{"header":{"revision":"2"}}"#;
        assert_eq!(
            parse_range(&decode_reply(200, empty).unwrap()).unwrap().kvs,
            vec![]
        );
        let failed_txn = br#"{"header":{"revision":"3"},"responses":[{"response_range":{"header":{"revision":"3"},"kvs":[{"key":"YQ==","create_revision":"3","mod_revision":"3","version":"1","value":"MQ=="}],"count":"1"}}]}"#;
        let t = parse_txn(&decode_reply(200, failed_txn).unwrap()).unwrap();
        assert!(!t.succeeded);
        assert!(matches!(&t.responses[0], TxnOpResponse::Range(r) if r.kvs[0].value == b"1"));
        let err = br#"{"error":"etcdserver: requested lease not found","message":"etcdserver: requested lease not found","code":5}"#;
        let e = decode_reply(404, err).unwrap_err().lease_not_found(7);
        assert!(matches!(e, EtcdError::LeaseNotFound(7)), "{e}");
        let e = decode_reply(404, b"Not Found\n").unwrap_err();
        assert!(matches!(e, EtcdError::Http { status: 404, .. }), "{e}");
        let stream_err = serde_json::json!({"error": {"grpc_code": 14, "http_code": 503, "message": "no leader"}});
        assert!(matches!(
            body_error(&stream_err, 200),
            Some(EtcdError::Server { code: 14, .. })
        ));
        // Wrong types are decode errors, not panics.
        for bad in [
            &br#"{"header":{"revision":"x"}}"#[..],
            br#"{"kvs":{}}"#,
            br#"{"kvs":[{"key":"!!!"}]}"#,
            br#"{"kvs":[{"key":5}]}"#,
            br#"{"count":1.5}"#,
            br#"{"more":"yes"}"#,
        ] {
            assert!(
                parse_range(&decode_reply(200, bad).unwrap()).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        assert!(decode_reply(200, b"[1]").is_err());
        assert!(decode_reply(200, b"nope").is_err());
        let compacted =
            serde_json::json!({"header":{"raft_term":"2"},"canceled":true,"compact_revision":"6"});
        let w = WatchStream {
            stream: None,
            endpoint: String::new(),
            created_revision: 0,
            pending: None,
        };
        assert!(matches!(
            w.interpret(&compacted),
            Err(EtcdError::Compacted {
                compact_revision: 6
            })
        ));
        let delete = serde_json::json!({"header":{"revision":"7"},"events":[{"type":"DELETE","kv":{"key":"cDE=","mod_revision":"7"}}]});
        let b = w.interpret(&delete).unwrap().unwrap();
        assert_eq!(b.events[0].kind, EventKind::Delete);
        assert_eq!(b.events[0].revision(), 7);
    }

    // ---- integration tests against a real etcd on loopback ----

    fn client(p: &EtcdProcess) -> Etcd {
        Etcd::new(vec![p.url.clone()]).unwrap()
    }

    fn keys(r: &RangeResponse) -> Vec<String> {
        r.kvs
            .iter()
            .map(|kv| String::from_utf8_lossy(&kv.key).into_owned())
            .collect()
    }

    #[test]
    fn etcd_put_get_prefix_delete() {
        let Some(p) = start_etcd("etcd_put_get_prefix_delete") else {
            return;
        };
        run(async {
            let e = client(&p);
            let r1 = e.put(b"a/1", b"one", None).await.unwrap();
            let r2 = e.put(b"a/2", b"\x00\xff binary", None).await.unwrap();
            e.put(b"b/1", b"other", None).await.unwrap();
            assert!(r2 > r1);
            let got = e.range(b"a/1", None).await.unwrap();
            assert_eq!(got.kvs.len(), 1);
            assert_eq!(got.kvs[0].value, b"one");
            assert_eq!(
                (got.kvs[0].create_revision, got.kvs[0].mod_revision),
                (r1, r1)
            );
            assert_eq!(got.kvs[0].version, 1);
            assert!(got.revision >= r2);
            let prefix = e.get_prefix(b"a/").await.unwrap();
            assert_eq!(keys(&prefix), ["a/1", "a/2"]);
            assert_eq!(prefix.kvs[1].value, b"\x00\xff binary");
            assert_eq!(prefix.count, 2);
            assert_eq!(e.get_prefix(b"").await.unwrap().kvs.len(), 3);
            assert!(e.range(b"missing", None).await.unwrap().kvs.is_empty());
            let r3 = e.put(b"a/1", b"uno", None).await.unwrap();
            let got = e.range(b"a/1", None).await.unwrap();
            assert_eq!(
                (
                    got.kvs[0].mod_revision,
                    got.kvs[0].version,
                    got.kvs[0].create_revision
                ),
                (r3, 2, r1)
            );
            assert_eq!(e.delete(b"a/1").await.unwrap().deleted, 1);
            assert_eq!(e.delete(b"a/1").await.unwrap().deleted, 0);
            assert_eq!(e.delete_prefix(b"a/").await.unwrap().deleted, 1);
            assert_eq!(keys(&e.get_prefix(b"").await.unwrap()), ["b/1"]);
            // Keep-alive: the sequential calls above reused one connection.
            assert_eq!(e.endpoints[0].idle_connections(), 1);
        });
    }

    #[test]
    fn etcd_txn_create_if_absent_and_cas() {
        let Some(p) = start_etcd("etcd_txn_create_if_absent_and_cas") else {
            return;
        };
        run(async {
            let e = client(&p);
            let create = |v: &'static [u8]| {
                let e = &e;
                async move {
                    e.txn(
                        &[Compare::absent(b"k".to_vec())],
                        &[TxnOp::put(b"k".to_vec(), v.to_vec(), None)],
                        &[TxnOp::get(b"k".to_vec())],
                    )
                    .await
                    .unwrap()
                }
            };
            let first = create(b"v1").await;
            assert!(first.succeeded);
            assert!(
                matches!(first.responses[..], [TxnOpResponse::Put { revision }] if revision == first.revision)
            );
            let second = create(b"v2").await;
            assert!(!second.succeeded);
            let TxnOpResponse::Range(current) = &second.responses[0] else {
                panic!("expected a range response: {second:?}");
            };
            assert_eq!(current.kvs[0].value, b"v1");
            let rev = current.kvs[0].mod_revision;

            // Update only if unchanged since read.
            let cas = |rev: i64, v: &'static [u8]| {
                let e = &e;
                async move {
                    e.txn(
                        &[Compare::mod_revision_is(b"k".to_vec(), rev)],
                        &[TxnOp::put(b"k".to_vec(), v.to_vec(), None)],
                        &[],
                    )
                    .await
                    .unwrap()
                }
            };
            assert!(cas(rev, b"v3").await.succeeded);
            let stale = cas(rev, b"v4").await;
            assert!(!stale.succeeded);
            assert!(stale.responses.is_empty());
            assert_eq!(e.range(b"k", None).await.unwrap().kvs[0].value, b"v3");

            // Value and version compares, and a delete in a txn.
            let t = e
                .txn(
                    &[
                        Compare::value_is(b"k".to_vec(), b"v3".to_vec()),
                        Compare::version_is(b"k".to_vec(), 2),
                        Compare::new(
                            b"k".to_vec(),
                            CompareOp::Greater,
                            CompareTarget::ModRevision(0),
                        ),
                    ],
                    &[TxnOp::delete(b"k".to_vec())],
                    &[],
                )
                .await
                .unwrap();
            assert!(t.succeeded);
            assert!(matches!(
                t.responses[..],
                [TxnOpResponse::Delete(DeleteResponse { deleted: 1, .. })]
            ));
        });
    }

    #[test]
    fn etcd_lease_attach_keepalive_revoke() {
        let Some(p) = start_etcd("etcd_lease_attach_keepalive_revoke") else {
            return;
        };
        run(async {
            let e = client(&p);
            let id = e.lease_grant(30).await.unwrap();
            e.put(b"node/1", b"alive", Some(id)).await.unwrap();
            let got = e.range(b"node/1", None).await.unwrap();
            assert_eq!(got.kvs[0].lease, id);
            let ttl = e.lease_keepalive_once(id).await.unwrap();
            assert!((1..=30).contains(&ttl), "ttl {ttl}");
            // The keepalive response ended, so its connection went back to the pool.
            assert!(e.endpoints[0].idle_connections() >= 1);
            assert_eq!(e.lease_keepalive_once(id).await.unwrap(), ttl);
            e.lease_revoke(id).await.unwrap();
            assert!(e.range(b"node/1", None).await.unwrap().kvs.is_empty());
            assert!(matches!(
                e.lease_keepalive_once(id).await,
                Err(EtcdError::LeaseNotFound(x)) if x == id
            ));
            assert!(matches!(
                e.lease_revoke(id).await,
                Err(EtcdError::LeaseNotFound(_))
            ));
            assert!(matches!(
                e.put(b"node/2", b"x", Some(id)).await,
                Err(EtcdError::Server { code: 5, .. })
            ));
        });
    }

    #[test]
    fn etcd_lease_expiry_removes_key() {
        let Some(p) = start_etcd("etcd_lease_expiry_removes_key") else {
            return;
        };
        run(async {
            let e = client(&p);
            let id = e.lease_grant(2).await.unwrap();
            e.put(b"ephemeral", b"x", Some(id)).await.unwrap();
            let t = Instant::now();
            loop {
                if e.range(b"ephemeral", None).await.unwrap().kvs.is_empty() {
                    break;
                }
                assert!(t.elapsed() < Duration::from_secs(15), "lease never expired");
                glommio::timer::sleep(Duration::from_millis(200)).await;
            }
            assert!(
                t.elapsed() >= Duration::from_millis(1500),
                "expired too early"
            );
            assert!(matches!(
                e.lease_keepalive_once(id).await,
                Err(EtcdError::LeaseNotFound(_))
            ));
        });
    }

    #[test]
    fn etcd_watch_sees_puts_and_deletes_in_order() {
        let Some(p) = start_etcd("etcd_watch_sees_puts_and_deletes_in_order") else {
            return;
        };
        run(async {
            let e = client(&p);
            let before = e.put(b"p/0", b"before", None).await.unwrap();
            e.put(b"q/0", b"outside", None).await.unwrap();
            let mut w = e.watch(b"p/", 0).await.unwrap();
            assert!(w.created_revision() >= before);
            let r1 = e.put(b"p/1", b"1", None).await.unwrap();
            e.put(b"q/1", b"outside", None).await.unwrap();
            let r2 = e.put(b"p/2", b"2", None).await.unwrap();
            let r3 = e.delete(b"p/1").await.unwrap().revision;
            let t = e
                .txn(
                    &[],
                    &[
                        TxnOp::put(b"p/3".to_vec(), b"3".to_vec(), None),
                        TxnOp::put(b"p/4".to_vec(), b"4".to_vec(), None),
                    ],
                    &[],
                )
                .await
                .unwrap();
            let r5 = e.delete_prefix(b"p/").await.unwrap().revision;
            let mut seen = Vec::new();
            while seen.len() < 8 {
                let batch = within(Duration::from_secs(5), w.next())
                    .await
                    .expect("watch stalled")
                    .unwrap();
                for ev in &batch.events {
                    assert!(batch.revision >= ev.revision());
                }
                seen.extend(batch.events);
            }
            let summary: Vec<(EventKind, String, i64)> = seen
                .iter()
                .map(|ev| {
                    (
                        ev.kind,
                        String::from_utf8_lossy(&ev.kv.key).into_owned(),
                        ev.revision(),
                    )
                })
                .collect();
            use EventKind::{Delete, Put};
            let expect: Vec<(EventKind, String, i64)> = vec![
                (Put, "p/1".into(), r1),
                (Put, "p/2".into(), r2),
                (Delete, "p/1".into(), r3),
                (Put, "p/3".into(), t.revision),
                (Put, "p/4".into(), t.revision),
                (Delete, "p/0".into(), r5),
                (Delete, "p/2".into(), r5),
                (Delete, "p/3".into(), r5),
            ];
            assert_eq!(summary[..8], expect[..]);
            assert_eq!(seen[0].kv.value, b"1");

            // A watch from a past revision replays history, starting at that revision.
            let mut replay = e.watch(b"p/", before).await.unwrap();
            let first = within(Duration::from_secs(5), replay.next())
                .await
                .unwrap()
                .unwrap();
            assert_eq!(first.events[0].kv.key, b"p/0");
            assert_eq!(first.events[0].revision(), before);

            // Killing etcd breaks the stream: a transport error or a closed stream, never `Compacted`.
            drop(e);
            let mut p = p;
            p.kill();
            let broken = within(Duration::from_secs(10), w.next())
                .await
                .expect("no error after kill");
            assert!(
                matches!(
                    broken,
                    Err(EtcdError::Transport { .. } | EtcdError::WatchClosed)
                ),
                "{broken:?}"
            );
            assert!(matches!(w.next().await, Err(EtcdError::WatchClosed)));
        });
    }

    #[test]
    fn etcd_watch_from_compacted_revision() {
        let Some(p) = start_etcd("etcd_watch_from_compacted_revision") else {
            return;
        };
        run(async {
            let e = client(&p);
            let first = e.put(b"c/x", b"0", None).await.unwrap();
            let mut last = first;
            for i in 1..5 {
                last = e
                    .put(b"c/x", format!("{i}").as_bytes(), None)
                    .await
                    .unwrap();
            }
            e.compact(last, true).await.unwrap();
            let mut w = e.watch(b"c/", first).await.unwrap();
            let err = within(Duration::from_secs(5), w.next())
                .await
                .expect("no compaction notice")
                .unwrap_err();
            assert!(
                matches!(err, EtcdError::Compacted { compact_revision } if compact_revision == last),
                "{err:?}"
            );
            assert!(matches!(w.next().await, Err(EtcdError::WatchClosed)));

            // The recovery recipe: re-read everything, watch from the read's revision + 1.
            let snapshot = e.get_prefix(b"c/").await.unwrap();
            assert_eq!(snapshot.kvs[0].value, b"4");
            let mut w = e.watch(b"c/", snapshot.revision + 1).await.unwrap();
            let next = e.put(b"c/y", b"new", None).await.unwrap();
            let batch = within(Duration::from_secs(5), w.next())
                .await
                .unwrap()
                .unwrap();
            assert_eq!(batch.events[0].revision(), next);
            assert_eq!(batch.events[0].kv.key, b"c/y");
        });
    }

    #[test]
    fn etcd_failover_from_dead_endpoint() {
        let Some(p) = start_etcd("etcd_failover_from_dead_endpoint") else {
            return;
        };
        run(async {
            let dead = format!("http://127.0.0.1:{}", free_port());
            let e = Etcd::new(vec![dead.clone(), p.url.clone()]).unwrap();
            assert_eq!(e.current_endpoint(), dead);
            e.put(b"f", b"1", None).await.unwrap();
            assert_eq!(e.current_endpoint(), p.url);
            assert_eq!(e.range(b"f", None).await.unwrap().kvs[0].value, b"1");
            let mut w = e.watch(b"f", 0).await.unwrap();
            assert_eq!(w.endpoint(), p.url);
            e.put(b"f", b"2", None).await.unwrap();
            let b = within(Duration::from_secs(5), w.next())
                .await
                .unwrap()
                .unwrap();
            assert_eq!(b.events[0].kv.value, b"2");

            // A watch and a keepalive also fail over when the dead endpoint comes first.
            let e = Etcd::new(vec![dead.clone(), p.url.clone()]).unwrap();
            let id = e.lease_grant(10).await.unwrap();
            let e = Etcd::new(vec![dead.clone(), p.url.clone()]).unwrap();
            assert!(e.lease_keepalive_once(id).await.unwrap() > 0);
            let e = Etcd::new(vec![dead.clone(), p.url.clone()]).unwrap();
            e.watch(b"f", 0).await.unwrap();

            // Nothing reachable: Unavailable, listing every endpoint.
            let e = Etcd::new(vec![
                dead.clone(),
                format!("http://127.0.0.1:{}", free_port()),
            ])
            .unwrap();
            match e.range(b"f", None).await {
                Err(EtcdError::Unavailable(errs)) => {
                    assert_eq!(errs.len(), 2);
                    assert!(errs.iter().all(|(_, err)| err.is_connect()));
                }
                other => panic!("expected Unavailable, got {other:?}"),
            }
            assert!(matches!(
                e.put(b"f", b"3", None).await,
                Err(EtcdError::Unavailable(_))
            ));
            assert!(Etcd::new(vec![]).is_err());
            assert!(Etcd::new(vec!["https://x:1".into()]).is_err());
        });
    }
}
