//! What the server advertises for an export, derived from the device's [`DeviceInfo`].
//!
//! Pure and shared by INFO, GO and EXPORT_NAME so that an INFO followed by a GO with the
//! same parameters gives identical answers (a spec requirement).
//!
//! Block sizes: the spec wants powers of two. A device's minimum block is used as is when
//! valid (else 1). The preferred block (e.g. a RAID stripe width, which need not be a
//! power of two) becomes its largest power-of-two divisor, so that preferred-aligned I/O is
//! still aligned to the stripe's chunks; it is clamped to `[max(min, 512), 64 MiB]`. The
//! advertised maximum payload is always 64 MiB: the server splits READ/WRITE larger than
//! the device's own `max_payload_bytes` into device-sized pieces.

use crate::device::DeviceInfo;
use crate::protocol::consts::{MAX_PAYLOAD_BYTES, tflags};

/// Largest minimum block the spec allows.
const MAX_MIN_BLOCK_BYTES: u32 = 64 * 1024;

/// The numbers sent to a client for one export.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Advertised {
    pub size_bytes: u64,
    pub transmission_flags: u16,
    pub min_block_bytes: u32,
    pub preferred_block_bytes: u32,
    pub max_payload_bytes: u32,
    /// Largest READ/WRITE handed to the device in one call (a multiple of the minimum block).
    pub device_piece_bytes: u32,
}

/// What to advertise to a client that did (`block_sizes_negotiated`) or did not ask for
/// block sizes: a [byte-granular](DeviceInfo::byte_granular) device serves the latter with a
/// minimum block of 1.
pub fn advertise_to(info: &DeviceInfo, structured: bool, block_sizes_negotiated: bool) -> Advertised {
    let mut a = advertise(info, structured);
    if info.byte_granular && !block_sizes_negotiated {
        a.min_block_bytes = 1;
    }
    a
}

/// Computes what to advertise. `structured` says whether structured replies were
/// negotiated (SEND_DF is only allowed then).
pub fn advertise(info: &DeviceInfo, structured: bool) -> Advertised {
    let mut flags = tflags::HAS_FLAGS;
    let writable = !info.read_only;
    if info.read_only {
        flags |= tflags::READ_ONLY;
    }
    if info.can_flush {
        flags |= tflags::SEND_FLUSH | tflags::SEND_FUA;
    }
    if info.rotational {
        flags |= tflags::ROTATIONAL;
    }
    if info.can_trim && writable {
        flags |= tflags::SEND_TRIM;
    }
    if info.can_write_zeroes && writable {
        flags |= tflags::SEND_WRITE_ZEROES;
        if info.can_fast_zero {
            flags |= tflags::SEND_FAST_ZERO;
        }
    }
    if structured {
        flags |= tflags::SEND_DF;
    }
    if info.can_multi_conn {
        flags |= tflags::CAN_MULTI_CONN;
    }
    if info.can_cache {
        flags |= tflags::SEND_CACHE;
    }

    let min = info.min_block_bytes;
    let min_block_bytes = if min.is_power_of_two() && min <= MAX_MIN_BLOCK_BYTES { min } else { 1 };
    let preferred_floor = min_block_bytes.max(512);
    let preferred_block_bytes = match info.preferred_block_bytes {
        0 => 4096u32.max(preferred_floor),
        p => (1u32 << p.trailing_zeros()).clamp(preferred_floor, MAX_PAYLOAD_BYTES),
    };
    // Round the device's limit down to whole minimum blocks so split pieces stay aligned.
    let device_max = match info.max_payload_bytes {
        0 => MAX_PAYLOAD_BYTES,
        m => m.min(MAX_PAYLOAD_BYTES),
    };
    let device_piece_bytes = (device_max / min_block_bytes * min_block_bytes).max(min_block_bytes);

    let advertised = Advertised {
        size_bytes: info.size_bytes,
        transmission_flags: flags,
        min_block_bytes,
        preferred_block_bytes,
        max_payload_bytes: MAX_PAYLOAD_BYTES,
        device_piece_bytes,
    };
    debug_assert!(advertised.min_block_bytes.is_power_of_two());
    debug_assert!(advertised.preferred_block_bytes.is_power_of_two());
    debug_assert!(advertised.preferred_block_bytes >= advertised.min_block_bytes.max(512));
    debug_assert!(advertised.max_payload_bytes >= advertised.preferred_block_bytes);
    debug_assert!(advertised.device_piece_bytes.is_multiple_of(advertised.min_block_bytes));
    advertised
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info() -> DeviceInfo {
        DeviceInfo {
            min_block_bytes: 512,
            preferred_block_bytes: 3 * 64 * 1024,
            max_payload_bytes: 1 << 20,
            ..DeviceInfo::full_featured(1 << 30, String::new())
        }
    }

    #[test]
    fn byte_granular_devices_give_unnegotiating_clients_a_minimum_of_one() {
        let mut i = info();
        i.min_block_bytes = 512;
        assert_eq!(advertise_to(&i, true, false).min_block_bytes, 512, "not byte granular");
        i.byte_granular = true;
        assert_eq!(advertise_to(&i, true, false).min_block_bytes, 1);
        assert_eq!(advertise_to(&i, true, true).min_block_bytes, 512, "negotiated: the device's");
        assert_eq!(advertise_to(&i, true, false).device_piece_bytes % 512, 0, "pieces stay device-aligned");
    }

    #[test]
    fn stripe_width_becomes_power_of_two_divisor() {
        let a = advertise(&info(), true);
        assert_eq!(a.preferred_block_bytes, 64 * 1024);
        assert_eq!(a.max_payload_bytes, MAX_PAYLOAD_BYTES);
        assert_eq!(a.device_piece_bytes, 1 << 20);
        let mut i = info();
        i.preferred_block_bytes = 256 * 1024;
        assert_eq!(advertise(&i, true).preferred_block_bytes, 256 * 1024);
    }

    #[test]
    fn read_only_hides_write_features_and_df_needs_structured() {
        let mut i = info();
        i.read_only = true;
        let a = advertise(&i, false);
        assert_ne!(a.transmission_flags & tflags::READ_ONLY, 0);
        assert_eq!(a.transmission_flags & (tflags::SEND_TRIM | tflags::SEND_WRITE_ZEROES | tflags::SEND_DF), 0);
        assert_ne!(a.transmission_flags & tflags::SEND_FLUSH, 0);
    }

    #[test]
    fn invalid_device_block_sizes_are_sanitised() {
        let mut i = info();
        i.min_block_bytes = 3;
        i.preferred_block_bytes = 0;
        i.max_payload_bytes = 0;
        let a = advertise(&i, true);
        assert_eq!((a.min_block_bytes, a.preferred_block_bytes, a.device_piece_bytes), (1, 4096, MAX_PAYLOAD_BYTES));
        i.min_block_bytes = 4096;
        i.max_payload_bytes = 5000;
        let a = advertise(&i, true);
        assert_eq!((a.min_block_bytes, a.device_piece_bytes), (4096, 4096));
    }
}
