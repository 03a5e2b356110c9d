//! md UUIDs: 16 raw bytes, printed and parsed the way mdadm does for v1.x metadata.
//!
//! mdadm prints a v1.x `set_uuid`/`device_uuid` as the bytes **in on-disk order**, two hex digits
//! each, with a colon after every 4 bytes (`super1.c` examine/brief/detail), and byte-swaps a
//! user-supplied `--uuid` on little-endian hosts so that the stored bytes equal the text order
//! (`md-format.md` §1.11). So the rule is simply: text `aabbccdd:eeff0011:...` ↔ bytes
//! `aa bb cc dd ee ff 00 11 ...`.
//!
//! Parsing follows mdadm's `parse_uuid`: 32 hex digits, with any of `:`, `.`, `-` or space
//! between them, so mdadm's form and the RFC 4122 dashed form are both accepted.

use std::fmt;
use std::str::FromStr;

use crate::error::{ErrorKind, RaidError};

/// A 16-byte md UUID in on-disk byte order.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct MdUuid(pub [u8; 16]);

impl MdUuid {
    pub const fn from_bytes(bytes: [u8; 16]) -> Self {
        Self(bytes)
    }

    pub const fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }

    pub fn is_zero(&self) -> bool {
        self.0 == [0; 16]
    }
}

impl fmt::Display for MdUuid {
    /// `aabbccdd:eeff0011:22334455:66778899`, as `mdadm --examine` prints it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, byte) in self.0.iter().enumerate() {
            if i != 0 && i % 4 == 0 {
                f.write_str(":")?;
            }
            write!(f, "{byte:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for MdUuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MdUuid({self})")
    }
}

impl FromStr for MdUuid {
    type Err = RaidError;

    fn from_str(text: &str) -> Result<Self, RaidError> {
        let bad = |why: &str| RaidError::new(ErrorKind::BadMetadata, format!("invalid UUID {text:?}: {why}"));
        let mut bytes = [0u8; 16];
        let mut digits = 0usize;
        for ch in text.trim().chars() {
            if matches!(ch, ':' | '.' | '-' | ' ') {
                continue;
            }
            let Some(value) = ch.to_digit(16) else {
                return Err(bad("not a hex digit"));
            };
            if digits == 32 {
                return Err(bad("more than 32 hex digits"));
            }
            // value < 16, so the cast is lossless.
            bytes[digits / 2] |= (value as u8) << if digits.is_multiple_of(2) { 4 } else { 0 };
            digits += 1;
        }
        if digits != 32 {
            return Err(bad("expected 32 hex digits"));
        }
        Ok(MdUuid(bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prints_bytes_in_disk_order_with_colons() {
        let uuid = MdUuid((0u8..16).map(|b| b * 0x11).collect::<Vec<_>>().try_into().unwrap());
        assert_eq!(uuid.to_string(), "00112233:44556677:8899aabb:ccddeeff");
    }

    #[test]
    fn parses_mdadm_and_rfc_forms() {
        let a: MdUuid = "00112233:44556677:8899aabb:ccddeeff".parse().unwrap();
        let b: MdUuid = "00112233-4455-6677-8899-AABBCCDDEEFF".parse().unwrap();
        let c: MdUuid = "00112233.44556677.8899aabb.ccddeeff".parse().unwrap();
        assert_eq!(a, b);
        assert_eq!(a, c);
        assert_eq!(a.0[0], 0x00);
        assert_eq!(a.0[1], 0x11);
        assert_eq!(a.0[15], 0xff);
        assert_eq!(a.to_string().parse::<MdUuid>().unwrap(), a);
    }

    #[test]
    fn rejects_malformed() {
        for text in ["", "0011", "00112233:44556677:8899aabb:ccddeefg", "00112233:44556677:8899aabb:ccddeeff00"] {
            assert!(text.parse::<MdUuid>().is_err(), "{text:?} accepted");
        }
    }
}
