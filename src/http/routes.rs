//! Routing of requests to broker operations, parameter parsing, and the one place where a `BrokerError` becomes a
//! status code (`status_of`). Called by `http::conn` for each parsed request.

use super::request::{query_pairs, Request};
use super::response::Response;
use crate::broker::core::Core;
use crate::broker::error::BrokerError;
use crate::broker::router::Target;
use crate::broker::topic::{self, TopicConfig};
use crate::duration::{format_ms, parse_duration_in};
use crate::partition::SettleOp;
use serde_json::json;
use std::rc::Rc;

/// Longest long-poll a consume may ask for (api.md: 0 to 60 s).
pub const MAX_WAIT_MS: u64 = 60_000;

/// The status and error code of every broker error: the only mapping in the code base.
pub fn status_of(e: &BrokerError) -> (u16, &'static str) {
    match e {
        BrokerError::InvalidTopic(_) => (400, "invalid_topic"),
        BrokerError::InvalidDuration(_) => (400, "invalid_duration"),
        BrokerError::InvalidReceiptHandle(_) => (400, "invalid_receipt_handle"),
        BrokerError::InvalidParameter(_) => (400, "invalid_parameter"),
        BrokerError::TopicNotFound(_) => (404, "topic_not_found"),
        BrokerError::PartitionNotFound { .. } => (404, "partition_not_found"),
        BrokerError::TopicExists { .. } => (409, "topic_exists"),
        BrokerError::LeaseGone => (410, "lease_gone"),
        BrokerError::OffsetOutOfRetention { .. } => (410, "offset_out_of_retention"),
        BrokerError::MessageTooLarge { .. } => (413, "message_too_large"),
        BrokerError::CorruptRecord { .. } => (422, "corrupt_record"),
        BrokerError::AckedAheadFull => (503, "acked_ahead_full"),
        BrokerError::Overloaded => (503, "overloaded"),
        BrokerError::ShuttingDown => (503, "shutting_down"),
        BrokerError::LogUnavailable => (503, "log_unavailable"),
        BrokerError::PartitionUnavailable(_) => (503, "partition_unavailable"),
        BrokerError::TopicUnavailable(_) => (503, "topic_unavailable"),
        BrokerError::TopicLimit { .. } => (409, "topic_limit"),
        BrokerError::PartitionLimit { .. } => (409, "partition_limit"),
        BrokerError::Storage(_) => (500, "storage_error"),
        BrokerError::NoSpace => (507, "insufficient_storage"),
    }
}

/// The error response for a broker error (503s carry Retry-After).
pub fn error_response(e: &BrokerError) -> Response {
    let (status, code) = status_of(e);
    let response = Response::error(status, code, &e.to_string());
    if status == 503 {
        response.with_header("retry-after", 1)
    } else {
        response
    }
}

/// A request's query parameters.
struct Params(Vec<(String, String)>);

impl Params {
    fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    fn topic(&self) -> Result<String, BrokerError> {
        let name = self
            .get("topic")
            .ok_or_else(|| BrokerError::InvalidTopic(String::new()))?;
        topic::validate_name(name)?;
        Ok(name.to_string())
    }

    fn duration(&self, name: &str, min_ms: u64, max_ms: u64) -> Result<Option<u64>, BrokerError> {
        self.get(name)
            .map(|text| {
                parse_duration_in(text, min_ms, max_ms)
                    .map_err(|e| BrokerError::InvalidDuration(format!("{name}: {}", e.0)))
            })
            .transpose()
    }

    fn number(&self, name: &str, min: u64, max: u64) -> Result<Option<u64>, BrokerError> {
        self.get(name)
            .map(|text| match text.parse::<u64>() {
                Ok(v) if text.bytes().all(|b| b.is_ascii_digit()) && (min..=max).contains(&v) => {
                    Ok(v)
                }
                _ => Err(BrokerError::InvalidParameter(format!(
                    "{name} must be an integer from {min} to {max}, not '{text}'"
                ))),
            })
            .transpose()
    }

    /// `partition` for replay/produce: any unsigned integer (range is checked against the topic: 404).
    fn partition(&self) -> Result<Option<u64>, BrokerError> {
        self.number("partition", 0, u64::MAX)
    }

    fn receipt_handle(&self) -> Result<(u64, u64, u64), BrokerError> {
        let text = self.get("receipt_handle").unwrap_or("");
        parse_receipt_handle(text)
            .ok_or_else(|| BrokerError::InvalidReceiptHandle(text.chars().take(100).collect()))
    }
}

/// `partition:offset:nonce`, three unsigned decimal integers.
pub fn parse_receipt_handle(text: &str) -> Option<(u64, u64, u64)> {
    let mut parts = text.split(':');
    let mut next = || -> Option<u64> {
        let part = parts.next()?;
        if part.is_empty() || part.len() > 20 || !part.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        part.parse().ok()
    };
    let handle = (next()?, next()?, next()?);
    parts.next().is_none().then_some(handle)
}

