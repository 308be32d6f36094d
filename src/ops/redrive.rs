//! Redrive: `POST /topics/D/redrive?to=T[&max=N][&group=G]` moves up to N messages (default: those available when
//! it starts) from topic D, consumed in group G, to topic T: each is appended to T before it is acked in D
//! (at-least-once: a crash between the two leaves a copy in both). The front runs it (`front::redrive`).
//!
//! Read in order: `parse`, then `front/redrive.rs` (consume from D, produce to T, ack in D, in rounds), and `render`.
//! Route: `http/routes.rs`.

use super::error::{OpError, OpResult};
use super::params::Query;
use super::response::Response;
use crate::engine::topic::validate_name;
use serde_json::json;

/// A redrive as the client asked for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedriveParams {
    pub from: String,
    pub to: String,
    pub group: String,
    /// None: what is available when it starts.
    pub max: Option<u64>,
}

/// Parses the query of `POST /topics/{from}/redrive`.
pub fn parse(from: &str, query: &Query) -> OpResult<RedriveParams> {
    validate_name(from)?;
    let to = query
        .get("to")
        .ok_or_else(|| OpError::InvalidParameter("redrive needs to=TOPIC".into()))?;
    validate_name(&to)?;
    if to == from {
        return Err(OpError::InvalidParameter(
            "redrive needs another topic than the one it reads".into(),
        ));
    }
    Ok(RedriveParams {
        from: from.to_string(),
        to: to.to_string(),
        group: query.group()?,
        max: query.number("max", 1, u64::MAX)?,
    })
}

// ---- The reply ----

/// The answer to a redrive: how many records it moved.
pub fn render(moved: u64) -> Response {
    Response::json(200, &json!({ "moved": moved }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redrive_needs_another_valid_topic() {
        let q = |s: &str| Query::new(s);
        let p = parse("t.dlq", &q("to=t&max=5")).unwrap();
        assert_eq!(
            (p.to.as_str(), p.max, p.group.as_str()),
            ("t", Some(5), "default")
        );
        assert!(parse("t.dlq", &q("")).is_err());
        assert!(parse("t.dlq", &q("to=t.dlq")).is_err());
        assert!(parse("t.dlq", &q("to=a/b")).is_err());
        assert!(parse("t.dlq", &q("to=t&max=0")).is_err());
    }
}
