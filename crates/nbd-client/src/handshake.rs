//! The client's handshake: fixed newstyle, extended headers or structured replies and the
//! `base:allocation` meta context if the server has them, then GO with the block sizes asked
//! for. Every length the server sends is bounded before it is
//! read (an option reply over [`MAX_OPTION_REPLY_BYTES`] is a violation).

use bytes::BytesMut;
use nbd_server::protocol::client_codec::{
    ExportInfo, decode_greeting, decode_info, decode_meta_context_reply, decode_option_reply_header,
    encode_client_flags, go_option_data, meta_context_option_data, put_option,
};
use nbd_server::protocol::consts::{info, opt, rep, tflags};
use nbd_server::protocol::framing::Framing;
use nbd_server::protocol::handshake_codec::{ClientFlags, GREETING_LEN, OPTION_REPLY_HEADER_LEN};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::error::{ClientError, Result};

/// Longest option reply accepted (the spec caps strings at 4 KiB).
const MAX_OPTION_REPLY_BYTES: u32 = 64 * 1024;

/// The meta context asked for: holes and zeros.
const BASE_ALLOCATION: &str = "base:allocation";

/// META_CONTEXT replies accepted for the one context asked for (a server may not send more).
const MAX_META_CONTEXT_REPLIES: usize = 4;

/// What the server said about the export.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExportDetails {
    pub size_bytes: u64,
    pub transmission_flags: u16,
    /// 1 when the server sent no block sizes.
    pub min_block_bytes: u32,
    pub preferred_block_bytes: u32,
    /// The largest READ/WRITE payload (32 MiB, the spec's default, when not sent).
    pub max_payload_bytes: u32,
    /// How requests and replies are framed on the connection: extended headers where the
    /// server has them and they were wanted, else structured replies, else simple ones.
    pub framing: Framing,
    /// The id the server gave the `base:allocation` meta context, when it took it (asked for
    /// with structured replies): BLOCK_STATUS can then be sent.
    pub allocation_context: Option<u32>,
}

impl ExportDetails {
    pub fn read_only(&self) -> bool {
        self.transmission_flags & tflags::READ_ONLY != 0
    }
    pub fn can(&self, flag: u16) -> bool {
        self.transmission_flags & flag != 0
    }
    /// FLUSH is advertised (the server may cache writes).
    pub fn can_flush(&self) -> bool {
        self.can(tflags::SEND_FLUSH)
    }
    /// CAN_MULTI_CONN: several connections see one another's writes, and a FLUSH on any
    /// covers the writes completed on all.
    pub fn can_multi_conn(&self) -> bool {
        self.can(tflags::CAN_MULTI_CONN)
    }
    /// FUA is advertised (a write with it is durable when answered).
    pub fn can_fua(&self) -> bool {
        self.can(tflags::SEND_FUA)
    }
    pub fn can_write_zeroes(&self) -> bool {
        self.can(tflags::SEND_WRITE_ZEROES)
    }
}

/// Reads the greeting and sends the client flags; `address` names the server in errors.
pub(crate) async fn greet<S>(stream: &mut S, address: &str) -> Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let io = |source| ClientError::Io { address: address.to_string(), source };
    let protocol = |what: String| ClientError::Protocol { address: address.to_string(), what };
    let mut greeting = [0u8; GREETING_LEN];
    stream.read_exact(&mut greeting).await.map_err(io)?;
    let server = decode_greeting(&greeting).map_err(|e| protocol(e.to_string()))?.expect("whole greeting");
    if !server.fixed_newstyle {
        return Err(protocol("the server does not speak fixed newstyle".into()));
    }
    let flags = ClientFlags { fixed_newstyle: true, no_zeroes: server.no_zeroes };
    stream.write_all(&encode_client_flags(flags)).await.map_err(io)?;
    Ok(())
}

/// Asks for TLS (NBD_OPT_STARTTLS); on success the TLS handshake comes next.
pub(crate) async fn start_tls<S>(stream: &mut S, address: &str) -> Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let io = |source| ClientError::Io { address: address.to_string(), source };
    let mut out = BytesMut::new();
    put_option(&mut out, opt::STARTTLS, &[]);
    stream.write_all(&out).await.map_err(io)?;
    stream.flush().await.map_err(io)?;
    let (header, data) = option_reply(stream, address).await?;
    if header.option != opt::STARTTLS {
        return Err(ClientError::Protocol {
            address: address.to_string(),
            what: format!("reply to option {} where STARTTLS's was due", header.option),
        });
    }
    if header.reply_type != rep::ACK {
        return Err(ClientError::Refused {
            address: address.to_string(),
            option: "STARTTLS",
            reply_type: header.reply_type,
            message: String::from_utf8_lossy(&data).into_owned(),
        });
    }
    Ok(())
}

