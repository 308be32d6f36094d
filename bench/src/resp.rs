//! A small RESP2 codec (the Redis protocol) for the load generator's Redis Streams baseline: commands are encoded as
//! arrays of bulk strings; replies are parsed from a byte buffer that may hold a partial reply (`Ok(None)`: read
//! more), with every length bounded by a named limit so that no input, however hostile, makes it allocate without
//! bound, recurse without bound or panic.

use std::fmt;

/// Longest bulk string accepted (the load generator's messages are at most 1 MiB; Redis's own cap is 512 MiB).
pub const MAX_BULK_BYTES: usize = 16 << 20;
/// Most elements in one array (an XREADGROUP of COUNT 1000 needs about 1000).
pub const MAX_ARRAY_LEN: usize = 1 << 20;
/// Deepest nesting of arrays (XREADGROUP replies nest 4 deep).
pub const MAX_DEPTH: usize = 16;
/// Longest line (simple string, error, integer, or a length line), CRLF excluded.
pub const MAX_LINE_BYTES: usize = 64 << 10;

/// A parsed reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// `+OK`
    Simple(Vec<u8>),
    /// `-ERR ...`
    Error(Vec<u8>),
    /// `:42`
    Integer(i64),
    /// `$3\r\nabc`
    Bulk(Vec<u8>),
    /// `$-1`
    NilBulk,
    /// `*2\r\n...`
    Array(Vec<Value>),
    /// `*-1`
    NilArray,
}

/// Why bytes are not a RESP2 reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParseError {
    /// The first byte of a value is not one of `+ - : $ *`.
    UnknownType(u8),
    /// A line longer than `MAX_LINE_BYTES`.
    LineTooLong,
    /// A `\r` not followed by `\n`, a bare `\n` in a line, or a bulk string not followed by CRLF.
    BadTerminator,
    /// An integer or length that is not a canonical decimal i64.
    BadInteger,
    /// A negative length other than -1.
    BadLength(i64),
    /// A bulk string longer than `MAX_BULK_BYTES`.
    BulkTooLarge(i64),
    /// An array longer than `MAX_ARRAY_LEN`.
    ArrayTooLong(i64),
    /// Arrays nested deeper than `MAX_DEPTH`.
    TooDeep,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParseError::UnknownType(b) => write!(f, "unknown RESP type byte 0x{b:02x}"),
            ParseError::LineTooLong => write!(f, "RESP line longer than {MAX_LINE_BYTES} bytes"),
            ParseError::BadTerminator => write!(f, "RESP line or bulk string not ended by CRLF"),
            ParseError::BadInteger => write!(f, "malformed RESP integer"),
            ParseError::BadLength(n) => write!(f, "negative RESP length {n}"),
            ParseError::BulkTooLarge(n) => write!(
                f,
                "RESP bulk string of {n} bytes is over MAX_BULK_BYTES ({MAX_BULK_BYTES})"
            ),
            ParseError::ArrayTooLong(n) => write!(
                f,
                "RESP array of {n} elements is over MAX_ARRAY_LEN ({MAX_ARRAY_LEN})"
            ),
            ParseError::TooDeep => write!(f, "RESP arrays nested deeper than {MAX_DEPTH}"),
        }
    }
}

impl std::error::Error for ParseError {}

impl From<ParseError> for std::io::Error {
    fn from(e: ParseError) -> std::io::Error {
        std::io::Error::new(std::io::ErrorKind::InvalidData, e)
    }
}

/// Appends a command: an array of bulk strings.
pub fn encode_command(out: &mut Vec<u8>, args: &[&[u8]]) {
    out.push(b'*');
    push_decimal(out, args.len() as i64);
    out.extend_from_slice(b"\r\n");
    for arg in args {
        out.push(b'$');
        push_decimal(out, arg.len() as i64);
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
}

fn push_decimal(out: &mut Vec<u8>, n: i64) {
    out.extend_from_slice(n.to_string().as_bytes());
}

impl Value {
    /// Appends this value in RESP2 (what a server would send; the tests' reply generator).
    #[cfg(test)]
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Value::Simple(s) | Value::Error(s) => {
                out.push(if matches!(self, Value::Simple(_)) {
                    b'+'
                } else {
                    b'-'
                });
                out.extend_from_slice(s);
                out.extend_from_slice(b"\r\n");
            }
            Value::Integer(n) => {
                out.push(b':');
                push_decimal(out, *n);
                out.extend_from_slice(b"\r\n");
            }
            Value::Bulk(b) => {
                out.push(b'$');
                push_decimal(out, b.len() as i64);
                out.extend_from_slice(b"\r\n");
                out.extend_from_slice(b);
                out.extend_from_slice(b"\r\n");
            }
            Value::NilBulk => out.extend_from_slice(b"$-1\r\n"),
            Value::Array(items) => {
                out.push(b'*');
                push_decimal(out, items.len() as i64);
                out.extend_from_slice(b"\r\n");
                for item in items {
                    item.encode(out);
                }
            }
            Value::NilArray => out.extend_from_slice(b"*-1\r\n"),
        }
    }

    /// The bytes of a bulk or simple string.
    pub fn as_bytes(&self) -> Option<&[u8]> {
        match self {
            Value::Bulk(b) | Value::Simple(b) => Some(b),
            _ => None,
        }
    }
}

