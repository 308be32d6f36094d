//! Message attributes in the native API: one JSON object, the same in every place a message carries them (the
//! `attributes` header of a single produce and of a single-message consume or replay reply, the `"attributes"`
//! field of an ndjson record or delivery, and the JSON header frame of a frames delivery):
//!
//! ```json
//! {"color": {"type": "String", "value": "red"}, "raw": {"type": "Binary.gz", "value_base64": "AP8H"}}
//! ```
//!
//! String and Number values are `"value"` (text); Binary values are `"value_base64"` (standard base64). Rules
//! (SQS's): at most `MAX_ATTRIBUTES`; a name is 1–256 of `[A-Za-z0-9_.-]`, neither starting nor ending with `.`,
//! without `..`, and not starting with `aws.`, `amazon.` or `berth.` (any case); a data type is `String`,
//! `Number` or `Binary`, optionally followed by `.` and a label of `[A-Za-z0-9_.-]`, 256 bytes in all; a value is
//! never empty, and a Number is a decimal number. Names, types and values count against `max_message_bytes`.

use super::error::{OpError, OpResult};
use crate::storage::meta::Attribute;
use base64::Engine as _;
use bytes::Bytes;
use serde_json::{Map, Value};

/// Attributes per message (SQS's limit).
pub const MAX_ATTRIBUTES: usize = 10;
/// Longest attribute name, and longest data type (with its label).
pub const MAX_NAME_BYTES: usize = 256;
/// Longest attributes object as a reply header (`to_header`): a single-message consume or replay returns the
/// attributes in a header, which common HTTP clients bound (curl at 100 KiB); 64 KiB.
pub const MAX_HEADER_BYTES: usize = 64 << 10;

fn bad(why: String) -> OpError {
    OpError::InvalidParameter(format!("attributes: {why}"))
}

/// Parses the attributes object (header text or an ndjson field), sorted by name.
pub fn parse_text(text: &str) -> OpResult<Vec<Attribute>> {
    let value: Value =
        serde_json::from_str(text).map_err(|e| bad(format!("not a JSON object: {e}")))?;
    parse_value(&value)
}

