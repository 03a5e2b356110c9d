//! Handshake wire format: pure decoders and encoders over byte buffers.
//!
//! Decoders follow mini-redis' check-then-parse shape: they look at a buffer that may hold
//! a partial message and return `Ok(None)` when more bytes are needed, `Err` for a protocol
//! violation that ends the connection, `Ok(Some(..))` otherwise. They never panic and never
//! allocate more than the input they were handed (the caller caps option data at
//! [`MAX_OPTION_DATA_BYTES`](super::consts::MAX_OPTION_DATA_BYTES) before buffering it), so
//! they can be fuzzed directly (`fuzz/fuzz_targets/handshake.rs`).
//!
//! Option *payload* problems are not errors: [`parse_option`] returns an [`OptionRefusal`],
//! which the handshake answers with an option reply and then keeps going.

use bytes::{BufMut, BytesMut};

use super::consts::IHAVEOPT;
use super::consts::{MAX_STRING_BYTES, NBDMAGIC, OPTION_REPLY_MAGIC, client_flags, handshake_flags, info, opt, rep};
use crate::error::{Error, Result};

/// Length of the server greeting: NBDMAGIC, IHAVEOPT, handshake flags.
pub const GREETING_LEN: usize = 18;
/// Length of an option request header: IHAVEOPT, option code, data length.
pub const OPTION_HEADER_LEN: usize = 16;
/// Length of an option reply header.
pub const OPTION_REPLY_HEADER_LEN: usize = 20;

/// The server's first message: fixed newstyle, NO_ZEROES offered.
pub fn encode_greeting() -> [u8; GREETING_LEN] {
    let mut out = [0u8; GREETING_LEN];
    out[..8].copy_from_slice(&NBDMAGIC.to_be_bytes());
    out[8..16].copy_from_slice(&IHAVEOPT.to_be_bytes());
    let flags = handshake_flags::FIXED_NEWSTYLE | handshake_flags::NO_ZEROES;
    out[16..18].copy_from_slice(&flags.to_be_bytes());
    out
}

/// What the client said in its 32-bit flags field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ClientFlags {
    pub fixed_newstyle: bool,
    pub no_zeroes: bool,
}

/// Decodes the client flags; unknown bits are a violation (the spec says drop the connection).
pub fn decode_client_flags(buf: &[u8]) -> Result<Option<ClientFlags>> {
    let Some(raw) = buf.first_chunk::<4>() else { return Ok(None) };
    let flags = u32::from_be_bytes(*raw);
    if flags & !client_flags::KNOWN != 0 {
        return Err(Error::protocol(format!("unknown client flags {flags:#x}")));
    }
    Ok(Some(ClientFlags {
        fixed_newstyle: flags & client_flags::FIXED_NEWSTYLE != 0,
        no_zeroes: flags & client_flags::NO_ZEROES != 0,
    }))
}

/// The fixed part of a client option.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionHeader {
    pub code: u32,
    pub data_len: u32,
}

/// Decodes an option header; a wrong magic is a violation (we cannot resynchronise).
pub fn decode_option_header(buf: &[u8]) -> Result<Option<OptionHeader>> {
    let Some(raw) = buf.first_chunk::<OPTION_HEADER_LEN>() else { return Ok(None) };
    let magic = u64::from_be_bytes(raw[..8].try_into().expect("8 bytes"));
    if magic != IHAVEOPT {
        return Err(Error::protocol(format!("bad option magic {magic:#018x}")));
    }
    let code = u32::from_be_bytes(raw[8..12].try_into().expect("4 bytes"));
    let data_len = u32::from_be_bytes(raw[12..16].try_into().expect("4 bytes"));
    Ok(Some(OptionHeader { code, data_len }))
}

/// An option the server understood, with its payload parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientOption {
    ExportName(String),
    Abort,
    List,
    StartTls,
    Info(ExportQuery),
    Go(ExportQuery),
    StructuredReply,
    ListMetaContext(MetaContextQuery),
    SetMetaContext(MetaContextQuery),
    ExtendedHeaders,
    /// Anything else (answered with `ERR_UNSUP`).
    Unknown(u32),
}

/// Payload of INFO and GO.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportQuery {
    pub name: String,
    /// Requested `NBD_INFO_*` codes, in order, duplicates kept.
    pub info_requests: Vec<u16>,
}

/// Payload of LIST_META_CONTEXT and SET_META_CONTEXT.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaContextQuery {
    pub export_name: String,
    pub queries: Vec<String>,
}

