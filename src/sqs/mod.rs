//! The SQS-compatible face (design/api.md "SQS-compatible face"; `docs/sqs.md`): existing Amazon SQS clients
//! pointed at berth's main listener. A queue is a topic (its consumer state the `default` group), a `.fifo` queue a
//! FIFO topic.
//!
//! Two wire protocols, one set of actions: the JSON 1.0 protocol (`POST` with `X-Amz-Target: AmazonSQS.<Action>`
//! and a JSON body, current SDKs) and the query protocol (`POST` of a form with `Action=<Action>`, XML replies, older
//! SDKs). A query request's form is turned into the JSON protocol's input (`query.rs`), the action runs on that
//! (`actions.rs`), and its output is written back as JSON or, for the query protocol, as XML (`query.rs`). Errors
//! carry AWS's modelled `__type` and the legacy code in `x-amzn-query-error` (JSON), or the legacy code in the XML
//! error document, so every SDK raises its typed exception.
//!
//! Read in order: `handle` here, then `actions.rs`; `md5.rs` (the digests replies carry), `query.rs`, `sigv4.rs`.

mod actions;
mod manage;
pub mod md5;
pub mod query;
pub mod sigv4;
pub mod tasks;

use crate::front::Front;
use crate::http::request::Request;
use crate::ops::response::Response;
use crate::ops::OpError;
use bytes::Bytes;
use serde_json::Value;
use std::cell::Cell;

/// The JSON protocol's media type.
const AMZ_JSON: &str = "application/x-amz-json-1.0";

/// Whether a request is for the SQS face: a `POST` to `/` or to a queue URL's path (`/{account}/{queue}`) in one of
/// its protocols. Its body is then bounded by `max_batch_bytes` (a SendMessageBatch of ten messages, escaped).
pub fn is_sqs_body(path: &str, content_type: Option<&str>) -> bool {
    // The media type first: the native API's requests mostly have none.
    content_type.is_some_and(|t| {
        let t = t.split(';').next().unwrap_or("").trim();
        t.eq_ignore_ascii_case(AMZ_JSON)
            || t.eq_ignore_ascii_case("application/x-www-form-urlencoded")
    }) && is_sqs_path(path)
}

/// `/`, or `/{account}/{queue}` (the path of a queue URL: Java SDK v1 and JS SDK v3 post there).
pub fn is_sqs_path(path: &str) -> bool {
    if path == "/" {
        return true;
    }
    let mut parts = path.trim_start_matches('/').split('/');
    matches!(
        (parts.next(), parts.next(), parts.next()),
        (Some(account), Some(queue), None)
            if account.len() == 12 && account.bytes().all(|b| b.is_ascii_digit()) && !queue.is_empty()
    )
}

/// Whether `req` speaks to the SQS face: `X-Amz-Target: AmazonSQS.*`, or a form body on an SQS path.
pub fn is_sqs_request(req: &Request) -> bool {
    // The headers before the path: the native API's requests have neither.
    req.method == "POST"
        && (req
            .amz_target
            .as_deref()
            .is_some_and(|t| t.starts_with("AmazonSQS."))
            || is_sqs_body(&req.path, req.content_type.as_deref()))
        && is_sqs_path(&req.path)
}

/// Whether `req` is an SQS ReceiveMessage (which may park: a client that hangs up must not get messages leased).
pub fn is_receive(req: &Request) -> bool {
    if !is_sqs_request(req) {
        return false;
    }
    match req.amz_target.as_deref() {
        Some(target) => target == "AmazonSQS.ReceiveMessage",
        None => form_urlencoded::parse(&req.body)
            .chain(form_urlencoded::parse(req.query.as_bytes()))
            .take(MAX_FORM_PAIRS)
            .any(|(k, v)| k == "Action" && v == "ReceiveMessage"),
    }
}

/// Most `name=value` pairs a query-protocol request may have (a SendMessageBatch of ten messages with ten
/// attributes each has about 400).
pub const MAX_FORM_PAIRS: usize = 2000;

/// Longest `Host` header the face puts in queue URLs.
const MAX_HOST_BYTES: usize = 255;

/// Most structural tokens (`,` and `:` outside strings) a JSON request may have, checked before it is parsed: a
/// full SendMessageBatch has a few hundred; a body of millions of tiny values would cost tens of bytes of memory each.
pub const MAX_JSON_TOKENS: usize = 10_000;

