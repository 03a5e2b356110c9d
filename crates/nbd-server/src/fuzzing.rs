//! Entry points for the fuzz targets in `fuzz/` (not a supported API; hidden from docs).
//!
//! Each function takes arbitrary bytes, drives one decoder path exactly as the server does,
//! and asserts the invariants the rest of the server relies on. Any panic is a bug.
//!
//! - [`handshake`]: the real `negotiate` state machine over a scripted in-memory stream
//!   (client bytes = the input, delivered in input-chosen pieces), against two exports.
//! - [`requests`]: request header decoding, payload accounting and validation under
//!   input-chosen export limits; accepted requests must be in range, aligned and sized.
//! - [`read_replies`]: READ framing (simple, structured, DF) of input-chosen device
//!   chunks (data, zeroes, file ranges); the encoded reply must decode back to exactly the
//!   same bytes.
//! - [`extents`]: block status encoding invariants.

use std::fs::File;
use std::future::Future;
use std::os::unix::fs::FileExt;
use std::pin::{Pin, pin};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, Waker};

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_util::sync::CancellationToken;

use crate::config::Export;
use crate::device::{Extent, FileRange, ReadChunk};
use crate::handshake::{Policy, TlsState, negotiate};
use crate::memory_device::MemoryDevice;
use crate::protocol::consts::{
    MAX_PAYLOAD_BYTES, NBDMAGIC, OPTION_REPLY_MAGIC, cmd, cmd_flags, reply_flags, reply_type,
};
use crate::protocol::framing::{Framing, ReplyTo};
use crate::protocol::read_reply::read_reply;
use crate::protocol::reply::{decode_chunk_header, decode_extended_chunk_header, decode_simple_reply, encode_extents};
use crate::protocol::request::{ExportLimits, Request, decode_request_header, payload_len, validate_request};

/// Peer bytes from a slice, in pieces of at most `piece` bytes; writes are collected.
/// (Also the nbd-client fuzz target's server.)
pub struct ScriptedStream<'a> {
    input: &'a [u8],
    piece: usize,
    pub output: Vec<u8>,
}

impl<'a> ScriptedStream<'a> {
    pub fn new(input: &'a [u8], piece: usize) -> Self {
        Self { input, piece: piece.max(1), output: Vec::new() }
    }
}

impl AsyncRead for ScriptedStream<'_> {
    fn poll_read(mut self: Pin<&mut Self>, _: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let n = self.input.len().min(buf.remaining()).min(self.piece);
        let (head, tail) = self.input.split_at(n);
        buf.put_slice(head);
        self.input = tail;
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for ScriptedStream<'_> {
    fn poll_write(mut self: Pin<&mut Self>, _: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        // Bound what a single input can make the server write (replies are small).
        assert!(self.output.len() < 64 << 20, "handshake produced more than 64 MiB of replies");
        self.output.extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// Polls a future that never waits for anything external to completion.
pub fn run_to_completion<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    let mut cx = Context::from_waker(Waker::noop());
    for _ in 0..1_000_000 {
        if let Poll::Ready(output) = future.as_mut().poll(&mut cx) {
            return output;
        }
    }
    panic!("future stalled although all its input is available");
}

fn exports() -> &'static [Export] {
    static EXPORTS: OnceLock<Vec<Export>> = OnceLock::new();
    EXPORTS.get_or_init(|| {
        vec![
            Export::new("disk", Arc::new(MemoryDevice::new(1 << 20))).with_description("fuzz disk"),
            Export::new("ro", Arc::new(MemoryDevice::new(8192).read_only(true).block_sizes(4096, 3 << 16, 65536))),
        ]
    })
}

/// Runs the handshake on `input` (first byte: read piece size).
pub fn handshake(input: &[u8]) {
    let Some((&piece, client_bytes)) = input.split_first() else { return };
    let mut stream = ScriptedStream::new(client_bytes, usize::from(piece % 64) + 1);
    let mut buf = BytesMut::new();
    let shutdown = CancellationToken::new();
    // The piece byte's top bit picks a server that requires TLS, to reach those refusals too.
    let tls = TlsState::Offered { required: piece & 0x80 != 0 };
    let policy = Policy { exports: exports(), tls };
    let outcome = run_to_completion(negotiate(&mut stream, &mut buf, &policy, &shutdown));
    let out = &stream.output;
    assert!(out.len() >= 18 && out[..8] == NBDMAGIC.to_be_bytes(), "greeting first");
    // After the greeting: option replies, possibly ending with an EXPORT_NAME reply.
    let mut rest = &out[18..];
    while rest.len() >= 20 && rest[..8] == OPTION_REPLY_MAGIC.to_be_bytes() {
        let len = u32::from_be_bytes(rest[16..20].try_into().expect("4 bytes")) as usize;
        assert!(len <= 64 * 1024, "option reply of {len} bytes");
        assert!(rest.len() >= 20 + len, "truncated option reply");
        rest = &rest[20 + len..];
    }
    assert!(rest.is_empty() || rest.len() == 10 || rest.len() == 134, "stray bytes after option replies");
    if let Ok(crate::handshake::Outcome::Transmission(n)) = outcome {
        assert!(n.export_index < exports().len());
        assert!(n.meta_contexts == 0 || n.framing.structured());
    }
}

