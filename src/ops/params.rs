//! Request parameters as the HTTP edge hands them over: the decoded query, and the few headers and limits the
//! operations' parsers need. Shared by every operation's `parse`, so all accept the same text for the same thing.

use super::error::{OpError, OpResult};
use crate::duration::parse_duration_in;
use crate::engine::topic::validate_name;
use crate::partition::DEFAULT_GROUP;
use smallvec::SmallVec;
use std::borrow::Cow;

/// A request's query string, still percent-encoded, with the places of its pairs found in one pass: a lookup
/// compares keys and decodes only the pair it matches (borrowing whatever holds no escape), so a request pays no
/// allocation per parameter and no rescan per lookup (scanning the text again for each of a consume's eight
/// lookups showed in the unbatched cycle's profile: docs/benchmark-history.md, "Design measurements").
#[derive(Debug, Clone, Default)]
pub struct Query {
    raw: String,
    /// Per pair, in order: where it is, and whether its key or value holds an escape (a data-path request has at
    /// most four; the query is held in every request, which is moved through its layers).
    pairs: SmallVec<[Pair; 4]>,
}

/// One `key=value` pair of a raw query: the start of its key, the end of its key, its end (the value follows the
/// key's `=`), and whether its key (`KEY_ESCAPED`) or its value (`VALUE_ESCAPED`) holds a `%` or `+`.
#[derive(Debug, Clone, Copy)]
struct Pair {
    start: u32,
    key_end: u32,
    end: u32,
    escapes: u8,
}

const KEY_ESCAPED: u8 = 1;
const VALUE_ESCAPED: u8 = 2;

/// The non-empty pairs of `raw` in order, found in one pass over its bytes, each given to `each` until it answers
/// `Some`, which is returned. (A plain walk over the bytes: an inclusive range with a sentinel `&` at the end cost
/// twice the instructions per byte in the unbatched cycle's profile.)
fn scan<T>(raw: &str, mut each: impl FnMut(Pair) -> Option<T>) -> Option<T> {
    const NO_KEY_END: usize = usize::MAX;
    let bytes = raw.as_bytes();
    let (mut start, mut key_end, mut escapes) = (0usize, NO_KEY_END, 0u8);
    let pair = |start: usize, key_end: usize, end: usize, escapes: u8| Pair {
        start: start as u32,
        key_end: if key_end == NO_KEY_END { end } else { key_end } as u32,
        end: end as u32,
        escapes,
    };
    for (i, &b) in bytes.iter().enumerate() {
        match b {
            b'&' => {
                if i > start {
                    if let Some(found) = each(pair(start, key_end, i, escapes)) {
                        return Some(found);
                    }
                }
                (start, key_end, escapes) = (i + 1, NO_KEY_END, 0);
            }
            b'=' if key_end == NO_KEY_END => key_end = i,
            b'%' | b'+' => {
                escapes |= if key_end == NO_KEY_END {
                    KEY_ESCAPED
                } else {
                    VALUE_ESCAPED
                }
            }
            _ => {}
        }
    }
    if bytes.len() > start {
        return each(pair(start, key_end, bytes.len(), escapes));
    }
    None
}

/// The value of `pair` of `raw` if its decoded key is `name`. Only a pair holding an escape whose key may match is
/// decoded; anything else is compared and borrowed as is.
fn pair_value<'q>(raw: &'q str, pair: Pair, name: &str) -> Option<Cow<'q, str>> {
    let (start, key_end, end) = (
        pair.start as usize,
        pair.key_end as usize,
        pair.end as usize,
    );
    if pair.escapes & KEY_ESCAPED == 0 {
        // Bytes, not `str` slices: the key's length first, and no char-boundary checks (the bounds come from the
        // scan, which cuts only at ASCII bytes).
        if key_end - start != name.len() || raw.as_bytes()[start..key_end] != *name.as_bytes() {
            return None;
        }
        if pair.escapes & VALUE_ESCAPED == 0 {
            return Some(Cow::Borrowed(raw.get(key_end + 1..end).unwrap_or("")));
        }
    }
    let (key, value) = form_urlencoded::parse(&raw.as_bytes()[start..end]).next()?;
    (key == name).then_some(value)
}

/// The raw text, so a request's query reads as the string it was sent as (the SQS face reads it whole).
impl std::ops::Deref for Query {
    type Target = str;

    fn deref(&self) -> &str {
        &self.raw
    }
}

/// How a request body is framed (its `Content-Type`, or for a consume reply its `Accept`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Media {
    /// Anything else: version 1's single raw message.
    Raw,
    /// `application/x-ndjson`: one JSON object per line.
    Ndjson,
    /// `application/vnd.berth.frames`: 4-byte little-endian length, then the bytes.
    Frames,
    /// `text/plain`: one receipt handle per line (settle batches).
    Text,
}

pub const NDJSON: &str = "application/x-ndjson";
pub const FRAMES: &str = "application/vnd.berth.frames";

impl Media {
    /// The media type a header value names (parameters such as `; charset=utf-8` ignored).
    pub fn of(header: Option<&str>) -> Media {
        let Some(value) = header else {
            return Media::Raw;
        };
        let essence = value.split(';').next().unwrap_or("").trim();
        if essence.eq_ignore_ascii_case(NDJSON) {
            Media::Ndjson
        } else if essence.eq_ignore_ascii_case(FRAMES) {
            Media::Frames
        } else if essence.eq_ignore_ascii_case("text/plain") {
            Media::Text
        } else {
            Media::Raw
        }
    }