/// Whether a JSON body has at most `max` structural tokens and nests at most 32 deep (a scan, no allocation).
fn json_within(body: &[u8], max: usize) -> bool {
    let (mut tokens, mut depth, mut in_string, mut escaped) = (0usize, 0usize, false, false);
    for &b in body {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b',' | b':' => tokens += 1,
            b'[' | b'{' => {
                depth += 1;
                if depth > 32 {
                    return false;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
        if tokens > max {
            return false;
        }
    }
    true
}

/// A `Host` header fit for queue URLs: `host[:port]`, a name, an IPv4 address or a bracketed IPv6 one.
fn valid_host(host: &str) -> bool {
    !host.is_empty()
        && host.len() <= MAX_HOST_BYTES
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b':' | b'[' | b']'))
}

/// At a request's head, before its body is read, when credentials are configured: a request that carries no SigV4
/// credential, or one of a key berth does not know, is refused at once (so an unauthenticated client never has a
/// body buffered); the signature itself is checked once the body is read (`handle`).
pub fn refuse_head(
    req: &Request,
    credentials: &std::collections::BTreeMap<String, String>,
) -> Option<Response> {
    let protocol = match req.amz_target {
        Some(_) => Protocol::Json,
        None => Protocol::Query,
    };
    let signed = req
        .authorization
        .as_deref()
        .filter(|a| a.starts_with("AWS4-HMAC-SHA256"));
    let from_header = signed
        .and_then(|a| a.split("Credential=").nth(1))
        .and_then(|c| c.split('/').next())
        .map(str::to_string);
    let key = from_header.or_else(|| {
        form_urlencoded::parse(req.query.as_bytes())
            .find(|(k, _)| k == "X-Amz-Credential")
            .and_then(|(_, v)| v.split('/').next().map(str::to_string))
    });
    let refusal = match key {
        None if signed.is_some() => SqsError::common(
            400,
            "IncompleteSignature",
            "IncompleteSignature",
            "Authorization header requires 'Credential' parameter.".into(),
        ),
        None => SqsError::common(
            403,
            "MissingAuthenticationToken",
            "MissingAuthenticationToken",
            "Request is missing Authentication Token".into(),
        ),
        Some(k) if !credentials.contains_key(&k) => SqsError::common(
            403,
            "InvalidClientTokenId",
            "InvalidClientTokenId",
            "The security token included in the request is invalid.".into(),
        ),
        Some(_) => return None,
    };
    Some(error_reply(protocol, &refusal, &request_id()).closing())
}

/// Which protocol a request spoke (and its reply speaks).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Protocol {
    Json,
    Query,
}

/// An SQS error: the HTTP status, the modelled shape (JSON `__type`, after `#`), the legacy query code, whose fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqsError {
    pub status: u16,
    /// The shape name: `QueueDoesNotExist`, or for AWS's common errors `InvalidParameterValueException`...
    pub shape: &'static str,
    /// Whether the shape is one of SQS's own (`com.amazonaws.sqs#`) or a common one (`com.amazon.coral.service#`).
    pub modelled: bool,
    /// The query protocol's code (`AWS.SimpleQueueService.NonExistentQueue`, `InvalidParameterValue`...).
    pub code: &'static str,
    pub message: String,
    /// `Sender` (the client's fault) or `Receiver`.
    pub sender: bool,
}

impl SqsError {
    fn new(status: u16, shape: &'static str, code: &'static str, message: String) -> SqsError {
        SqsError {
            status,
            shape,
            modelled: true,
            code,
            message,
            sender: status < 500,
        }
    }

    fn common(status: u16, shape: &'static str, code: &'static str, message: String) -> SqsError {
        SqsError {
            modelled: false,
            ..SqsError::new(status, shape, code, message)
        }
    }

    pub fn invalid(message: impl Into<String>) -> SqsError {
        SqsError::common(
            400,
            "InvalidParameterValueException",
            "InvalidParameterValue",
            message.into(),
        )
    }

    pub fn missing(parameter: &str) -> SqsError {
        SqsError::common(
            400,
            "MissingRequiredParameterException",
            "MissingParameter",
            format!("The request must contain the parameter {parameter}."),
        )
    }

