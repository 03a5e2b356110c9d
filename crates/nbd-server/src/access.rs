//! Which network peers may connect: [`AddressRange`]s (`--allow ADDRESS/PREFIX`), checked
//! right after accept, before a byte is read or written.
//!
//! Only IP peers are checked; who may reach a Unix socket is up to the file's permissions.
//! IPv4 peers on a dual-stack socket (`::ffff:a.b.c.d`) are matched as IPv4.

use std::net::IpAddr;
use std::str::FromStr;

/// An address prefix, such as `10.0.0.0/8`, `2001:db8::/32` or `127.0.0.1` (one host).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddressRange {
    network: IpAddr,
    prefix_len: u8,
}

impl AddressRange {
    pub fn new(address: IpAddr, prefix_len: u8) -> Result<Self, String> {
        let max = max_prefix_len(&address);
        if prefix_len > max {
            return Err(format!("prefix length {prefix_len} is longer than {max} for {address}"));
        }
        let network = match address {
            IpAddr::V4(a) => IpAddr::V4((u32::from(a) & mask32(prefix_len)).into()),
            IpAddr::V6(a) => IpAddr::V6((u128::from(a) & mask128(prefix_len)).into()),
        };
        Ok(Self { network, prefix_len })
    }

    /// Whether `peer` lies in this range.
    pub fn contains(&self, peer: IpAddr) -> bool {
        let peer = match peer {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(peer, IpAddr::V4),
            v4 => v4,
        };
        match (self.network, peer) {
            (IpAddr::V4(net), IpAddr::V4(p)) => u32::from(p) & mask32(self.prefix_len) == u32::from(net),
            (IpAddr::V6(net), IpAddr::V6(p)) => u128::from(p) & mask128(self.prefix_len) == u128::from(net),
            _ => false,
        }
    }
}

fn max_prefix_len(address: &IpAddr) -> u8 {
    if address.is_ipv4() { 32 } else { 128 }
}

fn mask32(prefix_len: u8) -> u32 {
    u32::MAX.checked_shl(32 - u32::from(prefix_len)).unwrap_or(0)
}

fn mask128(prefix_len: u8) -> u128 {
    u128::MAX.checked_shl(128 - u32::from(prefix_len)).unwrap_or(0)
}

impl FromStr for AddressRange {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (address, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let address: IpAddr = address
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse()
            .map_err(|_| format!("{s:?} is not ADDRESS or ADDRESS/PREFIX (e.g. 10.0.0.0/8, 2001:db8::/32)"))?;
        let prefix_len = match prefix {
            None => max_prefix_len(&address),
            Some(p) => p.parse().map_err(|_| format!("{s:?}: {p:?} is not a prefix length"))?,
        };
        Self::new(address, prefix_len)
    }
}

impl std::fmt::Display for AddressRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix_len)
    }
}

/// Whether `peer` may connect: an empty list allows everyone.
pub(crate) fn allowed(ranges: &[AddressRange], peer: IpAddr) -> bool {
    ranges.is_empty() || ranges.iter().any(|r| r.contains(peer))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn ranges_match_their_prefix_only() {
        let lan: AddressRange = "10.1.2.3/8".parse().unwrap();
        assert_eq!(lan.to_string(), "10.0.0.0/8");
        assert!(lan.contains(ip("10.255.0.1")));
        assert!(lan.contains(ip("::ffff:10.0.0.9")), "IPv4 on a dual-stack socket");
        assert!(!lan.contains(ip("11.0.0.1")));
        assert!(!lan.contains(ip("::1")));
        let host: AddressRange = "127.0.0.1".parse().unwrap();
        assert!(host.contains(ip("127.0.0.1")) && !host.contains(ip("127.0.0.2")));
        let v6: AddressRange = "[2001:db8::]/32".parse().unwrap();
        assert!(v6.contains(ip("2001:db8:ffff::1")) && !v6.contains(ip("2001:db9::1")));
        let all: AddressRange = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains(ip("192.0.2.1")));
        for bad in ["10.0.0.0/33", "::/129", "host/8", "10.0.0.0/x", ""] {
            assert!(bad.parse::<AddressRange>().is_err(), "{bad:?}");
        }
        assert!(allowed(&[], ip("192.0.2.1")));
        assert!(!allowed(&[lan, host], ip("192.0.2.1")));
    }
}
