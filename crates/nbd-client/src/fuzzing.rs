//! Entry point for the fuzz target in `fuzz/` (not a supported API; hidden from docs).
//!
//! [`replies`] runs the real reply reader over arbitrary server bytes, delivered in
//! input-chosen pieces, with up to four requests in flight whose commands, offsets and
//! lengths the input chooses, and asserts what the rest of the client relies on: no panic,
//! every request answered (or failed when the stream ends), a READ's data exactly its length,
//! and a violation ending the connection for every request still waiting.

use nbd_server::fuzzing::{ScriptedStream, run_to_completion};
use nbd_server::protocol::framing::Framing;
use tokio::sync::oneshot;

use crate::error::ClientError;
use crate::replies::{Ended, reply_loop};
use crate::shared::{Closed, Shared};
use crate::waiter::{Answer, Expect, ReplyResult, Waiter};

/// The meta context id the scripted BLOCK_STATUS requests were negotiated with.
const FUZZ_CONTEXT: u32 = 1;

/// One request of the input: command and high-offset flag, offset / 512 (4 bytes), length /
/// 512 (2 bytes), one spare byte.
const REQUEST_BYTES: usize = 8;

/// Runs the reply reader on `input`: byte 0 (request count: 2 bits; structured replies, and
/// with them extended headers: 1 bit each; piece size: 4 bits), then the requests, then the
/// server's bytes.
pub fn replies(input: &[u8]) {
    let Some((&config, rest)) = input.split_first() else { return };
    let count = usize::from(config >> 6) + 1;
    let framing = match (config & 0x20 != 0, config & 0x10 != 0) {
        (false, _) => Framing::Simple,
        (true, false) => Framing::Structured,
        (true, true) => Framing::Extended,
    };
    let piece = usize::from(config & 0x0f) + 1;
    let Some(requests) = rest.get(..count * REQUEST_BYTES) else { return };
    let stream = &rest[count * REQUEST_BYTES..];

    let shared = Shared::new("fuzz".into());
    let mut waiting = Vec::new();
    for (i, raw) in requests.chunks_exact(REQUEST_BYTES).enumerate() {
        let command = ["READ", "WRITE", "FLUSH", "BLOCK_STATUS"][usize::from(raw[0] & 3)];
        // Offsets near 2^64 too, so wrapping arithmetic would show.
        let high = if raw[0] & 0x80 != 0 { u64::MAX - (1 << 40) } else { 0 };
        let offset = high + u64::from(u32::from_be_bytes(raw[1..5].try_into().expect("4 bytes"))) * 512;
        let len = u32::from(u16::from_be_bytes([raw[5], raw[6]]) % 129) * 512;
        let (tx, rx) = oneshot::channel::<ReplyResult>();
        let cookie = i as u64 + 1;
        let expect = match command {
            "READ" => Expect::Data,
            "BLOCK_STATUS" => Expect::Status(FUZZ_CONTEXT),
            _ => Expect::Nothing,
        };
        shared.lock().by_cookie.insert(cookie, Waiter::new(command, offset, len, expect, tx, None, None));
        waiting.push((command, len, rx));
    }

    let mut reader = ScriptedStream::new(stream, piece);
    let ended = run_to_completion(reply_loop(&mut reader, &shared, framing));
    let closed = match ended {
        Ok(()) => Closed::lost("end of input"),
        Err(Ended::Io(e)) => Closed::lost(e.to_string()),
        Err(Ended::Violation(what)) => Closed::violation(what),
    };
    let violation = closed.is_violation();
    shared.close(closed);
    assert!(shared.lock().by_cookie.is_empty(), "the close fails every request still waiting");

    for (command, len, mut rx) in waiting {
        let result = rx.try_recv().expect("every request is answered or failed");
        match result {
            Ok(Answer::Data(data)) => {
                assert_eq!(command, "READ", "only READs answer with data");
                assert_eq!(data.bytes().len(), len as usize, "a READ's data is its length");
            }
            Ok(Answer::Status(extents)) => {
                assert_eq!(command, "BLOCK_STATUS", "only BLOCK_STATUS answers with extents");
                let covered: u64 = extents.iter().map(|&(n, _)| u64::from(n)).sum();
                assert!(!extents.is_empty() && extents.iter().all(|&(n, _)| n > 0), "non-empty extents");
                assert!(covered <= u64::from(len), "extents stay inside the request");
            }
            Ok(Answer::Done) => assert!(command != "READ" && command != "BLOCK_STATUS", "{command} answers with more"),
            Err(ClientError::Protocol { .. }) => assert!(violation, "a Protocol error only after a violation"),
            Err(ClientError::ConnectionLost { .. } | ClientError::Errno { .. }) => {}
            Err(other) => panic!("unexpected error {other}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use bytes::BufMut;
    use nbd_server::protocol::consts::{STRUCTURED_REPLY_MAGIC, reply_flags, reply_type};
    use rand::{Rng, SeedableRng};

    use super::*;

    /// A READ's reply as a server may send it: the request cut into data and hole chunks,
    /// sent in a random order; returns the stream, the bytes the READ must return, and the
    /// positions of every header byte (magic, flags, type, cookie, length, offset).
    fn valid_reply(rng: &mut impl Rng, offset: u64, len: u32) -> (Vec<u8>, Vec<u8>, Vec<usize>) {
        let mut cuts = vec![0, len];
        for _ in 0..rng.random_range(0..6) {
            cuts.push(rng.random_range(0..len / 512) * 512);
        }
        cuts.sort_unstable();
        cuts.dedup();
        let mut pieces: Vec<(u32, u32, bool)> = cuts.windows(2).map(|w| (w[0], w[1] - w[0], rng.random())).collect();
        for i in (1..pieces.len()).rev() {
            pieces.swap(i, rng.random_range(0..=i));
        }
        let mut expected = vec![0u8; len as usize];
        let (mut stream, mut header_bytes) = (Vec::new(), Vec::new());
        for (i, &(at, n, is_data)) in pieces.iter().enumerate() {
            let done = if i + 1 == pieces.len() { reply_flags::DONE } else { 0 };
            let (kind, payload_len) =
                if is_data { (reply_type::OFFSET_DATA, 8 + n) } else { (reply_type::OFFSET_HOLE, 12) };
            header_bytes.extend(stream.len()..stream.len() + 20 + if is_data { 8 } else { 12 });
            stream.put_u32(STRUCTURED_REPLY_MAGIC);
            stream.put_u16(done);
            stream.put_u16(kind);
            stream.put_u64(1);
            stream.put_u32(payload_len);
            stream.put_u64(offset + u64::from(at));
            if is_data {
                let data: Vec<u8> = (0..n).map(|_| rng.random()).collect();
                expected[at as usize..(at + n) as usize].copy_from_slice(&data);
                stream.extend_from_slice(&data);
            } else {
                stream.put_u32(n);
            }
        }
        (stream, expected, header_bytes)
    }

    /// One READ at `offset`+`len` answered by `stream`.
    fn read_through(offset: u64, len: u32, stream: &[u8], piece: usize) -> ReplyResult {
        let shared = Shared::new("test".into());
        let (tx, mut rx) = oneshot::channel();
        shared.lock().by_cookie.insert(1, Waiter::new("READ", offset, len, Expect::Data, tx, None, None));
        let mut reader = ScriptedStream::new(stream, piece);
        let closed = match run_to_completion(reply_loop(&mut reader, &shared, Framing::Structured)) {
            Err(Ended::Violation(what)) => Closed::violation(what),
            _ => Closed::lost("end of stream"),
        };
        shared.close(closed);
        rx.try_recv().expect("answered or failed")
    }

    /// Never a wrong byte: a valid reply in any chunking and order reads back exactly, and
    /// the same reply with any one header byte changed reads back exactly or fails.
    #[test]
    fn a_read_returns_exactly_what_was_sent_or_fails() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(33);
        let (mut exact, mut failed) = (0, 0);
        for round in 0..400 {
            let len = rng.random_range(1..=64u32) * 512;
            let offset = if round % 4 == 0 {
                u64::MAX - u64::from(len) - rng.random_range(0..4) * 512
            } else {
                rng.random_range(0..1u64 << 40) * 512
            };
            let (stream, expected, header_bytes) = valid_reply(&mut rng, offset, len);
            let piece = rng.random_range(1..64);
            assert_eq!(
                read_through(offset, len, &stream, piece).unwrap(),
                Answer::Data(Box::new(expected.clone())),
                "round {round}"
            );
            for _ in 0..20 {
                let mut broken = stream.clone();
                let at = header_bytes[rng.random_range(0..header_bytes.len())];
                broken[at] ^= 1 << rng.random_range(0..8);
                match read_through(offset, len, &broken, piece) {
                    Ok(data) => {
                        assert_eq!(data, Answer::Data(Box::new(expected.clone())), "round {round}: byte {at} changed");
                        exact += 1;
                    }
                    Err(_) => failed += 1,
                }
            }
        }
        assert!(failed > exact, "most header changes are caught: {failed} failed, {exact} exact");
    }

    /// One BLOCK_STATUS (context 7) at 4096+8192 answered by `stream` on a connection of
    /// `framing`.
    fn status_through(framing: Framing, stream: &[u8]) -> ReplyResult {
        let shared = Shared::new("test".into());
        let (tx, mut rx) = oneshot::channel();
        shared.lock().by_cookie.insert(1, Waiter::new("BLOCK_STATUS", 4096, 8192, Expect::Status(7), tx, None, None));
        let mut reader = ScriptedStream::new(stream, 5);
        let closed = match run_to_completion(reply_loop(&mut reader, &shared, framing)) {
            Err(Ended::Violation(what)) => Closed::violation(what),
            _ => Closed::lost("end of stream"),
        };
        shared.close(closed);
        rx.try_recv().expect("answered or failed")
    }

    /// A BLOCK_STATUS chunk (DONE) for cookie 1 with `context` and `extents`.
    fn status_chunk(context: u32, extents: &[(u32, u32)]) -> Vec<u8> {
        let mut stream = Vec::new();
        stream.put_u32(STRUCTURED_REPLY_MAGIC);
        stream.put_u16(reply_flags::DONE);
        stream.put_u16(reply_type::BLOCK_STATUS);
        stream.put_u64(1);
        stream.put_u32(4 + 8 * extents.len() as u32);
        stream.put_u32(context);
        for &(n, flags) in extents {
            stream.put_u32(n);
            stream.put_u32(flags);
        }
        stream
    }

    /// A BLOCK_STATUS_EXT chunk (DONE) for cookie 1, offset `offset`, with extended headers.
    fn status_chunk_ext(offset: u64, context: u32, extents: &[(u64, u64)]) -> Vec<u8> {
        let mut stream = Vec::new();
        stream.put_u32(nbd_server::protocol::consts::EXTENDED_REPLY_MAGIC);
        stream.put_u16(reply_flags::DONE);
        stream.put_u16(reply_type::BLOCK_STATUS_EXT);
        stream.put_u64(1);
        stream.put_u64(offset);
        stream.put_u64(8 + 16 * extents.len() as u64);
        stream.put_u32(context);
        stream.put_u32(extents.len() as u32);
        for &(n, flags) in extents {
            stream.put_u64(n);
            stream.put_u64(flags);
        }
        stream
    }

    #[test]
    fn extended_block_status_is_checked_like_the_compact_one() {
        let run = |stream: &[u8]| status_through(Framing::Extended, stream);
        let answer = run(&status_chunk_ext(4096, 7, &[(1 << 40, 3)])).unwrap();
        assert_eq!(answer, Answer::Status(vec![(8192, 3)]), "a 64-bit extent clipped to the request");
        for (stream, what) in [
            (status_chunk_ext(0, 7, &[(4096, 3)]), "another offset in the header"),
            (status_chunk_ext(4096, 7, &[(4096, 1 << 40)]), "flags beyond 32 bits"),
            (status_chunk(7, &[(4096, 3)]), "a structured chunk after extended headers"),
        ] {
            assert!(matches!(run(&stream), Err(ClientError::Protocol { .. })), "{what}");
        }
        let mut wrong_count = status_chunk_ext(4096, 7, &[(4096, 3)]);
        wrong_count[36..40].copy_from_slice(&2u32.to_be_bytes());
        assert!(matches!(run(&wrong_count), Err(ClientError::Protocol { .. })), "a count that disagrees");
    }

    #[test]
    fn block_status_is_checked_and_clipped_to_the_request() {
        let answer = status_through(Framing::Structured, &status_chunk(7, &[(4096, 3), (65536, 0)])).unwrap();
        assert_eq!(answer, Answer::Status(vec![(4096, 3), (4096, 0)]), "the last extent clipped");
        for (stream, what) in [
            (status_chunk(8, &[(4096, 3)]), "another context"),
            (status_chunk(7, &[(0, 3)]), "an empty extent"),
            (status_chunk(7, &[]), "no extents"),
        ] {
            let result = status_through(Framing::Structured, &stream);
            assert!(matches!(result, Err(ClientError::Protocol { .. })), "{what}: {result:?}");
        }
        // A second chunk for the one context (the first not DONE).
        let mut first = status_chunk(7, &[(4096, 3)]);
        first[4..6].copy_from_slice(&0u16.to_be_bytes());
        first.extend(status_chunk(7, &[(4096, 3)]));
        assert!(matches!(status_through(Framing::Structured, &first), Err(ClientError::Protocol { .. })));
        // Done without any status chunk.
        let mut none = Vec::new();
        none.put_u32(STRUCTURED_REPLY_MAGIC);
        none.put_u16(reply_flags::DONE);
        none.put_u16(reply_type::NONE);
        none.put_u64(1);
        none.put_u32(0);
        assert!(matches!(status_through(Framing::Structured, &none), Err(ClientError::Protocol { .. })));
    }

    /// Replays the committed fuzz corpus, so the entry point (and the corpus) stay healthy.
    #[test]
    fn fuzz_corpus_replays_cleanly() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/replies");
        let mut count = 0;
        for entry in std::fs::read_dir(root).expect("corpus directory") {
            super::replies(&std::fs::read(entry.unwrap().path()).unwrap());
            count += 1;
        }
        assert!(count > 0, "empty corpus");
    }
}
