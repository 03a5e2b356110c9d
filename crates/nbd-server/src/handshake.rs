//! The handshake phase: greeting, client flags, option haggling, until transmission starts
//! (EXPORT_NAME or GO), TLS is to begin (STARTTLS), the client aborts, or something ends the
//! connection.
//!
//! TLS follows the spec's TLS section: STARTTLS is answered ACK, then the caller runs the TLS
//! handshake and calls [`haggle`] again on the TLS stream with fresh state: nothing negotiated
//! before STARTTLS (structured replies, meta contexts) survives it (nbdkit's CVE-2021-3716
//! was exactly that). Bytes the client sent after STARTTLS before the TLS handshake would be
//! plaintext smuggled past the upgrade: the connection is closed. With TLS required
//! (FORCEDTLS), every option before STARTTLS but ABORT is answered `ERR_TLS_REQD`, and
//! EXPORT_NAME closes the connection; an export that requires TLS on a server that only
//! offers it (SELECTIVETLS) is refused the same way. Once TLS is up, exports that name the
//! peers they allow refuse others with `ERR_POLICY`.
//!
//! Option data is capped at [`MAX_OPTION_DATA_BYTES`]; a longer option is refused with
//! `ERR_TOO_BIG` — skipped without buffering up to [`MAX_SKIPPED_OPTION_BYTES`], beyond that
//! answered at once and the connection closed (not read through). The caller bounds the whole
//! phase, TLS handshake included, with the handshake timeout.
//!
//! Behaviour per option (see `nbd-protocol.md` §1.4):
//!
//! | option | answer |
//! |---|---|
//! | EXPORT_NAME | size + flags (+124 zeroes unless NO_ZEROES); unknown or refused export ⇒ close |
//! | ABORT | ACK, then close |
//! | LIST | one SERVER per export, ACK |
//! | STARTTLS | ACK (TLS offered), ERR_POLICY (no TLS), ERR_INVALID (TLS already up) |
//! | INFO / GO | INFO(EXPORT, BLOCK_SIZE, NAME/DESCRIPTION if asked), ACK; unknown ⇒ ERR_UNKNOWN |
//! | STRUCTURED_REPLY | ACK once, ERR_INVALID when repeated, ERR_EXT_HEADER_REQD after EXTENDED_HEADERS |
//! | EXTENDED_HEADERS | ACK once (also after STRUCTURED_REPLY), ERR_INVALID when repeated or with data; EXPORT_NAME after it closes |
//! | LIST/SET_META_CONTEXT | `base:allocation` and the device's own (`BlockDevice::meta_contexts`); ERR_INVALID before STRUCTURED_REPLY or EXTENDED_HEADERS |
//! | unknown | ERR_UNSUP echoing the option |

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio_util::sync::CancellationToken;
use tracing::debug;

use crate::advertise::{Advertised, advertise_to};
use crate::config::Export;
use crate::error::{Error, Result};
use crate::protocol::consts::{
    BASE_ALLOCATION, BASE_ALLOCATION_ID, MAX_OPTION_DATA_BYTES, MAX_SKIPPED_OPTION_BYTES, info, opt, rep,
};
use crate::protocol::framing::Framing;
use crate::protocol::handshake_codec::{
    ClientFlags, ClientOption, ExportQuery, MetaContextQuery, OPTION_HEADER_LEN, decode_client_flags,
    decode_option_header, encode_greeting, info_block_size_data, info_export_data, info_text_data,
    meta_context_reply_data, parse_option, put_export_name_reply, put_option_error, put_option_reply,
    server_reply_data,
};
use crate::read_buffer::{discard, fill, fill_exact};
use crate::tls::PeerIdentity;

/// Meta contexts one export may offer (a bit each in the selected set).
const MAX_META_CONTEXTS: usize = 32;

