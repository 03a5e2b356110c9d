//! Wire constants of the NBD protocol (NetworkBlockDevice/nbd `doc/proto.md`).
//!
//! Names follow the spec with the `NBD_` prefix dropped and grouped by the field they
//! belong to. Values are what goes on the wire (big-endian when serialised).

/// "NBDMAGIC", the first 8 bytes the server sends.
pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
/// "IHAVEOPT": newstyle greeting and prefix of every client option.
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// Magic of every option reply.
pub const OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
/// Compact request magic.
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
/// Extended request magic (only valid after `OPT_EXTENDED_HEADERS`, which this server refuses).
pub const EXTENDED_REQUEST_MAGIC: u32 = 0x21e4_1c71;
/// Simple reply magic.
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
/// Structured reply chunk magic.
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;
/// Extended reply chunk magic (`NBD_EXTENDED_REPLY_MAGIC`).
pub const EXTENDED_REPLY_MAGIC: u32 = 0x6e8a_278c;

/// Handshake flags (server → client, u16).
pub mod handshake_flags {
    pub const FIXED_NEWSTYLE: u16 = 1 << 0;
    pub const NO_ZEROES: u16 = 1 << 1;
}

/// Client flags (client → server, u32).
pub mod client_flags {
    pub const FIXED_NEWSTYLE: u32 = 1 << 0;
    pub const NO_ZEROES: u32 = 1 << 1;
    /// Every flag a client may set given that the server offers both handshake flags.
    pub const KNOWN: u32 = FIXED_NEWSTYLE | NO_ZEROES;
}

/// Option codes (`NBD_OPT_*`).
pub mod opt {
    pub const EXPORT_NAME: u32 = 1;
    pub const ABORT: u32 = 2;
    pub const LIST: u32 = 3;
    pub const PEEK_EXPORT: u32 = 4;
    pub const STARTTLS: u32 = 5;
    pub const INFO: u32 = 6;
    pub const GO: u32 = 7;
    pub const STRUCTURED_REPLY: u32 = 8;
    pub const LIST_META_CONTEXT: u32 = 9;
    pub const SET_META_CONTEXT: u32 = 10;
    pub const EXTENDED_HEADERS: u32 = 11;
}

/// Option reply types (`NBD_REP_*`); errors have bit 31 set.
pub mod rep {
    pub const ACK: u32 = 1;
    pub const SERVER: u32 = 2;
    pub const INFO: u32 = 3;
    pub const META_CONTEXT: u32 = 4;
    const ERR: u32 = 1 << 31;
    pub const ERR_UNSUP: u32 = ERR + 1;
    pub const ERR_POLICY: u32 = ERR + 2;
    pub const ERR_INVALID: u32 = ERR + 3;
    pub const ERR_PLATFORM: u32 = ERR + 4;
    pub const ERR_TLS_REQD: u32 = ERR + 5;
    pub const ERR_UNKNOWN: u32 = ERR + 6;
    pub const ERR_SHUTDOWN: u32 = ERR + 7;
    pub const ERR_BLOCK_SIZE_REQD: u32 = ERR + 8;
    pub const ERR_TOO_BIG: u32 = ERR + 9;
    pub const ERR_EXT_HEADER_REQD: u32 = ERR + 10;
}

/// Information types inside `NBD_REP_INFO` (`NBD_INFO_*`).
pub mod info {
    pub const EXPORT: u16 = 0;
    pub const NAME: u16 = 1;
    pub const DESCRIPTION: u16 = 2;
    pub const BLOCK_SIZE: u16 = 3;
}

