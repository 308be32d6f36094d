//! Server-side AWS Signature Version 4 verification for the SQS face: reads the `Authorization` header (or a
//! presigned query string), rebuilds the canonical request the client signed and checks its HMAC-SHA256.
//! Pure: the clock and the key store are arguments, nothing here does I/O. The SQS HTTP handler calls
//! [`authenticate`] before it dispatches an action, and maps [`SigError`] to an AWS error code.
//! References: docs/sqs-protocol-notes.md §10; AWS General Reference, "Signature Version 4 signing process"
//! (tasks 1–4: canonical request, string to sign, signing key, signature) and "Authenticating requests: using
//! query parameters"; botocore `auth.SigV4Auth` / `auth.SigV4QueryAuth`, which this matches byte for byte.

use std::fmt;

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::md5::lower_hex;

type HmacSha256 = Hmac<Sha256>;

/// The one algorithm accepted, in the `Authorization` header and in `X-Amz-Algorithm`.
const ALGORITHM: &str = "AWS4-HMAC-SHA256";
/// Last element of every credential scope.
const SCOPE_TERMINATOR: &str = "aws4_request";
/// Query parameters whose presence makes a request presigned.
const QUERY_AUTH_MARKERS: [&[u8]; 3] =
    [b"X-Amz-Algorithm", b"X-Amz-Credential", b"X-Amz-Signature"];
/// Default for [`Policy::max_skew_secs`]: 5 minutes. (AWS SQS itself was seen allowing 15; notes §10.3.)
pub const DEFAULT_MAX_SKEW_SECS: u64 = 5 * 60;
/// Longest validity a presigned request may ask for in `X-Amz-Expires` (7 days), as AWS enforces.
pub const MAX_PRESIGNED_EXPIRES_SECS: u64 = 7 * 24 * 3600;
const SECS_PER_DAY: u64 = 86_400;

/// One HTTP request as received, independent of any HTTP library.
#[derive(Debug, Clone, Copy)]
pub struct SignedRequest<'a> {
    /// Request method, as on the request line (`POST`).
    pub method: &'a str,
    /// Raw request path as received, still percent-encoded, up to (not including) `?`.
    pub path: &'a str,
    /// Raw query string after `?`, still percent-encoded; empty when there is none.
    pub query: &'a str,
    /// Header fields in arrival order: names in any case, repeated names kept as separate entries.
    pub headers: &'a [(&'a str, &'a [u8])],
    /// Body bytes exactly as received (before any form or JSON decoding).
    pub body: &'a [u8],
}

/// What a signature must satisfy besides matching.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy<'a> {
    /// Service name the credential scope must carry: `sqs` for SQS clients.
    pub service: &'a str,
    /// How far a header-signed request's time may be from now, either way, and how far a presigned request's
    /// time may lie in the future. Default [`DEFAULT_MAX_SKEW_SECS`].
    pub max_skew_secs: u64,
}

impl Policy<'static> {
    /// SQS clients: service `sqs`, [`DEFAULT_MAX_SKEW_SECS`].
    pub const SQS: Policy<'static> = Policy {
        service: "sqs",
        max_skew_secs: DEFAULT_MAX_SKEW_SECS,
    };
}

/// Where the signature travelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthKind {
    /// `Authorization: AWS4-HMAC-SHA256 …` header.
    Header,
    /// Presigned: `X-Amz-Algorithm`, `X-Amz-Credential`, … in the query string.
    Query {
        /// `X-Amz-Expires`, when given: seconds the request stays valid after `X-Amz-Date`.
        expires_secs: Option<u64>,
    },
}

/// The SigV4 fields of a request, checked for form but not yet verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed {
    /// Header or query-string auth.
    pub kind: AuthKind,
    /// Access key id, the first element of the credential.
    pub access_key: String,
    /// Region of the credential scope, as the client put it (not checked here).
    pub region: String,
    /// Service of the credential scope (checked against [`Policy::service`] by [`verify`]).
    pub service: String,
    /// Request time as `YYYYMMDDTHHMMSSZ`, the form it takes in the string to sign; its first 8 characters
    /// equal the credential scope's date.
    pub amz_date: String,
    /// The same instant in seconds since the Unix epoch.
    pub request_unix_secs: u64,
    /// The `;`-separated lower-case header names the client signed, verbatim.
    pub signed_headers: String,
    /// The signature, decoded from hex.
    pub signature: [u8; 32],
    /// `X-Amz-Security-Token` (temporary credentials), when present; the caller decides what it is worth.
    pub security_token: Option<String>,
}

/// Outcome of [`authenticate`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The request carries no SigV4 auth at all.
    Unsigned,
    /// The signature is valid for the access key and region inside.
    Signed(Parsed),
}

/// Why a signed request was refused. The HTTP layer picks the AWS code; [`fmt::Display`] gives the message, AWS's
/// own text where it is known (notes §10, public reports of AWS replies).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SigError {
    /// Auth fields missing, duplicated or ill-formed, a credential scope that does not fit, a signed header the
    /// request lacks. AWS: 400 `IncompleteSignature` (or `InvalidParameterValue`).
    Malformed(String),
    /// No secret for the access key. AWS: 403 `InvalidClientTokenId`.
    UnknownKey,
    /// The signature does not match. AWS: 403 `SignatureDoesNotMatch`. Carries what the server signed, for the
    /// log (nothing secret: the client knows all of it).
    BadSignature {
        /// The canonical request as rebuilt here (non-UTF-8 header bytes shown lossily).
        canonical_request: String,
        /// The string to sign as rebuilt here.
        string_to_sign: String,
    },
    /// The request time is too far from now, or a presigned request is past `X-Amz-Expires`; the message is AWS's.
    /// AWS: 403 `RequestExpired` for presigned requests; SQS answers header-signed ones with 403
    /// `SignatureDoesNotMatch` and this message (notes §10.3).
    Expired(String),
}

impl fmt::Display for SigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SigError::Malformed(message) | SigError::Expired(message) => f.write_str(message),
            SigError::UnknownKey => {
                f.write_str("The security token included in the request is invalid.")
            }
            SigError::BadSignature { .. } => f.write_str(
                "The request signature we calculated does not match the signature you provided. Check your AWS \
                 Secret Access Key and signing method. Consult the service documentation for details.",
            ),
        }
    }
}

impl std::error::Error for SigError {}

fn malformed(message: impl Into<String>) -> SigError {
    SigError::Malformed(message.into())
}

/// Parses and verifies a request in one step: [`Verdict::Unsigned`] when it carries no SigV4 auth, otherwise
/// [`parse`] then [`verify`].
pub fn authenticate(
    req: &SignedRequest<'_>,
    policy: &Policy<'_>,
    secret_for: impl FnOnce(&str) -> Option<String>,
    now_unix_secs: u64,
) -> Result<Verdict, SigError> {
    match parse(req)? {
        None => Ok(Verdict::Unsigned),
        Some(parsed) => {
            verify(req, &parsed, policy, secret_for, now_unix_secs)?;
            Ok(Verdict::Signed(parsed))
        }
    }
}

/// Reads the SigV4 fields of a request: from the `Authorization` header, or from the query string when it has
/// `X-Amz-Algorithm`, `X-Amz-Credential` or `X-Amz-Signature` (presigned). `Ok(None)` when it has neither.
/// Checks form only: the algorithm, the credential `AKID/YYYYMMDD/region/service/aws4_request` (AWS SigV4
/// "Task 2"), a request time (`X-Amz-Date`, else the `Date` header, as botocore sends one when the request had
/// it) whose date equals the scope's, a signed-header list that includes `host`, a 64-digit hex signature.
pub fn parse(req: &SignedRequest<'_>) -> Result<Option<Parsed>, SigError> {
    let authorization = single_header(req, "authorization")?;
    let query = decode_query(req.query);
    let query_auth = query
        .iter()
        .any(|(key, _)| QUERY_AUTH_MARKERS.contains(&key.as_slice()));
    match (authorization, query_auth) {
        (None, false) => Ok(None),
        (Some(_), true) => Err(malformed(
            "Only one auth mechanism allowed; only the X-Amz-Algorithm query parameter or the Authorization \
             header should be specified",
        )),
        (Some(value), false) => parse_header_auth(req, value).map(Some),
        (None, true) => parse_query_auth(&query).map(Some),
    }
}

/// Checks a parsed request's signature, per AWS SigV4 tasks 1–4: the scope's service is `policy.service`, the
/// access key is known (`secret_for` gives its secret), the request time is within `policy.max_skew_secs` of
/// `now_unix_secs` (a presigned one: not yet expired), and HMAC-SHA256 of the rebuilt string to sign under the
/// derived key equals the signature (compared in constant time). The payload hash is SHA-256 of the body, or the
/// `x-amz-content-sha256` header, which must then be that same hash.
pub fn verify(
    req: &SignedRequest<'_>,
    parsed: &Parsed,
    policy: &Policy<'_>,
    secret_for: impl FnOnce(&str) -> Option<String>,
    now_unix_secs: u64,
) -> Result<(), SigError> {
    if parsed.service != policy.service {
        return Err(malformed(format!(
            "Credential should be scoped to correct service: '{}'.",
            policy.service
        )));
    }
    let secret = secret_for(&parsed.access_key).ok_or(SigError::UnknownKey)?;
    check_time(parsed, policy.max_skew_secs, now_unix_secs)?;
    let canonical = canonical_request(req, parsed)?;
    let string_to_sign = string_to_sign(parsed, &canonical);
    let key = signing_key(&secret, scope_date(parsed), &parsed.region, &parsed.service);
    let expected = hmac_sha256(&key, string_to_sign.as_bytes());
    if bool::from(expected.ct_eq(&parsed.signature)) {
        Ok(())
    } else {
        Err(SigError::BadSignature {
            canonical_request: String::from_utf8_lossy(&canonical).into_owned(),
            string_to_sign,
        })
    }
}

/// `Authorization: AWS4-HMAC-SHA256 Credential=…, SignedHeaders=…, Signature=…` (parts in any order, separated
/// by `,` with optional spaces: botocore writes `", "`, other signers `","`).
fn parse_header_auth(req: &SignedRequest<'_>, value: &[u8]) -> Result<Parsed, SigError> {
    let value = std::str::from_utf8(value)
        .map_err(|_| malformed("the Authorization header is not UTF-8"))?
        .trim();
    let (scheme, rest) = value
        .split_once(|c: char| c.is_ascii_whitespace())
        .unwrap_or((value, ""));
    if scheme != ALGORITHM {
        return Err(malformed(format!(
            "Unsupported Authorization scheme '{scheme}': only {ALGORITHM} is accepted"
        )));
    }
    let (mut credential, mut signed_headers, mut signature) = (None, None, None);
    for part in rest.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let Some((key, field)) = part.split_once('=') else {
            return Err(malformed(format!(
                "'{part}' in the Authorization header is not key=value"
            )));
        };
        let slot = match key {
            "Credential" => &mut credential,
            "SignedHeaders" => &mut signed_headers,
            "Signature" => &mut signature,
            _ => {
                return Err(malformed(format!(
                    "unknown parameter '{key}' in the Authorization header"
                )))
            }
        };
        if slot.replace(field).is_some() {
            return Err(malformed(format!(
                "'{key}' appears twice in the Authorization header"
            )));
        }
    }
    let (Some(credential), Some(signed_headers), Some(signature)) =
        (credential, signed_headers, signature)
    else {
        let missing: Vec<String> = [
            ("Credential", credential),
            ("Signature", signature),
            ("SignedHeaders", signed_headers),
        ]
        .iter()
        .filter(|(_, field)| field.is_none())
        .map(|(name, _)| format!("Authorization header requires '{name}' parameter."))
        .collect();
        return Err(malformed(missing.join(" ")));
    };
    let (amz_date, request_unix_secs) = match header_str(req, "x-amz-date")? {
        Some(text) => {
            let text = text.trim();
            let secs = parse_amz_date(text).ok_or_else(|| {
                malformed(format!(
                    "X-Amz-Date '{text}' is not of the form YYYYMMDDTHHMMSSZ"
                ))
            })?;
            (text.to_owned(), secs)
        }
        None => match header_str(req, "date")? {
            Some(text) => {
                let secs = parse_http_date(text).ok_or_else(|| {
                    malformed(format!("Date header '{}' is not an RFC 1123 date", text.trim()))
                })?;
                (format_amz_date(secs), secs)
            }
            None => {
                return Err(malformed(
                    "Authorization header requires existence of either a 'X-Amz-Date' or a 'Date' header.",
                ))
            }
        },
    };
    let security_token = header_str(req, "x-amz-security-token")?.map(|t| t.trim().to_owned());
    build_parsed(
        AuthKind::Header,
        credential,
        amz_date,
        request_unix_secs,
        signed_headers,
        signature,
        security_token,
    )
}