    pub fn no_queue() -> SqsError {
        SqsError::new(
            400,
            "QueueDoesNotExist",
            "AWS.SimpleQueueService.NonExistentQueue",
            "The specified queue does not exist.".into(),
        )
    }

    pub fn unsupported(what: &str) -> SqsError {
        SqsError::new(
            400,
            "UnsupportedOperation",
            "AWS.SimpleQueueService.UnsupportedOperation",
            format!("{what} is not supported by berth yet (docs/sqs.md)"),
        )
    }

    fn invalid_action(action: &str) -> SqsError {
        SqsError::common(
            400,
            "InvalidAction",
            "InvalidAction",
            format!("The action {action} is not valid for this endpoint."),
        )
    }

    /// What berth's own error means to an SQS client.
    pub fn of(e: &OpError) -> SqsError {
        use crate::engine::EngineError as E;
        let (status, code) = crate::ops::status::status_of(e);
        match e {
            OpError::Engine(E::TopicNotFound(_)) => SqsError::no_queue(),
            OpError::MessageTooLarge { limit } => SqsError::invalid(format!(
                "One or more parameters are invalid. Reason: Message must be shorter than {limit} bytes."
            )),
            _ if status == 503 => SqsError::common(
                503,
                "ServiceUnavailable",
                "ServiceUnavailable",
                e.to_string(),
            ),
            _ if status >= 500 => {
                SqsError::common(500, "InternalFailure", "InternalFailure", e.to_string())
            }
            _ if code.ends_with("_limit") => {
                SqsError::new(403, "OverLimit", "OverLimit", e.to_string())
            }
            _ => SqsError::invalid(e.to_string()),
        }
    }
}

impl From<OpError> for SqsError {
    fn from(e: OpError) -> SqsError {
        SqsError::of(&e)
    }
}

/// What an action knows of the request beyond its input.
pub struct Context<'a> {
    pub front: &'a Front,
    /// `http` or `https`, and the Host header: queue URLs are `{scheme}://{host}/{account}/{queue}`.
    pub scheme: &'static str,
    pub host: String,
    /// The account and region of queue URLs and ARNs.
    pub account: String,
    pub region: String,
    /// The queue named by the request's path (`/{account}/{queue}`), if any; a `QueueUrl` in the input wins.
    pub path_queue: Option<String>,
}

/// Request ids: unique per core and process (AWS sends UUIDs; clients treat them as opaque text).
fn request_id() -> String {
    thread_local! {
        static NEXT: Cell<u64> = const { Cell::new(0) };
    }
    let n = NEXT.with(|c| {
        c.set(c.get() + 1);
        c.get()
    });
    let core = glommio::executor().id() as u64;
    let start = crate::clock::wall_clock_ms();
    format!(
        "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
        (start >> 16) as u32,
        (start & 0xffff) as u16,
        core & 0xfff,
        (n >> 48) & 0xfff,
        n & 0xffff_ffff_ffff
    )
}