/// Parses one reply from the start of `buf`: `Ok(Some((value, bytes used)))`, `Ok(None)` when `buf` holds only a
/// prefix of a reply (nothing invalid so far), or the first error.
pub fn parse(buf: &[u8]) -> Result<Option<(Value, usize)>, ParseError> {
    value(buf, 0, 0)
}

fn value(buf: &[u8], pos: usize, depth: usize) -> Result<Option<(Value, usize)>, ParseError> {
    let Some(&kind) = buf.get(pos) else {
        return Ok(None);
    };
    if !matches!(kind, b'+' | b'-' | b':' | b'$' | b'*') {
        return Err(ParseError::UnknownType(kind));
    }
    let Some((line, next)) = line(buf, pos + 1)? else {
        return Ok(None);
    };
    match kind {
        b'+' => Ok(Some((Value::Simple(line.to_vec()), next))),
        b'-' => Ok(Some((Value::Error(line.to_vec()), next))),
        b':' => Ok(Some((Value::Integer(integer(line)?), next))),
        b'$' => {
            let n = integer(line)?;
            if n == -1 {
                return Ok(Some((Value::NilBulk, next)));
            }
            if n < 0 {
                return Err(ParseError::BadLength(n));
            }
            if n as u64 > MAX_BULK_BYTES as u64 {
                return Err(ParseError::BulkTooLarge(n));
            }
            let end = next + n as usize;
            match (buf.get(end), buf.get(end + 1)) {
                (Some(b'\r'), Some(b'\n')) => {
                    Ok(Some((Value::Bulk(buf[next..end].to_vec()), end + 2)))
                }
                (None, _) | (Some(b'\r'), None) => Ok(None),
                _ => Err(ParseError::BadTerminator),
            }
        }
        _ => {
            let n = integer(line)?;
            if n == -1 {
                return Ok(Some((Value::NilArray, next)));
            }
            if n < 0 {
                return Err(ParseError::BadLength(n));
            }
            if n as u64 > MAX_ARRAY_LEN as u64 {
                return Err(ParseError::ArrayTooLong(n));
            }
            if n > 0 && depth + 1 >= MAX_DEPTH {
                return Err(ParseError::TooDeep);
            }
            // Each element takes at least 3 bytes ("+\r\n"): never reserve for more than the buffer could hold.
            let mut items = Vec::with_capacity((n as usize).min((buf.len() - next) / 3));
            let mut at = next;
            for _ in 0..n {
                match value(buf, at, depth + 1)? {
                    Some((v, used)) => {
                        items.push(v);
                        at = used;
                    }
                    None => return Ok(None),
                }
            }
            Ok(Some((Value::Array(items), at)))
        }
    }
}

/// The line starting at `from` (without its CRLF) and the position after the CRLF.
fn line(buf: &[u8], from: usize) -> Result<Option<(&[u8], usize)>, ParseError> {
    let rest = buf.get(from..).unwrap_or_default();
    let window = &rest[..rest.len().min(MAX_LINE_BYTES + 1)];
    match window.iter().position(|&b| b == b'\r' || b == b'\n') {
        Some(i) if window[i] == b'\n' => Err(ParseError::BadTerminator),
        Some(i) => match rest.get(i + 1) {
            Some(b'\n') => Ok(Some((&rest[..i], from + i + 2))),
            Some(_) => Err(ParseError::BadTerminator),
            None => Ok(None),
        },
        None if window.len() > MAX_LINE_BYTES => Err(ParseError::LineTooLong),
        None => Ok(None),
    }
}

