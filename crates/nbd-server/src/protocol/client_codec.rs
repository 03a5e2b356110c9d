//! The client's side of the wire format: what an NBD client (the coming NBD member of a
//! network RAID, tests, tools) encodes and decodes, as pure functions next to the server's,
//! sharing the constants and header layouts.
//!
//! ```text
//!  handshake:    decode_greeting ─▶ encode_client_flags ─▶ put_option (STRUCTURED_REPLY,
//!                GO: go_option_data) ─▶ decode_option_reply_header + decode_info ... ACK
//!  transmission: encode_request (+ payload) ─▶ decode_simple_reply / decode_chunk_header /
//!                decode_extended_chunk_header (reply.rs) ─▶ decode_offset_data /
//!                decode_offset_hole / decode_error_chunk / decode_block_descriptor
//! ```
//!
//! Decoders follow the server's check-then-parse rules: `Ok(None)` when more bytes are
//! needed, `Err` for a violation, and they never panic on what a server sends.

use bytes::{BufMut, BytesMut};

use super::consts::{
    EXTENDED_REQUEST_MAGIC, IHAVEOPT, NBDMAGIC, OPTION_REPLY_MAGIC, REQUEST_MAGIC, client_flags, handshake_flags, info,
};
use super::framing::Framing;
use super::handshake_codec::{ClientFlags, GREETING_LEN, OPTION_REPLY_HEADER_LEN};
use super::request::{EXTENDED_REQUEST_HEADER_LEN, REQUEST_HEADER_LEN, RequestHeader};
use crate::error::{Error, Result};

/// What the server's greeting offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerHandshakeFlags {
    pub fixed_newstyle: bool,
    pub no_zeroes: bool,
}

/// Decodes the server greeting (NBDMAGIC, IHAVEOPT, handshake flags). Oldstyle servers (no
/// IHAVEOPT) are a violation here: only newstyle negotiation is spoken.
pub fn decode_greeting(buf: &[u8]) -> Result<Option<ServerHandshakeFlags>> {
    let Some(raw) = buf.first_chunk::<GREETING_LEN>() else { return Ok(None) };
    let magic = u64::from_be_bytes(raw[..8].try_into().expect("8 bytes"));
    let option_magic = u64::from_be_bytes(raw[8..16].try_into().expect("8 bytes"));
    if magic != NBDMAGIC || option_magic != IHAVEOPT {
        return Err(Error::protocol(format!("not a newstyle NBD server (magic {magic:#018x} {option_magic:#018x})")));
    }
    let flags = u16::from_be_bytes(raw[16..18].try_into().expect("2 bytes"));
    Ok(Some(ServerHandshakeFlags {
        fixed_newstyle: flags & handshake_flags::FIXED_NEWSTYLE != 0,
        no_zeroes: flags & handshake_flags::NO_ZEROES != 0,
    }))
}

/// The client's 32-bit flags field.
pub fn encode_client_flags(flags: ClientFlags) -> [u8; 4] {
    let mut bits = 0u32;
    if flags.fixed_newstyle {
        bits |= client_flags::FIXED_NEWSTYLE;
    }
    if flags.no_zeroes {
        bits |= client_flags::NO_ZEROES;
    }
    bits.to_be_bytes()
}

/// Appends one option request: IHAVEOPT, the option code, the data length and the data.
pub fn put_option(out: &mut BytesMut, code: u32, data: &[u8]) {
    let len = u32::try_from(data.len()).expect("option data fits the length field");
    out.reserve(16 + data.len());
    out.put_u64(IHAVEOPT);
    out.put_u32(code);
    out.put_u32(len);
    out.put_slice(data);
}

/// The data of NBD_OPT_GO / NBD_OPT_INFO: the export name and the information requested.
pub fn go_option_data(export_name: &str, info_requests: &[u16]) -> Vec<u8> {
    let mut data = Vec::with_capacity(6 + export_name.len() + 2 * info_requests.len());
    data.extend_from_slice(&(export_name.len() as u32).to_be_bytes());
    data.extend_from_slice(export_name.as_bytes());
    data.extend_from_slice(&(info_requests.len() as u16).to_be_bytes());
    for code in info_requests {
        data.extend_from_slice(&code.to_be_bytes());
    }
    data
}

/// The data of NBD_OPT_SET_META_CONTEXT / LIST_META_CONTEXT: the export name and the
/// context names asked for.
pub fn meta_context_option_data(export_name: &str, queries: &[&str]) -> Vec<u8> {
    let mut data = Vec::with_capacity(8 + export_name.len() + queries.iter().map(|q| 4 + q.len()).sum::<usize>());
    data.extend_from_slice(&(export_name.len() as u32).to_be_bytes());
    data.extend_from_slice(export_name.as_bytes());
    data.extend_from_slice(&(queries.len() as u32).to_be_bytes());
    for query in queries {
        data.extend_from_slice(&(query.len() as u32).to_be_bytes());
        data.extend_from_slice(query.as_bytes());
    }
    data
}