/// Presigned: `X-Amz-Algorithm`, `X-Amz-Credential`, `X-Amz-Date`, `X-Amz-SignedHeaders`, `X-Amz-Signature`
/// required, `X-Amz-Expires` and `X-Amz-Security-Token` optional, each at most once.
fn parse_query_auth(query: &[(Vec<u8>, Vec<u8>)]) -> Result<Parsed, SigError> {
    let param = |name: &str| -> Result<Option<&str>, SigError> {
        let mut values = query.iter().filter(|(key, _)| key == name.as_bytes());
        let Some((_, value)) = values.next() else {
            return Ok(None);
        };
        if values.next().is_some() {
            return Err(malformed(format!(
                "query parameter '{name}' appears more than once"
            )));
        }
        std::str::from_utf8(value)
            .map(Some)
            .map_err(|_| malformed(format!("query parameter '{name}' is not UTF-8")))
    };
    let (Some(algorithm), Some(credential), Some(date), Some(signed_headers), Some(signature)) = (
        param("X-Amz-Algorithm")?,
        param("X-Amz-Credential")?,
        param("X-Amz-Date")?,
        param("X-Amz-SignedHeaders")?,
        param("X-Amz-Signature")?,
    ) else {
        return Err(malformed(
            "AWS query-string parameters must include 'X-Amz-Algorithm', 'X-Amz-Credential', \
             'X-Amz-Signature', 'X-Amz-Date', 'X-Amz-SignedHeaders'. Re-examine the query-string parameters.",
        ));
    };
    if algorithm != ALGORITHM {
        return Err(malformed(format!(
            "X-Amz-Algorithm only supports '{ALGORITHM}', not '{algorithm}'"
        )));
    }
    let request_unix_secs = parse_amz_date(date).ok_or_else(|| {
        malformed(format!(
            "X-Amz-Date '{date}' is not of the form YYYYMMDDTHHMMSSZ"
        ))
    })?;
    let expires_secs = match param("X-Amz-Expires")? {
        None => None,
        Some(text) => match parse_digits(text) {
            Some(secs) if secs <= MAX_PRESIGNED_EXPIRES_SECS => Some(secs),
            Some(_) => {
                return Err(malformed(format!(
                    "X-Amz-Expires must be less than a week (in seconds) that is {MAX_PRESIGNED_EXPIRES_SECS}"
                )))
            }
            None => {
                return Err(malformed(format!(
                    "X-Amz-Expires '{text}' is not a number of seconds"
                )))
            }
        },
    };
    let security_token = param("X-Amz-Security-Token")?.map(str::to_owned);
    build_parsed(
        AuthKind::Query { expires_secs },
        credential,
        date.to_owned(),
        request_unix_secs,
        signed_headers,
        signature,
        security_token,
    )
}

/// The checks header and query auth share: credential scope, scope date, signed-header list, signature form.
fn build_parsed(
    kind: AuthKind,
    credential: &str,
    amz_date: String,
    request_unix_secs: u64,
    signed_headers: &str,
    signature: &str,
    security_token: Option<String>,
) -> Result<Parsed, SigError> {
    // AKID/YYYYMMDD/region/service/aws4_request; split from the right so only the key id is "the rest".
    let mut parts = credential.rsplitn(5, '/');
    let (Some(terminator), Some(service), Some(region), Some(date), Some(access_key)) = (
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
    ) else {
        return Err(malformed(format!(
            "Credential '{credential}' is not of the form <key id>/<YYYYMMDD>/<region>/<service>/aws4_request"
        )));
    };
    if access_key.is_empty() || region.is_empty() || service.is_empty() {
        return Err(malformed(format!(
            "Credential '{credential}' has an empty key id, region or service"
        )));
    }
    if terminator != SCOPE_TERMINATOR {
        return Err(malformed(format!(
            "Credential should be scoped with a valid terminator: '{SCOPE_TERMINATOR}', not '{terminator}'."
        )));
    }
    if amz_date.get(..8) != Some(date) {
        return Err(malformed(format!(
            "Date in Credential scope does not match YYYYMMDD from ISO-8601 version of date from HTTP: \
             '{date}' != '{}', from '{amz_date}'.",
            amz_date.get(..8).unwrap_or_default()
        )));
    }
    let names_ok = signed_headers.split(';').all(|name| {
        !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_graphic() && !b.is_ascii_uppercase())
    });
    if !names_ok {
        return Err(malformed(format!(
            "SignedHeaders '{signed_headers}' is not a ';'-separated list of lower-case header names"
        )));
    }
    if !signed_headers.split(';').any(|name| name == "host") {
        return Err(malformed(format!(
            "SignedHeaders '{signed_headers}' must include 'host'"
        )));
    }
    let signature = decode_signature(signature)
        .ok_or_else(|| malformed("Signature must be 64 hexadecimal digits"))?;
    Ok(Parsed {
        kind,
        access_key: access_key.to_owned(),
        region: region.to_owned(),
        service: service.to_owned(),
        amz_date,
        request_unix_secs,
        signed_headers: signed_headers.to_owned(),
        signature,
        security_token,
    })
}

/// Header-signed, or presigned without `X-Amz-Expires`: within `max_skew_secs` of now either way (AWS's
/// messages). Presigned with `X-Amz-Expires`: not more than the skew in the future, and not past its expiry.
fn check_time(parsed: &Parsed, max_skew_secs: u64, now: u64) -> Result<(), SigError> {
    let at = parsed.request_unix_secs;
    let skew = if max_skew_secs.is_multiple_of(60) {
        format!("{} min.", max_skew_secs / 60)
    } else {
        format!("{max_skew_secs} s.")
    };
    if at > now.saturating_add(max_skew_secs) {
        return Err(SigError::Expired(match parsed.kind {
            AuthKind::Query {
                expires_secs: Some(_),
            } => "Request is not valid yet".to_owned(),
            _ => format!(
                "Signature not yet current: {} is still later than {} ({} + {skew})",
                parsed.amz_date,
                format_amz_date(now.saturating_add(max_skew_secs)),
                format_amz_date(now),
            ),
        }));
    }
    match parsed.kind {
        AuthKind::Query {
            expires_secs: Some(expires),
        } => {
            if now > at.saturating_add(expires) {
                return Err(SigError::Expired("Request has expired".to_owned()));
            }
        }
        _ => {
            if at.saturating_add(max_skew_secs) < now {
                return Err(SigError::Expired(format!(
                    "Signature expired: {} is now earlier than {} ({} - {skew})",
                    parsed.amz_date,
                    format_amz_date(now.saturating_sub(max_skew_secs)),
                    format_amz_date(now),
                )));
            }
        }
    }
    Ok(())
}

/// AWS SigV4 task 1: method, canonical URI, canonical query, canonical headers, signed headers, payload hash,
/// joined by `\n`. Bytes, since header values need not be UTF-8.
fn canonical_request(req: &SignedRequest<'_>, parsed: &Parsed) -> Result<Vec<u8>, SigError> {
    let presigned = matches!(parsed.kind, AuthKind::Query { .. });
    let mut out = Vec::with_capacity(256 + req.query.len());
    out.extend_from_slice(req.method.as_bytes());
    out.push(b'\n');
    out.extend_from_slice(canonical_uri(req.path).as_bytes());
    out.push(b'\n');
    out.extend_from_slice(canonical_query(req.query, presigned).as_bytes());
    out.push(b'\n');
    for name in parsed.signed_headers.split(';') {
        out.extend_from_slice(name.as_bytes());
        out.push(b':');
        let mut found = false;
        for value in header_values(req, name) {
            if found {
                out.push(b',');
            }
            found = true;
            push_trimmed(&mut out, value);
        }
        if !found {
            return Err(malformed(format!(
                "SignedHeaders names '{name}', which the request does not carry"
            )));
        }
        out.push(b'\n');
    }
    out.push(b'\n');
    out.extend_from_slice(parsed.signed_headers.as_bytes());
    out.push(b'\n');
    out.extend_from_slice(payload_hash(req)?.as_bytes());
    Ok(out)
}

/// AWS SigV4 task 2: algorithm, request time, credential scope, hex SHA-256 of the canonical request.
fn string_to_sign(parsed: &Parsed, canonical_request: &[u8]) -> String {
    format!(
        "{ALGORITHM}\n{}\n{}/{}/{}/{SCOPE_TERMINATOR}\n{}",
        parsed.amz_date,
        scope_date(parsed),
        parsed.region,
        parsed.service,
        lower_hex(&Sha256::digest(canonical_request))
    )
}

/// AWS SigV4 task 3: `kSigning = HMAC(HMAC(HMAC(HMAC("AWS4" + secret, date), region), service), "aws4_request")`.
fn signing_key(secret: &str, date: &str, region: &str, service: &str) -> [u8; 32] {
    let k_date = hmac_sha256(format!("AWS4{secret}").as_bytes(), date.as_bytes());
    let k_region = hmac_sha256(&k_date, region.as_bytes());
    let k_service = hmac_sha256(&k_region, service.as_bytes());
    hmac_sha256(&k_service, SCOPE_TERMINATOR.as_bytes())
}

fn hmac_sha256(key: &[u8], data: &[u8]) -> [u8; 32] {
    // HMAC takes a key of any length (longer ones are hashed first), so this cannot fail.
    let mut mac = HmacSha256::new_from_slice(key).expect("HMAC accepts keys of any length");
    mac.update(data);
    mac.finalize().into_bytes().into()
}

/// The credential scope's date: the first 8 characters of the request time (checked equal by [`parse`]).
fn scope_date(parsed: &Parsed) -> &str {
    parsed.amz_date.get(..8).unwrap_or_default()
}

/// Canonical URI the way botocore builds it for every service but S3: the path as received (already
/// percent-encoded), dot segments and empty segments removed, then percent-encoded again except `/` and the
/// RFC 3986 unreserved characters, so `%20` becomes `%2520`. An empty path is `/`.
fn canonical_uri(path: &str) -> String {
    percent_encode(remove_dot_segments(path).as_bytes(), true)
}

/// botocore `utils.normalize_url_path`: RFC 3986 §5.2.4 dot-segment removal that also drops empty segments
/// (`//a//` → `/a/`), keeping a leading and (when anything is left) a trailing `/`.
fn remove_dot_segments(path: &str) -> String {
    if path.is_empty() {
        return "/".to_owned();
    }
    let mut kept: Vec<&str> = Vec::new();
    for segment in path.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                kept.pop();
            }
            _ => kept.push(segment),
        }
    }
    let first = if path.starts_with('/') { "/" } else { "" };
    let last = if path.ends_with('/') && !kept.is_empty() {
        "/"
    } else {
        ""
    };
    format!("{first}{}{last}", kept.join("/"))
}