/// Answers one SQS request (`is_sqs_request`).
pub async fn handle(front: &Front, req: Request, tls: bool) -> Response {
    let id = request_id();
    let config = front.engine().config();
    let protocol = match req.amz_target {
        Some(_) => Protocol::Json,
        None => Protocol::Query,
    };
    if !config.sqs_credentials.is_empty() {
        if let Err(e) = authenticate(&req, &config.sqs_credentials) {
            tracing::debug!(error = %e.message, "an SQS request was refused its signature");
            return error_reply(protocol, &e, &id);
        }
    }
    // SDKs send no Origin; a browser does: a page (even one on another loopback port) never drives the face.
    if req.origin.is_some() {
        let e = SqsError::common(
            403,
            "AccessDeniedException",
            "AccessDenied",
            "browser requests (with an Origin header) are refused by the SQS face".into(),
        );
        return error_reply(protocol, &e, &id);
    }
    if req.host.as_deref().is_some_and(|h| !valid_host(h)) {
        return error_reply(
            protocol,
            &SqsError::invalid("the Host header is not host[:port]"),
            &id,
        );
    }
    let (protocol, action, input) = match decode(&req) {
        Ok(decoded) => decoded,
        Err((protocol, e)) => return error_reply(protocol, &e, &id),
    };
    let path_queue = is_sqs_path(&req.path)
        .then(|| req.path.rsplit('/').next().map(str::to_string))
        .flatten()
        .filter(|q| !q.is_empty());
    let ctx = Context {
        front,
        scheme: if tls { "https" } else { "http" },
        host: req
            .host
            .clone()
            .unwrap_or_else(|| config.listen.to_string()),
        account: config.sqs_account.clone(),
        region: config
            .sqs_region
            .clone()
            .or_else(|| credential_region(req.authorization.as_deref()))
            .unwrap_or_else(|| "us-east-1".into()),
        path_queue,
    };
    // Cluster mode: a queue created through another node a moment ago may not be in this node's replica of the
    // metastore yet. As for the native routes, the metastore itself is asked, and the action run again (it failed
    // at its first step, finding the queue, so nothing of it was done).
    let named = front
        .engine()
        .clustered()
        .then(|| actions::queue_named(&input, ctx.path_queue.as_deref()))
        .flatten();
    let mut result = Box::pin(actions::run(&ctx, &action, input)).await;
    if let (Err(e), Some(name)) = (&result, &named) {
        if *e == SqsError::no_queue() && front.lookup_topic(name, true).await {
            if let Ok((_, _, input)) = decode(&req) {
                result = Box::pin(actions::run(&ctx, &action, input)).await;
            }
        }
    }
    match result {
        Ok(output) => match protocol {
            Protocol::Json => Response::bytes(
                200,
                AMZ_JSON,
                Bytes::from(serde_json::to_vec(&output).expect("a JSON value serialises")),
            )
            .with_header("x-amzn-requestid", &id),
            Protocol::Query => Response::bytes(
                200,
                "text/xml",
                Bytes::from(query::output_to_xml(&action, &output, &id)),
            )
            .with_header("x-amzn-requestid", &id),
        },
        Err(e) => error_reply(protocol, &e, &id),
    }
}

/// Checks a request's SigV4 signature against the configured credentials (`sigv4.rs`), as AWS answers: unsigned
/// `MissingAuthenticationToken`, an unknown key `InvalidClientTokenId`, a wrong signature or a request time more
/// than 5 minutes off `SignatureDoesNotMatch`, a malformed signature `IncompleteSignature`.
fn authenticate(
    req: &Request,
    credentials: &std::collections::BTreeMap<String, String>,
) -> Result<(), SqsError> {
    let headers: Vec<(&str, &[u8])> = req
        .signed_headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_slice()))
        .collect();
    let signed = sigv4::SignedRequest {
        method: req.method,
        path: &req.path,
        query: &req.query,
        headers: &headers,
        body: &req.body,
    };
    let now = crate::clock::wall_clock_ms() / 1000;
    let denied =
        |shape: &'static str, message: String| SqsError::common(403, shape, shape, message);
    match sigv4::authenticate(
        &signed,
        &sigv4::Policy::SQS,
        |key| credentials.get(key).cloned(),
        now,
    ) {
        Ok(sigv4::Verdict::Signed(_)) => Ok(()),
        Ok(sigv4::Verdict::Unsigned) => Err(denied(
            "MissingAuthenticationToken",
            "Request is missing Authentication Token".into(),
        )),
        Err(e @ sigv4::SigError::UnknownKey) => Err(denied("InvalidClientTokenId", e.to_string())),
        Err(e @ (sigv4::SigError::BadSignature { .. } | sigv4::SigError::Expired(_))) => {
            Err(denied("SignatureDoesNotMatch", e.to_string()))
        }
        Err(e @ sigv4::SigError::Malformed(_)) => Err(SqsError::common(
            400,
            "IncompleteSignature",
            "IncompleteSignature",
            e.to_string(),
        )),
    }
}