/// An NBD_REP_META_CONTEXT reply's data: (context id, context name).
pub fn decode_meta_context_reply(data: &[u8]) -> Result<(u32, String)> {
    let id = data.first_chunk::<4>().ok_or_else(|| Error::protocol("META_CONTEXT reply shorter than its id"))?;
    let name = std::str::from_utf8(&data[4..]).map_err(|_| Error::protocol("META_CONTEXT name is not UTF-8"))?;
    Ok((u32::from_be_bytes(*id), name.to_string()))
}

/// A decoded option reply header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionReplyHeader {
    pub option: u32,
    pub reply_type: u32,
    pub data_len: u32,
}

impl OptionReplyHeader {
    /// Error replies have bit 31 set.
    pub fn is_error(&self) -> bool {
        self.reply_type & (1 << 31) != 0
    }
}

/// Decodes an option reply header; a wrong magic is a violation.
pub fn decode_option_reply_header(buf: &[u8]) -> Result<Option<OptionReplyHeader>> {
    let Some(raw) = buf.first_chunk::<OPTION_REPLY_HEADER_LEN>() else { return Ok(None) };
    let magic = u64::from_be_bytes(raw[..8].try_into().expect("8 bytes"));
    if magic != OPTION_REPLY_MAGIC {
        return Err(Error::protocol(format!("bad option reply magic {magic:#018x}")));
    }
    Ok(Some(OptionReplyHeader {
        option: u32::from_be_bytes(raw[8..12].try_into().expect("4 bytes")),
        reply_type: u32::from_be_bytes(raw[12..16].try_into().expect("4 bytes")),
        data_len: u32::from_be_bytes(raw[16..20].try_into().expect("4 bytes")),
    }))
}

/// One NBD_REP_INFO item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExportInfo {
    Export {
        size_bytes: u64,
        transmission_flags: u16,
    },
    Name(String),
    Description(String),
    BlockSize {
        min_bytes: u32,
        preferred_bytes: u32,
        max_payload_bytes: u32,
    },
    /// An information type this side does not know (the spec says ignore it).
    Unknown(u16),
}

/// Decodes the data of an NBD_REP_INFO reply.
pub fn decode_info(data: &[u8]) -> Result<ExportInfo> {
    let bad = |what: &str| Error::protocol(format!("malformed NBD_REP_INFO ({what}, {} bytes)", data.len()));
    let Some(kind) = data.first_chunk::<2>().map(|k| u16::from_be_bytes(*k)) else { return Err(bad("no type")) };
    let body = &data[2..];
    let text = || String::from_utf8(body.to_vec()).map_err(|_| bad("text is not UTF-8"));
    Ok(match kind {
        info::EXPORT => {
            let raw = body.first_chunk::<10>().filter(|_| body.len() == 10).ok_or_else(|| bad("export"))?;
            ExportInfo::Export {
                size_bytes: u64::from_be_bytes(raw[..8].try_into().expect("8 bytes")),
                transmission_flags: u16::from_be_bytes(raw[8..10].try_into().expect("2 bytes")),
            }
        }
        info::NAME => ExportInfo::Name(text()?),
        info::DESCRIPTION => ExportInfo::Description(text()?),
        info::BLOCK_SIZE => {
            let raw = body.first_chunk::<12>().filter(|_| body.len() == 12).ok_or_else(|| bad("block size"))?;
            ExportInfo::BlockSize {
                min_bytes: u32::from_be_bytes(raw[..4].try_into().expect("4 bytes")),
                preferred_bytes: u32::from_be_bytes(raw[4..8].try_into().expect("4 bytes")),
                max_payload_bytes: u32::from_be_bytes(raw[8..12].try_into().expect("4 bytes")),
            }
        }
        other => ExportInfo::Unknown(other),
    })
}