/// Canonical query string: every `key=value` pair decoded, re-encoded with RFC 3986 (unreserved kept, everything
/// else `%XX`, space `%20`), sorted by encoded key then encoded value, joined with `&`. Presigned requests leave
/// `X-Amz-Signature` out.
fn canonical_query(query: &str, presigned: bool) -> String {
    let mut pairs: Vec<(String, String)> = decode_query(query)
        .into_iter()
        .filter(|(key, _)| !(presigned && key == b"X-Amz-Signature"))
        .map(|(key, value)| (percent_encode(&key, false), percent_encode(&value, false)))
        .collect();
    pairs.sort();
    let mut out = String::with_capacity(query.len() + 16);
    for (i, (key, value)) in pairs.iter().enumerate() {
        if i > 0 {
            out.push('&');
        }
        out.push_str(key);
        out.push('=');
        out.push_str(value);
    }
    out
}

/// Splits a raw query into decoded `(key, value)` pairs, as `application/x-www-form-urlencoded` reads them:
/// `+` is a space, `%XX` a byte, a `%` not followed by two hex digits itself; empty pieces between `&`s are
/// skipped, a piece without `=` has an empty value.
fn decode_query(query: &str) -> Vec<(Vec<u8>, Vec<u8>)> {
    query
        .split('&')
        .filter(|piece| !piece.is_empty())
        .map(|piece| {
            let (key, value) = piece.split_once('=').unwrap_or((piece, ""));
            (form_decode(key), form_decode(value))
        })
        .collect()
}

fn form_decode(text: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    let mut rest = text.as_bytes();
    while let Some((&b, tail)) = rest.split_first() {
        rest = tail;
        match b {
            b'+' => out.push(b' '),
            b'%' => {
                let escaped = match tail {
                    [hi, lo, after @ ..] => hex_value(*hi)
                        .zip(hex_value(*lo))
                        .map(|(hi, lo)| (hi * 16 + lo, after)),
                    _ => None,
                };
                match escaped {
                    Some((byte, after)) => {
                        out.push(byte);
                        rest = after;
                    }
                    None => out.push(b'%'),
                }
            }
            _ => out.push(b),
        }
    }
    out
}

/// RFC 3986 percent-encoding as SigV4 wants it: `A-Z a-z 0-9 - _ . ~` kept (and `/` when `keep_slash`),
/// every other byte `%XX` with upper-case hex.
fn percent_encode(bytes: &[u8], keep_slash: bool) -> String {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = String::with_capacity(bytes.len());
    for &b in bytes {
        if b.is_ascii_alphanumeric()
            || matches!(b, b'-' | b'_' | b'.' | b'~')
            || (keep_slash && b == b'/')
        {
            out.push(char::from(b));
        } else {
            out.push('%');
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 0x0f)]));
        }
    }
    out
}

/// Appends a header value with leading and trailing whitespace removed and inner runs of whitespace (line folds
/// included) collapsed to one space (SigV4 "Trimall"; botocore `' '.join(value.split())`).
fn push_trimmed(out: &mut Vec<u8>, value: &[u8]) {
    for (i, word) in value
        .split(|b| is_space(*b))
        .filter(|word| !word.is_empty())
        .enumerate()
    {
        if i > 0 {
            out.push(b' ');
        }
        out.extend_from_slice(word);
    }
}

fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r' | b'\x0b' | b'\x0c')
}

/// Hex SHA-256 of the body, or the `x-amz-content-sha256` header's value when there is one (botocore signs the
/// header's value verbatim), which must then be the body's hash: SQS has no unsigned or streaming payloads.
fn payload_hash(req: &SignedRequest<'_>) -> Result<String, SigError> {
    let actual = lower_hex(&Sha256::digest(req.body));
    let Some(claimed) = header_str(req, "x-amz-content-sha256")? else {
        return Ok(actual);
    };
    let claimed = claimed.trim();
    if claimed.eq_ignore_ascii_case(&actual) {
        Ok(claimed.to_owned())
    } else if claimed.len() == 64 && claimed.bytes().all(|b| b.is_ascii_hexdigit()) {
        Err(malformed(
            "The provided 'x-amz-content-sha256' header does not match what was computed.",
        ))
    } else {
        Err(malformed(format!(
            "x-amz-content-sha256 '{claimed}' is not supported: it must be the hex SHA-256 of the body"
        )))
    }
}

/// Values of every header named `name` (ASCII case-insensitive), in arrival order.
fn header_values<'r>(
    req: &SignedRequest<'r>,
    name: &'r str,
) -> impl Iterator<Item = &'r [u8]> + 'r {
    req.headers
        .iter()
        .filter(move |(key, _)| key.eq_ignore_ascii_case(name))
        .map(|(_, value)| *value)
}

/// The value of a header that may appear at most once.
fn single_header<'r>(req: &SignedRequest<'r>, name: &'r str) -> Result<Option<&'r [u8]>, SigError> {
    let mut values = header_values(req, name);
    let first = values.next();
    if values.next().is_some() {
        return Err(malformed(format!(
            "the request has more than one '{name}' header"
        )));
    }
    Ok(first)
}

fn header_str<'r>(req: &SignedRequest<'r>, name: &'r str) -> Result<Option<&'r str>, SigError> {
    match single_header(req, name)? {
        None => Ok(None),
        Some(value) => std::str::from_utf8(value)
            .map(Some)
            .map_err(|_| malformed(format!("the '{name}' header is not UTF-8"))),
    }
}

fn decode_signature(text: &str) -> Option<[u8; 32]> {
    let bytes = text.as_bytes();
    if bytes.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (slot, pair) in out.iter_mut().zip(bytes.chunks_exact(2)) {
        *slot = hex_value(pair[0])? * 16 + hex_value(pair[1])?;
    }
    Some(out)
}

fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// A non-empty run of ASCII digits that fits a `u64` (no sign, unlike `str::parse`).
fn parse_digits(text: &str) -> Option<u64> {
    if !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// `YYYYMMDDTHHMMSSZ` (botocore `SIGV4_TIMESTAMP`, ISO 8601 basic format, UTC) to Unix seconds; `None` unless
/// every field is in range and the instant is not before 1970.
fn parse_amz_date(text: &str) -> Option<u64> {
    let b = text.as_bytes();
    if b.len() != 16 || b[8] != b'T' || b[15] != b'Z' {
        return None;
    }
    let year = parse_digits(text.get(0..4)?)?;
    let month = parse_digits(text.get(4..6)?)?;
    let day = parse_digits(text.get(6..8)?)?;
    let hour = parse_digits(text.get(9..11)?)?;
    let minute = parse_digits(text.get(11..13)?)?;
    let second = parse_digits(text.get(13..15)?)?;
    unix_secs(year, month, day, hour, minute, second)
}

/// An HTTP `Date` header in RFC 1123 form, `Sun, 06 Nov 1994 08:49:37 GMT` (the weekday optional and not
/// checked), with zone `GMT`, `UT`, `UTC`, `Z` or a numeric `±HHMM` (Python's `email.utils.formatdate`, which
/// botocore uses, writes `-0000`). The obsolete RFC 850 and asctime forms are not accepted.
fn parse_http_date(text: &str) -> Option<u64> {
    let text = text.trim();
    let rest = text.split_once(',').map_or(text, |(_, rest)| rest);
    let mut fields = rest.split_ascii_whitespace();
    let (day, month, year, time, zone) = (
        fields.next()?,
        fields.next()?,
        fields.next()?,
        fields.next()?,
        fields.next()?,
    );
    if fields.next().is_some() || day.len() > 2 || year.len() != 4 {
        return None;
    }
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let month = MONTHS.iter().position(|m| m.eq_ignore_ascii_case(month))? as u64 + 1;
    let mut clock = time.split(':');
    let (hour, minute, second) = (clock.next()?, clock.next()?, clock.next()?);
    if clock.next().is_some() || hour.len() != 2 || minute.len() != 2 || second.len() != 2 {
        return None;
    }
    let local = unix_secs(
        parse_digits(year)?,
        month,
        parse_digits(day)?,
        parse_digits(hour)?,
        parse_digits(minute)?,
        parse_digits(second)?,
    )?;
    match zone {
        "GMT" | "UT" | "UTC" | "Z" => Some(local),
        _ => {
            let (sign, digits) = zone.split_at_checked(1)?;
            if digits.len() != 4 {
                return None;
            }
            let hours = parse_digits(digits.get(0..2)?)?;
            let minutes = parse_digits(digits.get(2..4)?)?;
            if minutes >= 60 {
                return None;
            }
            let offset = hours * 3600 + minutes * 60;
            match sign {
                // Local time ahead of UTC: subtract to get UTC.
                "+" => local.checked_sub(offset),
                "-" => local.checked_add(offset),
                _ => None,
            }
        }
    }
}

/// Seconds since the Unix epoch of a UTC civil time, `None` when a field is out of range or before 1970.
fn unix_secs(year: u64, month: u64, day: u64, hour: u64, minute: u64, second: u64) -> Option<u64> {
    let leap = year.is_multiple_of(4) && (!year.is_multiple_of(100) || year.is_multiple_of(400));
    let month_days = match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return None,
    };
    if !(1970..=9999).contains(&year)
        || !(1..=month_days).contains(&day)
        || hour > 23
        || minute > 59
        || second > 59
    {
        return None;
    }
    let days = days_from_civil(year, month, day);
    Some(days * SECS_PER_DAY + hour * 3600 + minute * 60 + second)
}

