//! Consumer groups: `PUT /topics/T/groups/G[?start=earliest|latest]` (create), `DELETE /topics/T/groups/G`, and
//! `GET /topics/T/groups` (list, with per-partition state). Core 0 applies creations and deletions (every core
//! writes its partitions' frontier files first); a consume naming a group that does not exist creates it too.

use super::error::{OpError, OpResult};
use super::params::Query;
use crate::engine::Engine;
use std::rc::Rc;

/// Where a new group starts.
pub fn parse_start(query: &Query) -> OpResult<bool> {
    match query.get("start").as_deref() {
        None | Some("earliest") => Ok(false),
        Some("latest") => Ok(true),
        Some(other) => Err(OpError::InvalidParameter(format!(
            "start must be earliest or latest, not '{other}'"
        ))),
    }
}

/// Creates a group (core 0): true if created, false if it existed.
pub async fn create(engine: &Rc<Engine>, topic: &str, group: &str, latest: bool) -> OpResult<bool> {
    Ok(engine.create_group(topic, group, latest).await?)
}

/// Deletes a group (core 0).
pub async fn delete(engine: &Rc<Engine>, topic: &str, group: &str) -> OpResult<()> {
    Ok(engine.delete_group(topic, group).await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_is_earliest_by_default_or_latest() {
        let q = |s: &str| Query::new(s);
        assert_eq!(parse_start(&q("")), Ok(false));
        assert_eq!(parse_start(&q("start=earliest")), Ok(false));
        assert_eq!(parse_start(&q("start=latest")), Ok(true));
        assert!(parse_start(&q("start=now")).is_err());
    }
}
