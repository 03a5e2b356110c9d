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
//! Headers are compact (28 bytes, 32-bit length) or, with extended headers, 32 bytes with a
//! 64-bit length ([`Framing`]); a 64-bit length is an effect length (TRIM, WRITE_ZEROES,
//! BLOCK_STATUS, CACHE) unless `NBD_CMD_FLAG_PAYLOAD_LEN` makes it the payload's.
//!
//! Only a violation that desynchronises the stream (bad magic, a payload above
//! [`MAX_PAYLOAD_BYTES`]) is an [`Error`]; everything else is a [`Rejection`] answered with
//! an NBD error value while the connection stays usable. All range checks use checked
//! arithmetic: `offset + length` may wrap near 2^64.

use super::consts::{EXTENDED_REQUEST_MAGIC, MAX_PAYLOAD_BYTES, REQUEST_MAGIC, cmd, cmd_flags, errno, tflags};
use super::framing::Framing;
use crate::device::ZeroFlags;
use crate::error::{Error, Result};

/// Length of a compact request header.
pub const REQUEST_HEADER_LEN: usize = 28;
/// Length of an extended request header.
pub const EXTENDED_REQUEST_HEADER_LEN: usize = 32;

/// A request header as sent by the client (compact headers carry a 32-bit length).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestHeader {
    pub flags: u16,
    pub command: u16,
    pub cookie: u64,
    pub offset: u64,
    pub length: u64,
}

/// Decodes a request header of `framing`, `Ok(None)` while fewer bytes are buffered.
pub fn decode_request_header(buf: &[u8], framing: Framing) -> Result<Option<RequestHeader>> {
    let header_len = framing.request_header_len();
    let Some(raw) = buf.get(..header_len) else { return Ok(None) };
    let magic = u32::from_be_bytes(raw[0..4].try_into().expect("4 bytes"));
    let expected = if framing.extended() { EXTENDED_REQUEST_MAGIC } else { REQUEST_MAGIC };
    if magic != expected {
        return Err(match magic {
            EXTENDED_REQUEST_MAGIC => Error::protocol("extended request header without negotiating extended headers"),
            REQUEST_MAGIC => Error::protocol("compact request header after negotiating extended headers"),
            _ => Error::protocol(format!("bad request magic {magic:#010x}")),
        });
    }
    let length = if framing.extended() {
        u64::from_be_bytes(raw[24..32].try_into().expect("8 bytes"))
    } else {
        u64::from(u32::from_be_bytes(raw[24..28].try_into().expect("4 bytes")))
    };
    Ok(Some(RequestHeader {
        flags: u16::from_be_bytes(raw[4..6].try_into().expect("2 bytes")),
        command: u16::from_be_bytes(raw[6..8].try_into().expect("2 bytes")),
        cookie: u64::from_be_bytes(raw[8..16].try_into().expect("8 bytes")),
        offset: u64::from_be_bytes(raw[16..24].try_into().expect("8 bytes")),
        length,
    }))
}

/// How many payload bytes follow `header` on the wire.
///
/// A WRITE carries a payload (with extended headers it must say so with PAYLOAD_LEN; one
/// that does not is taken as meaning it, as qemu does), and with extended headers any
/// command with PAYLOAD_LEN does; its bytes are consumed even when the request is then
/// refused. A payload longer than [`MAX_PAYLOAD_BYTES`] is treated as a denial of service
/// (the spec allows a hard disconnect there): we will not buffer or skip 4 GiB.
pub fn payload_len(header: &RequestHeader, framing: Framing) -> Result<u32> {
    let declared = framing.extended() && header.flags & cmd_flags::PAYLOAD_LEN != 0;
    if header.command != cmd::WRITE && !declared {
        return Ok(0);
    }
    match u32::try_from(header.length) {
        Ok(len) if len <= MAX_PAYLOAD_BYTES => Ok(len),
        _ => Err(Error::protocol(format!(
            "payload of {} bytes exceeds the {MAX_PAYLOAD_BYTES}-byte limit",
            header.length
        ))),
    }
}