/// The result of a successful negotiation.
#[derive(Debug)]
pub(crate) struct Negotiated {
    pub export_index: usize,
    pub advertised: Advertised,
    pub framing: Framing,
    /// The meta contexts selected for the export that was entered: bit `id - 1` for context
    /// id `id` (1: `base:allocation`, 2 + i: the device's `meta_contexts()[i]`).
    pub meta_contexts: u32,
}

/// How the handshake ended without an error.
#[derive(Debug)]
pub(crate) enum Outcome {
    Transmission(Negotiated),
    /// STARTTLS was acknowledged: the caller runs the TLS handshake, then [`haggle`] again.
    StartTls,
    /// ABORT, a clean close between options, or server shutdown.
    Closed,
}

/// Finds the export a client means; `""` is the export named `""`, else the first one.
pub(crate) fn find_export(exports: &[Export], name: &str) -> Option<usize> {
    exports.iter().position(|e| e.name == name).or(if name.is_empty() && !exports.is_empty() { Some(0) } else { None })
}

/// Where TLS stands on this connection.
#[derive(Debug, Clone, Copy)]
pub(crate) enum TlsState<'a> {
    /// The server has no TLS.
    Unavailable,
    /// TLS can be started; `required`: nothing but STARTTLS and ABORT is accepted before it.
    Offered { required: bool },
    /// TLS is up, with what it proved about the peer.
    Established(&'a PeerIdentity),
}

/// What the server offers and to whom.
#[derive(Clone, Copy)]
pub(crate) struct Policy<'a> {
    pub exports: &'a [Export],
    pub tls: TlsState<'a>,
}

impl Policy<'_> {
    /// Why export `index` is refused to this client now, if it is (reply type, message).
    fn refusal(&self, index: usize) -> Option<(u32, String)> {
        let export = &self.exports[index];
        match self.tls {
            TlsState::Unavailable => None,
            TlsState::Offered { required } => (required || export.tls_required)
                .then(|| (rep::ERR_TLS_REQD, format!("export {:?} requires TLS: send STARTTLS first", export.name))),
            TlsState::Established(peer) => (!export.tls_peers.is_empty()
                && !export.tls_peers.iter().any(|name| peer.is(name)))
            .then(|| (rep::ERR_POLICY, format!("export {:?} is not open to this client", export.name))),
        }
    }
}

/// Negotiation state that options change.
#[derive(Default)]
struct State {
    flags: ClientFlags,
    framing: Framing,
    /// The export for which meta contexts are selected, and which (see
    /// [`Negotiated::meta_contexts`]).
    meta_contexts: Option<(usize, u32)>,
}

/// Runs the handshake on `stream` from the greeting on. Bytes the client sent after the
/// final option stay in `buf` for the transmission phase.
pub(crate) async fn negotiate<S>(
    stream: &mut S,
    buf: &mut BytesMut,
    policy: &Policy<'_>,
    shutdown: &CancellationToken,
) -> Result<Outcome>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    match greet(stream, buf).await? {
        Some(flags) => haggle(stream, buf, flags, policy, shutdown).await,
        None => Ok(Outcome::Closed),
    }
}

/// Sends the greeting and reads the client's flags (`None`: the client closed).
pub(crate) async fn greet<S>(stream: &mut S, buf: &mut BytesMut) -> Result<Option<ClientFlags>>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    stream.write_all(&encode_greeting()).await?;
    stream.flush().await?;
    if !fill(stream, buf, 4).await? {
        return Ok(None);
    }
    let flags = decode_client_flags(buf)?.expect("4 bytes buffered");
    buf.advance(4);
    debug!(fixed_newstyle = flags.fixed_newstyle, no_zeroes = flags.no_zeroes, "client flags");
    Ok(Some(flags))
}

