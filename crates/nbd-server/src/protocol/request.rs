//! Transmission requests: a pure header decoder and a pure validator.
//!
//! The transmission loop runs three steps on every request, all free of I/O so they can be
//! fuzzed (`fuzz/fuzz_targets/request.rs`):
//!
//! ```text
//!  bytes ──decode_request_header──▶ RequestHeader ──payload_len──▶ bytes to consume
//!                                        │
//!                                        └──validate_request(limits)──▶ Request | Rejection(errno)
//! ```
//!
//! Only a violation that desynchronises the stream (bad magic, a WRITE payload above
//! [`MAX_PAYLOAD_BYTES`]) is an [`Error`]; everything else is a [`Rejection`] answered with
//! an NBD error value while the connection stays usable. All range checks use checked
//! arithmetic: `offset + length` may wrap near 2^64.

use super::consts::{EXTENDED_REQUEST_MAGIC, MAX_PAYLOAD_BYTES, REQUEST_MAGIC, cmd, cmd_flags, errno, tflags};
use crate::device::ZeroFlags;
use crate::error::{Error, Result};

/// Length of a compact request header.
pub const REQUEST_HEADER_LEN: usize = 28;

/// A compact request header as sent by the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestHeader {
    pub flags: u16,
    pub command: u16,
    pub cookie: u64,
    pub offset: u64,
    pub length: u32,
}

/// Decodes a request header, `Ok(None)` if fewer than 28 bytes are buffered.
pub fn decode_request_header(buf: &[u8]) -> Result<Option<RequestHeader>> {
    let Some(raw) = buf.first_chunk::<REQUEST_HEADER_LEN>() else { return Ok(None) };
    let magic = u32::from_be_bytes(raw[0..4].try_into().expect("4 bytes"));
    if magic != REQUEST_MAGIC {
        return Err(if magic == EXTENDED_REQUEST_MAGIC {
            Error::protocol("extended request header without negotiating extended headers")
        } else {
            Error::protocol(format!("bad request magic {magic:#010x}"))
        });
    }
    Ok(Some(RequestHeader {
        flags: u16::from_be_bytes(raw[4..6].try_into().expect("2 bytes")),
        command: u16::from_be_bytes(raw[6..8].try_into().expect("2 bytes")),
        cookie: u64::from_be_bytes(raw[8..16].try_into().expect("8 bytes")),
        offset: u64::from_be_bytes(raw[16..24].try_into().expect("8 bytes")),
        length: u32::from_be_bytes(raw[24..28].try_into().expect("4 bytes")),
    }))
}

/// How many payload bytes follow `header` on the wire.
///
/// Only WRITE carries a payload, and its bytes must be consumed even when the request is
/// then refused. A WRITE longer than [`MAX_PAYLOAD_BYTES`] is treated as a denial of
/// service (the spec allows a hard disconnect there): we will not buffer or skip 4 GiB.
pub fn payload_len(header: &RequestHeader) -> Result<u32> {
    if header.command != cmd::WRITE {
        return Ok(0);
    }
    if header.length > MAX_PAYLOAD_BYTES {
        return Err(Error::protocol(format!(
            "WRITE payload of {} bytes exceeds the {MAX_PAYLOAD_BYTES}-byte limit",
            header.length
        )));
    }
    Ok(header.length)
}

/// What the validator needs to know about the export and the negotiation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExportLimits {
    pub size_bytes: u64,
    /// Transmission flags advertised to this client.
    pub transmission_flags: u16,
    pub structured_replies: bool,
    /// `base:allocation` was selected for this export.
    pub meta_context_selected: bool,
    /// Offsets and lengths must be multiples of this (a power of two, 1 = no constraint).
    pub min_block_bytes: u32,
    /// Largest READ/WRITE accepted.
    pub max_payload_bytes: u32,
}