/// What the validator needs to know about the export and the negotiation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExportLimits {
    pub size_bytes: u64,
    /// Transmission flags advertised to this client.
    pub transmission_flags: u16,
    pub framing: Framing,
    /// A meta context (`base:allocation` or one of the device's own) was selected.
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
    Trim { offset: u64, len: u64, fua: bool },
    Cache { offset: u64, len: u64 },
    WriteZeroes { offset: u64, len: u64, flags: ZeroFlags },
    BlockStatus { offset: u64, len: u64, req_one: bool },
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
        cmd::BLOCK_STATUS if limits.framing.structured() && limits.meta_context_selected => {}
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
        cmd::WRITE if limits.framing.extended() => allowed |= cmd_flags::PAYLOAD_LEN,
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

    let in_range = h.offset.checked_add(h.length).is_some_and(|end| end <= limits.size_bytes);
    if !in_range {
        return Err(match h.command {
            cmd::WRITE | cmd::WRITE_ZEROES => reject(errno::ENOSPC, "request extends past the end of the export"),
            _ => reject(errno::EINVAL, "request extends past the end of the export"),
        });
    }

    let min_block = u64::from(limits.min_block_bytes.max(1));
    debug_assert!(min_block.is_power_of_two());
    let offset_misaligned = !h.offset.is_multiple_of(min_block);
    let length_misaligned = !h.length.is_multiple_of(min_block) && h.command != cmd::BLOCK_STATUS;
    if offset_misaligned || length_misaligned {
        return Err(reject(errno::EINVAL, "request not aligned to the minimum block size"));
    }

    let (offset, len) = (h.offset, h.length);
    let payload_sized = u32::try_from(len).ok().filter(|&len| len <= limits.max_payload_bytes);
    match h.command {
        cmd::READ | cmd::WRITE if payload_sized.is_none() => {
            Err(reject(errno::EINVAL, "request larger than the maximum payload"))
        }
        cmd::READ => Ok(Request::Read { offset, len: payload_sized.expect("checked"), df: flag(cmd_flags::DF) }),
        cmd::WRITE => Ok(Request::Write { offset, len: payload_sized.expect("checked"), fua: flag(cmd_flags::FUA) }),
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
        RequestHeader { flags, command, cookie: 7, offset, length: length.into() }
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
            framing: Framing::Structured,
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
        assert_eq!(decode_request_header(&raw, Framing::Simple).unwrap(), None);
        raw.extend_from_slice(&512u32.to_be_bytes());
        let h = decode_request_header(&raw, Framing::Structured).unwrap().unwrap();
        assert_eq!(
            h,
            RequestHeader { flags: 1, command: cmd::WRITE, cookie: 0x1122334455667788, offset: 4096, length: 512 }
        );
        assert!(decode_request_header(&raw, Framing::Extended).unwrap().is_none(), "32 bytes needed");
        raw.extend_from_slice(&[0; 4]);
        assert!(decode_request_header(&raw, Framing::Extended).is_err(), "compact magic after extended headers");
        raw[0] = 0;
        assert!(decode_request_header(&raw, Framing::Simple).is_err());
        raw[..4].copy_from_slice(&EXTENDED_REQUEST_MAGIC.to_be_bytes());
        assert!(decode_request_header(&raw, Framing::Simple).is_err());
    }

    #[test]
    fn extended_headers_carry_64_bit_lengths_and_declared_payloads() {
        let mut raw = Vec::new();
        raw.extend_from_slice(&EXTENDED_REQUEST_MAGIC.to_be_bytes());
        raw.extend_from_slice(&0u16.to_be_bytes());
        raw.extend_from_slice(&cmd::WRITE_ZEROES.to_be_bytes());
        raw.extend_from_slice(&9u64.to_be_bytes());
        raw.extend_from_slice(&0u64.to_be_bytes());
        raw.extend_from_slice(&(6u64 << 30).to_be_bytes());
        let h = decode_request_header(&raw, Framing::Extended).unwrap().unwrap();
        assert_eq!((h.command, h.cookie, h.length), (cmd::WRITE_ZEROES, 9, 6 << 30));
        assert_eq!(payload_len(&h, Framing::Extended).unwrap(), 0, "an effect length, no payload");
        let mut l = limits();
        l.framing = Framing::Extended;
        l.size_bytes = 8 << 30;
        assert_eq!(
            validate_request(&h, &l).unwrap(),
            Request::WriteZeroes { offset: 0, len: 6 << 30, flags: ZeroFlags::default() }
        );
        let write =
            RequestHeader { flags: cmd_flags::PAYLOAD_LEN, command: cmd::WRITE, cookie: 1, offset: 0, length: 4096 };
        assert_eq!(payload_len(&write, Framing::Extended).unwrap(), 4096);
        assert!(validate_request(&write, &l).is_ok());
        assert_eq!(
            validate_request(&write, &limits()).unwrap_err().errno,
            errno::EINVAL,
            "PAYLOAD_LEN only with extended headers"
        );
        // A payload on a command that takes none is read (the stream stays in step), then refused.
        let read = RequestHeader { flags: cmd_flags::PAYLOAD_LEN, command: cmd::READ, cookie: 2, offset: 0, length: 8 };
        assert_eq!(payload_len(&read, Framing::Extended).unwrap(), 8);
        assert_eq!(validate_request(&read, &l).unwrap_err().errno, errno::EINVAL);
        let huge = RequestHeader { length: 1 << 40, ..write };
        assert!(payload_len(&huge, Framing::Extended).is_err());
        let read = RequestHeader { flags: 0, length: 1 << 33, ..read };
        assert_eq!(validate_request(&read, &l).unwrap_err().errno, errno::EINVAL, "READ beyond the maximum payload");
    }

    #[test]
    fn oversized_write_payload_disconnects_but_read_does_not() {
        assert!(payload_len(&header(cmd::WRITE, 0, 0, u32::MAX), Framing::Simple).is_err());
        assert_eq!(
            payload_len(&header(cmd::WRITE, 0, 0, MAX_PAYLOAD_BYTES), Framing::Simple).unwrap(),
            MAX_PAYLOAD_BYTES
        );
        assert_eq!(payload_len(&header(cmd::READ, 0, 0, u32::MAX), Framing::Simple).unwrap(), 0);
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