/// Transmission flags (u16, sent with the export size).
pub mod tflags {
    pub const HAS_FLAGS: u16 = 1 << 0;
    pub const READ_ONLY: u16 = 1 << 1;
    pub const SEND_FLUSH: u16 = 1 << 2;
    pub const SEND_FUA: u16 = 1 << 3;
    pub const ROTATIONAL: u16 = 1 << 4;
    pub const SEND_TRIM: u16 = 1 << 5;
    pub const SEND_WRITE_ZEROES: u16 = 1 << 6;
    pub const SEND_DF: u16 = 1 << 7;
    pub const CAN_MULTI_CONN: u16 = 1 << 8;
    pub const SEND_RESIZE: u16 = 1 << 9;
    pub const SEND_CACHE: u16 = 1 << 10;
    pub const SEND_FAST_ZERO: u16 = 1 << 11;
}

/// Command types (`NBD_CMD_*`).
pub mod cmd {
    pub const READ: u16 = 0;
    pub const WRITE: u16 = 1;
    pub const DISC: u16 = 2;
    pub const FLUSH: u16 = 3;
    pub const TRIM: u16 = 4;
    pub const CACHE: u16 = 5;
    pub const WRITE_ZEROES: u16 = 6;
    pub const BLOCK_STATUS: u16 = 7;
}

/// Command flags (`NBD_CMD_FLAG_*`).
pub mod cmd_flags {
    pub const FUA: u16 = 1 << 0;
    pub const NO_HOLE: u16 = 1 << 1;
    pub const DF: u16 = 1 << 2;
    pub const REQ_ONE: u16 = 1 << 3;
    pub const FAST_ZERO: u16 = 1 << 4;
    pub const PAYLOAD_LEN: u16 = 1 << 5;
}

/// Structured reply flags.
pub mod reply_flags {
    pub const DONE: u16 = 1 << 0;
}

/// Structured reply chunk types (`NBD_REPLY_TYPE_*`).
pub mod reply_type {
    pub const NONE: u16 = 0;
    pub const OFFSET_DATA: u16 = 1;
    pub const OFFSET_HOLE: u16 = 2;
    pub const BLOCK_STATUS: u16 = 5;
    /// 64-bit extents, the only block-status type with extended headers.
    pub const BLOCK_STATUS_EXT: u16 = 6;
    pub const ERROR: u16 = (1 << 15) + 1;
    pub const ERROR_OFFSET: u16 = (1 << 15) + 2;
}

/// `base:allocation` status flags.
pub mod state {
    pub const HOLE: u32 = 1 << 0;
    pub const ZERO: u32 = 1 << 1;
}

/// NBD error values (the `error` field of replies).
pub mod errno {
    pub const EPERM: u32 = 1;
    pub const EIO: u32 = 5;
    pub const ENOMEM: u32 = 12;
    pub const EINVAL: u32 = 22;
    pub const ENOSPC: u32 = 28;
    pub const EOVERFLOW: u32 = 75;
    pub const ENOTSUP: u32 = 95;
    pub const ESHUTDOWN: u32 = 108;
}

/// The only metadata context this server knows.
pub const BASE_ALLOCATION: &str = "base:allocation";
/// Context id handed out for `base:allocation` by SET_META_CONTEXT.
pub const BASE_ALLOCATION_ID: u32 = 1;

/// Largest READ/WRITE payload the server ever accepts and advertises (twice the spec's
/// interoperable 32 MiB: older clients and test tools send up to 64 MiB).
pub const MAX_PAYLOAD_BYTES: u32 = 64 * 1024 * 1024;
/// Largest string the spec allows (export names, queries, messages).
pub const MAX_STRING_BYTES: usize = 4096;
/// Option data above this many bytes is refused with `ERR_TOO_BIG`...
pub const MAX_OPTION_DATA_BYTES: u32 = 64 * 1024;
/// ... and skipped to stay in sync up to this many; a longer option is answered at once and
/// the connection closed.
pub const MAX_SKIPPED_OPTION_BYTES: u32 = 1 << 20;
/// Length of the EXPORT_NAME reply padding unless NO_ZEROES was negotiated.
pub const EXPORT_NAME_PAD_BYTES: usize = 124;

const _: () = assert!(MAX_PAYLOAD_BYTES.is_power_of_two());
const _: () = assert!(MAX_OPTION_DATA_BYTES as usize > MAX_STRING_BYTES + 8);