/// Serves one request.
pub async fn handle(core: &Rc<Core>, req: Request) -> Response {
    let method = req.method.as_str();
    let path = req.path.as_str();
    let allowed: &str = match path {
        "/health" | "/metrics" | "/topics" | "/consume" => "GET",
        "/produce" | "/ack" | "/nack" | "/extend" => "POST",
        p if p.starts_with("/topics/") && p.len() > "/topics/".len() => "GET, PUT, DELETE",
        _ => return Response::error(404, "not_found", &format!("no route for {path}")),
    };
    if !allowed.split(", ").any(|m| m == method) {
        return Response::error(
            405,
            "method_not_allowed",
            &format!("{path} allows {allowed}"),
        )
        .with_header("allow", allowed);
    }
    match &core.config.auth_token {
        Some(token) => {
            if path != "/health" && !authorized(token, req.authorization.as_deref()) {
                return Response::error(401, "unauthorized", "missing or wrong bearer token")
                    .with_header("www-authenticate", "Bearer")
                    .closing();
            }
        }
        None => {
            // Without a token, only loopback (or configured) host names, and no cross-origin browser requests:
            // a web page must not reach the broker through DNS rebinding.
            if let Some(host) = req.host.as_deref() {
                // An address is not a name a rebinding page can use; names must be loopback or configured.
                let name = host_name(host);
                if name.parse::<std::net::IpAddr>().is_err()
                    && !host_allowed(name, &core.config.allowed_hosts)
                {
                    return Response::error(
                        403,
                        "host_not_allowed",
                        "the Host header names a host this server does not answer for without a token (allowed_hosts)",
                    )
                    .closing();
                }
            }
            if let Some(origin) = req.origin.as_deref() {
                let host = origin.split_once("://").map_or("", |(_, rest)| rest);
                if !host_allowed(host_name(host), &core.config.allowed_hosts) {
                    return Response::error(
                        403,
                        "cross_origin_refused",
                        "cross-origin browser requests are refused without a token",
                    )
                    .closing();
                }
            }
        }
    }
    let params = Params(query_pairs(&req.query));
    let result = match path {
        "/health" => Ok(health(core)),
        "/metrics" => metrics(core).await,
        "/topics" => Ok(Response::json(200, &json!(core.topic_names()))),
        "/produce" => produce(core, &params, req.body).await,
        "/consume" => consume(core, &params).await,
        "/ack" => settle(core, &params, Ok(SettleOp::Ack)).await,
        "/nack" => settle(core, &params, Ok(SettleOp::Nack)).await,
        "/extend" => {
            let visibility = params.duration(
                "visibility",
                topic::MIN_VISIBILITY_MS,
                topic::MAX_VISIBILITY_MS,
            );
            settle(core, &params, visibility.map(SettleOp::Extend)).await
        }
        _ => {
            let name = percent_decode(&path["/topics/".len()..]);
            match method {
                "PUT" => create_topic(core, &name, &params).await,
                "GET" => describe_topic(core, &name).await,
                _ => delete_topic(core, &name).await,
            }
        }
    };
    result.unwrap_or_else(|e| error_response(&e))
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
    let authority = authority.trim();
    if let Some(rest) = authority.strip_prefix('[') {
        return rest.split(']').next().unwrap_or("");
    }
    authority
        .rsplit_once(':')
        .filter(|(_, port)| port.bytes().all(|b| b.is_ascii_digit()))
        .map_or(authority, |(host, _)| host)
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

fn health(core: &Core) -> Response {
    let ready = core.shared.ready.load(std::sync::atomic::Ordering::Acquire);
    if ready >= core.cores && !core.stopping.get() {
        Response::json(200, &json!({"status": "ok", "cores": core.cores}))
    } else {
        Response::error(
            503,
            "not_ready",
            &format!("{ready} of {} cores serving", core.cores),
        )
    }
}

async fn metrics(core: &Rc<Core>) -> Result<Response, BrokerError> {
    let stats = core.stats().await?;
    let text = crate::broker::metrics::render(&stats);
    Ok(Response::bytes(
        200,
        "text/plain; version=0.0.4",
        text.into(),
    ))
}

fn config_json(c: &TopicConfig) -> serde_json::Value {
    json!({
        "partitions": c.partitions,
        "visibility": format_ms(c.visibility_ms),
        "visibility_ms": c.visibility_ms,
        "max_in_flight": c.max_in_flight,
        "max_acked_ahead": c.max_acked_ahead,
        "retention": format_ms(c.retention_ms),
        "retention_ms": c.retention_ms,
    })
}

async fn create_topic(
    core: &Rc<Core>,
    name: &str,
    params: &Params,
) -> Result<Response, BrokerError> {
    topic::validate_name(name)?;
    let mut config = TopicConfig::with_defaults(name);
    if let Some(p) = params.number("partitions", 1, topic::MAX_PARTITIONS as u64)? {
        config.partitions = p as u32;
    }
    if let Some(v) = params.duration(
        "visibility",
        topic::MIN_VISIBILITY_MS,
        topic::MAX_VISIBILITY_MS,
    )? {
        config.visibility_ms = v;
    }
    if let Some(v) = params.number("max_in_flight", 1, topic::MAX_CAP as u64)? {
        config.max_in_flight = v as usize;
    }
    if let Some(v) = params.number("max_acked_ahead", 1, topic::MAX_CAP as u64)? {
        config.max_acked_ahead = v as usize;
    }
    if let Some(v) = params.duration("retention", 1000, topic::MAX_RETENTION_MS)? {
        config.retention_ms = v;
    }
    let (created, config) = core.create(config).await?;
    let body = json!({"name": config.name, "created": created, "config": config_json(&config)});
    Ok(Response::json(if created { 201 } else { 200 }, &body))
}

async fn describe_topic(core: &Rc<Core>, name: &str) -> Result<Response, BrokerError> {
    topic::validate_name(name)?;
    let (config, partitions) = core.describe(name).await?;
    let body =
        json!({"name": config.name, "config": config_json(&config), "partitions": partitions});
    Ok(Response::json(200, &body))
}

async fn delete_topic(core: &Rc<Core>, name: &str) -> Result<Response, BrokerError> {
    topic::validate_name(name)?;
    core.delete(name).await?;
    Ok(Response::empty(204))
}

async fn produce(
    core: &Rc<Core>,
    params: &Params,
    body: bytes::Bytes,
) -> Result<Response, BrokerError> {
    let topic = params.topic()?;
    let target = match (params.partition()?, params.get("key")) {
        (Some(p), _) => Target::Partition(p),
        (None, Some(key)) => Target::Key(key.as_bytes()),
        (None, None) => Target::Any,
    };
    let (partition, offset) = core.produce(&topic, target, body).await?;
    Ok(Response::json(
        200,
        &json!({"partition": partition, "offset": offset}),
    ))
}

async fn consume(core: &Rc<Core>, params: &Params) -> Result<Response, BrokerError> {
    let topic = params.topic()?;
    let wait_ms = params.duration("wait", 0, MAX_WAIT_MS)?.unwrap_or(0);
    let visibility = params.duration(
        "visibility",
        topic::MIN_VISIBILITY_MS,
        topic::MAX_VISIBILITY_MS,
    )?;
    let partition = params.partition()?;
    let offset = params.number("offset", 0, u64::MAX)?;
    match (partition, offset) {
        (Some(p), Some(o)) => {
            let Some(record) = core.replay(&topic, p, o, wait_ms).await? else {
                return Ok(Response::empty(204));
            };
            Ok(
                Response::bytes(200, "application/octet-stream", record.payload)
                    .with_header("partition", p)
                    .with_header("offset", record.offset),
            )
        }
        (None, None) => {
            let Some(d) = core.consume(&topic, wait_ms, visibility).await? else {
                return Ok(Response::empty(204));
            };
            Ok(Response::bytes(200, "application/octet-stream", d.payload)
                .with_header(
                    "receipt-handle",
                    format!("{}:{}:{}", d.partition, d.offset, d.nonce),
                )
                .with_header("partition", d.partition)
                .with_header("offset", d.offset))
        }
        _ => Err(BrokerError::InvalidParameter(
            "replay needs both partition and offset".into(),
        )),
    }
}

async fn settle(
    core: &Rc<Core>,
    params: &Params,
    op: Result<SettleOp, BrokerError>,
) -> Result<Response, BrokerError> {
    let topic = params.topic()?;
    let (partition, offset, nonce) = params.receipt_handle()?;
    core.topic(&topic)?;
    let op = op?;
    core.settle(&topic, partition, offset, nonce, op).await?;
    Ok(Response::empty(200))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn receipt_handles_are_three_unsigned_integers() {
        assert_eq!(parse_receipt_handle("0:41:881"), Some((0, 41, 881)));
        assert_eq!(
            parse_receipt_handle("18446744073709551615:0:1"),
            Some((u64::MAX, 0, 1))
        );
        for bad in [
            "",
            "1:2",
            "1:2:3:4",
            "-1:2:3",
            "a:b:c",
            "1::3",
            " 1:2:3",
            "1:2:3 ",
            "18446744073709551616:0:0",
            "+1:2:3",
        ] {
            assert_eq!(parse_receipt_handle(bad), None, "{bad}");
        }
    }

    #[test]
    fn host_names_lose_port_and_brackets_and_only_loopback_or_configured_names_pass() {
        assert_eq!(host_name("localhost:7070"), "localhost");
        assert_eq!(host_name("[::1]:7070"), "::1");
        assert_eq!(host_name("127.0.0.1"), "127.0.0.1");
        assert_eq!(host_name("broker.internal:80"), "broker.internal");
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

    #[test]
    fn every_error_maps_to_its_api_status() {
        assert_eq!(status_of(&BrokerError::LeaseGone), (410, "lease_gone"));
        assert_eq!(status_of(&BrokerError::AckedAheadFull).0, 503);
        assert_eq!(
            status_of(&BrokerError::MessageTooLarge { limit: 1 }),
            (413, "message_too_large")
        );
        assert!(error_response(&BrokerError::Overloaded)
            .headers
            .iter()
            .any(|(h, _)| *h == "retry-after"));
    }
}