/// Decodes and validates a stream of requests (first 12 bytes: export limits).
pub fn requests(input: &[u8]) {
    let Some((config, mut rest)) = input.split_first_chunk::<12>() else { return };
    let limits = ExportLimits {
        size_bytes: u64::from_le_bytes(config[..8].try_into().expect("8 bytes")),
        transmission_flags: u16::from_le_bytes([config[8], config[9]]),
        framing: match config[10] & 1 | (config[10] >> 1) & 2 {
            0 => Framing::Simple,
            1 => Framing::Structured,
            _ => Framing::Extended,
        },
        meta_context_selected: config[10] & 2 != 0,
        min_block_bytes: 1 << (config[11] % 17),
        max_payload_bytes: MAX_PAYLOAD_BYTES,
    };
    while let Ok(Some(header)) = decode_request_header(rest, limits.framing) {
        rest = &rest[limits.framing.request_header_len()..];
        let Ok(payload) = payload_len(&header, limits.framing) else { break };
        assert!(payload <= MAX_PAYLOAD_BYTES);
        assert!(
            payload == 0
                || header.command == cmd::WRITE
                || (limits.framing.extended() && header.flags & cmd_flags::PAYLOAD_LEN != 0)
        );
        match validate_request(&header, &limits) {
            Ok(request) => check_accepted(&request, &header, &limits),
            Err(rejection) => assert_ne!(rejection.errno, 0),
        }
        rest = &rest[rest.len().min(payload as usize)..];
    }
}

fn check_accepted(request: &Request, header: &crate::protocol::request::RequestHeader, limits: &ExportLimits) {
    let (offset, len) = match *request {
        Request::Read { offset, len, .. } | Request::Write { offset, len, .. } => (offset, u64::from(len)),
        Request::Trim { offset, len, .. }
        | Request::Cache { offset, len }
        | Request::WriteZeroes { offset, len, .. }
        | Request::BlockStatus { offset, len, .. } => (offset, len),
        Request::Disc | Request::Flush => return,
    };
    assert_eq!((offset, len), (header.offset, header.length));
    let end = offset.checked_add(len).expect("accepted range must not wrap");
    assert!(end <= limits.size_bytes, "accepted range past the end");
    assert!(offset.is_multiple_of(u64::from(limits.min_block_bytes)), "accepted offset misaligned");
    if matches!(request, Request::Read { .. } | Request::Write { .. }) {
        assert!(len <= u64::from(limits.max_payload_bytes));
    }
    if matches!(request, Request::BlockStatus { .. }) {
        assert!(len > 0 && limits.framing.structured() && limits.meta_context_selected);
    }
    if matches!(request, Request::Write { .. } | Request::Trim { .. } | Request::WriteZeroes { .. }) {
        assert_eq!(limits.transmission_flags & crate::protocol::consts::tflags::READ_ONLY, 0);
    }
}

/// Frames input-chosen READ chunks and decodes the reply back.
pub fn read_replies(input: &[u8]) {
    let Some((&mode, rest)) = input.split_first() else { return };
    // mode % 3: simple, structured, DF; mode / 3 % 2 with a structured one: extended headers.
    let framing = match mode % 3 {
        0 => Framing::Simple,
        _ if mode / 3 % 2 == 1 => Framing::Extended,
        _ => Framing::Structured,
    };
    let df = mode % 3 == 2;
    // Chunks: a tag byte (by tag % 3: data, zeroes, a range of a file) and a 2-byte length.
    let mut chunks = Vec::new();
    let mut expected = Vec::new();
    for spec in rest.chunks_exact(3) {
        let n = usize::from(u16::from_le_bytes([spec[1], spec[2]]));
        match spec[0] % 3 {
            0 => {
                let data: Vec<u8> = (0..n).map(|i| ((i as u8) ^ spec[0]) | 1).collect();
                expected.extend_from_slice(&data);
                chunks.push(ReadChunk::Data(Bytes::from(data)));
            }
            1 => {
                expected.resize(expected.len() + n, 0);
                chunks.push(ReadChunk::Zero(n as u32));
            }
            _ => {
                let (file, content) = fuzz_file();
                let offset = usize::from(spec[0]) * 257;
                expected.extend_from_slice(&content[offset..offset + n]);
                chunks.push(ReadChunk::File(FileRange {
                    file: file.clone(),
                    offset: offset as u64,
                    len: n as u32,
                    mapping: None,
                }));
            }
        }
        if expected.len() > 1 << 20 {
            return;
        }
    }
    let offset = 1u64 << 40;
    let cookie = 0x1234_5678;
    let len = expected.len() as u32;
    let to = ReplyTo { framing, cookie, offset };
    let wire = read_reply(to, len, df, Ok(chunks)).to_vec();
    let got = match framing {
        Framing::Simple => {
            let header = decode_simple_reply(&wire).expect("simple reply");
            assert_eq!((header.error, header.cookie), (0, cookie));
            wire[16..].to_vec()
        }
        Framing::Structured | Framing::Extended => decode_structured_read(&wire, to, len, df),
    };
    assert!(got == expected, "READ reply does not decode to the device data");
}