/// The region of a SigV4 `Authorization` header's credential scope (`Credential=AKID/DATE/REGION/sqs/...`).
fn credential_region(authorization: Option<&str>) -> Option<String> {
    let credential = authorization?.split("Credential=").nth(1)?;
    let region = credential.split('/').nth(2)?;
    (!region.is_empty()
        && region.len() <= 32
        && region
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'))
    .then(|| region.to_string())
}

/// The protocol, the action and its input (the JSON protocol's shape) of a request.
fn decode(req: &Request) -> Result<(Protocol, String, Value), (Protocol, SqsError)> {
    if let Some(target) = req.amz_target.as_deref() {
        let protocol = Protocol::Json;
        let Some(action) = target.strip_prefix("AmazonSQS.") else {
            return Err((protocol, SqsError::invalid_action(target)));
        };
        if !actions::known(action) {
            return Err((protocol, SqsError::invalid_action(action)));
        }
        if !json_within(&req.body, MAX_JSON_TOKENS) {
            return Err((
                protocol,
                SqsError::invalid(format!(
                    "the request has more than {MAX_JSON_TOKENS} JSON members and items, or nests deeper than 32"
                )),
            ));
        }
        let input = if req.body.iter().all(u8::is_ascii_whitespace) {
            Value::Object(Default::default())
        } else {
            serde_json::from_slice::<Value>(&req.body).map_err(|e| {
                (
                    protocol,
                    SqsError::common(
                        400,
                        "SerializationException",
                        "SerializationException",
                        format!("the body is not JSON: {e}"),
                    ),
                )
            })?
        };
        if !input.is_object() {
            return Err((
                protocol,
                SqsError::common(
                    400,
                    "SerializationException",
                    "SerializationException",
                    "the body is not a JSON object".into(),
                ),
            ));
        }
        return Ok((protocol, action.to_string(), input));
    }
    let protocol = Protocol::Query;
    let pairs: Vec<(String, String)> = form_urlencoded::parse(&req.body)
        .chain(form_urlencoded::parse(req.query.as_bytes()))
        .take(MAX_FORM_PAIRS + 1)
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    if pairs.len() > MAX_FORM_PAIRS {
        return Err((
            protocol,
            SqsError::invalid(format!(
                "the request has more than {MAX_FORM_PAIRS} parameters"
            )),
        ));
    }
    let Some(action) = pairs
        .iter()
        .find(|(k, _)| k == "Action")
        .map(|(_, v)| v.clone())
    else {
        return Err((protocol, SqsError::missing("Action")));
    };
    if !actions::known(&action) {
        return Err((protocol, SqsError::invalid_action(&action)));
    }
    let input = query::input_from_form(&action, &pairs)
        .map_err(|e| (protocol, SqsError::invalid(e.message)))?;
    Ok((protocol, action, input))
}

fn error_reply(protocol: Protocol, e: &SqsError, id: &str) -> Response {
    let fault = if e.sender { "Sender" } else { "Receiver" };
    match protocol {
        Protocol::Json => {
            let namespace = if e.modelled {
                "com.amazonaws.sqs"
            } else {
                "com.amazon.coral.service"
            };
            let body = serde_json::json!({
                "__type": format!("{namespace}#{}", e.shape),
                "message": e.message,
            });
            Response::bytes(
                e.status,
                AMZ_JSON,
                Bytes::from(serde_json::to_vec(&body).expect("a JSON value serialises")),
            )
            .with_header("x-amzn-requestid", id)
            .with_header("x-amzn-query-error", format!("{};{fault}", e.code))
        }
        Protocol::Query => Response::bytes(
            e.status,
            "text/xml",
            Bytes::from(query::error_xml(e.code, &e.message, e.sender, id)),
        )
        .with_header("x-amzn-requestid", id),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqs_paths_are_the_root_and_queue_urls() {
        assert!(is_sqs_path("/"));
        assert!(is_sqs_path("/000000000000/orders"));
        assert!(!is_sqs_path("/000000000000"));
        assert!(!is_sqs_path("/produce"));
        assert!(!is_sqs_path("/topics/orders"));
        assert!(!is_sqs_path("/00000000000x/orders"));
        assert!(!is_sqs_path("/000000000000/orders/extra"));
        assert!(is_sqs_body("/", Some("application/x-amz-json-1.0")));
        assert!(is_sqs_body(
            "/",
            Some("application/x-www-form-urlencoded; charset=utf-8")
        ));
        assert!(!is_sqs_body("/produce", Some("application/x-amz-json-1.0")));
        assert!(!is_sqs_body("/", Some("text/plain")));
    }

    #[test]
    fn the_region_comes_from_the_credential_scope() {
        let auth = "AWS4-HMAC-SHA256 Credential=AKID/20261206/eu-west-3/sqs/aws4_request, SignedHeaders=host, Signature=00";
        assert_eq!(credential_region(Some(auth)).as_deref(), Some("eu-west-3"));
        assert_eq!(credential_region(Some("Bearer x")), None);
        assert_eq!(
            credential_region(Some("AWS4-HMAC-SHA256 Credential=A/D/EVIL<>/sqs")),
            None
        );
    }
}
