//! A connection's framing, fixed by the handshake: compact headers with simple replies,
//! compact headers with structured replies, or extended headers (32-byte requests with
//! 64-bit lengths, 32-byte reply chunks, never a simple reply). Every reader and writer of
//! the transmission phase takes this one value.

/// How requests and replies are framed on one connection; ordered (each implies the one
/// before: extended headers imply structured replies).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum Framing {
    /// 28-byte requests, simple replies only.
    #[default]
    Simple,
    /// 28-byte requests, structured replies (NBD_OPT_STRUCTURED_REPLY).
    Structured,
    /// 32-byte requests and reply chunks, 64-bit lengths (NBD_OPT_EXTENDED_HEADERS).
    Extended,
}

impl Framing {
    /// Structured reply chunks may be sent (errors with messages, READ chunks, block status).
    pub fn structured(self) -> bool {
        self >= Framing::Structured
    }

    pub fn extended(self) -> bool {
        self == Framing::Extended
    }

    /// Lower-case name, as in logs and status.
    pub fn name(self) -> &'static str {
        match self {
            Framing::Simple => "simple",
            Framing::Structured => "structured",
            Framing::Extended => "extended",
        }
    }

    /// Bytes of one request header.
    pub fn request_header_len(self) -> usize {
        if self.extended() { 32 } else { 28 }
    }

    /// Bytes of one reply chunk header (structured or extended).
    pub fn chunk_header_len(self) -> usize {
        if self.extended() { 32 } else { 20 }
    }
}

/// What a reply answers: the request's cookie and offset (extended chunk headers repeat the
/// offset), framed as the connection was negotiated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplyTo {
    pub framing: Framing,
    pub cookie: u64,
    pub offset: u64,
}