/// An unlinked temporary file with known content, large enough for every file chunk.
fn fuzz_file() -> &'static (Arc<File>, Vec<u8>) {
    static FILE: OnceLock<(Arc<File>, Vec<u8>)> = OnceLock::new();
    FILE.get_or_init(|| {
        let content: Vec<u8> = (0..256 * 257 + 65536).map(|i| (i % 251) as u8 ^ 0x5a).collect();
        let path = std::env::temp_dir().join(format!("nbd-fuzz-{}.img", std::process::id()));
        let file = File::options().create(true).truncate(true).read(true).write(true).open(&path).expect("temp file");
        let _ = std::fs::remove_file(&path);
        file.write_all_at(&content, 0).expect("fill temp file");
        (Arc::new(file), content)
    })
}

/// Reassembles a structured READ reply, checking the spec's rules on the way.
fn decode_structured_read(wire: &[u8], to: ReplyTo, len: u32, df: bool) -> Vec<u8> {
    let (cookie, offset) = (to.cookie, to.offset);
    let mut data = vec![0u8; len as usize];
    let mut covered = 0u64;
    let mut content_chunks = 0;
    let mut at = 0;
    let header_len = to.framing.chunk_header_len();
    loop {
        let h = if to.framing.extended() {
            let (h, header_offset) = decode_extended_chunk_header(&wire[at..]).expect("extended chunk header");
            assert_eq!(header_offset, offset, "extended chunks repeat the request's offset");
            h
        } else {
            decode_chunk_header(&wire[at..]).expect("chunk header")
        };
        assert_eq!(h.cookie, cookie);
        let payload = &wire[at + header_len..at + header_len + h.payload_len as usize];
        match h.chunk_type {
            reply_type::NONE => assert!(payload.is_empty()),
            reply_type::OFFSET_DATA => {
                let start = u64::from_be_bytes(payload[..8].try_into().expect("8 bytes")) - offset;
                let bytes = &payload[8..];
                assert!(!bytes.is_empty());
                data[start as usize..start as usize + bytes.len()].copy_from_slice(bytes);
                covered += bytes.len() as u64;
                content_chunks += 1;
            }
            reply_type::OFFSET_HOLE => {
                assert!(!df, "holes are not allowed with DF");
                assert_eq!(payload.len(), 12);
                let hole = u32::from_be_bytes(payload[8..12].try_into().expect("4 bytes"));
                assert!(hole > 0);
                covered += u64::from(hole);
                content_chunks += 1;
            }
            other => panic!("unexpected chunk type {other}"),
        }
        at += header_len + h.payload_len as usize;
        if h.flags & reply_flags::DONE != 0 {
            break;
        }
    }
    assert_eq!(at, wire.len(), "bytes after the DONE chunk");
    assert_eq!(covered, u64::from(len), "content chunks must cover the read exactly");
    assert!(!df || content_chunks <= 1, "DF allows one content chunk");
    data
}

/// Block status encoding of input-chosen extents.
pub fn extents(input: &[u8]) {
    let Some((config, rest)) = input.split_first_chunk::<5>() else { return };
    let len = u32::from_le_bytes(config[..4].try_into().expect("4 bytes"));
    if len == 0 {
        return;
    }
    let req_one = config[4] & 1 != 0;
    let extents: Vec<Extent> = rest
        .chunks_exact(9)
        .map(|c| Extent {
            len_bytes: u64::from_le_bytes(c[..8].try_into().expect("8 bytes")),
            hole: c[8] & 1 != 0,
            zero: c[8] & 2 != 0,
        })
        .collect();
    let encoded = encode_extents(&extents, len.into(), req_one);
    assert!(!encoded.is_empty());
    assert!(encoded.iter().all(|&(l, _)| l > 0));
    assert!(encoded.iter().map(|&(l, _)| l).sum::<u64>() <= u64::from(len));
    assert!(!req_one || encoded.len() == 1);
    assert!(encoded.windows(2).all(|w| w[0].1 != w[1].1), "neighbours with equal flags are merged");
}

#[cfg(test)]
mod tests {
    /// Replays the committed fuzz corpus, so the entry points (and the corpus) stay healthy.
    #[test]
    fn fuzz_corpus_replays_cleanly() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus");
        type Target = (&'static str, fn(&[u8]));
        let targets: [Target; 3] = [
            ("handshake", super::handshake),
            ("request", |d| {
                super::requests(d);
                super::extents(d);
            }),
            ("read_reply", super::read_replies),
        ];
        for (name, run) in targets {
            let mut count = 0;
            for entry in std::fs::read_dir(root.join(name)).expect("corpus directory") {
                run(&std::fs::read(entry.unwrap().path()).unwrap());
                count += 1;
            }
            assert!(count > 0, "empty corpus for {name}");
        }
    }
}