/// A canonical decimal i64: an optional `-`, then digits, no overflow.
fn integer(line: &[u8]) -> Result<i64, ParseError> {
    let (negative, digits) = match line.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, line),
    };
    if digits.is_empty() || digits.len() > 19 {
        return Err(ParseError::BadInteger);
    }
    let mut n: i64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return Err(ParseError::BadInteger);
        }
        let d = (d - b'0') as i64;
        n = n
            .checked_mul(10)
            .and_then(|n| {
                if negative {
                    n.checked_sub(d)
                } else {
                    n.checked_add(d)
                }
            })
            .ok_or(ParseError::BadInteger)?;
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn bulk(s: &str) -> Value {
        Value::Bulk(s.as_bytes().to_vec())
    }

    /// One of every reply type, and the nested shape of an XREADGROUP reply.
    fn samples() -> Vec<Value> {
        vec![
            Value::Simple(b"OK".to_vec()),
            Value::Simple(Vec::new()),
            Value::Error(b"BUSYGROUP Consumer Group name already exists".to_vec()),
            Value::Integer(0),
            Value::Integer(-42),
            Value::Integer(i64::MAX),
            Value::Integer(i64::MIN),
            bulk("1700000000000-0"),
            Value::Bulk(Vec::new()),
            Value::Bulk(b"bin\r\nary\0\xff".to_vec()),
            Value::NilBulk,
            Value::Array(Vec::new()),
            Value::NilArray,
            Value::Array(vec![Value::Integer(1), Value::NilBulk, bulk("x")]),
            Value::Array(vec![Value::Array(vec![
                bulk("stream"),
                Value::Array(vec![
                    Value::Array(vec![
                        bulk("1-0"),
                        Value::Array(vec![bulk("body"), bulk("hello")]),
                    ]),
                    Value::Array(vec![bulk("1-1"), Value::NilArray]),
                ]),
            ])]),
        ]
    }

    fn encoded(v: &Value) -> Vec<u8> {
        let mut out = Vec::new();
        v.encode(&mut out);
        out
    }

    #[test]
    fn commands_are_arrays_of_bulk_strings() {
        let mut out = Vec::new();
        encode_command(&mut out, &[b"XADD", b"s", b"*", b"body", b"a\r\nb"]);
        assert_eq!(
            out,
            b"*5\r\n$4\r\nXADD\r\n$1\r\ns\r\n$1\r\n*\r\n$4\r\nbody\r\n$4\r\na\r\nb\r\n"
        );
        encode_command(&mut out, &[]);
        assert!(out.ends_with(b"*0\r\n"));
        // A command parses back as the array of bulk strings it is.
        let mut one = Vec::new();
        encode_command(&mut one, &[b"XACK", b"s", b"g", b"1-0"]);
        assert_eq!(
            parse(&one).unwrap(),
            Some((
                Value::Array(vec![bulk("XACK"), bulk("s"), bulk("g"), bulk("1-0")]),
                one.len()
            ))
        );
    }

    #[test]
    fn every_reply_type_parses_whole_and_is_incomplete_at_every_split() {
        for v in samples() {
            let bytes = encoded(&v);
            assert_eq!(
                parse(&bytes).unwrap(),
                Some((v.clone(), bytes.len())),
                "{v:?}"
            );
            for split in 0..bytes.len() {
                assert_eq!(
                    parse(&bytes[..split]),
                    Ok(None),
                    "{v:?} cut at {split} of {}",
                    bytes.len()
                );
            }
            // Followed by the next reply: exactly this one's bytes are used.
            let mut two = bytes.clone();
            two.extend_from_slice(b":7\r\n");
            assert_eq!(parse(&two).unwrap(), Some((v.clone(), bytes.len())));
        }
    }

    #[test]
    fn a_stream_of_replies_split_anywhere_reassembles() {
        let all: Vec<u8> = samples().iter().flat_map(encoded).collect();
        for chunk in [1, 2, 3, 5, 7, 64] {
            let (mut buf, mut got, mut fed) = (Vec::new(), Vec::new(), 0);
            while fed < all.len() || !buf.is_empty() {
                let take = chunk.min(all.len() - fed);
                buf.extend_from_slice(&all[fed..fed + take]);
                fed += take;
                while let Some((v, used)) = parse(&buf).unwrap() {
                    got.push(v);
                    buf.drain(..used);
                }
                if take == 0 {
                    break;
                }
            }
            assert_eq!(got, samples(), "chunks of {chunk}");
        }
    }

    #[test]
    fn garbage_is_refused_with_a_reason() {
        let cases: &[(&[u8], ParseError)] = &[
            (b"?OK\r\n", ParseError::UnknownType(b'?')),
            (b"OK\r\n", ParseError::UnknownType(b'O')),
            (b"\r\n", ParseError::UnknownType(b'\r')),
            (b"+OK\rX", ParseError::BadTerminator),
            (b"+O\nK\r\n", ParseError::BadTerminator),
            (b":12a\r\n", ParseError::BadInteger),
            (b":\r\n", ParseError::BadInteger),
            (b":-\r\n", ParseError::BadInteger),
            (b":+1\r\n", ParseError::BadInteger),
            (b":99999999999999999999\r\n", ParseError::BadInteger),
            (b":9223372036854775808\r\n", ParseError::BadInteger),
            (b"$abc\r\n", ParseError::BadInteger),
            (b"$-2\r\n", ParseError::BadLength(-2)),
            (b"*-5\r\n", ParseError::BadLength(-5)),
            (b"$3\r\nabcXY", ParseError::BadTerminator),
            (b"$3\r\nabc\rX", ParseError::BadTerminator),
            (b"*2\r\n:1\r\n!\r\n", ParseError::UnknownType(b'!')),
        ];
        for (bytes, want) in cases {
            assert_eq!(
                parse(bytes).as_ref().err(),
                Some(want),
                "{:?}",
                String::from_utf8_lossy(bytes)
            );
        }
    }

    #[test]
    fn oversized_lengths_are_refused_before_their_bytes_arrive() {
        let too_big = format!("${}\r\n", MAX_BULK_BYTES + 1);
        assert_eq!(
            parse(too_big.as_bytes()),
            Err(ParseError::BulkTooLarge(MAX_BULK_BYTES as i64 + 1))
        );
        let huge = format!("${}\r\n", i64::MAX);
        assert_eq!(
            parse(huge.as_bytes()),
            Err(ParseError::BulkTooLarge(i64::MAX))
        );
        // At the limit it is only incomplete.
        assert_eq!(parse(format!("${MAX_BULK_BYTES}\r\n").as_bytes()), Ok(None));
        let long = format!("*{}\r\n", MAX_ARRAY_LEN + 1);
        assert_eq!(
            parse(long.as_bytes()),
            Err(ParseError::ArrayTooLong(MAX_ARRAY_LEN as i64 + 1))
        );
        // A huge announced array with few elements present reserves nothing like its announced size.
        assert_eq!(
            parse(format!("*{MAX_ARRAY_LEN}\r\n:1\r\n").as_bytes()),
            Ok(None)
        );
        let mut line = b"+".to_vec();
        line.resize(MAX_LINE_BYTES + 2, b'a');
        assert_eq!(parse(&line), Err(ParseError::LineTooLong));
        let deep = "*1\r\n".repeat(MAX_DEPTH + 1);
        assert_eq!(parse(deep.as_bytes()), Err(ParseError::TooDeep));
        let ok_depth = format!("{}:1\r\n", "*1\r\n".repeat(MAX_DEPTH - 1));
        assert!(matches!(parse(ok_depth.as_bytes()), Ok(Some(_))));
    }

    fn arb_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            "[a-zA-Z0-9 ]{0,12}".prop_map(|s| Value::Simple(s.into_bytes())),
            "[a-zA-Z0-9 ]{0,12}".prop_map(|s| Value::Error(s.into_bytes())),
            any::<i64>().prop_map(Value::Integer),
            proptest::collection::vec(any::<u8>(), 0..40).prop_map(Value::Bulk),
            Just(Value::NilBulk),
            Just(Value::NilArray),
        ];
        leaf.prop_recursive(4, 64, 8, |inner| {
            proptest::collection::vec(inner, 0..8).prop_map(Value::Array)
        })
    }

    proptest! {
        #[test]
        fn any_bytes_parse_without_panicking(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            if let Ok(Some((_, used))) = parse(&bytes) {
                prop_assert!(used <= bytes.len());
            }
        }

        #[test]
        fn replies_with_resp_shaped_noise_parse_without_panicking(
            parts in proptest::collection::vec(prop_oneof![
                Just(b"*".to_vec()), Just(b"$".to_vec()), Just(b":".to_vec()), Just(b"+".to_vec()),
                Just(b"-".to_vec()), Just(b"\r\n".to_vec()), Just(b"\r".to_vec()), Just(b"\n".to_vec()),
                Just(b"-1".to_vec()), Just(b"3".to_vec()), Just(b"99999999999".to_vec()), Just(b"abc".to_vec()),
            ], 0..40)
        ) {
            let bytes = parts.concat();
            if let Ok(Some((_, used))) = parse(&bytes) {
                prop_assert!(used <= bytes.len());
            }
        }

        #[test]
        fn any_value_round_trips(v in arb_value()) {
            let bytes = encoded(&v);
            prop_assert_eq!(parse(&bytes), Ok(Some((v, bytes.len()))));
        }
    }
}