    /// The batch media type an `Accept` header asks for, if any (the first of ours it lists).
    pub fn accepted(header: Option<&str>) -> Option<Media> {
        header?
            .split(',')
            .map(|part| Media::of(Some(part)))
            .find(|m| matches!(m, Media::Ndjson | Media::Frames))
    }
}

/// Batch limits (server configuration).
#[derive(Debug, Clone, Copy)]
pub struct BatchLimits {
    pub max_batch_records: usize,
    pub max_batch_bytes: usize,
    pub max_message_bytes: usize,
}

impl Query {
    /// `raw` is the text after `?`, as sent (bounded by the request head's limit, far below 4 GiB).
    pub fn new(raw: impl Into<String>) -> Query {
        let raw = raw.into();
        let mut pairs = SmallVec::new();
        scan::<()>(&raw, |pair| {
            pairs.push(pair);
            None
        });
        Query { raw, pairs }
    }

    /// The query as sent.
    pub fn raw(&self) -> &str {
        &self.raw
    }

    /// The first value of `name`, decoded exactly as `form_urlencoded` decodes it.
    pub fn get(&self, name: &str) -> Option<Cow<'_, str>> {
        self.pairs
            .iter()
            .find_map(|&pair| pair_value(&self.raw, pair, name))
    }

    /// The `topic` parameter, validated.
    pub fn topic(&self) -> OpResult<String> {
        let name = self
            .get("topic")
            .ok_or_else(|| OpError::InvalidTopic(String::new()))?;
        validate_name(&name)?;
        Ok(name.into_owned())
    }

    /// The `group` parameter (default `default`), validated like a topic name.
    pub fn group(&self) -> OpResult<String> {
        match self.get("group") {
            None => Ok(DEFAULT_GROUP.to_string()),
            Some(name) => {
                validate_name(&name)?;
                Ok(name.into_owned())
            }
        }
    }

    pub fn duration(&self, name: &str, min_ms: u64, max_ms: u64) -> OpResult<Option<u64>> {
        self.get(name)
            .map(|text| {
                parse_duration_in(&text, min_ms, max_ms)
                    .map_err(|e| OpError::InvalidDuration(format!("{name}: {}", e.0)))
            })
            .transpose()
    }

    pub fn number(&self, name: &str, min: u64, max: u64) -> OpResult<Option<u64>> {
        self.get(name)
            .map(|text| match text.parse::<u64>() {
                Ok(v) if text.bytes().all(|b| b.is_ascii_digit()) && (min..=max).contains(&v) => {
                    Ok(v)
                }
                _ => Err(OpError::InvalidParameter(format!(
                    "{name} must be an integer from {min} to {max}, not '{text}'"
                ))),
            })
            .transpose()
    }

    /// A yes/no parameter: `true` or `false`.
    pub fn flag(&self, name: &str) -> OpResult<Option<bool>> {
        self.get(name)
            .map(|text| match &*text {
                "true" => Ok(true),
                "false" => Ok(false),
                _ => Err(OpError::InvalidParameter(format!(
                    "{name} must be true or false, not '{text}'"
                ))),
            })
            .transpose()
    }

    /// `partition`: any unsigned integer (the range is checked against the topic: 404).
    pub fn partition(&self) -> OpResult<Option<u64>> {
        self.number("partition", 0, u64::MAX)
    }
}

/// The first value of `name` in the raw query string `query`, decoded as [`Query::get`] does (for a single lookup).
pub fn query_value<'q>(query: &'q str, name: &str) -> Option<Cow<'q, str>> {
    scan(query, |pair| pair_value(query, pair, name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookups_decode_like_form_urlencoded() {
        let queries = [
            "",
            "topic=a",
            "topic=a&topic=b",
            "&&topic=a&",
            "receipt_handle=0%3A41%3A881&topic=t",
            "top%69c=x&topic=y",
            "topic",
            "topic=&group=g",
            "key=a+b%20c&topic=t",
            "a=1=2&b",
            "k%=v%zz&k=w",
            "%FF=1&topic=%FF",
            "+topic=1&topic+=2& topic=3&topic=4",
            "topic=a+b&topic=c",
            "to%70ic=%7A&=x&topic==y",
            "=&&=topic&topic=%",
            "topic=é&group=ü%C3%BC",
            "%C3%A9=1&é=2",
        ];
        let names = [
            "topic",
            "group",
            "key",
            "receipt_handle",
            "a",
            "b",
            "k%",
            "k",
            "\u{fffd}",
            " topic",
            "topic ",
            "",
            "=topic",
            "é",
        ];
        for q in queries {
            let query = Query::new(q);
            for name in names {
                let expected = form_urlencoded::parse(q.as_bytes())
                    .find(|(k, _)| k == name)
                    .map(|(_, v)| v.into_owned());
                assert_eq!(
                    query.get(name).map(Cow::into_owned),
                    expected,
                    "{q:?} {name:?}"
                );
                assert_eq!(
                    query_value(q, name).map(Cow::into_owned),
                    expected,
                    "query_value {q:?} {name:?}"
                );
            }
        }
    }

    #[test]
    fn media_types_ignore_parameters_and_case() {
        assert_eq!(
            Media::of(Some("application/x-ndjson; charset=utf-8")),
            Media::Ndjson
        );
        assert_eq!(
            Media::of(Some("Application/Vnd.Berth.Frames")),
            Media::Frames
        );
        assert_eq!(Media::of(Some("application/octet-stream")), Media::Raw);
        assert_eq!(Media::of(None), Media::Raw);
        assert_eq!(
            Media::accepted(Some("text/html, application/vnd.berth.frames;q=0.9")),
            Some(Media::Frames)
        );
        assert_eq!(Media::accepted(Some("*/*")), None);
    }
}