/// Negotiates `export` (after [`greet`], and TLS if asked) up to the framing `want`:
/// extended headers (asked for alone first: once they are on, STRUCTURED_REPLY must not be
/// sent), else structured replies, with the `base:allocation` context; simple replies only
/// for the kernel's driver, which speaks nothing else. Then GO.
pub(crate) async fn negotiate<S>(stream: &mut S, export: &str, address: &str, want: Framing) -> Result<ExportDetails>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let io = |source| ClientError::Io { address: address.to_string(), source };
    let protocol = |what: String| ClientError::Protocol { address: address.to_string(), what };
    let mut framing = Framing::Simple;
    if want.extended() {
        let mut out = BytesMut::new();
        put_option(&mut out, opt::EXTENDED_HEADERS, &[]);
        stream.write_all(&out).await.map_err(io)?;
        stream.flush().await.map_err(io)?;
        if acked(stream, address, opt::EXTENDED_HEADERS).await? {
            framing = Framing::Extended;
        }
    }
    let ask_structured = want.structured() && !framing.extended();
    let mut out = BytesMut::new();
    if ask_structured {
        put_option(&mut out, opt::STRUCTURED_REPLY, &[]);
    }
    if want.structured() {
        put_option(&mut out, opt::SET_META_CONTEXT, &meta_context_option_data(export, &[BASE_ALLOCATION]));
    }
    put_option(&mut out, opt::GO, &go_option_data(export, &[info::BLOCK_SIZE]));
    stream.write_all(&out).await.map_err(io)?;
    stream.flush().await.map_err(io)?;
    if ask_structured && acked(stream, address, opt::STRUCTURED_REPLY).await? {
        framing = Framing::Structured;
    }

    // SET_META_CONTEXT: the contexts the server took, then ACK; or an error (then none).
    let mut allocation_context = None;
    if want.structured() {
        for replies in 0.. {
            let (header, data) = option_reply(stream, address).await?;
            if header.option != opt::SET_META_CONTEXT {
                return Err(protocol(format!("reply to option {} where SET_META_CONTEXT's was due", header.option)));
            }
            match header.reply_type {
                rep::ACK => break,
                _ if header.is_error() => break,
                rep::META_CONTEXT if replies < MAX_META_CONTEXT_REPLIES => {
                    let (id, name) = decode_meta_context_reply(&data).map_err(|e| protocol(e.to_string()))?;
                    if name == BASE_ALLOCATION && framing.structured() {
                        allocation_context = Some(id);
                    }
                }
                other => return Err(protocol(format!("unexpected SET_META_CONTEXT reply type {other:#x}"))),
            }
        }
    }

    let mut size = None;
    let mut block = None;
    loop {
        let (header, data) = option_reply(stream, address).await?;
        if header.option != opt::GO {
            return Err(protocol(format!("reply to option {} where GO's was due", header.option)));
        }
        if header.is_error() {
            return Err(ClientError::Refused {
                address: address.to_string(),
                option: "GO",
                reply_type: header.reply_type,
                message: String::from_utf8_lossy(&data).into_owned(),
            });
        }
        match header.reply_type {
            rep::ACK => break,
            rep::INFO => match decode_info(&data).map_err(|e| protocol(e.to_string()))? {
                ExportInfo::Export { size_bytes, transmission_flags } => size = Some((size_bytes, transmission_flags)),
                ExportInfo::BlockSize { min_bytes, preferred_bytes, max_payload_bytes } => {
                    block = Some((min_bytes, preferred_bytes, max_payload_bytes))
                }
                _ => {}
            },
            other => return Err(protocol(format!("unexpected GO reply type {other:#x}"))),
        }
    }
    let Some((size_bytes, transmission_flags)) = size else {
        return Err(protocol("GO succeeded without NBD_INFO_EXPORT".into()));
    };
    let (min, preferred, max) = block.unwrap_or((1, 4096, 32 << 20));
    let valid =
        min.is_power_of_two() && min <= 64 * 1024 && preferred.is_power_of_two() && preferred >= min && max >= min;
    if !valid {
        return Err(protocol(format!("invalid block sizes {min}/{preferred}/{max}")));
    }
    Ok(ExportDetails {
        size_bytes,
        transmission_flags,
        min_block_bytes: min,
        preferred_block_bytes: preferred,
        max_payload_bytes: max,
        framing,
        allocation_context,
    })
}

/// The reply to an option that is answered with ACK or an error (STRUCTURED_REPLY,
/// EXTENDED_HEADERS): whether it was ACKed.
async fn acked<S: AsyncRead + Unpin>(stream: &mut S, address: &str, option: u32) -> Result<bool> {
    let protocol = |what: String| ClientError::Protocol { address: address.to_string(), what };
    let (header, data) = option_reply(stream, address).await?;
    if header.option != option {
        return Err(protocol(format!("reply to option {} where {option}'s was due", header.option)));
    }
    if header.reply_type != rep::ACK && !header.is_error() {
        return Err(protocol(format!("option {option} answered with {:#x} ({} bytes)", header.reply_type, data.len())));
    }
    Ok(header.reply_type == rep::ACK)
}

/// One option reply: header and (bounded) data.
async fn option_reply<S: AsyncRead + Unpin>(
    stream: &mut S,
    address: &str,
) -> Result<(nbd_server::protocol::client_codec::OptionReplyHeader, Vec<u8>)> {
    let io = |source| ClientError::Io { address: address.to_string(), source };
    let mut raw = [0u8; OPTION_REPLY_HEADER_LEN];
    stream.read_exact(&mut raw).await.map_err(io)?;
    let header = decode_option_reply_header(&raw)
        .map_err(|e| ClientError::Protocol { address: address.to_string(), what: e.to_string() })?
        .expect("whole header");
    if header.data_len > MAX_OPTION_REPLY_BYTES {
        return Err(ClientError::Protocol {
            address: address.to_string(),
            what: format!("option reply of {} bytes", header.data_len),
        });
    }
    let mut data = vec![0u8; header.data_len as usize];
    stream.read_exact(&mut data).await.map_err(io)?;
    Ok((header, data))
}
