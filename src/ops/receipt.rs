//! Receipt handles: the text a consumer gets with each lease and sends back to settle it, `partition:offset:nonce`
//! (three unsigned decimal integers, e.g. `3:41:459798116755456001`). The nonce is the lease's: a handle of an
//! earlier lease of the same offset no longer matches (`410 lease_gone`). This type owns the text form both ways;
//! `docs/api.md` ("Receipt handles") documents it.

use crate::partition::Delivery;

/// One lease's receipt handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReceiptHandle {
    /// As sent: a partition number the topic may not have (checked against it when the settle is routed).
    pub partition: u64,
    pub offset: u64,
    pub nonce: u64,
}

impl ReceiptHandle {
    /// The handle of a delivery's lease.
    pub fn of(d: &Delivery) -> ReceiptHandle {
        ReceiptHandle {
            partition: d.partition.into(),
            offset: d.offset,
            nonce: d.nonce,
        }
    }

    /// Parses `partition:offset:nonce`; None unless it is exactly three unsigned decimal integers (at most 20 digits
    /// each, within u64).
    pub fn parse(text: &str) -> Option<ReceiptHandle> {
        // One pass over the bytes (read for every ack): each part 1 to 20 digits, no more than u64::MAX.
        let mut parts = text.as_bytes().split(|&b| b == b':');
        let mut next = || -> Option<u64> {
            let part = parts.next()?;
            if part.is_empty() || part.len() > 20 {
                return None;
            }
            part.iter().try_fold(0u64, |n, &b| {
                b.is_ascii_digit()
                    .then(|| n.checked_mul(10)?.checked_add(u64::from(b - b'0')))
                    .flatten()
            })
        };
        let handle = ReceiptHandle {
            partition: next()?,
            offset: next()?,
            nonce: next()?,
        };
        parts.next().is_none().then_some(handle)
    }
}

impl ReceiptHandle {
    /// The three integers of the text form, in order, joined by `:` (a reply writes them with
    /// `Response::with_header_decimals`, the same bytes as `Display`).
    pub fn parts(&self) -> [u64; 3] {
        [self.partition, self.offset, self.nonce]
    }
}

impl std::fmt::Display for ReceiptHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}:{}", self.partition, self.offset, self.nonce)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(partition: u64, offset: u64, nonce: u64) -> ReceiptHandle {
        ReceiptHandle {
            partition,
            offset,
            nonce,
        }
    }

    #[test]
    fn receipt_handles_are_three_unsigned_integers() {
        assert_eq!(ReceiptHandle::parse("0:41:881"), Some(h(0, 41, 881)));
        assert_eq!(
            ReceiptHandle::parse("18446744073709551615:0:1"),
            Some(h(u64::MAX, 0, 1))
        );
        for bad in [
            "",
            "0",
            "0:1",
            "0:1:2:3",
            "a:1:2",
            "-1:1:2",
            "0:1:",
            ":1:2",
            "0: 1:2",
            "+1:1:2",
            "18446744073709551616:0:1",
            "000000000000000000001:0:1",
            "1::3",
            " 1:2:3",
            "1:2:3 ",
        ] {
            assert_eq!(ReceiptHandle::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_text_form_round_trips() {
        for handle in [
            h(0, 0, 0),
            h(3, 41, 459_798_116_755_456_001),
            h(u64::MAX, u64::MAX, u64::MAX),
        ] {
            assert_eq!(ReceiptHandle::parse(&handle.to_string()), Some(handle));
        }
    }
}