/// Option haggling, from a fresh state (the start, or just after the TLS handshake).
pub(crate) async fn haggle<S>(
    stream: &mut S,
    buf: &mut BytesMut,
    flags: ClientFlags,
    policy: &Policy<'_>,
    shutdown: &CancellationToken,
) -> Result<Outcome>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut state = State { flags, ..State::default() };
    let mut out = BytesMut::with_capacity(4096);
    loop {
        let more = tokio::select! {
            biased;
            _ = shutdown.cancelled(), if buf.is_empty() => return Ok(Outcome::Closed),
            more = fill(stream, buf, OPTION_HEADER_LEN) => more?,
        };
        if !more {
            return Ok(Outcome::Closed);
        }
        let header = decode_option_header(buf)?.expect("header buffered");
        buf.advance(OPTION_HEADER_LEN);
        debug!(option = header.code, data_len = header.data_len, "option");

        if !state.flags.fixed_newstyle && header.code != opt::EXPORT_NAME {
            return Err(Error::protocol("non-fixed-newstyle client sent an option other than EXPORT_NAME"));
        }
        out.clear();
        if header.data_len > MAX_OPTION_DATA_BYTES {
            if header.code == opt::EXPORT_NAME {
                return Err(Error::protocol("EXPORT_NAME longer than any export name"));
            }
            put_option_error(&mut out, header.code, rep::ERR_TOO_BIG, "option data too long");
            if header.data_len > MAX_SKIPPED_OPTION_BYTES {
                // Not read through (a 2 GiB option would hold the connection until the
                // handshake timeout): answered at once, then the connection is closed, since
                // the stream cannot be resynchronised without reading it.
                stream.write_all(&out).await?;
                return Err(Error::protocol(format!(
                    "option {} declares {} bytes of data; closing",
                    header.code, header.data_len
                )));
            }
            discard(stream, buf, u64::from(header.data_len)).await?;
            stream.write_all(&out).await?;
            continue;
        }
        let data_len = header.data_len as usize;
        fill_exact(stream, buf, data_len).await?;
        let data = buf.split_to(data_len);

        if shutdown.is_cancelled() && header.code != opt::ABORT {
            if header.code == opt::EXPORT_NAME {
                return Ok(Outcome::Closed);
            }
            put_option_error(&mut out, header.code, rep::ERR_SHUTDOWN, "server is shutting down");
            stream.write_all(&out).await?;
            continue;
        }

        if matches!(policy.tls, TlsState::Offered { required: true })
            && header.code != opt::ABORT
            && header.code != opt::STARTTLS
        {
            if header.code == opt::EXPORT_NAME {
                return Err(Error::protocol("EXPORT_NAME before STARTTLS on a server that requires TLS"));
            }
            put_option_error(&mut out, header.code, rep::ERR_TLS_REQD, "TLS is required: send STARTTLS first");
            stream.write_all(&out).await?;
            continue;
        }

        let option = match parse_option(header.code, &data) {
            Ok(option) => option,
            Err(refusal) => {
                if header.code == opt::EXPORT_NAME {
                    return Err(Error::protocol(format!("unusable EXPORT_NAME: {}", refusal.message)));
                }
                if header.code == opt::SET_META_CONTEXT {
                    state.meta_contexts = None;
                }
                put_option_error(&mut out, header.code, refusal.reply_type, &refusal.message);
                stream.write_all(&out).await?;
                continue;
            }
        };

        let step = handle_option(header.code, option, &mut state, policy, &mut out)?;
        stream.write_all(&out).await?;
        match step {
            Step::Continue => {}
            Step::StartTls => {
                stream.flush().await?;
                if !buf.is_empty() {
                    return Err(Error::protocol("data after STARTTLS before the TLS handshake"));
                }
                return Ok(Outcome::StartTls);
            }
            Step::Close => {
                stream.flush().await?;
                return Ok(Outcome::Closed);
            }
            Step::Transmission(negotiated) => {
                stream.flush().await?;
                return Ok(Outcome::Transmission(negotiated));
            }
        }
    }
}

enum Step {
    Continue,
    StartTls,
    Close,
    Transmission(Negotiated),
}