/// Why a known option's payload is refused; answered with `reply_type` and `message`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OptionRefusal {
    pub reply_type: u32,
    pub message: String,
}

impl OptionRefusal {
    pub fn invalid(message: impl Into<String>) -> Self {
        Self { reply_type: rep::ERR_INVALID, message: message.into() }
    }
}

/// Parses the payload of option `code`.
///
/// `data` is exactly the option data the client declared. Options that take no data refuse
/// a non-empty payload with `ERR_INVALID` (ABORT ignores it, as the spec says).
pub fn parse_option(code: u32, data: &[u8]) -> Result<ClientOption, OptionRefusal> {
    let no_data = |option: ClientOption| {
        if data.is_empty() { Ok(option) } else { Err(OptionRefusal::invalid("option takes no data")) }
    };
    match code {
        opt::EXPORT_NAME => Ok(ClientOption::ExportName(parse_string(data, "export name")?)),
        opt::ABORT => Ok(ClientOption::Abort),
        opt::LIST => no_data(ClientOption::List),
        opt::STARTTLS => no_data(ClientOption::StartTls),
        opt::INFO => Ok(ClientOption::Info(parse_export_query(data)?)),
        opt::GO => Ok(ClientOption::Go(parse_export_query(data)?)),
        opt::STRUCTURED_REPLY => no_data(ClientOption::StructuredReply),
        opt::LIST_META_CONTEXT => Ok(ClientOption::ListMetaContext(parse_meta_context_query(data)?)),
        opt::SET_META_CONTEXT => Ok(ClientOption::SetMetaContext(parse_meta_context_query(data)?)),
        opt::EXTENDED_HEADERS => no_data(ClientOption::ExtendedHeaders),
        other => Ok(ClientOption::Unknown(other)),
    }
}

/// A cursor over option data that refuses (rather than panics) on truncation.
struct Cursor<'a> {
    rest: &'a [u8],
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], OptionRefusal> {
        if self.rest.len() < n {
            return Err(OptionRefusal::invalid(format!("option data truncated in {what}")));
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Ok(head)
    }

    fn u16(&mut self, what: &str) -> Result<u16, OptionRefusal> {
        Ok(u16::from_be_bytes(self.take(2, what)?.try_into().expect("2 bytes")))
    }

    fn u32(&mut self, what: &str) -> Result<u32, OptionRefusal> {
        Ok(u32::from_be_bytes(self.take(4, what)?.try_into().expect("4 bytes")))
    }

    /// A u32 length followed by that many bytes of string.
    fn string(&mut self, what: &str) -> Result<String, OptionRefusal> {
        let len = self.u32(what)? as usize;
        if len > self.rest.len() {
            return Err(OptionRefusal::invalid(format!("{what} length exceeds the option data")));
        }
        if len > MAX_STRING_BYTES {
            return Err(OptionRefusal {
                reply_type: rep::ERR_TOO_BIG,
                message: format!("{what} longer than {MAX_STRING_BYTES} bytes"),
            });
        }
        parse_string(self.take(len, what)?, what)
    }
}

/// A protocol string: UTF-8, no NUL, at most 4096 bytes.
fn parse_string(bytes: &[u8], what: &str) -> Result<String, OptionRefusal> {
    if bytes.len() > MAX_STRING_BYTES {
        return Err(OptionRefusal {
            reply_type: rep::ERR_TOO_BIG,
            message: format!("{what} longer than {MAX_STRING_BYTES} bytes"),
        });
    }
    if bytes.contains(&0) {
        return Err(OptionRefusal::invalid(format!("{what} contains NUL")));
    }
    String::from_utf8(bytes.to_vec()).map_err(|_| OptionRefusal::invalid(format!("{what} is not UTF-8")))
}

fn parse_export_query(data: &[u8]) -> Result<ExportQuery, OptionRefusal> {
    let mut cursor = Cursor { rest: data };
    let name = cursor.string("export name")?;
    let count = cursor.u16("information request count")? as usize;
    if cursor.rest.len() != count * 2 {
        return Err(OptionRefusal::invalid("information request count does not match option length"));
    }
    let mut info_requests = Vec::with_capacity(count);
    for _ in 0..count {
        info_requests.push(cursor.u16("information request")?);
    }
    Ok(ExportQuery { name, info_requests })
}