/// A request that passed validation: in range, allowed and well-formed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    Read { offset: u64, len: u32, df: bool },
    Write { offset: u64, len: u32, fua: bool },
    Disc,
    Flush,
    Trim { offset: u64, len: u32, fua: bool },
    Cache { offset: u64, len: u32 },
    WriteZeroes { offset: u64, len: u32, flags: ZeroFlags },
    BlockStatus { offset: u64, len: u32, req_one: bool },
}

/// A refused request: the NBD error value and a message for structured error chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rejection {
    pub errno: u32,
    pub message: &'static str,
}

const fn reject(errno: u32, message: &'static str) -> Rejection {
    Rejection { errno, message }
}

/// Checks a request against the export and the negotiated features.
///
/// Order of checks: read-only (EPERM for any write kind) → command known and advertised →
/// flags allowed → range →
/// alignment → size limit. Out of range is `ENOSPC` for WRITE/WRITE_ZEROES and `EINVAL`
/// otherwise, as the spec asks.
pub fn validate_request(h: &RequestHeader, limits: &ExportLimits) -> Result<Request, Rejection> {
    let advertised = |flag: u16| limits.transmission_flags & flag != 0;
    let is_write_kind = matches!(h.command, cmd::WRITE | cmd::TRIM | cmd::WRITE_ZEROES);

    // Writes of any kind on a read-only export are EPERM, even those not advertised there.
    if is_write_kind && advertised(tflags::READ_ONLY) {
        return Err(reject(errno::EPERM, "export is read-only"));
    }

    // Command known and advertised.
    match h.command {
        cmd::READ | cmd::WRITE | cmd::DISC => {}
        cmd::FLUSH if advertised(tflags::SEND_FLUSH) => {}
        cmd::TRIM if advertised(tflags::SEND_TRIM) => {}
        cmd::CACHE if advertised(tflags::SEND_CACHE) => {}
        cmd::WRITE_ZEROES if advertised(tflags::SEND_WRITE_ZEROES) => {}
        cmd::BLOCK_STATUS if limits.structured_replies && limits.meta_context_selected => {}
        cmd::BLOCK_STATUS => return Err(reject(errno::EINVAL, "no metadata context was negotiated")),
        cmd::FLUSH | cmd::TRIM | cmd::CACHE | cmd::WRITE_ZEROES => {
            return Err(reject(errno::EINVAL, "command not advertised for this export"));
        }
        _ => return Err(reject(errno::EINVAL, "unknown command")),
    }

    // Flags documented for this command (and advertised).
    let mut allowed = 0u16;
    if advertised(tflags::SEND_FUA) {
        allowed |= cmd_flags::FUA;
    }
    match h.command {
        cmd::READ if advertised(tflags::SEND_DF) => allowed |= cmd_flags::DF,
        cmd::WRITE_ZEROES => {
            allowed |= cmd_flags::NO_HOLE;
            if advertised(tflags::SEND_FAST_ZERO) {
                allowed |= cmd_flags::FAST_ZERO;
            }
        }
        cmd::BLOCK_STATUS => allowed |= cmd_flags::REQ_ONE,
        _ => {}
    }
    if h.flags & !allowed != 0 {
        return Err(reject(errno::EINVAL, "command flag not valid for this command"));
    }
    let flag = |bit: u16| h.flags & bit != 0;

    if h.command == cmd::DISC {
        return Ok(Request::Disc);
    }
    if h.command == cmd::FLUSH {
        if h.offset != 0 || h.length != 0 {
            return Err(reject(errno::EINVAL, "FLUSH must have offset and length 0"));
        }
        return Ok(Request::Flush);
    }

    let in_range = h.offset.checked_add(u64::from(h.length)).is_some_and(|end| end <= limits.size_bytes);
    if !in_range {
        return Err(match h.command {
            cmd::WRITE | cmd::WRITE_ZEROES => reject(errno::ENOSPC, "request extends past the end of the export"),
            _ => reject(errno::EINVAL, "request extends past the end of the export"),
        });
    }

    let min_block = u64::from(limits.min_block_bytes.max(1));
    debug_assert!(min_block.is_power_of_two());
    let offset_misaligned = !h.offset.is_multiple_of(min_block);
    let length_misaligned = !u64::from(h.length).is_multiple_of(min_block) && h.command != cmd::BLOCK_STATUS;
    if offset_misaligned || length_misaligned {
        return Err(reject(errno::EINVAL, "request not aligned to the minimum block size"));
    }

    let (offset, len) = (h.offset, h.length);
    match h.command {
        cmd::READ | cmd::WRITE if len > limits.max_payload_bytes => {
            Err(reject(errno::EINVAL, "request larger than the maximum payload"))
        }
        cmd::READ => Ok(Request::Read { offset, len, df: flag(cmd_flags::DF) }),
        cmd::WRITE => Ok(Request::Write { offset, len, fua: flag(cmd_flags::FUA) }),
        cmd::TRIM => Ok(Request::Trim { offset, len, fua: flag(cmd_flags::FUA) }),
        cmd::CACHE => Ok(Request::Cache { offset, len }),
        cmd::WRITE_ZEROES => Ok(Request::WriteZeroes {
            offset,
            len,
            flags: ZeroFlags {
                fua: flag(cmd_flags::FUA),
                no_hole: flag(cmd_flags::NO_HOLE),
                fast_zero: flag(cmd_flags::FAST_ZERO),
            },
        }),
        cmd::BLOCK_STATUS if len == 0 => Err(reject(errno::EINVAL, "BLOCK_STATUS of length 0")),
        cmd::BLOCK_STATUS => Ok(Request::BlockStatus { offset, len, req_one: flag(cmd_flags::REQ_ONE) }),
        _ => unreachable!("commands were filtered above"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(command: u16, flags: u16, offset: u64, length: u32) -> RequestHeader {
        RequestHeader { flags, command, cookie: 7, offset, length }
    }

    fn limits() -> ExportLimits {
        ExportLimits {
            size_bytes: 1 << 20,
            transmission_flags: tflags::HAS_FLAGS
                | tflags::SEND_FLUSH
                | tflags::SEND_FUA
                | tflags::SEND_TRIM
                | tflags::SEND_WRITE_ZEROES
                | tflags::SEND_FAST_ZERO
                | tflags::SEND_DF
                | tflags::SEND_CACHE,
            structured_replies: true,
            meta_context_selected: true,
            min_block_bytes: 1,
            max_payload_bytes: MAX_PAYLOAD_BYTES,
        }
    }

    #[test]
    fn decodes_header_and_rejects_bad_magic() {
        let mut raw = Vec::new();
        raw.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
        raw.extend_from_slice(&1u16.to_be_bytes());
        raw.extend_from_slice(&cmd::WRITE.to_be_bytes());
        raw.extend_from_slice(&0x1122334455667788u64.to_be_bytes());
        raw.extend_from_slice(&4096u64.to_be_bytes());
        assert_eq!(decode_request_header(&raw).unwrap(), None);
        raw.extend_from_slice(&512u32.to_be_bytes());
        let h = decode_request_header(&raw).unwrap().unwrap();
        assert_eq!(
            h,
            RequestHeader { flags: 1, command: cmd::WRITE, cookie: 0x1122334455667788, offset: 4096, length: 512 }
        );
        raw[0] = 0;
        assert!(decode_request_header(&raw).is_err());
        raw[..4].copy_from_slice(&EXTENDED_REQUEST_MAGIC.to_be_bytes());
        assert!(decode_request_header(&raw).is_err());
    }

    #[test]
    fn oversized_write_payload_disconnects_but_read_does_not() {
        assert!(payload_len(&header(cmd::WRITE, 0, 0, u32::MAX)).is_err());
        assert_eq!(payload_len(&header(cmd::WRITE, 0, 0, MAX_PAYLOAD_BYTES)).unwrap(), MAX_PAYLOAD_BYTES);
        assert_eq!(payload_len(&header(cmd::READ, 0, 0, u32::MAX)).unwrap(), 0);
        let r = validate_request(&header(cmd::READ, 0, 0, u32::MAX), &limits()).unwrap_err();
        assert_eq!(r.errno, errno::EINVAL);
    }

    #[test]
    fn range_checks_do_not_wrap() {
        let l = limits();
        for command in [cmd::READ, cmd::TRIM, cmd::CACHE, cmd::BLOCK_STATUS] {
            assert_eq!(validate_request(&header(command, 0, u64::MAX - 10, 512), &l).unwrap_err().errno, errno::EINVAL);
        }
        for command in [cmd::WRITE, cmd::WRITE_ZEROES] {
            assert_eq!(validate_request(&header(command, 0, u64::MAX, 1), &l).unwrap_err().errno, errno::ENOSPC);
            assert_eq!(validate_request(&header(command, 0, 1 << 20, 1), &l).unwrap_err().errno, errno::ENOSPC);
        }
        assert!(validate_request(&header(cmd::READ, 0, (1 << 20) - 512, 512), &l).is_ok());
    }

    #[test]
    fn flags_must_be_documented_and_advertised() {
        let mut l = limits();
        assert_eq!(
            validate_request(&header(cmd::WRITE, cmd_flags::NO_HOLE, 0, 1), &l).unwrap_err().errno,
            errno::EINVAL
        );
        assert_eq!(validate_request(&header(cmd::READ, 0x8000, 0, 1), &l).unwrap_err().errno, errno::EINVAL);
        assert!(validate_request(&header(cmd::READ, cmd_flags::DF | cmd_flags::FUA, 0, 1), &l).is_ok());
        l.transmission_flags &= !(tflags::SEND_DF | tflags::SEND_FUA);
        assert_eq!(validate_request(&header(cmd::READ, cmd_flags::DF, 0, 1), &l).unwrap_err().errno, errno::EINVAL);
        assert_eq!(validate_request(&header(cmd::WRITE, cmd_flags::FUA, 0, 1), &l).unwrap_err().errno, errno::EINVAL);
    }

    #[test]
    fn read_only_and_missing_features() {
        let mut l = limits();
        l.transmission_flags |= tflags::READ_ONLY;
        for command in [cmd::WRITE, cmd::TRIM, cmd::WRITE_ZEROES] {
            assert_eq!(validate_request(&header(command, 0, 0, 512), &l).unwrap_err().errno, errno::EPERM);
        }
        assert!(validate_request(&header(cmd::READ, 0, 0, 512), &l).is_ok());
        l.meta_context_selected = false;
        assert_eq!(validate_request(&header(cmd::BLOCK_STATUS, 0, 0, 512), &l).unwrap_err().errno, errno::EINVAL);
        l.transmission_flags &= !tflags::SEND_TRIM;
        assert_eq!(validate_request(&header(cmd::TRIM, 0, 0, 512), &l).unwrap_err().errno, errno::EPERM);
        l.transmission_flags &= !tflags::READ_ONLY;
        assert_eq!(validate_request(&header(cmd::TRIM, 0, 0, 512), &l).unwrap_err().errno, errno::EINVAL);
        assert_eq!(validate_request(&header(99, 0, 0, 0), &l).unwrap_err().errno, errno::EINVAL);
    }

    #[test]
    fn alignment_and_flush_shape() {
        let mut l = limits();
        l.min_block_bytes = 4096;
        assert_eq!(validate_request(&header(cmd::READ, 0, 512, 4096), &l).unwrap_err().errno, errno::EINVAL);
        assert_eq!(validate_request(&header(cmd::READ, 0, 4096, 512), &l).unwrap_err().errno, errno::EINVAL);
        assert!(validate_request(&header(cmd::BLOCK_STATUS, 0, 4096, 1), &l).is_ok());
        assert_eq!(validate_request(&header(cmd::FLUSH, 0, 1, 0), &l).unwrap_err().errno, errno::EINVAL);
        assert_eq!(validate_request(&header(cmd::FLUSH, 0, 0, 0), &l).unwrap(), Request::Flush);
    }
}