/// A request header on the wire (compact form: the length must fit 32 bits).
pub fn encode_request_header(header: &RequestHeader) -> [u8; REQUEST_HEADER_LEN] {
    assert!(header.length <= u64::from(u32::MAX), "a compact request header's length is 32-bit");
    let mut out = [0u8; REQUEST_HEADER_LEN];
    out[..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
    out[4..6].copy_from_slice(&header.flags.to_be_bytes());
    out[6..8].copy_from_slice(&header.command.to_be_bytes());
    out[8..16].copy_from_slice(&header.cookie.to_be_bytes());
    out[16..24].copy_from_slice(&header.offset.to_be_bytes());
    out[24..28].copy_from_slice(&(header.length as u32).to_be_bytes());
    out
}

/// A request header as `framing` puts it on the wire: 28 bytes (compact; the length must
/// fit 32 bits) or 32 (extended headers: 64-bit length); the buffer and how much is used.
pub fn encode_request(header: &RequestHeader, framing: Framing) -> ([u8; EXTENDED_REQUEST_HEADER_LEN], usize) {
    let mut out = [0u8; EXTENDED_REQUEST_HEADER_LEN];
    if !framing.extended() {
        debug_assert!(header.length <= u64::from(u32::MAX), "compact requests are 32-bit");
        out[..REQUEST_HEADER_LEN].copy_from_slice(&encode_request_header(header));
        return (out, REQUEST_HEADER_LEN);
    }
    out[0..4].copy_from_slice(&EXTENDED_REQUEST_MAGIC.to_be_bytes());
    out[4..6].copy_from_slice(&header.flags.to_be_bytes());
    out[6..8].copy_from_slice(&header.command.to_be_bytes());
    out[8..16].copy_from_slice(&header.cookie.to_be_bytes());
    out[16..24].copy_from_slice(&header.offset.to_be_bytes());
    out[24..32].copy_from_slice(&header.length.to_be_bytes());
    (out, EXTENDED_REQUEST_HEADER_LEN)
}

/// The offset that starts an NBD_REPLY_TYPE_OFFSET_DATA chunk's payload (the data follows).
pub fn decode_offset_data(payload: &[u8]) -> Result<u64> {
    payload
        .first_chunk::<8>()
        .map(|o| u64::from_be_bytes(*o))
        .ok_or_else(|| Error::protocol("OFFSET_DATA chunk shorter than its offset"))
}

/// An NBD_REPLY_TYPE_OFFSET_HOLE chunk's payload: (offset, hole length).
pub fn decode_offset_hole(payload: &[u8]) -> Result<(u64, u32)> {
    let raw = payload
        .first_chunk::<12>()
        .filter(|_| payload.len() == 12)
        .ok_or_else(|| Error::protocol("OFFSET_HOLE chunk of the wrong size"))?;
    Ok((u64::from_be_bytes(raw[..8].try_into().expect("8 bytes")), u32::from_be_bytes(raw[8..].try_into().expect("4"))))
}

/// One descriptor of an NBD_REPLY_TYPE_BLOCK_STATUS chunk (after its 4-byte context id):
/// (length, status flags).
pub const BLOCK_DESCRIPTOR_LEN: usize = 8;
/// One descriptor of an NBD_REPLY_TYPE_BLOCK_STATUS_EXT chunk (after its context id and
/// descriptor count): 64-bit length and status.
pub const BLOCK_DESCRIPTOR_EXT_LEN: usize = 16;

/// Decodes one BLOCK_STATUS or BLOCK_STATUS_EXT descriptor (told apart by its length) into
/// (length, status); `None` for another length.
pub fn decode_block_descriptor(raw: &[u8]) -> Option<(u64, u64)> {
    match raw.len() {
        BLOCK_DESCRIPTOR_LEN => Some((
            u64::from(u32::from_be_bytes(raw[..4].try_into().ok()?)),
            u64::from(u32::from_be_bytes(raw[4..].try_into().ok()?)),
        )),
        BLOCK_DESCRIPTOR_EXT_LEN => {
            Some((u64::from_be_bytes(raw[..8].try_into().ok()?), u64::from_be_bytes(raw[8..].try_into().ok()?)))
        }
        _ => None,
    }
}

/// An error chunk's payload: (errno, message, offset for ERROR_OFFSET).
pub fn decode_error_chunk(payload: &[u8], with_offset: bool) -> Result<(u32, String, Option<u64>)> {
    let bad = || Error::protocol("malformed error chunk");
    let errno = u32::from_be_bytes(*payload.first_chunk::<4>().ok_or_else(bad)?);
    let message_len = usize::from(u16::from_be_bytes(*payload[4..].first_chunk::<2>().ok_or_else(bad)?));
    let message = payload.get(6..6 + message_len).ok_or_else(bad)?;
    let rest = &payload[6 + message_len..];
    let offset = match (with_offset, rest.first_chunk::<8>()) {
        (false, _) if rest.is_empty() => None,
        (true, Some(o)) if rest.len() == 8 => Some(u64::from_be_bytes(*o)),
        _ => return Err(bad()),
    };
    Ok((errno, String::from_utf8_lossy(message).into_owned(), offset))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::consts::{cmd, opt, rep, reply_type};
    use crate::protocol::handshake_codec::{
        ClientOption, decode_client_flags, decode_option_header, encode_greeting, info_block_size_data,
        info_export_data, info_text_data, parse_option, put_option_error, put_option_reply,
    };
    use crate::protocol::reply::{Reply, decode_chunk_header};
    use crate::protocol::request::decode_request_header;

    #[test]
    fn client_and_server_codecs_agree_on_the_handshake() {
        let greeting = decode_greeting(&encode_greeting()).unwrap().unwrap();
        assert!(greeting.fixed_newstyle && greeting.no_zeroes);
        assert_eq!(decode_greeting(&encode_greeting()[..10]).unwrap(), None);
        assert!(decode_greeting(&[0u8; GREETING_LEN]).is_err());

        let flags = ClientFlags { fixed_newstyle: true, no_zeroes: true };
        assert_eq!(decode_client_flags(&encode_client_flags(flags)).unwrap(), Some(flags));

        let mut out = BytesMut::new();
        put_option(&mut out, opt::GO, &go_option_data("disk", &[info::BLOCK_SIZE, info::NAME]));
        let header = decode_option_header(&out).unwrap().unwrap();
        assert_eq!(header.code, opt::GO);
        match parse_option(header.code, &out[16..16 + header.data_len as usize]).unwrap() {
            ClientOption::Go(q) => {
                assert_eq!(q.name, "disk");
                assert_eq!(q.info_requests, vec![info::BLOCK_SIZE, info::NAME]);
            }
            other => panic!("{other:?}"),
        }

        let mut replies = BytesMut::new();
        put_option_reply(&mut replies, opt::GO, rep::INFO, &info_export_data(1 << 30, 0x1ed));
        let h = decode_option_reply_header(&replies).unwrap().unwrap();
        assert_eq!((h.option, h.reply_type, h.is_error()), (opt::GO, rep::INFO, false));
        let data = &replies[OPTION_REPLY_HEADER_LEN..OPTION_REPLY_HEADER_LEN + h.data_len as usize];
        assert_eq!(decode_info(data).unwrap(), ExportInfo::Export { size_bytes: 1 << 30, transmission_flags: 0x1ed });
        assert_eq!(
            decode_info(&info_block_size_data(512, 65536, 32 << 20)).unwrap(),
            ExportInfo::BlockSize { min_bytes: 512, preferred_bytes: 65536, max_payload_bytes: 32 << 20 }
        );
        assert_eq!(decode_info(&info_text_data(info::NAME, "disk")).unwrap(), ExportInfo::Name("disk".into()));
        assert!(decode_info(&info_export_data(1, 1)[..11]).is_err(), "short export info");
        assert_eq!(decode_info(&[0, 77]).unwrap(), ExportInfo::Unknown(77));

        let mut err = BytesMut::new();
        put_option_error(&mut err, opt::GO, rep::ERR_UNKNOWN, "no such export");
        assert!(decode_option_reply_header(&err).unwrap().unwrap().is_error());
        assert!(decode_option_reply_header(&[0u8; OPTION_REPLY_HEADER_LEN]).is_err());
    }

    #[test]
    fn request_headers_round_trip() {
        let header =
            RequestHeader { flags: 1, command: cmd::WRITE, cookie: 0xdead_beef, offset: 1 << 40, length: 4096 };
        let wire = encode_request_header(&header);
        assert_eq!(decode_request_header(&wire, crate::protocol::framing::Framing::Structured).unwrap(), Some(header));
    }

    #[test]
    fn structured_reply_chunks_decode() {
        let mut reply = Reply::with_capacity(4);
        let to = crate::protocol::framing::ReplyTo {
            framing: crate::protocol::framing::Framing::Structured,
            cookie: 7,
            offset: 4096,
        };
        reply.push_offset_data_header(false, to, 4096, 512);
        reply.push_offset_hole(false, to, 8192, 1024);
        reply.push_error_chunk(to, 5, "media error", Some(12288));
        let wire = reply.to_vec();
        let data = decode_chunk_header(&wire).unwrap();
        assert_eq!((data.chunk_type, data.cookie, data.payload_len), (reply_type::OFFSET_DATA, 7, 8 + 512));
        assert_eq!(decode_offset_data(&wire[20..28]).unwrap(), 4096);
        let hole_at = 20 + 8; // the data itself is not part of `reply` (only its header)
        let hole = decode_chunk_header(&wire[hole_at..]).unwrap();
        assert_eq!(hole.chunk_type, reply_type::OFFSET_HOLE);
        assert_eq!(decode_offset_hole(&wire[hole_at + 20..hole_at + 32]).unwrap(), (8192, 1024));
        let error_at = hole_at + 32;
        let error = decode_chunk_header(&wire[error_at..]).unwrap();
        let payload = &wire[error_at + 20..error_at + 20 + error.payload_len as usize];
        assert_eq!(decode_error_chunk(payload, true).unwrap(), (5, "media error".to_string(), Some(12288)));
        assert!(decode_error_chunk(&payload[..5], true).is_err());
    }
}
