//! The MD5 digests SQS puts in its replies (`MD5OfMessageBody`, `MD5OfBody`, `MD5OfMessageAttributes`,
//! `MD5OfMessageSystemAttributes`), which SDKs that check them (Java v1/v2, Go v2) recompute byte for byte.
//! Pure functions; the SQS handlers call them when they render SendMessage, SendMessageBatch and ReceiveMessage.
//! Reference: docs/sqs-protocol-notes.md §6.

use md5::{Digest, Md5};

/// One message attribute's value, as the wire format carries it. The variant, not the `DataType` label, picks the
/// transport byte: `StringValue` (types `String`, `Number` and their custom labels such as `Number.int`) is
/// [`AttrValue::Text`], `BinaryValue` (`Binary`, `Binary.x`) is [`AttrValue::Binary`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttrValue<'a> {
    /// A `StringValue`: its UTF-8 bytes are hashed.
    Text(&'a str),
    /// A `BinaryValue`: the raw bytes, already base64-decoded.
    Binary(&'a [u8]),
}

/// Transport byte for a `StringValue` (Java SDK `STRING_TYPE_FIELD_INDEX`).
const STRING_TYPE_FIELD_INDEX: u8 = 1;
/// Transport byte for a `BinaryValue` (Java SDK `BINARY_TYPE_FIELD_INDEX`).
const BINARY_TYPE_FIELD_INDEX: u8 = 2;

/// Lower-case hex MD5 of `data`: `MD5OfMessageBody` / `MD5OfBody` when `data` is the body's UTF-8 bytes as the
/// client sent them, after form or JSON decoding (notes §6.1).
pub fn md5_hex(data: &[u8]) -> String {
    lower_hex(&Md5::digest(data))
}

/// `MD5OfMessageAttributes` of `(name, data type, value)` triples, or `MD5OfMessageSystemAttributes` of the system
/// attributes (same encoding), as lower-case hex (notes §6.2, the Java SDK's `calculateMessageAttributesMd5`).
///
/// Attributes are taken in ascending order of name, compared as UTF-16 code units like Java's `String.compareTo`
/// (the same as byte order unless one name has a character above U+FFFF where the other has one in
/// U+E000–U+FFFF). Each contributes: length-prefixed name, length-prefixed data type (the full label, custom
/// suffix included), the transport byte (1 for text, 2 for binary), length-prefixed value; every length a 4-byte
/// big-endian count of bytes. Names are expected to be unique, as SQS requires of a request.
pub fn md5_of_message_attributes(attrs: &[(&str, &str, AttrValue<'_>)]) -> String {
    md5_hex(&attribute_bytes(attrs))
}

/// Lower-case hex of `bytes`, two digits a byte (also how `sigv4` writes its SHA-256 hashes).
pub fn lower_hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    out
}

/// The byte string [`md5_of_message_attributes`] hashes.
fn attribute_bytes(attrs: &[(&str, &str, AttrValue<'_>)]) -> Vec<u8> {
    let mut sorted: Vec<&(&str, &str, AttrValue<'_>)> = attrs.iter().collect();
    sorted.sort_by(|a, b| a.0.encode_utf16().cmp(b.0.encode_utf16()));
    let mut out = Vec::new();
    for (name, data_type, value) in sorted {
        push_len_and_bytes(&mut out, name.as_bytes());
        push_len_and_bytes(&mut out, data_type.as_bytes());
        match value {
            AttrValue::Text(text) => {
                out.push(STRING_TYPE_FIELD_INDEX);
                push_len_and_bytes(&mut out, text.as_bytes());
            }
            AttrValue::Binary(bytes) => {
                out.push(BINARY_TYPE_FIELD_INDEX);
                push_len_and_bytes(&mut out, bytes);
            }
        }
    }
    out
}

/// Appends `bytes` preceded by their length as a 4-byte big-endian integer. SQS caps a message, attributes
/// included, at 1 MiB, so a length always fits; a longer slice (never produced by a valid request) saturates
/// rather than wraps.
fn push_len_and_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    let len = u32::try_from(bytes.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(bytes);
}

#[cfg(test)]
mod tests {
    use super::*;
    use AttrValue::{Binary, Text};

    type Attrs<'a> = &'a [(&'a str, &'a str, AttrValue<'a>)];

    #[test]
    fn body_digests_match_the_ones_aws_returned() {
        // notes §6.1: AWS responses ("message", "msg") and a moto test ("derp").
        assert_eq!(md5_hex(b"message"), "78e731027d8fd50ed642340b7c9a63b3");
        assert_eq!(md5_hex(b"msg"), "6e2baaf3b97dbeef01c0043275f9a0e7");
        assert_eq!(md5_hex(b"derp"), "58fd9edd83341c29f1aebba81c31e257");
        // RFC 1321 test suite.
        assert_eq!(md5_hex(b""), "d41d8cd98f00b204e9800998ecf8427e");
        assert_eq!(md5_hex(b"abc"), "900150983cd24fb0d6963f7d28e17f72");
        // Non-ASCII body: the UTF-8 bytes are hashed (Python hashlib and moto's `Message.body_md5` agree).
        assert_eq!(
            md5_hex("héllo wörld ✓".as_bytes()),
            "aa0c8a307a4488bfe0cb56530da19bc3"
        );
    }

    #[test]
    fn attribute_encoding_is_byte_for_byte_the_worked_example() {
        // notes §6.2 worked example: Binary "b" sorts before Number.int "n"; the custom label is hashed whole.
        let attrs = [
            ("n", "Number.int", Text("42")),
            ("b", "Binary", Binary(&[0x00, 0x01])),
        ];
        let expected: Vec<u8> = [
            &[0, 0, 0, 1, b'b', 0, 0, 0, 6][..],
            b"Binary",
            &[2, 0, 0, 0, 2, 0x00, 0x01],
            &[0, 0, 0, 1, b'n', 0, 0, 0, 10],
            b"Number.int",
            &[1, 0, 0, 0, 2, b'4', b'2'],
        ]
        .concat();
        assert_eq!(attribute_bytes(&attrs), expected);
        assert_eq!(
            md5_of_message_attributes(&attrs),
            "f8bac093b6c19974fcdc8e4160a80f1d"
        );
    }

    #[test]
    fn attribute_digests_match_the_ones_aws_returned() {
        // notes §6.2 table; [AWS] rows were recorded against real SQS by localstack's snapshot tests.
        let cases: &[(Attrs<'_>, &str)] = &[
            (
                &[("Foo", "String", Text("Bar"))],
                "ae7155c6026991b6d54b11589678bf9c",
            ),
            (
                &[("MyAttribute", "String", Text("foobar"))],
                "adb59cd4678ea5a855436b949cd07ab6",
            ),
            (
                &[
                    ("Help.Me", "String", Text("Me")),
                    ("Hello", "String", Text("There")),
                    ("General", "String", Text("Kenobi")),
                ],
                "4c360f3fdafd970e05fae2f149d997f5",
            ),
            (
                &[
                    ("Hello", "String", Text("There")),
                    ("General", "String", Text("Kenobi")),
                ],
                "fca026605781cb4126a1e9044df24232",
            ),
            (
                &[("Hello", "String", Text("There"))],
                "a311262e065454b75da111d535b8dacd",
            ),
            (
                &[
                    ("Hello", "String", Text("There")),
                    ("Help.Me", "String", Text("Me")),
                ],
                "83fee93c1bcd8b9a5a923ffacdc636c7",
            ),
            (
                &[("timestamp", "Number", Text("1493147359900"))],
                "235c5c510d26fb653d073faed50ae77c",
            ),
            (
                &[("timestamp", "Number.java.lang.Long", Text("1493147359900"))],
                "2e2e4876d8e0bd6b8c2c8f556831c349",
            ),
            (
                &[(
                    "attr1",
                    "Binary",
                    Binary(
                        b"traceparent\x1e00-774062d6c37081a5a0b9b5b88e30627c-2d2482211f6489da-01",
                    ),
                )],
                "8cbe4db156db8a94db8b801b7addb984",
            ),
            (
                &[("SOME_Valid.attribute-Name", "Number", Text("1493147359900"))],
                "36655e7e9d7c0e8479fa3f3f42247ae7",
            ),
            (
                &[
                    ("id", "String", Text("453ae55e-f03b-21a6-a4b1-70c2e2e8fe71")),
                    ("mybin", "Binary", Binary(b"kekchebukek")),
                    ("timestamp", "Number.java.lang.Long", Text("1603134247654")),
                    ("contentType", "String", Text("application/json")),
                ],
                "049075255ebc53fb95f7f9f3cedf3c50",
            ),
        ];
        for (attrs, want) in cases {
            assert_eq!(md5_of_message_attributes(attrs), *want, "{attrs:?}");
        }
    }

    #[test]
    fn system_attribute_digest_matches_aws() {
        // notes §6.2, MD5OfMessageSystemAttributes for an X-Ray trace header (localstack, reproduced there).
        let attrs = [(
            "AWSTraceHeader",
            "String",
            Text("Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1"),
        )];
        assert_eq!(
            md5_of_message_attributes(&attrs),
            "5ae4d5d7636402d80f4eb6d213245a88"
        );
    }

    #[test]
    fn custom_labels_and_order_match_moto() {
        // Computed with moto's `Message.attribute_md5` (moto 5.x) and an independent Python re-implementation.
        let attrs = [
            ("z.last", "String.custom", Text("Z")),
            ("A-first", "Number", Text("-1.5e3")),
            ("mid_bin", "Binary.png", Binary(&ALL_BYTES)),
        ];
        assert_eq!(
            md5_of_message_attributes(&attrs),
            "1f5eab93974c6040d95c879d76e2ded7"
        );
    }

    const ALL_BYTES: [u8; 256] = {
        let mut all = [0u8; 256];
        let mut i = 0;
        while i < 256 {
            all[i] = i as u8;
            i += 1;
        }
        all
    };

    #[test]
    fn non_ascii_names_sort_as_java_strings() {
        // U+FF21 (fullwidth A) against U+10400 (Deseret capital long I): UTF-8 puts U+FF21 first, Java's UTF-16
        // compareTo puts U+10400 (a surrogate pair, 0xD801…) first. Digests from Python with each ordering.
        let attrs = [
            ("\u{ff21}", "String", Text("fullwidth")),
            ("\u{10400}", "String", Text("deseret")),
        ];
        assert_eq!(
            md5_of_message_attributes(&attrs),
            "67fd0efd313aa2a7b587a6abadb4f942"
        );
        assert_ne!(
            md5_of_message_attributes(&attrs),
            "3c4def8a1c536d88ad198157659b5855" // byte order
        );
        // A name AWS accepted (localstack test_send_message_with_invalid_string_attributes) beside an ASCII one.
        let attrs = [
            ("attr.1øßä", "String", Text("v")),
            ("attr.1a", "Binary.custom", Binary(&[0x00, 0xff])),
        ];
        assert_eq!(
            md5_of_message_attributes(&attrs),
            "2a3769f9359326c087bf2845a2a63a4e"
        );
    }

    #[test]
    fn empty_text_value_still_gets_its_transport_byte() {
        // Java checks `StringValue != null`, so "" is hashed as text (moto, which tests truthiness, skips it; SQS
        // rejects empty values before it gets this far).
        let attrs = [("e", "String", Text(""))];
        assert_eq!(
            md5_of_message_attributes(&attrs),
            "6bc73efe9a52418a9ef9300a04f7287d"
        );
    }

    #[test]
    fn no_attributes_hash_to_the_empty_digest() {
        assert_eq!(
            md5_of_message_attributes(&[]),
            "d41d8cd98f00b204e9800998ecf8427e"
        );
    }

    #[test]
    fn hex_is_lower_case_two_digits_a_byte() {
        assert_eq!(lower_hex(&[0x00, 0x0f, 0xa0, 0xff]), "000fa0ff");
        assert_eq!(lower_hex(&[]), "");
    }
}