/// Days since 1970-01-01 of a date in 1970..=9999 (H. Hinnant's `days_from_civil`, unsigned because the range
/// starts at the epoch).
fn days_from_civil(year: u64, month: u64, day: u64) -> u64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year / 400;
    let year_of_era = year - era * 400;
    let month_from_march = (month + 9) % 12;
    let day_of_year = (153 * month_from_march + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// Unix seconds as `YYYYMMDDTHHMMSSZ` (H. Hinnant's `civil_from_days`).
fn format_amz_date(secs: u64) -> String {
    let days = secs / SECS_PER_DAY + 719_468;
    let era = days / 146_097;
    let day_of_era = days - era * 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    };
    let year = year_of_era + era * 400 + u64::from(month <= 2);
    let rem = secs % SECS_PER_DAY;
    format!(
        "{year:04}{month:02}{day:02}T{:02}{:02}{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const SUITE_SECRET: &str = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY";

    /// One recorded request. `canonical_request`, when known, is the signer's own canonical request.
    struct Case {
        name: &'static str,
        method: &'static str,
        path: &'static str,
        query: &'static str,
        headers: &'static [(&'static str, &'static [u8])],
        body: &'static [u8],
        canonical_request: Option<&'static str>,
    }

    impl Case {
        fn request(&self) -> SignedRequest<'static> {
            SignedRequest {
                method: self.method,
                path: self.path,
                query: self.query,
                headers: self.headers,
                body: self.body,
            }
        }
    }

    fn secrets(key: &str) -> Option<String> {
        (key == "AKIDEXAMPLE").then(|| SUITE_SECRET.to_owned())
    }

    fn at(amz_date: &str) -> u64 {
        parse_amz_date(amz_date).expect("a valid test date")
    }

    fn check(req: &SignedRequest<'_>, policy: &Policy<'_>, now: u64) -> Result<Verdict, SigError> {
        authenticate(req, policy, secrets, now)
    }

    /// Headers of `case` with one header's value replaced (or the header dropped when `value` is None).
    fn with_header(
        headers: &[(&'static str, &'static [u8])],
        name: &str,
        value: Option<&'static [u8]>,
    ) -> Vec<(&'static str, &'static [u8])> {
        headers
            .iter()
            .filter_map(|&(key, old)| {
                if key.eq_ignore_ascii_case(name) {
                    value.map(|new| (key, new))
                } else {
                    Some((key, old))
                }
            })
            .collect()
    }

    fn named(table: &'static [Case], name: &str) -> &'static Case {
        table
            .iter()
            .find(|c| c.name == name)
            .expect("a case of that name")
    }

    #[test]
    fn every_aws_suite_request_verifies_with_the_suites_canonical_request() {
        // AWS SigV4 test suite (aws-c-auth tests/aws-sig-v4-test-suite, as vendored in boto/botocore
        // tests/unit/auth/aws4_testsuite at 0e6e2404): service "service", signed 20150830T123600Z.
        let policy = Policy {
            service: "service",
            max_skew_secs: DEFAULT_MAX_SKEW_SECS,
        };
        let now = at("20150830T123600Z");
        for case in AWS_SUITE {
            let req = case.request();
            let parsed = parse(&req)
                .unwrap_or_else(|e| panic!("{}: {e:?}", case.name))
                .unwrap_or_else(|| panic!("{}: no auth found", case.name));
            if let Some(expected) = case.canonical_request {
                let rebuilt = canonical_request(&req, &parsed).expect("a canonical request");
                assert_eq!(String::from_utf8_lossy(&rebuilt), expected, "{}", case.name);
            }
            assert_eq!(
                verify(&req, &parsed, &policy, secrets, now),
                Ok(()),
                "{}",
                case.name
            );
        }
    }

    #[test]
    fn every_sdk_request_verifies() {
        // Captured from botocore 1.44.18 (JSON protocol; the query-protocol one through the 1.34.89 SQS model),
        // time frozen at 20261206T103000Z: what goes on the wire, Host and the unsigned User-Agent and
        // amz-sdk-* headers included. And signed by the AWS SDK for Rust's aws-sigv4 at the same instant.
        let now = at("20261206T103000Z");
        for case in BOTOCORE.iter().chain(AWS_SDK_RUST) {
            let verdict = check(&case.request(), &Policy::SQS, now)
                .unwrap_or_else(|e| panic!("{}: {e:?}", case.name));
            let Verdict::Signed(parsed) = verdict else {
                panic!("{}: unsigned", case.name)
            };
            assert_eq!(parsed.access_key, "AKIDEXAMPLE", "{}", case.name);
            assert_eq!(parsed.region, "us-east-1", "{}", case.name);
            assert_eq!(parsed.amz_date, "20261206T103000Z", "{}", case.name);
        }
    }

    #[test]
    fn the_notes_vectors_verify() {
        // docs/sqs-protocol-notes.md §10: botocore 1.43.11 at 20240101T000000Z, JSON and query GetQueueUrl.
        let now = at("20240101T000000Z");
        let json = SignedRequest {
            method: "POST",
            path: "/",
            query: "",
            headers: &[
                ("Host", b"localhost:9324"),
                ("X-Amz-Target", b"AmazonSQS.GetQueueUrl"),
                ("Content-Type", b"application/x-amz-json-1.0"),
                ("x-amzn-query-mode", b"true"),
                ("X-Amz-Date", b"20240101T000000Z"),
                ("Authorization", b"AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20240101/us-east-1/sqs/aws4_request, SignedHeaders=content-type;host;x-amz-date;x-amz-target;x-amzn-query-mode, Signature=bd8ef631700a2c7c9db98385868f6d315f57b37eddf51dfe844238a8d524293c"),
            ],
            body: br#"{"QueueName": "orders"}"#,
        };
        let parsed = parse(&json).expect("well formed").expect("signed");
        let canonical = canonical_request(&json, &parsed).expect("a canonical request");
        assert_eq!(
            String::from_utf8_lossy(&canonical),
            "POST\n/\n\ncontent-type:application/x-amz-json-1.0\nhost:localhost:9324\nx-amz-date:20240101T000000Z\n\
             x-amz-target:AmazonSQS.GetQueueUrl\nx-amzn-query-mode:true\n\n\
             content-type;host;x-amz-date;x-amz-target;x-amzn-query-mode\n\
             f1b956558f056b898f85cb298d31cff61868ceb2cbc215d164e77d8eb2dfebfd"
        );
        assert_eq!(
            string_to_sign(&parsed, &canonical),
            "AWS4-HMAC-SHA256\n20240101T000000Z\n20240101/us-east-1/sqs/aws4_request\n\
             79b934e274722557035594d71ed0b71fc90642200c9229d8187155b2f7648ea7"
        );
        assert_eq!(
            lower_hex(&signing_key(SUITE_SECRET, "20240101", "us-east-1", "sqs")),
            "6e9a7792b58224219512402d1ace012e0d8d249118d08a7004e985425a8a7192"
        );
        assert_eq!(verify(&json, &parsed, &Policy::SQS, secrets, now), Ok(()));

        let query = SignedRequest {
            method: "POST",
            path: "/",
            query: "",
            headers: &[
                ("Host", b"localhost:9324"),
                ("Content-Type", b"application/x-www-form-urlencoded; charset=utf-8"),
                ("X-Amz-Date", b"20240101T000000Z"),
                ("Authorization", b"AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20240101/us-east-1/sqs/aws4_request, SignedHeaders=content-type;host;x-amz-date, Signature=4d7fe46c61e91de2763e2723dd35f212183995a1ef7261aba14ee7df846032ca"),
            ],
            body: b"Action=GetQueueUrl&Version=2012-11-05&QueueName=orders",
        };
        assert!(matches!(
            check(&query, &Policy::SQS, now),
            Ok(Verdict::Signed(_))
        ));
    }

    #[test]
    fn an_encoded_path_is_encoded_again() {
        // What botocore does for every service but S3 (notes §10.4), and what the botocore vector
        // "encoded_path_and_query" was signed with.
        assert_eq!(
            canonical_uri("/000000000000/q%20x"),
            "/000000000000/q%2520x"
        );
        assert_eq!(
            canonical_uri("/000000000000/q%20x/a:b"),
            "/000000000000/q%2520x/a%3Ab"
        );
        assert_eq!(canonical_uri(""), "/");
        assert_eq!(canonical_uri("//a/./b/../c//"), "/a/c/");
        assert_eq!(canonical_uri("/a/.."), "/");
    }

    #[test]
    fn the_query_is_decoded_then_encoded_strictly_and_sorted() {
        assert_eq!(
            canonical_query("b=2&a=%7e&A=x+y&a=1&&c&d=%zz", false),
            "A=x%20y&a=1&a=~&b=2&c=&d=%25zz"
        );
        assert_eq!(
            canonical_query("X-Amz-Signature=ab&Action=ListQueues", true),
            "Action=ListQueues"
        );
        assert_eq!(
            canonical_query("X-Amz-Signature=ab&Action=ListQueues", false),
            "Action=ListQueues&X-Amz-Signature=ab"
        );
    }

    #[test]
    fn digits_are_digits_only() {
        assert_eq!(parse_digits("007"), Some(7));
        assert_eq!(parse_digits("18446744073709551615"), Some(u64::MAX));
        for bad in ["", "+1", "-1", " 1", "1 ", "18446744073709551616", "１"] {
            assert_eq!(parse_digits(bad), None, "{bad}");
        }
    }

    #[test]
    fn errors_read_as_aws_words_them() {
        assert_eq!(
            SigError::UnknownKey.to_string(),
            "The security token included in the request is invalid."
        );
        let bad = SigError::BadSignature {
            canonical_request: String::new(),
            string_to_sign: String::new(),
        };
        assert!(bad
            .to_string()
            .starts_with("The request signature we calculated does not match"));
        assert_eq!(
            SigError::Expired("Request has expired".to_owned()).to_string(),
            "Request has expired"
        );
    }

    #[test]
    fn a_request_without_sigv4_is_unsigned() {
        let req = SignedRequest {
            method: "POST",
            path: "/",
            query: "Action=ListQueues",
            headers: &[("Host", b"localhost:9324")],
            body: b"",
        };
        assert_eq!(parse(&req), Ok(None));
        assert_eq!(check(&req, &Policy::SQS, 0), Ok(Verdict::Unsigned));
    }

    #[test]
    fn a_flipped_signature_digit_does_not_match() {
        let case = named(BOTOCORE, "json_get_queue_url");
        let req = case.request();
        let mut parsed = parse(&req).expect("well formed").expect("signed");
        parsed.signature[31] ^= 0x01;
        let now = at("20261206T103000Z");
        let Err(SigError::BadSignature {
            canonical_request,
            string_to_sign,
        }) = verify(&req, &parsed, &Policy::SQS, secrets, now)
        else {
            panic!("a flipped bit must not verify")
        };
        assert!(
            canonical_request.starts_with("POST\n/\n\ncontent-type:application/x-amz-json-1.0\n")
        );
        assert!(string_to_sign.starts_with("AWS4-HMAC-SHA256\n20261206T103000Z\n"));
    }

    #[test]
    fn an_unknown_access_key_is_refused_before_the_clock_or_signature_is_looked_at() {
        let req = named(BOTOCORE, "json_get_queue_url").request();
        let signed_at = at("20261206T103000Z");
        let mut asked = None;
        let verdict = authenticate(
            &req,
            &Policy::SQS,
            |key| {
                asked = Some(key.to_owned());
                None
            },
            signed_at + 3600,
        );
        assert_eq!(verdict, Err(SigError::UnknownKey));
        assert_eq!(asked.as_deref(), Some("AKIDEXAMPLE"));
    }

    #[test]
    fn a_request_six_minutes_off_has_expired_either_way() {
        let req = named(BOTOCORE, "json_get_queue_url").request();
        let signed_at = at("20261206T103000Z");
        assert_eq!(
            check(&req, &Policy::SQS, signed_at + 6 * 60),
            Err(SigError::Expired(
                "Signature expired: 20261206T103000Z is now earlier than 20261206T103100Z \
                 (20261206T103600Z - 5 min.)"
                    .to_owned()
            ))
        );
        assert_eq!(
            check(&req, &Policy::SQS, signed_at - 6 * 60),
            Err(SigError::Expired(
                "Signature not yet current: 20261206T103000Z is still later than 20261206T102900Z \
                 (20261206T102400Z + 5 min.)"
                    .to_owned()
            ))
        );
        // Five minutes either way is still inside.
        assert!(check(&req, &Policy::SQS, signed_at + 5 * 60).is_ok());
        assert!(check(&req, &Policy::SQS, signed_at - 5 * 60).is_ok());
        // A wider window is the policy's to give (AWS SQS allows 15 minutes).
        let wide = Policy {
            max_skew_secs: 15 * 60,
            ..Policy::SQS
        };
        assert!(check(&req, &wide, signed_at + 6 * 60).is_ok());
    }

    #[test]
    fn a_body_changed_after_signing_does_not_match() {
        let case = named(BOTOCORE, "json_get_queue_url");
        let req = SignedRequest {
            body: br#"{"QueueName": "orderz"}"#,
            ..case.request()
        };
        assert!(matches!(
            check(&req, &Policy::SQS, at("20261206T103000Z")),
            Err(SigError::BadSignature { .. })
        ));
    }

    #[test]
    fn a_changed_signed_header_does_not_match_but_an_unsigned_one_may_change() {
        let case = named(BOTOCORE, "json_get_queue_url");
        let now = at("20261206T103000Z");
        let target = with_header(case.headers, "x-amz-target", Some(b"AmazonSQS.DeleteQueue"));
        let req = SignedRequest {
            headers: &target,
            ..case.request()
        };
        assert!(matches!(
            check(&req, &Policy::SQS, now),
            Err(SigError::BadSignature { .. })
        ));
        let agent = with_header(case.headers, "user-agent", Some(b"something else"));
        let req = SignedRequest {
            headers: &agent,
            ..case.request()
        };
        assert!(check(&req, &Policy::SQS, now).is_ok());
    }

    #[test]
    fn a_signed_header_missing_from_the_request_is_malformed() {
        let case = named(BOTOCORE, "json_get_queue_url");
        let headers = with_header(case.headers, "x-amzn-query-mode", None);
        let req = SignedRequest {
            headers: &headers,
            ..case.request()
        };
        assert_eq!(
            check(&req, &Policy::SQS, at("20261206T103000Z")),
            Err(SigError::Malformed(
                "SignedHeaders names 'x-amzn-query-mode', which the request does not carry"
                    .to_owned()
            ))
        );
    }

    #[test]
    fn a_scope_for_another_service_or_date_is_malformed() {
        // The AWS suite's requests are scoped to "service", not "sqs".
        let req = named(AWS_SUITE, "get-vanilla").request();
        assert_eq!(
            check(&req, &Policy::SQS, at("20150830T123600Z")),
            Err(SigError::Malformed(
                "Credential should be scoped to correct service: 'sqs'.".to_owned()
            ))
        );
        let headers: &[(&str, &[u8])] = &[
            ("Host", b"localhost"),
            ("X-Amz-Date", b"20261206T103000Z"),
            ("Authorization", b"AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20261205/us-east-1/sqs/aws4_request, SignedHeaders=host;x-amz-date, Signature=0000000000000000000000000000000000000000000000000000000000000000"),
        ];
        let req = SignedRequest {
            method: "POST",
            path: "/",
            query: "",
            headers,
            body: b"",
        };
        assert_eq!(
            parse(&req),
            Err(SigError::Malformed(
                "Date in Credential scope does not match YYYYMMDD from ISO-8601 version of date from HTTP: \
                 '20261205' != '20261206', from '20261206T103000Z'."
                    .to_owned()
            ))
        );
    }

    #[test]
    fn malformed_authorization_headers_are_refused_with_a_reason() {
        let cases: &[(&[u8], &str)] = &[
            (b"AWS AKIDEXAMPLE:c2lnbmF0dXJl", "Unsupported Authorization scheme 'AWS'"),
            (b"AWS4-HMAC-SHA256", "Authorization header requires 'Credential' parameter. Authorization header requires 'Signature' parameter. Authorization header requires 'SignedHeaders' parameter."),
            (b"AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20261206/us-east-1/sqs/aws4_request, SignedHeaders=host", "Authorization header requires 'Signature' parameter."),
            (b"AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20261206/us-east-1/sqs/aws4_request,SignedHeaders=host,Signature=abc", "Signature must be 64 hexadecimal digits"),
            (b"AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20261206/us-east-1/sqs/aws4_request, SignedHeaders=x-amz-date, Signature=0000000000000000000000000000000000000000000000000000000000000000", "must include 'host'"),
            (b"AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20261206/us-east-1/sqs/aws4_request, SignedHeaders=Host;x-amz-date, Signature=0000000000000000000000000000000000000000000000000000000000000000", "lower-case header names"),
            (b"AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20261206/us-east-1/sqs, SignedHeaders=host, Signature=0000000000000000000000000000000000000000000000000000000000000000", "is not of the form"),
            (b"AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20261206/us-east-1/sqs/aws5_request, SignedHeaders=host, Signature=0000000000000000000000000000000000000000000000000000000000000000", "valid terminator"),
            (b"AWS4-HMAC-SHA256 Credential=/20261206/us-east-1/sqs/aws4_request, SignedHeaders=host, Signature=0000000000000000000000000000000000000000000000000000000000000000", "empty key id"),
            (b"AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20261206//sqs/aws4_request, SignedHeaders=host, Signature=0000000000000000000000000000000000000000000000000000000000000000", "empty key id, region"),
            (b"AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20261206/us-east-1//aws4_request, SignedHeaders=host, Signature=0000000000000000000000000000000000000000000000000000000000000000", "region or service"),
            (b"AWS4-HMAC-SHA256 Credential=a, Credential=b", "appears twice"),
            (b"AWS4-HMAC-SHA256 Credential=a, Extra=b", "unknown parameter 'Extra'"),
            (b"AWS4-HMAC-SHA256 Credential", "is not key=value"),
            (b"AWS4-HMAC-SHA256 \xff", "not UTF-8"),
        ];
        for (value, reason) in cases {
            let headers: &[(&str, &[u8])] = &[
                ("Host", b"localhost"),
                ("X-Amz-Date", b"20261206T103000Z"),
                ("Authorization", value),
            ];
            let req = SignedRequest {
                method: "POST",
                path: "/",
                query: "",
                headers,
                body: b"",
            };
            match parse(&req) {
                Err(SigError::Malformed(message)) => assert!(
                    message.contains(reason),
                    "{}: {message}",
                    String::from_utf8_lossy(value)
                ),
                other => panic!("{}: {other:?}", String::from_utf8_lossy(value)),
            }
        }
    }

    #[test]
    fn a_missing_or_bad_date_is_malformed() {
        let authorization: &[u8] = b"AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20261206/us-east-1/sqs/aws4_request, SignedHeaders=host, Signature=0000000000000000000000000000000000000000000000000000000000000000";
        for (date_header, reason) in [
            (
                None,
                "requires existence of either a 'X-Amz-Date' or a 'Date' header",
            ),
            (
                Some(("X-Amz-Date", &b"2026-12-06T10:30:00Z"[..])),
                "not of the form",
            ),
            (
                Some(("X-Amz-Date", &b"20260230T103000Z"[..])),
                "not of the form",
            ),
            (
                Some(("Date", &b"Sunday, 06-Dec-26 10:30:00 GMT"[..])),
                "not an RFC 1123 date",
            ),
        ] {
            let mut headers: Vec<(&str, &[u8])> =
                vec![("Host", b"localhost"), ("Authorization", authorization)];
            headers.extend(date_header);
            let req = SignedRequest {
                method: "POST",
                path: "/",
                query: "",
                headers: &headers,
                body: b"",
            };
            match parse(&req) {
                Err(SigError::Malformed(message)) => assert!(message.contains(reason), "{message}"),
                other => panic!("{date_header:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn repeated_auth_headers_or_both_mechanisms_are_malformed() {
        let case = named(BOTOCORE, "json_get_queue_url");
        let mut headers = case.headers.to_vec();
        headers.push(("x-amz-date", b"20261206T103000Z"));
        let req = SignedRequest {
            headers: &headers,
            ..case.request()
        };
        assert!(
            matches!(parse(&req), Err(SigError::Malformed(m)) if m.contains("more than one 'x-amz-date'"))
        );
        let mut headers = case.headers.to_vec();
        headers.push(("authorization", b"AWS4-HMAC-SHA256 x"));
        let req = SignedRequest {
            headers: &headers,
            ..case.request()
        };
        assert!(
            matches!(parse(&req), Err(SigError::Malformed(m)) if m.contains("more than one 'authorization'"))
        );
        let req = SignedRequest {
            query: "X-Amz-Signature=00",
            ..case.request()
        };
        assert!(
            matches!(parse(&req), Err(SigError::Malformed(m)) if m.contains("Only one auth mechanism"))
        );
    }

    #[test]
    fn a_presigned_request_verifies_until_it_expires() {
        // botocore SigV4QueryAuth, X-Amz-Expires=300, signed 20261206T103000Z.
        let req = named(BOTOCORE, "presigned_send_message").request();
        let signed_at = at("20261206T103000Z");
        let Ok(Verdict::Signed(parsed)) = check(&req, &Policy::SQS, signed_at + 300) else {
            panic!("a presigned request inside its window must verify")
        };
        assert_eq!(
            parsed.kind,
            AuthKind::Query {
                expires_secs: Some(300)
            }
        );
        assert_eq!(
            check(&req, &Policy::SQS, signed_at + 301),
            Err(SigError::Expired("Request has expired".to_owned()))
        );
        assert_eq!(
            check(&req, &Policy::SQS, signed_at - 6 * 60),
            Err(SigError::Expired("Request is not valid yet".to_owned()))
        );
        // The signature covers the query: another message body does not verify.
        let tampered = SignedRequest {
            query: &req.query.replace("hi%20there", "hi%20thera"),
            ..req
        };
        assert!(matches!(
            check(&tampered, &Policy::SQS, signed_at),
            Err(SigError::BadSignature { .. })
        ));
    }

    #[test]
    fn a_presigned_token_is_reported() {
        let req = named(BOTOCORE, "presigned_token").request();
        let Ok(Verdict::Signed(parsed)) = check(&req, &Policy::SQS, at("20261206T103000Z")) else {
            panic!("must verify")
        };
        assert_eq!(parsed.security_token.as_deref(), Some("TOKEN/+="));
    }

    #[test]
    fn presigned_parameters_are_checked() {
        let full = named(BOTOCORE, "presigned_send_message").request();
        let cases = [
            (
                full.query.replace("X-Amz-Date=20261206T103000Z&", ""),
                "must include",
            ),
            (
                full.query
                    .replace("X-Amz-Expires=300", "X-Amz-Expires=604801"),
                "less than a week",
            ),
            (
                full.query.replace("X-Amz-Expires=300", "X-Amz-Expires=-1"),
                "not a number of seconds",
            ),
            (
                full.query
                    .replace("X-Amz-Expires=300", "X-Amz-Expires=%2B300"),
                "not a number of seconds",
            ),
            (
                full.query.replace("AWS4-HMAC-SHA256", "AWS4-HMAC-SHA512"),
                "only supports",
            ),
            (
                format!("{}&X-Amz-Date=20261206T103000Z", full.query),
                "more than once",
            ),
        ];
        // A week exactly is allowed.
        let week = full
            .query
            .replace("X-Amz-Expires=300", "X-Amz-Expires=604800");
        let req = SignedRequest {
            query: &week,
            ..full
        };
        assert_eq!(
            parse(&req).map(|p| p.map(|p| p.kind)),
            Ok(Some(AuthKind::Query {
                expires_secs: Some(604_800)
            }))
        );
        for (query, reason) in &cases {
            let req = SignedRequest { query, ..full };
            match parse(&req) {
                Err(SigError::Malformed(message)) => assert!(message.contains(reason), "{message}"),
                other => panic!("{query}: {other:?}"),
            }
        }
    }

    #[test]
    fn the_session_token_header_is_reported() {
        let req = named(BOTOCORE, "json_session_token").request();
        let Ok(Verdict::Signed(parsed)) = check(&req, &Policy::SQS, at("20261206T103000Z")) else {
            panic!("must verify")
        };
        assert_eq!(parsed.kind, AuthKind::Header);
        assert_eq!(
            parsed.security_token.as_deref(),
            Some("FQoGZXIvYXdzEXAMPLETOKEN/+=")
        );
    }

    #[test]
    fn a_date_header_stands_in_for_x_amz_date() {
        // botocore signs `Date` (as "Sun, 06 Dec 2026 10:30:00 -0000") when the request already had one.
        let req = named(BOTOCORE, "raw_date_header").request();
        let Ok(Verdict::Signed(parsed)) = check(&req, &Policy::SQS, at("20261206T103000Z")) else {
            panic!("must verify")
        };
        assert_eq!(parsed.amz_date, "20261206T103000Z");
    }

    #[test]
    fn a_content_sha256_header_must_be_the_bodys_hash() {
        let case = named(BOTOCORE, "content_sha256_header");
        let now = at("20261206T103000Z");
        assert!(check(&case.request(), &Policy::SQS, now).is_ok());
        let req = SignedRequest {
            body: br#"{"QueueName": "orderz"}"#,
            ..case.request()
        };
        assert!(matches!(
            check(&req, &Policy::SQS, now),
            Err(SigError::Malformed(m)) if m.contains("does not match what was computed")
        ));
        // Unsigned and streaming payloads, a short hash, 64 characters that are not hex.
        for claimed in [&b"UNSIGNED-PAYLOAD"[..], b"f1b9", &[b'x'; 64]] {
            let headers = with_header(case.headers, "x-amz-content-sha256", Some(claimed));
            let req = SignedRequest {
                headers: &headers,
                ..case.request()
            };
            assert!(matches!(
                check(&req, &Policy::SQS, now),
                Err(SigError::Malformed(m)) if m.contains("is not supported")
            ));
        }
    }

    #[test]
    fn dates_parse_only_when_every_field_is_in_range() {
        assert_eq!(parse_amz_date("19700101T000000Z"), Some(0));
        assert_eq!(parse_amz_date("20150830T123600Z"), Some(1_440_938_160));
        assert_eq!(parse_amz_date("20240229T235959Z"), Some(1_709_251_199));
        for bad in [
            "20230229T000000Z",
            "21000229T000000Z",
            "20241301T000000Z",
            "20240100T000000Z",
            "20240101T240000Z",
            "20240101T006000Z",
            "20240101T000060Z",
            "19691231T235959Z",
            "20240101 000000Z",
            "20240101T000000",
            "2024010T1000000Z",
            "+0240101T000000Z",
            "2024０101T000000Z",
            "",
        ] {
            assert_eq!(parse_amz_date(bad), None, "{bad}");
        }
        assert_eq!(parse_amz_date("20000229T000000Z"), Some(951_782_400));
        assert_eq!(
            parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT"),
            Some(784_111_777)
        );
        assert_eq!(
            parse_http_date("6 Nov 1994 08:49:37 UTC"),
            Some(784_111_777)
        );
        assert_eq!(
            parse_http_date("Sun, 06 Nov 1994 09:49:37 +0100"),
            Some(784_111_777)
        );
        assert_eq!(
            parse_http_date("Sun, 06 Nov 1994 07:49:37 -0100"),
            Some(784_111_777)
        );
        assert_eq!(
            parse_http_date("Sun, 06 Nov 1994 14:19:37 +0530"),
            Some(784_111_777)
        );
        for bad in [
            "Sun, 06 Nov 1994 08:49:37",
            "Sun, 06 Foo 1994 08:49:37 GMT",
            "Sun, 06 Nov 94 08:49:37 GMT",
            "Sun, 06 Nov 1994 8:49:37 GMT",
            "Sun, 06 Nov 1994 08:9:37 GMT",
            "Sun, 06 Nov 1994 08:49:7 GMT",
            "Sun, 006 Nov 1994 08:49:37 GMT",
            "Sun, 06 Nov 01994 08:49:37 GMT",
            "Sun, 06 Nov 1994 08:49:37 +0160",
            "Sun, 06 Nov 1994 08:49:37 +01",
            "Sun, 06 Nov 1994 08:49:37 *0100",
            "Sun, 06 Nov 1994 08:49:37 GMT extra",
            "Thu, 01 Jan 1970 00:00:00 +0100",
        ] {
            assert_eq!(parse_http_date(bad), None, "{bad}");
        }
    }

    #[test]
    fn formatting_inverts_parsing() {
        // Every day from 1970 into 2570 (leap days, century years, the 400-year cycle at 2000 and 2400), each at
        // a time of day that moves through the day.
        for day in 0..220_000 {
            let secs = day * SECS_PER_DAY + (day * 7_919) % SECS_PER_DAY;
            let text = format_amz_date(secs);
            assert_eq!(parse_amz_date(&text), Some(secs), "{text}");
        }
        assert_eq!(format_amz_date(1_709_251_199), "20240229T235959Z");
        assert_eq!(format_amz_date(253_402_300_799), "99991231T235959Z");
    }

    #[test]
    fn garbage_never_panics() {
        // Every prefix of a real request's auth, and every byte of it replaced by a few troublesome ones.
        let case = named(BOTOCORE, "json_session_token");
        let now = at("20261206T103000Z");
        let authorization = case
            .headers
            .iter()
            .find(|(name, _)| *name == "Authorization")
            .map(|(_, value)| *value)
            .expect("an Authorization header");
        let mut variants: Vec<Vec<u8>> = (0..authorization.len())
            .map(|end| authorization[..end].to_vec())
            .collect();
        for i in 0..authorization.len() {
            for b in [b'/', b',', b'=', b' ', b'\xff', b'\x00', b'%'] {
                let mut v = authorization.to_vec();
                v[i] = b;
                variants.push(v);
            }
        }
        for value in &variants {
            let headers = [
                ("Host", &b"localhost:9324"[..]),
                ("X-Amz-Date", b"20261206T103000Z"),
                ("Authorization", value),
            ];
            let req = SignedRequest {
                headers: &headers,
                ..case.request()
            };
            let _ = check(&req, &Policy::SQS, now);
        }
        let query = case_query_variants(named(BOTOCORE, "presigned_send_message").query);
        for q in &query {
            let req = SignedRequest {
                query: q,
                ..case.request()
            };
            let _ = check(&req, &Policy::SQS, now);
            let _ = check(&req, &Policy::SQS, u64::MAX);
        }
    }

    fn case_query_variants(query: &str) -> Vec<String> {
        let mut out: Vec<String> = (0..query.len())
            .filter(|&end| query.is_char_boundary(end))
            .map(|end| query[..end].to_owned())
            .collect();
        for (i, _) in query.char_indices() {
            for c in ["%", "%f", "&", "=", "+", "%ff"] {
                let mut v = query.to_owned();
                v.replace_range(i..i + 1, c);
                out.push(v);
            }
        }
        out
    }

    // AWS SigV4 test suite requests (the .sreq files, with the .authz header where the two disagree: the
    // suite's get-vanilla-with-session-token.sreq carries a stale signature) and their .creq files.
    #[rustfmt::skip]
    const AWS_SUITE: &[Case] = &[
        Case { name: "get-header-key-duplicate", method: "GET", path: "/", query: "",
            headers: &[("Host", b"example.amazonaws.com"), ("My-Header1", b"value2"), ("My-Header1", b"value2"), ("My-Header1", b"value1"), ("X-Amz-Date", b"20150830T123600Z"), ("Authorization", b"AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;my-header1;x-amz-date, Signature=c9d5ea9f3f72853aea855b47ea873832890dbdd183b4468f858259531a5138ea")],
            body: b"", canonical_request: Some("GET\n/\n\nhost:example.amazonaws.com\nmy-header1:value2,value2,value1\nx-amz-date:20150830T123600Z\n\nhost;my-header1;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855") },
        Case { name: "get-header-value-multiline", method: "GET", path: "/", query: "",
            headers: &[("Host", b"example.amazonaws.com"), ("My-Header1", b"value1\n  value2\n     value3"), ("X-Amz-Date", b"20150830T123600Z"), ("Authorization", b"AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;my-header1;x-amz-date, Signature=cfd34249e4b1c8d6b91ef74165d41a32e5fab3306300901bb65a51a73575eefd")],
            body: b"", canonical_request: Some("GET\n/\n\nhost:example.amazonaws.com\nmy-header1:value1 value2 value3\nx-amz-date:20150830T123600Z\n\nhost;my-header1;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855") },
        Case { name: "get-header-value-order", method: "GET", path: "/", query: "",
            headers: &[("Host", b"example.amazonaws.com"), ("My-Header1", b"value4"), ("My-Header1", b"value1"), ("My-Header1", b"value3"), ("My-Header1", b"value2"), ("X-Amz-Date", b"20150830T123600Z"), ("Authorization", b"AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;my-header1;x-amz-date, Signature=08c7e5a9acfcfeb3ab6b2185e75ce8b1deb5e634ec47601a50643f830c755c01")],
            body: b"", canonical_request: Some("GET\n/\n\nhost:example.amazonaws.com\nmy-header1:value4,value1,value3,value2\nx-amz-date:20150830T123600Z\n\nhost;my-header1;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855") },
        Case { name: "get-header-value-trim", method: "GET", path: "/", query: "",
            headers: &[("Host", b"example.amazonaws.com"), ("My-Header1", b" value1"), ("My-Header2", b" \"a   b   c\""), ("X-Amz-Date", b"20150830T123600Z"), ("Authorization", b"AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;my-header1;my-header2;x-amz-date, Signature=acc3ed3afb60bb290fc8d2dd0098b9911fcaa05412b367055dee359757a9c736")],
            body: b"", canonical_request: Some("GET\n/\n\nhost:example.amazonaws.com\nmy-header1:value1\nmy-header2:\"a b c\"\nx-amz-date:20150830T123600Z\n\nhost;my-header1;my-header2;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855") },
        Case { name: "get-unreserved", method: "GET", path: "/-._~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz", query: "",
            headers: &[("Host", b"example.amazonaws.com"), ("X-Amz-Date", b"20150830T123600Z"), ("Authorization", b"AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;x-amz-date, Signature=07ef7494c76fa4850883e2b006601f940f8a34d404d0cfa977f52a65bbf5f24f")],
            body: b"", canonical_request: Some("GET\n/-._~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855") },
        Case { name: "get-utf8", method: "GET", path: "/ሴ", query: "",
            headers: &[("Host", b"example.amazonaws.com"), ("X-Amz-Date", b"20150830T123600Z"), ("Authorization", b"AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;x-amz-date, Signature=8318018e0b0f223aa2bbf98705b62bb787dc9c0e678f255a891fd03141be5d85")],
            body: b"", canonical_request: Some("GET\n/%E1%88%B4\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855") },
        Case { name: "get-vanilla", method: "GET", path: "/", query: "",
            headers: &[("Host", b"example.amazonaws.com"), ("X-Amz-Date", b"20150830T123600Z"), ("Authorization", b"AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;x-amz-date, Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31")],
            body: b"", canonical_request: Some("GET\n/\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855") },
        Case { name: "get-vanilla-empty-query-key", method: "GET", path: "/", query: "Param1=value1",
            headers: &[("Host", b"example.amazonaws.com"), ("X-Amz-Date", b"20150830T123600Z"), ("Authorization", b"AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;x-amz-date, Signature=a67d582fa61cc504c4bae71f336f98b97f1ea3c7a6bfe1b6e45aec72011b9aeb")],
            body: b"", canonical_request: Some("GET\n/\nParam1=value1\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855") },
        Case { name: "get-vanilla-query", method: "GET", path: "/", query: "",
            headers: &[("Host", b"example.amazonaws.com"), ("X-Amz-Date", b"20150830T123600Z"), ("Authorization", b"AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;x-amz-date, Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31")],
            body: b"", canonical_request: Some("GET\n/\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855") },
        Case { name: "get-vanilla-query-order-encoded", method: "GET", path: "/", query: "Param-3=Value3&Param=Value2&%E1%88%B4=Value1",
            headers: &[("Host", b"example.amazonaws.com"), ("X-Amz-Date", b"20150830T123600Z"), ("Authorization", b"AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;x-amz-date, Signature=371d3713e185cc334048618a97f809c9ffe339c62934c032af5a0e595648fcac")],
            body: b"", canonical_request: Some("GET\n/\n%E1%88%B4=Value1&Param=Value2&Param-3=Value3\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855") },
        Case { name: "get-vanilla-query-order-key", method: "GET", path: "/", query: "Param1=value2&Param1=Value1",
            headers: &[("Host", b"example.amazonaws.com"), ("X-Amz-Date", b"20150830T123600Z"), ("Authorization", b"AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;x-amz-date, Signature=eedbc4e291e521cf13422ffca22be7d2eb8146eecf653089df300a15b2382bd1")],
            body: b"", canonical_request: Some("GET\n/\nParam1=Value1&Param1=value2\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855") },
        Case { name: "get-vanilla-query-order-key-case", method: "GET", path: "/", query: "Param2=value2&Param1=value1",
            headers: &[("Host", b"example.amazonaws.com"), ("X-Amz-Date", b"20150830T123600Z"), ("Authorization", b"AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;x-amz-date, Signature=b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500")],
            body: b"", canonical_request: Some("GET\n/\nParam1=value1&Param2=value2\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855") },
        Case { name: "get-vanilla-query-order-value", method: "GET", path: "/", query: "Param1=value2&Param1=value1",
            headers: &[("Host", b"example.amazonaws.com"), ("X-Amz-Date", b"20150830T123600Z"), ("Authorization", b"AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;x-amz-date, Signature=5772eed61e12b33fae39ee5e7012498b51d56abc0abb7c60486157bd471c4694")],
            body: b"", canonical_request: Some("GET\n/\nParam1=value1&Param1=value2\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855") },
        Case { name: "get-vanilla-query-unreserved", method: "GET", path: "/", query: "-._~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz=-._~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz",
            headers: &[("Host", b"example.amazonaws.com"), ("X-Amz-Date", b"20150830T123600Z"), ("Authorization", b"AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;x-amz-date, Signature=9c3e54bfcdf0b19771a7f523ee5669cdf59bc7cc0884027167c21bb143a40197")],
            body: b"", canonical_request: Some("GET\n/\n-._~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz=-._~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855") },
        Case { name: "get-vanilla-utf8-query", method: "GET", path: "/", query: "ሴ=bar",
            headers: &[("Host", b"example.amazonaws.com"), ("X-Amz-Date", b"20150830T123600Z"), ("Authorization", b"AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;x-amz-date, Signature=2cdec8eed098649ff3a119c94853b13c643bcf08f8b0a1d91e12c9027818dd04")],
            body: b"", canonical_request: Some("GET\n/\n%E1%88%B4=bar\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855") },
        Case { name: "get-vanilla-with-session-token", method: "GET", path: "/", query: "",
            headers: &[("Host", b"example.amazonaws.com"), ("X-Amz-Date", b"20150830T123600Z"), ("X-Amz-Security-Token", b"6e86291e8372ff2a2260956d9b8aae1d763fbf315fa00fa31553b73ebf194267"), ("Authorization", b"AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;x-amz-date;x-amz-security-token, Signature=07ec1639c89043aa0e3e2de82b96708f198cceab042d4a97044c66dd9f74e7f8")],
            body: b"", canonical_request: Some("GET\n/\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\nx-amz-security-token:6e86291e8372ff2a2260956d9b8aae1d763fbf315fa00fa31553b73ebf194267\n\nhost;x-amz-date;x-amz-security-token\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855") },
        Case { name: "normalize-path/get-relative", method: "GET", path: "/example/..", query: "",
            headers: &[("Host", b"example.amazonaws.com"), ("X-Amz-Date", b"20150830T123600Z"), ("Authorization", b"AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;x-amz-date, Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31")],
            body: b"", canonical_request: Some("GET\n/\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855") },
        Case { name: "normalize-path/get-relative-relative", method: "GET", path: "/example1/example2/../..", query: "",
            headers: &[("Host", b"example.amazonaws.com"), ("X-Amz-Date", b"20150830T123600Z"), ("Authorization", b"AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;x-amz-date, Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31")],
            body: b"", canonical_request: Some("GET\n/\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855") },
        Case { name: "normalize-path/get-slash", method: "GET", path: "//", query: "",
            headers: &[("Host", b"example.amazonaws.com"), ("X-Amz-Date", b"20150830T123600Z"), ("Authorization", b"AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;x-amz-date, Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31")],
            body: b"", canonical_request: Some("GET\n/\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855") },
        Case { name: "normalize-path/get-slash-dot-slash", method: "GET", path: "/./", query: "",
            headers: &[("Host", b"example.amazonaws.com"), ("X-Amz-Date", b"20150830T123600Z"), ("Authorization", b"AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;x-amz-date, Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31")],
            body: b"", canonical_request: Some("GET\n/\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855") },
        Case { name: "normalize-path/get-slash-pointless-dot", method: "GET", path: "/./example", query: "",
            headers: &[("Host", b"example.amazonaws.com"), ("X-Amz-Date", b"20150830T123600Z"), ("Authorization", b"AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;x-amz-date, Signature=ef75d96142cf21edca26f06005da7988e4f8dc83a165a80865db7089db637ec5")],
            body: b"", canonical_request: Some("GET\n/example\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855") },
        Case { name: "normalize-path/get-slashes", method: "GET", path: "//example//", query: "",
            headers: &[("Host", b"example.amazonaws.com"), ("X-Amz-Date", b"20150830T123600Z"), ("Authorization", b"AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;x-amz-date, Signature=9a624bd73a37c9a373b5312afbebe7a714a789de108f0bdfe846570885f57e84")],
            body: b"", canonical_request: Some("GET\n/example/\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855") },
        Case { name: "normalize-path/get-space", method: "GET", path: "/example space/", query: "",
            headers: &[("Host", b"example.amazonaws.com"), ("X-Amz-Date", b"20150830T123600Z"), ("Authorization", b"AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;x-amz-date, Signature=652487583200325589f1fba4c7e578f72c47cb61beeca81406b39ddec1366741")],
            body: b"", canonical_request: Some("GET\n/example%20space/\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855") },
        Case { name: "normalize-path/get-special-character", method: "GET", path: "/example/$delete", query: "",
            headers: &[("Host", b"example.amazonaws.com"), ("X-Amz-Date", b"20150830T123600Z"), ("Authorization", b"AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;x-amz-date, Signature=a853c9b21b528b19643d00910d35b83a10c366a10833ceefb45edd6c80e40f27")],
            body: b"", canonical_request: Some("GET\n/example/%24delete\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855") },
        Case { name: "post-header-key-case", method: "POST", path: "/", query: "",
            headers: &[("Host", b"example.amazonaws.com"), ("X-Amz-Date", b"20150830T123600Z"), ("Authorization", b"AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;x-amz-date, Signature=5da7c1a2acd57cee7505fc6676e4e544621c30862966e37dddb68e92efbe5d6b")],
            body: b"", canonical_request: Some("POST\n/\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855") },
        Case { name: "post-header-key-sort", method: "POST", path: "/", query: "",
            headers: &[("Host", b"example.amazonaws.com"), ("My-Header1", b"value1"), ("X-Amz-Date", b"20150830T123600Z"), ("Authorization", b"AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;my-header1;x-amz-date, Signature=c5410059b04c1ee005303aed430f6e6645f61f4dc9e1461ec8f8916fdf18852c")],
            body: b"", canonical_request: Some("POST\n/\n\nhost:example.amazonaws.com\nmy-header1:value1\nx-amz-date:20150830T123600Z\n\nhost;my-header1;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855") },
        Case { name: "post-header-value-case", method: "POST", path: "/", query: "",
            headers: &[("Host", b"example.amazonaws.com"), ("My-Header1", b"VALUE1"), ("X-Amz-Date", b"20150830T123600Z"), ("Authorization", b"AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;my-header1;x-amz-date, Signature=cdbc9802e29d2942e5e10b5bccfdd67c5f22c7c4e8ae67b53629efa58b974b7d")],
            body: b"", canonical_request: Some("POST\n/\n\nhost:example.amazonaws.com\nmy-header1:VALUE1\nx-amz-date:20150830T123600Z\n\nhost;my-header1;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855") },
        Case { name: "post-sts-token/post-sts-header-after", method: "POST", path: "/", query: "",
            headers: &[("Host", b"example.amazonaws.com"), ("X-Amz-Date", b"20150830T123600Z"), ("X-Amz-Security-Token", b"AQoDYXdzEPT//////////wEXAMPLEtc764bNrC9SAPBSM22wDOk4x4HIZ8j4FZTwdQWLWsKWHGBuFqwAeMicRXmxfpSPfIeoIYRqTflfKD8YUuwthAx7mSEI/qkPpKPi/kMcGdQrmGdeehM4IC1NtBmUpp2wUE8phUZampKsburEDy0KPkyQDYwT7WZ0wq5VSXDvp75YU9HFvlRd8Tx6q6fE8YQcHNVXAkiY9q6d+xo0rKwT38xVqr7ZD0u0iPPkUL64lIZbqBAz+scqKmlzm8FDrypNC9Yjc8fPOLn9FX9KSYvKTr4rvx3iSIlTJabIQwj2ICCR/oLxBA=="), ("Authorization", b"AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;x-amz-date, Signature=5da7c1a2acd57cee7505fc6676e4e544621c30862966e37dddb68e92efbe5d6b")],
            body: b"", canonical_request: Some("POST\n/\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855") },
        Case { name: "post-sts-token/post-sts-header-before", method: "POST", path: "/", query: "",
            headers: &[("Host", b"example.amazonaws.com"), ("X-Amz-Date", b"20150830T123600Z"), ("X-Amz-Security-Token", b"AQoDYXdzEPT//////////wEXAMPLEtc764bNrC9SAPBSM22wDOk4x4HIZ8j4FZTwdQWLWsKWHGBuFqwAeMicRXmxfpSPfIeoIYRqTflfKD8YUuwthAx7mSEI/qkPpKPi/kMcGdQrmGdeehM4IC1NtBmUpp2wUE8phUZampKsburEDy0KPkyQDYwT7WZ0wq5VSXDvp75YU9HFvlRd8Tx6q6fE8YQcHNVXAkiY9q6d+xo0rKwT38xVqr7ZD0u0iPPkUL64lIZbqBAz+scqKmlzm8FDrypNC9Yjc8fPOLn9FX9KSYvKTr4rvx3iSIlTJabIQwj2ICCR/oLxBA=="), ("Authorization", b"AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;x-amz-date;x-amz-security-token, Signature=85d96828115b5dc0cfc3bd16ad9e210dd772bbebba041836c64533a82be05ead")],
            body: b"", canonical_request: Some("POST\n/\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\nx-amz-security-token:AQoDYXdzEPT//////////wEXAMPLEtc764bNrC9SAPBSM22wDOk4x4HIZ8j4FZTwdQWLWsKWHGBuFqwAeMicRXmxfpSPfIeoIYRqTflfKD8YUuwthAx7mSEI/qkPpKPi/kMcGdQrmGdeehM4IC1NtBmUpp2wUE8phUZampKsburEDy0KPkyQDYwT7WZ0wq5VSXDvp75YU9HFvlRd8Tx6q6fE8YQcHNVXAkiY9q6d+xo0rKwT38xVqr7ZD0u0iPPkUL64lIZbqBAz+scqKmlzm8FDrypNC9Yjc8fPOLn9FX9KSYvKTr4rvx3iSIlTJabIQwj2ICCR/oLxBA==\n\nhost;x-amz-date;x-amz-security-token\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855") },
        Case { name: "post-vanilla", method: "POST", path: "/", query: "",
            headers: &[("Host", b"example.amazonaws.com"), ("X-Amz-Date", b"20150830T123600Z"), ("Authorization", b"AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;x-amz-date, Signature=5da7c1a2acd57cee7505fc6676e4e544621c30862966e37dddb68e92efbe5d6b")],
            body: b"", canonical_request: Some("POST\n/\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855") },
        Case { name: "post-vanilla-empty-query-value", method: "POST", path: "/", query: "Param1=value1",
            headers: &[("Host", b"example.amazonaws.com"), ("X-Amz-Date", b"20150830T123600Z"), ("Authorization", b"AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;x-amz-date, Signature=28038455d6de14eafc1f9222cf5aa6f1a96197d7deb8263271d420d138af7f11")],
            body: b"", canonical_request: Some("POST\n/\nParam1=value1\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855") },
        Case { name: "post-vanilla-query", method: "POST", path: "/", query: "Param1=value1",
            headers: &[("Host", b"example.amazonaws.com"), ("X-Amz-Date", b"20150830T123600Z"), ("Authorization", b"AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;x-amz-date, Signature=28038455d6de14eafc1f9222cf5aa6f1a96197d7deb8263271d420d138af7f11")],
            body: b"", canonical_request: Some("POST\n/\nParam1=value1\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855") },
        Case { name: "post-x-www-form-urlencoded", method: "POST", path: "/", query: "",
            headers: &[("Content-Type", b"application/x-www-form-urlencoded"), ("Host", b"example.amazonaws.com"), ("X-Amz-Date", b"20150830T123600Z"), ("Authorization", b"AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=content-type;host;x-amz-date, Signature=ff11897932ad3f4e8b18135d722051e5ac45fc38421b1da7b9d196a0fe09473a")],
            body: b"Param1=value1", canonical_request: Some("POST\n/\n\ncontent-type:application/x-www-form-urlencoded\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\ncontent-type;host;x-amz-date\n9095672bbd1f56dfc5b65f3e153adc8731a4a654192329106275f4c7b24d0b6e") },
        Case { name: "post-x-www-form-urlencoded-parameters", method: "POST", path: "/", query: "",
            headers: &[("Content-Type", b"application/x-www-form-urlencoded; charset=utf8"), ("Host", b"example.amazonaws.com"), ("X-Amz-Date", b"20150830T123600Z"), ("Authorization", b"AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=content-type;host;x-amz-date, Signature=1a72ec8f64bd914b0e42e42607c7fbce7fb2c7465f63e3092b3b0d39fa77a6fe")],
            body: b"Param1=value1", canonical_request: Some("POST\n/\n\ncontent-type:application/x-www-form-urlencoded; charset=utf8\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\ncontent-type;host;x-amz-date\n9095672bbd1f56dfc5b65f3e153adc8731a4a654192329106275f4c7b24d0b6e") },
    ];

    // botocore 1.44.18 requests as sent, with the Host header urllib3 adds.
    #[rustfmt::skip]
    const BOTOCORE: &[Case] = &[
        Case { name: "json_get_queue_url", method: "POST", path: "/", query: "",
            headers: &[("Host", b"localhost:9324"), ("X-Amz-Target", b"AmazonSQS.GetQueueUrl"), ("Content-Type", b"application/x-amz-json-1.0"), ("x-amzn-query-mode", b"true"), ("User-Agent", b"Botocore/1.44.18 ua/2.1 os/linux#6.18.44-fc-v1252 md/arch#x86_64 lang/python#3.11.7 md/pyimpl#CPython m/E,Z,b,N,e cfg/retry-mode#standard"), ("X-Amz-Date", b"20261206T103000Z"), ("Authorization", b"AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20261206/us-east-1/sqs/aws4_request, SignedHeaders=content-type;host;x-amz-date;x-amz-target;x-amzn-query-mode, Signature=a3a9f5b95499bc8fb3f2a1a4fb30fd19ad9ce9f34bd34c9d2c79c07f7ae7de6e"), ("amz-sdk-invocation-id", b"46c2a99b-0912-4a84-b9ed-b7577c4714a7"), ("amz-sdk-request", b"attempt=1; max=3"), ("Content-Length", b"23")],
            body: b"{\"QueueName\": \"orders\"}", canonical_request: None },
        Case { name: "json_send_message", method: "POST", path: "/", query: "",
            headers: &[("Host", b"localhost:9324"), ("X-Amz-Target", b"AmazonSQS.SendMessage"), ("Content-Type", b"application/x-amz-json-1.0"), ("x-amzn-query-mode", b"true"), ("User-Agent", b"Botocore/1.44.18 ua/2.1 os/linux#6.18.44-fc-v1252 md/arch#x86_64 lang/python#3.11.7 md/pyimpl#CPython m/E,Z,b,N,e cfg/retry-mode#standard"), ("X-Amz-Date", b"20261206T103000Z"), ("Authorization", b"AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20261206/us-east-1/sqs/aws4_request, SignedHeaders=content-type;host;x-amz-date;x-amz-target;x-amzn-query-mode, Signature=9aece54e8849ab373edacb2f4b01020202f0b86bf60d5a934f5d84edb9019869"), ("amz-sdk-invocation-id", b"6d9d2713-c488-44c4-bc76-30ad6c4571f2"), ("amz-sdk-request", b"attempt=1; max=3"), ("Content-Length", b"171")],
            body: b"{\"QueueUrl\": \"http://localhost:9324/000000000000/orders\", \"MessageBody\": \"h\\u00e9llo  w\\u00f6rld\", \"MessageAttributes\": {\"n\": {\"DataType\": \"Number\", \"StringValue\": \"42\"}}}", canonical_request: None },
        Case { name: "json_session_token", method: "POST", path: "/", query: "",
            headers: &[("Host", b"localhost:9324"), ("X-Amz-Target", b"AmazonSQS.ListQueues"), ("Content-Type", b"application/x-amz-json-1.0"), ("x-amzn-query-mode", b"true"), ("User-Agent", b"Botocore/1.44.18 ua/2.1 os/linux#6.18.44-fc-v1252 md/arch#x86_64 lang/python#3.11.7 md/pyimpl#CPython m/E,Z,b,N,e cfg/retry-mode#standard"), ("X-Amz-Date", b"20261206T103000Z"), ("X-Amz-Security-Token", b"FQoGZXIvYXdzEXAMPLETOKEN/+="), ("Authorization", b"AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20261206/us-east-1/sqs/aws4_request, SignedHeaders=content-type;host;x-amz-date;x-amz-security-token;x-amz-target;x-amzn-query-mode, Signature=a631d9650224b651041c781fbb09d9d317c3852b52eafecaa643885c8d9997a4"), ("amz-sdk-invocation-id", b"2f5ddfdc-e8d0-47b6-9727-b20c5b4cfd25"), ("amz-sdk-request", b"attempt=1; max=3"), ("Content-Length", b"2")],
            body: b"{}", canonical_request: None },
        Case { name: "query_send_message", method: "POST", path: "/", query: "",
            headers: &[("Host", b"localhost:9324"), ("Content-Type", b"application/x-www-form-urlencoded; charset=utf-8"), ("User-Agent", b"Botocore/1.44.18 ua/2.1 os/linux#6.18.44-fc-v1252 md/arch#x86_64 lang/python#3.11.7 md/pyimpl#CPython m/N,e,E,b,Z cfg/retry-mode#standard"), ("X-Amz-Date", b"20261206T103000Z"), ("Authorization", b"AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20261206/us-east-1/sqs/aws4_request, SignedHeaders=content-type;host;x-amz-date, Signature=57319a53f828e937689b62ed4361ba843c34792d93eb52dcd86e93dd5339a4d7"), ("amz-sdk-invocation-id", b"9ab07d46-ef47-47e8-a532-0a9a02ad51f4"), ("amz-sdk-request", b"attempt=1; max=3"), ("Content-Length", b"137")],
            body: b"Action=SendMessage&Version=2012-11-05&QueueUrl=http%3A%2F%2Flocalhost%3A9324%2F000000000000%2Forders&MessageBody=a%2Bb+%26+c%3Dd+~+%C3%BC", canonical_request: None },
        Case { name: "raw_date_header", method: "POST", path: "/", query: "",
            headers: &[("Host", b"localhost:9324"), ("Content-Type", b"application/x-amz-json-1.0"), ("X-Amz-Target", b"AmazonSQS.ListQueues"), ("Date", b"Sun, 06 Dec 2026 10:30:00 -0000"), ("Authorization", b"AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20261206/us-east-1/sqs/aws4_request, SignedHeaders=content-type;date;host;x-amz-target, Signature=21939d9cf0fb1ec774b11871dc60ed640958dd18b1ed443e5e3a34fd771cbb51"), ("Content-Length", b"2")],
            body: b"{}", canonical_request: None },
        Case { name: "presigned_send_message", method: "GET", path: "/000000000000/orders", query: "Action=SendMessage&Version=2012-11-05&MessageBody=hi%20there%2F%C3%BC&X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIDEXAMPLE%2F20261206%2Fus-east-1%2Fsqs%2Faws4_request&X-Amz-Date=20261206T103000Z&X-Amz-Expires=300&X-Amz-SignedHeaders=host&X-Amz-Signature=2a4e1235cfdc0d1e5eca4cf9d6b5ccc1d9d231f00709c39aed3a4a7855c4d14d",
            headers: &[("Host", b"localhost:9324")],
            body: b"", canonical_request: None },
        Case { name: "presigned_token", method: "GET", path: "/", query: "Action=ListQueues&Version=2012-11-05&X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIDEXAMPLE%2F20261206%2Fus-east-1%2Fsqs%2Faws4_request&X-Amz-Date=20261206T103000Z&X-Amz-Expires=60&X-Amz-SignedHeaders=host&X-Amz-Security-Token=TOKEN%2F%2B%3D&X-Amz-Signature=5485487f9d5e970051e8f962560b822484d3dc7f3fee6ddc00dd4882e617e779",
            headers: &[("Host", b"localhost:9324")],
            body: b"", canonical_request: None },
        Case { name: "encoded_path_and_query", method: "POST", path: "/000000000000/q%20x/a:b", query: "Z=1&a=b%2Fc&b=x%2By",
            headers: &[("Host", b"localhost:9324"), ("Content-Type", b"application/x-www-form-urlencoded; charset=utf-8"), ("X-Amz-Date", b"20261206T103000Z"), ("Authorization", b"AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20261206/us-east-1/sqs/aws4_request, SignedHeaders=content-type;host;x-amz-date, Signature=349d5eae3639bb569f89b6985c0e1fc30e9fba2a1dc1eb2a6a2e924a846d2978"), ("Content-Length", b"44")],
            body: b"Action=GetQueueAttributes&Version=2012-11-05", canonical_request: None },
        Case { name: "content_sha256_header", method: "POST", path: "/", query: "",
            headers: &[("Host", b"localhost:9324"), ("Content-Type", b"application/x-amz-json-1.0"), ("X-Amz-Target", b"AmazonSQS.GetQueueUrl"), ("X-Amz-Content-SHA256", b"f1b956558f056b898f85cb298d31cff61868ceb2cbc215d164e77d8eb2dfebfd"), ("X-Amz-Date", b"20261206T103000Z"), ("Authorization", b"AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20261206/us-east-1/sqs/aws4_request, SignedHeaders=content-type;host;x-amz-content-sha256;x-amz-date;x-amz-target, Signature=9b25024f6d340a63c544478e840d4b615211ad4287734d7cfa495e8f41d8a9b6"), ("Content-Length", b"23")],
            body: b"{\"QueueName\": \"orders\"}", canonical_request: None },
    ];

    // aws-sigv4 1.6.6 (the AWS SDK for Rust's signer, default settings, service sqs) at 20261206T103000Z: its
    // headers beside the request's; the presigned query as an HTTP client would encode the returned params.
    #[rustfmt::skip]
    const AWS_SDK_RUST: &[Case] = &[
        Case { name: "rust_sdk_json", method: "POST", path: "/", query: "",
            headers: &[("Host", b"localhost:9324"), ("content-type", b"application/x-amz-json-1.0"), ("x-amz-target", b"AmazonSQS.GetQueueUrl"), ("x-amzn-query-mode", b"true"), ("x-amz-date", b"20261206T103000Z"), ("authorization", b"AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20261206/us-east-1/sqs/aws4_request, SignedHeaders=content-type;host;x-amz-date;x-amz-target;x-amzn-query-mode, Signature=1d9f825c787b4c92a32bfa2bd136ed9309b89aa09942d73993a6829c8894c54a")],
            body: b"{\"QueueName\":\"orders\"}", canonical_request: None },
        Case { name: "rust_sdk_token_encoded_path", method: "POST", path: "/000000000000/q%20x", query: "b=x%2By&a=1",
            headers: &[("Host", b"localhost:9324"), ("content-type", b"application/x-www-form-urlencoded"), ("x-amz-meta", b"  a   b  "), ("x-amz-date", b"20261206T103000Z"), ("authorization", b"AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20261206/us-east-1/sqs/aws4_request, SignedHeaders=content-type;host;x-amz-date;x-amz-meta;x-amz-security-token, Signature=f092870fef719e548e5b3f209b877b5532f2f2f7f101c0b31141276a9b73c8c4"), ("x-amz-security-token", b"TOKEN/+=")],
            body: b"Action=ListQueues&Version=2012-11-05", canonical_request: None },
        Case { name: "rust_sdk_presigned", method: "GET", path: "/000000000000/orders", query: "Action=SendMessage&MessageBody=hi%20there%2F%C3%BC&Version=2012-11-05&X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIDEXAMPLE%2F20261206%2Fus-east-1%2Fsqs%2Faws4_request&X-Amz-Date=20261206T103000Z&X-Amz-Expires=300&X-Amz-SignedHeaders=host&X-Amz-Signature=2a4e1235cfdc0d1e5eca4cf9d6b5ccc1d9d231f00709c39aed3a4a7855c4d14d",
            headers: &[("Host", b"localhost:9324")],
            body: b"", canonical_request: None },
    ];
}