/// Answers one parsed option into `out`.
fn handle_option(
    code: u32,
    option: ClientOption,
    state: &mut State,
    policy: &Policy<'_>,
    out: &mut BytesMut,
) -> Result<Step> {
    let exports = policy.exports;
    match option {
        ClientOption::ExportName(name) => {
            if state.framing.extended() {
                // EXPORT_NAME has no error reply: the spec's answer is to close.
                return Err(Error::protocol("EXPORT_NAME after negotiating extended headers (use GO)"));
            }
            let Some(index) = find_export(exports, &name) else { return Err(Error::UnknownExport(name)) };
            if let Some((_, why)) = policy.refusal(index) {
                return Err(Error::protocol(format!("EXPORT_NAME refused: {why}")));
            }
            let negotiated = enter(index, state, exports, false);
            let a = &negotiated.advertised;
            put_export_name_reply(out, a.size_bytes, a.transmission_flags, state.flags.no_zeroes);
            Ok(Step::Transmission(negotiated))
        }
        ClientOption::Abort => {
            put_option_reply(out, code, rep::ACK, &[]);
            Ok(Step::Close)
        }
        ClientOption::List => {
            for export in exports {
                put_option_reply(
                    out,
                    code,
                    rep::SERVER,
                    &server_reply_data(&export.name, &export.effective_description()),
                );
            }
            put_option_reply(out, code, rep::ACK, &[]);
            Ok(Step::Continue)
        }
        ClientOption::StartTls => match policy.tls {
            TlsState::Unavailable => {
                put_option_error(out, code, rep::ERR_POLICY, "TLS is not configured on this server");
                Ok(Step::Continue)
            }
            TlsState::Established(_) => {
                put_option_error(out, code, rep::ERR_INVALID, "TLS is already established");
                Ok(Step::Continue)
            }
            TlsState::Offered { .. } => {
                put_option_reply(out, code, rep::ACK, &[]);
                Ok(Step::StartTls)
            }
        },
        ClientOption::Info(query) => {
            answer_info(code, &query, state, policy, out);
            Ok(Step::Continue)
        }
        ClientOption::Go(query) => match answer_info(code, &query, state, policy, out) {
            Some(index) => {
                let asked = query.info_requests.contains(&info::BLOCK_SIZE);
                Ok(Step::Transmission(enter(index, state, exports, asked)))
            }
            None => Ok(Step::Continue),
        },
        ClientOption::StructuredReply => {
            match state.framing {
                Framing::Extended => put_option_error(
                    out,
                    code,
                    rep::ERR_EXT_HEADER_REQD,
                    "extended headers are negotiated (they imply structured replies)",
                ),
                Framing::Structured => {
                    put_option_error(out, code, rep::ERR_INVALID, "structured replies already negotiated")
                }
                Framing::Simple => {
                    state.framing = Framing::Structured;
                    put_option_reply(out, code, rep::ACK, &[]);
                }
            }
            Ok(Step::Continue)
        }
        ClientOption::ListMetaContext(query) => {
            answer_meta_context(code, &query, false, state, exports, out);
            Ok(Step::Continue)
        }
        ClientOption::SetMetaContext(query) => {
            answer_meta_context(code, &query, true, state, exports, out);
            Ok(Step::Continue)
        }
        ClientOption::ExtendedHeaders => {
            if state.framing.extended() {
                put_option_error(out, code, rep::ERR_INVALID, "extended headers already negotiated");
            } else {
                state.framing = Framing::Extended;
                put_option_reply(out, code, rep::ACK, &[]);
            }
            Ok(Step::Continue)
        }
        ClientOption::Unknown(code) => {
            put_option_error(out, code, rep::ERR_UNSUP, "unknown option");
            Ok(Step::Continue)
        }
    }
}

/// The negotiation result for entering export `index`; `block_sizes_asked`: the client
/// asked for NBD_INFO_BLOCK_SIZE (and so keeps to it).
fn enter(index: usize, state: &State, exports: &[Export], block_sizes_asked: bool) -> Negotiated {
    let info = exports[index].device.info();
    Negotiated {
        export_index: index,
        advertised: advertise_to(&info, state.framing.structured(), block_sizes_asked),
        framing: state.framing,
        meta_contexts: match state.meta_contexts {
            Some((export, mask)) if state.framing.structured() && export == index => mask,
            _ => 0,
        },
    }
}