/// Parses an attributes object already read as JSON, sorted by name.
pub fn parse_value(value: &Value) -> OpResult<Vec<Attribute>> {
    let Value::Object(map) = value else {
        return Err(bad("not a JSON object".into()));
    };
    if map.len() > MAX_ATTRIBUTES {
        return Err(bad(format!(
            "{} attributes, at most {MAX_ATTRIBUTES}",
            map.len()
        )));
    }
    let mut out = Vec::with_capacity(map.len());
    for (name, spec) in map {
        check_name(name)?;
        let Value::Object(spec) = spec else {
            return Err(bad(format!("{name:?}: not an object with type and value")));
        };
        if let Some(other) = spec
            .keys()
            .find(|k| !matches!(k.as_str(), "type" | "value" | "value_base64"))
        {
            return Err(bad(format!("{name:?}: unknown field {other:?}")));
        }
        let Some(Value::String(data_type)) = spec.get("type") else {
            return Err(bad(format!("{name:?}: needs a \"type\" string")));
        };
        check_type(name, data_type)?;
        let binary = data_type.starts_with("Binary");
        let value = match (spec.get("value"), spec.get("value_base64")) {
            (Some(Value::String(text)), None) if !binary => Bytes::from(text.clone()),
            (None, Some(Value::String(b64))) if binary => Bytes::from(
                base64::engine::general_purpose::STANDARD
                    .decode(b64.as_bytes())
                    .map_err(|e| bad(format!("{name:?}: value_base64 is not base64: {e}")))?,
            ),
            _ if binary => {
                return Err(bad(format!(
                    "{name:?}: a Binary attribute needs \"value_base64\" (a string) and no \"value\""
                )))
            }
            _ => {
                return Err(bad(format!(
                    "{name:?}: a {data_type} attribute needs \"value\" (a string) and no \"value_base64\""
                )))
            }
        };
        if value.is_empty() {
            return Err(bad(format!("{name:?}: the value is empty")));
        }
        if data_type.starts_with("Number") && !is_number(&value) {
            return Err(bad(format!("{name:?}: the value is not a decimal number")));
        }
        out.push(Attribute {
            name: name.clone(),
            data_type: data_type.clone(),
            value,
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    let header = to_header(&out).len();
    if header > MAX_HEADER_BYTES {
        return Err(bad(format!(
            "{header} bytes as a header, at most {MAX_HEADER_BYTES} (they are returned in one)"
        )));
    }
    Ok(out)
}

fn check_name(name: &str) -> OpResult<()> {
    let lower = name.to_ascii_lowercase();
    if name.is_empty()
        || name.len() > MAX_NAME_BYTES
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
        || name.starts_with('.')
        || name.ends_with('.')
        || name.contains("..")
    {
        return Err(bad(format!(
            "{name:?} is not a name: 1 to {MAX_NAME_BYTES} of A-Z a-z 0-9 _ . -, not starting or ending with '.', no '..'"
        )));
    }
    if ["aws.", "amazon.", "berth."]
        .iter()
        .any(|p| lower.starts_with(p))
    {
        return Err(bad(format!(
            "{name:?}: names starting with aws., amazon. or berth. are reserved"
        )));
    }
    Ok(())
}

fn check_type(name: &str, data_type: &str) -> OpResult<()> {
    let ok = ["String", "Number", "Binary"].iter().any(|base| {
        data_type == *base
            || data_type.strip_prefix(base).is_some_and(|rest| {
                rest.strip_prefix('.').is_some_and(|label| {
                    !label.is_empty()
                        && label
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
                })
            })
    });
    if !ok || data_type.len() > MAX_NAME_BYTES {
        return Err(bad(format!(
            "{name:?}: type {data_type:?} is not String, Number or Binary (optionally .label)"
        )));
    }
    Ok(())
}

/// A decimal number as SQS takes one: optional sign, digits with an optional fraction, optional exponent.
fn is_number(v: &[u8]) -> bool {
    let Ok(s) = std::str::from_utf8(v) else {
        return false;
    };
    let s = s.strip_prefix(['-', '+']).unwrap_or(s);
    let (mantissa, exponent) = match s.find(['e', 'E']) {
        Some(i) => (&s[..i], Some(&s[i + 1..])),
        None => (s, None),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits = |t: &str| t.bytes().all(|b| b.is_ascii_digit());
    (!int.is_empty() || !frac.is_empty())
        && digits(int)
        && digits(frac)
        && exponent.is_none_or(|e| {
            let e = e.strip_prefix(['-', '+']).unwrap_or(e);
            !e.is_empty() && digits(e)
        })
}

/// Bytes the attributes count against `max_message_bytes`.
pub fn size(attributes: &[Attribute]) -> usize {
    attributes.iter().map(Attribute::size).sum()
}

/// The attributes object, as JSON.
pub fn to_value(attributes: &[Attribute]) -> Value {
    let mut map = Map::new();
    for a in attributes {
        let mut spec = Map::new();
        spec.insert("type".into(), Value::String(a.data_type.clone()));
        if a.is_binary() {
            spec.insert(
                "value_base64".into(),
                Value::String(base64::engine::general_purpose::STANDARD.encode(&a.value)),
            );
        } else {
            spec.insert(
                "value".into(),
                Value::String(String::from_utf8_lossy(&a.value).into_owned()),
            );
        }
        map.insert(a.name.clone(), Value::Object(spec));
    }
    Value::Object(map)
}

/// The attributes object as header text: JSON with every character past ASCII escaped (`\uXXXX`), so the header
/// is plain ASCII whatever the values hold.
pub fn to_header(attributes: &[Attribute]) -> String {
    ascii_json(&to_value(attributes).to_string())
}

fn ascii_json(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        if c.is_ascii() && c != '\x7f' {
            out.push(c);
        } else {
            let mut units = [0u16; 2];
            for u in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{:04x}", u));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_round_trip_through_the_header_text_unchanged() {
        let text = r#"{"z": {"type": "String", "value": "h\u00e9 \ud83d\ude00 ; , \""},
                       "n": {"type": "Number.int", "value": "-1.5e3"},
                       "b": {"type": "Binary", "value_base64": "AP8H"}}"#;
        let attrs = parse_text(text).unwrap();
        assert_eq!(
            attrs.iter().map(|a| a.name.as_str()).collect::<Vec<_>>(),
            ["b", "n", "z"]
        );
        assert_eq!(&attrs[0].value[..], &[0, 255, 7]);
        assert_eq!(&attrs[2].value[..], "hé 😀 ; , \"".as_bytes());
        let header = to_header(&attrs);
        assert!(header.is_ascii(), "{header}");
        assert_eq!(parse_text(&header).unwrap(), attrs);
    }

    #[test]
    fn bad_attributes_are_refused_with_the_reason() {
        let eleven: String = (0..11)
            .map(|i| format!("\"a{i}\":{{\"type\":\"String\",\"value\":\"v\"}}"))
            .collect::<Vec<_>>()
            .join(",");
        for (text, why) in [
            ("[]", "not a JSON object"),
            ("{\"a\": 1}", "not an object"),
            (&format!("{{{eleven}}}")[..], "at most 10"),
            (
                "{\"a b\": {\"type\":\"String\",\"value\":\"v\"}}",
                "is not a name",
            ),
            (
                "{\".a\": {\"type\":\"String\",\"value\":\"v\"}}",
                "is not a name",
            ),
            (
                "{\"a..b\": {\"type\":\"String\",\"value\":\"v\"}}",
                "is not a name",
            ),
            (
                "{\"AWS.x\": {\"type\":\"String\",\"value\":\"v\"}}",
                "reserved",
            ),
            (
                "{\"berth.x\": {\"type\":\"String\",\"value\":\"v\"}}",
                "reserved",
            ),
            (
                "{\"a\": {\"type\":\"Str\",\"value\":\"v\"}}",
                "is not String",
            ),
            (
                "{\"a\": {\"type\":\"String.\",\"value\":\"v\"}}",
                "is not String",
            ),
            ("{\"a\": {\"type\":\"String\",\"value\":\"\"}}", "empty"),
            ("{\"a\": {\"type\":\"Number\",\"value\":\"1x\"}}", "decimal"),
            (
                "{\"a\": {\"type\":\"Binary\",\"value\":\"v\"}}",
                "value_base64",
            ),
            (
                "{\"a\": {\"type\":\"String\",\"value_base64\":\"dg==\"}}",
                "needs \"value\"",
            ),
            (
                "{\"a\": {\"type\":\"Binary\",\"value_base64\":\"!\"}}",
                "not base64",
            ),
            (
                "{\"a\": {\"type\":\"String\",\"value\":\"v\",\"x\":1}}",
                "unknown field",
            ),
        ] {
            let e = parse_text(text).expect_err(text).to_string();
            assert!(e.contains(why), "{text}: {e}");
        }
    }

    #[test]
    fn numbers_are_decimal_literals() {
        for ok in [
            "0",
            "-1",
            "+2.5",
            ".5",
            "5.",
            "1e9",
            "1E-9",
            "123456789012345678901234567890",
        ] {
            assert!(is_number(ok.as_bytes()), "{ok}");
        }
        for no in ["", "-", ".", "1e", "e5", "1.2.3", "0x10", "NaN", "1 "] {
            assert!(!is_number(no.as_bytes()), "{no}");
        }
    }

    #[test]
    fn the_header_form_escapes_del_and_is_bounded() {
        let attrs = parse_text(r#"{"d":{"type":"String","value":"a\u007fb"}}"#).unwrap();
        let header = to_header(&attrs);
        assert!(
            !header.contains('\x7f') && header.contains("\\u007f"),
            "{header}"
        );
        assert_eq!(parse_text(&header).unwrap(), attrs);
        // Past 64 KiB as a header (control characters take six bytes each there): refused.
        let big = format!(
            r#"{{"d":{{"type":"String","value":"{}"}}}}"#,
            "\\u0001".repeat(11_000)
        );
        let e = parse_text(&big).unwrap_err().to_string();
        assert!(e.contains("as a header"), "{e}");
    }
}