fn parse_meta_context_query(data: &[u8]) -> Result<MetaContextQuery, OptionRefusal> {
    let mut cursor = Cursor { rest: data };
    let export_name = cursor.string("export name")?;
    let count = cursor.u32("query count")? as usize;
    // Each query needs at least its 4-byte length: reject impossible counts before allocating.
    if count > cursor.rest.len() / 4 {
        return Err(OptionRefusal::invalid("query count does not match option length"));
    }
    let mut queries = Vec::with_capacity(count);
    for _ in 0..count {
        queries.push(cursor.string("query")?);
    }
    if !cursor.rest.is_empty() {
        return Err(OptionRefusal::invalid("trailing bytes after the last query"));
    }
    Ok(MetaContextQuery { export_name, queries })
}

/// Appends one option reply (header + data) to `out`.
pub fn put_option_reply(out: &mut BytesMut, option: u32, reply_type: u32, data: &[u8]) {
    debug_assert!(data.len() <= u32::MAX as usize);
    out.reserve(OPTION_REPLY_HEADER_LEN + data.len());
    out.put_u64(OPTION_REPLY_MAGIC);
    out.put_u32(option);
    out.put_u32(reply_type);
    out.put_u32(data.len() as u32);
    out.put_slice(data);
}

/// Appends an error reply whose data is a human-readable message (clipped to the spec's
/// string limit on a character boundary).
pub fn put_option_error(out: &mut BytesMut, option: u32, reply_type: u32, message: &str) {
    debug_assert!(reply_type & (1 << 31) != 0, "not an error reply type");
    let mut end = message.len().min(MAX_STRING_BYTES);
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    put_option_reply(out, option, reply_type, &message.as_bytes()[..end]);
}

/// `NBD_REP_SERVER` data for LIST: name length, name, description.
pub fn server_reply_data(name: &str, description: &str) -> Vec<u8> {
    let mut data = Vec::with_capacity(4 + name.len() + description.len());
    data.extend_from_slice(&(name.len() as u32).to_be_bytes());
    data.extend_from_slice(name.as_bytes());
    data.extend_from_slice(description.as_bytes());
    data
}

/// `NBD_INFO_EXPORT` data: size and transmission flags.
pub fn info_export_data(size_bytes: u64, transmission_flags: u16) -> [u8; 12] {
    let mut data = [0u8; 12];
    data[..2].copy_from_slice(&info::EXPORT.to_be_bytes());
    data[2..10].copy_from_slice(&size_bytes.to_be_bytes());
    data[10..12].copy_from_slice(&transmission_flags.to_be_bytes());
    data
}

/// `NBD_INFO_NAME` or `NBD_INFO_DESCRIPTION` data: the type and the text.
pub fn info_text_data(info_type: u16, text: &str) -> Vec<u8> {
    debug_assert!(info_type == info::NAME || info_type == info::DESCRIPTION);
    let mut data = Vec::with_capacity(2 + text.len());
    data.extend_from_slice(&info_type.to_be_bytes());
    data.extend_from_slice(text.as_bytes());
    data
}

/// `NBD_INFO_BLOCK_SIZE` data: minimum, preferred, maximum payload.
pub fn info_block_size_data(min: u32, preferred: u32, max_payload: u32) -> [u8; 14] {
    let mut data = [0u8; 14];
    data[..2].copy_from_slice(&info::BLOCK_SIZE.to_be_bytes());
    data[2..6].copy_from_slice(&min.to_be_bytes());
    data[6..10].copy_from_slice(&preferred.to_be_bytes());
    data[10..14].copy_from_slice(&max_payload.to_be_bytes());
    data
}

/// `NBD_REP_META_CONTEXT` data: context id and name.
pub fn meta_context_reply_data(context_id: u32, name: &str) -> Vec<u8> {
    let mut data = Vec::with_capacity(4 + name.len());
    data.extend_from_slice(&context_id.to_be_bytes());
    data.extend_from_slice(name.as_bytes());
    data
}