/// Answers INFO or GO; returns the export index on success (ACK sent).
fn answer_info(
    code: u32,
    query: &ExportQuery,
    state: &State,
    policy: &Policy<'_>,
    out: &mut BytesMut,
) -> Option<usize> {
    let exports = policy.exports;
    let Some(index) = find_export(exports, &query.name) else {
        put_option_error(out, code, rep::ERR_UNKNOWN, &format!("no export named {:?}", query.name));
        return None;
    };
    if let Some((reply_type, why)) = policy.refusal(index) {
        put_option_error(out, code, reply_type, &why);
        return None;
    }
    let export = &exports[index];
    let asked = query.info_requests.contains(&info::BLOCK_SIZE);
    let a = advertise_to(&export.device.info(), state.framing.structured(), asked);
    put_option_reply(out, code, rep::INFO, &info_export_data(a.size_bytes, a.transmission_flags));
    // Block sizes are sent unasked (a client that did not ask is not bound by them), with
    // the minimum this client will get (1 on a byte-granular device).
    put_option_reply(
        out,
        code,
        rep::INFO,
        &info_block_size_data(a.min_block_bytes, a.preferred_block_bytes, a.max_payload_bytes),
    );
    if query.info_requests.contains(&info::NAME) {
        put_option_reply(out, code, rep::INFO, &info_text_data(info::NAME, &export.name));
    }
    if query.info_requests.contains(&info::DESCRIPTION) {
        let description = export.effective_description();
        put_option_reply(out, code, rep::INFO, &info_text_data(info::DESCRIPTION, &description));
    }
    put_option_reply(out, code, rep::ACK, &[]);
    Some(index)
}

/// Answers LIST_META_CONTEXT (`select = false`) or SET_META_CONTEXT (`select = true`) with
/// the export's contexts: `base:allocation` (id 1) and the device's own (ids 2...). SET selects
/// the names asked for exactly; LIST also answers a bare namespace ("raidnbd:") with all of
/// its contexts, and an empty query with every context.
fn answer_meta_context(
    code: u32,
    query: &MetaContextQuery,
    select: bool,
    state: &mut State,
    exports: &[Export],
    out: &mut BytesMut,
) {
    if select {
        // SET replaces the active set even when it fails.
        state.meta_contexts = None;
    }
    if !state.framing.structured() {
        put_option_error(out, code, rep::ERR_INVALID, "negotiate structured replies or extended headers first");
        return;
    }
    let Some(index) = find_export(exports, &query.export_name) else {
        put_option_error(out, code, rep::ERR_UNKNOWN, &format!("no export named {:?}", query.export_name));
        return;
    };
    if let Some(bad) = query.queries.iter().find(|q| !q.contains(':')) {
        put_option_error(out, code, rep::ERR_INVALID, &format!("query {bad:?} has no namespace"));
        return;
    }
    let own = exports[index].device.meta_contexts();
    let contexts = std::iter::once(BASE_ALLOCATION).chain(own.iter().copied()).take(MAX_META_CONTEXTS);
    let mut mask = 0u32;
    for (i, name) in contexts.enumerate() {
        let asked =
            query.queries.iter().any(|q| q == name || (!select && q.ends_with(':') && name.starts_with(q.as_str())));
        if asked || (!select && query.queries.is_empty()) {
            let id = BASE_ALLOCATION_ID + i as u32;
            put_option_reply(out, code, rep::META_CONTEXT, &meta_context_reply_data(if select { id } else { 0 }, name));
            mask |= 1 << i;
        }
    }
    if select && mask != 0 {
        state.meta_contexts = Some((index, mask));
    }
    put_option_reply(out, code, rep::ACK, &[]);
}