/// The EXPORT_NAME success reply: size, flags and (unless NO_ZEROES) 124 zero bytes.
pub fn put_export_name_reply(out: &mut BytesMut, size_bytes: u64, transmission_flags: u16, no_zeroes: bool) {
    out.put_u64(size_bytes);
    out.put_u16(transmission_flags);
    if !no_zeroes {
        out.put_bytes(0, super::consts::EXPORT_NAME_PAD_BYTES);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn string_field(s: &str) -> Vec<u8> {
        let mut v = (s.len() as u32).to_be_bytes().to_vec();
        v.extend_from_slice(s.as_bytes());
        v
    }

    #[test]
    fn greeting_is_fixed_newstyle_with_no_zeroes() {
        let g = encode_greeting();
        assert_eq!(&g[..8], b"NBDMAGIC");
        assert_eq!(&g[8..16], b"IHAVEOPT");
        assert_eq!(&g[16..], &[0, 3]);
    }

    #[test]
    fn client_flags_reject_unknown_bits() {
        assert_eq!(decode_client_flags(&[0, 0, 0]).unwrap(), None);
        let f = decode_client_flags(&[0, 0, 0, 3]).unwrap().unwrap();
        assert!(f.fixed_newstyle && f.no_zeroes);
        assert!(decode_client_flags(&[0, 0, 0, 4]).is_err());
        assert!(decode_client_flags(&[0x80, 0, 0, 1]).is_err());
    }

    #[test]
    fn option_header_needs_magic() {
        let mut buf = IHAVEOPT.to_be_bytes().to_vec();
        buf.extend_from_slice(&7u32.to_be_bytes());
        assert_eq!(decode_option_header(&buf).unwrap(), None);
        buf.extend_from_slice(&9u32.to_be_bytes());
        assert_eq!(decode_option_header(&buf).unwrap(), Some(OptionHeader { code: 7, data_len: 9 }));
        buf[0] ^= 1;
        assert!(decode_option_header(&buf).is_err());
    }

    #[test]
    fn go_payload_parses_and_checks_count() {
        let mut data = string_field("disk");
        data.extend_from_slice(&2u16.to_be_bytes());
        data.extend_from_slice(&info::NAME.to_be_bytes());
        data.extend_from_slice(&info::BLOCK_SIZE.to_be_bytes());
        let parsed = parse_option(opt::GO, &data).unwrap();
        assert_eq!(
            parsed,
            ClientOption::Go(ExportQuery { name: "disk".into(), info_requests: vec![info::NAME, info::BLOCK_SIZE] })
        );
        data.push(0);
        assert_eq!(parse_option(opt::GO, &data).unwrap_err().reply_type, rep::ERR_INVALID);
        // Name length pointing past the end.
        let mut bad = 1000u32.to_be_bytes().to_vec();
        bad.extend_from_slice(b"ab\0\0");
        assert_eq!(parse_option(opt::INFO, &bad).unwrap_err().reply_type, rep::ERR_INVALID);
    }

    #[test]
    fn meta_context_payload_rejects_absurd_counts() {
        let mut data = string_field("");
        data.extend_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(parse_option(opt::SET_META_CONTEXT, &data).unwrap_err().reply_type, rep::ERR_INVALID);
        let mut ok = string_field("x");
        ok.extend_from_slice(&1u32.to_be_bytes());
        ok.extend_from_slice(&string_field("base:allocation"));
        assert_eq!(
            parse_option(opt::LIST_META_CONTEXT, &ok).unwrap(),
            ClientOption::ListMetaContext(MetaContextQuery {
                export_name: "x".into(),
                queries: vec!["base:allocation".into()]
            })
        );
    }

    #[test]
    fn strings_are_checked() {
        assert!(parse_option(opt::EXPORT_NAME, b"a\0b").is_err());
        assert!(parse_option(opt::EXPORT_NAME, &[0xff, 0xfe]).is_err());
        assert_eq!(parse_option(opt::EXPORT_NAME, &vec![b'a'; 5000]).unwrap_err().reply_type, rep::ERR_TOO_BIG);
        assert_eq!(parse_option(opt::EXPORT_NAME, b"").unwrap(), ClientOption::ExportName(String::new()));
    }

    #[test]
    fn no_data_options_refuse_data() {
        assert_eq!(parse_option(opt::LIST, b"x").unwrap_err().reply_type, rep::ERR_INVALID);
        assert_eq!(parse_option(opt::ABORT, b"x").unwrap(), ClientOption::Abort);
        assert_eq!(parse_option(0x7654321, b"xyz").unwrap(), ClientOption::Unknown(0x7654321));
    }

    #[test]
    fn option_error_message_is_clipped_on_char_boundary() {
        let mut out = BytesMut::new();
        let message = "é".repeat(3000);
        put_option_error(&mut out, 1, rep::ERR_INVALID, &message);
        let len = u32::from_be_bytes(out[16..20].try_into().unwrap()) as usize;
        assert!(len <= MAX_STRING_BYTES);
        assert!(std::str::from_utf8(&out[20..]).is_ok());
    }
}
