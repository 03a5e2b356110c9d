//! Raw-socket tests: bytes no well-behaved client sends, and server behaviour (pipelining
//! depth, reply order, backpressure, limits, shutdown) observed through a gated device.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use nbd_server::protocol::consts::{
    EXTENDED_REQUEST_MAGIC, IHAVEOPT, NBDMAGIC, OPTION_REPLY_MAGIC, REQUEST_MAGIC, cmd, cmd_flags, errno, info, opt,
    rep, reply_flags, reply_type, tflags,
};
use nbd_server::protocol::reply::{
    ChunkHeader, decode_chunk_header, decode_extended_chunk_header, decode_simple_reply,
};
use nbd_server::protocol::request::REQUEST_HEADER_LEN;
use nbd_server::{
    BlockDevice, DeviceFuture, DeviceInfo, DeviceResult, Export, Extent, MemoryDevice, ReadChunk, Server, ServerConfig,
    WriteTarget, ZeroFlags,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::oneshot;

use crate::util::{ServerHandle, pattern, standard_exports};

const TIMEOUT: Duration = Duration::from_secs(10);

/// A client that speaks the protocol byte by byte.
pub(crate) struct Raw<S> {
    pub(crate) stream: S,
}

impl Raw<TcpStream> {
    pub(crate) async fn connect(server: &ServerHandle) -> Self {
        let stream = TcpStream::connect(server.addr).await.expect("connect");
        stream.set_nodelay(true).unwrap();
        Raw { stream }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> Raw<S> {
    pub(crate) async fn read_exact(&mut self, n: usize) -> Vec<u8> {
        let mut buf = vec![0u8; n];
        tokio::time::timeout(TIMEOUT, self.stream.read_exact(&mut buf)).await.expect("reply in time").expect("read");
        buf
    }

    pub(crate) async fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).await.expect("send");
    }

    /// The server closes the connection: EOF (or reset) within the timeout, nothing else.
    pub(crate) async fn expect_closed(&mut self) {
        let mut buf = [0u8; 1024];
        match tokio::time::timeout(TIMEOUT, self.stream.read(&mut buf)).await {
            Err(_) => panic!("server did not close the connection"),
            Ok(Ok(0)) | Ok(Err(_)) => {}
            Ok(Ok(n)) => panic!("expected close, got {n} more bytes: {:02x?}", &buf[..n]),
        }
    }

    pub(crate) async fn greeting(&mut self) {
        let g = self.read_exact(18).await;
        assert_eq!(u64::from_be_bytes(g[..8].try_into().unwrap()), NBDMAGIC);
        assert_eq!(u64::from_be_bytes(g[8..16].try_into().unwrap()), IHAVEOPT);
        assert_eq!(&g[16..], &[0, 3], "FIXED_NEWSTYLE | NO_ZEROES");
    }

    /// Greeting plus client flags.
    pub(crate) async fn start(&mut self, client_flags: u32) {
        self.greeting().await;
        self.send(&client_flags.to_be_bytes()).await;
    }

    pub(crate) async fn option(&mut self, code: u32, data: &[u8]) {
        let mut msg = IHAVEOPT.to_be_bytes().to_vec();
        msg.extend_from_slice(&code.to_be_bytes());
        msg.extend_from_slice(&(data.len() as u32).to_be_bytes());
        msg.extend_from_slice(data);
        self.send(&msg).await;
    }

    /// One option reply: (echoed option, reply type, data).
    pub(crate) async fn option_reply(&mut self) -> (u32, u32, Vec<u8>) {
        let h = self.read_exact(20).await;
        assert_eq!(u64::from_be_bytes(h[..8].try_into().unwrap()), OPTION_REPLY_MAGIC);
        let option = u32::from_be_bytes(h[8..12].try_into().unwrap());
        let reply = u32::from_be_bytes(h[12..16].try_into().unwrap());
        let len = u32::from_be_bytes(h[16..20].try_into().unwrap()) as usize;
        assert!(len < 1 << 16, "option reply of {len} bytes");
        (option, reply, self.read_exact(len).await)
    }

    /// Replies until (and including) the final ACK or error.
    pub(crate) async fn option_replies(&mut self) -> Vec<(u32, u32, Vec<u8>)> {
        let mut all = Vec::new();
        loop {
            let r = self.option_reply().await;
            let last = r.1 == rep::ACK || r.1 & (1 << 31) != 0;
            all.push(r);
            if last {
                return all;
            }
        }
    }

    /// Fixed newstyle, NO_ZEROES, optional structured replies and base:allocation, then GO.
    /// Returns (size, transmission flags).
    pub(crate) async fn go(&mut self, name: &str, structured: bool, meta_for: Option<&str>) -> (u64, u16) {
        self.start(3).await;
        if structured {
            self.option(opt::STRUCTURED_REPLY, &[]).await;
            assert_eq!(self.option_reply().await.1, rep::ACK);
        }
        if let Some(meta_export) = meta_for {
            self.option(opt::SET_META_CONTEXT, &meta_query(meta_export, &["base:allocation"])).await;
            let replies = self.option_replies().await;
            assert_eq!(replies.len(), 2, "{replies:?}");
            assert_eq!(replies[0].1, rep::META_CONTEXT);
        }
        self.option(opt::GO, &go_data(name, &[])).await;
        let mut export = None;
        for (option, reply, data) in self.option_replies().await {
            assert_eq!(option, opt::GO);
            if reply == rep::INFO && u16::from_be_bytes(data[..2].try_into().unwrap()) == info::EXPORT {
                export = Some((
                    u64::from_be_bytes(data[2..10].try_into().unwrap()),
                    u16::from_be_bytes(data[10..12].try_into().unwrap()),
                ));
            }
            assert!(
                reply == rep::INFO || reply == rep::ACK,
                "GO failed: {reply:#x} {:?}",
                String::from_utf8_lossy(&data)
            );
        }
        export.expect("NBD_INFO_EXPORT")
    }

    pub(crate) async fn request(
        &mut self,
        flags: u16,
        command: u16,
        cookie: u64,
        offset: u64,
        len: u32,
        payload: &[u8],
    ) {
        self.send(&request_message(flags, command, cookie, offset, len, payload)).await;
    }

    /// A simple reply: (error, cookie); reads `data_len` bytes of data if error is 0.
    pub(crate) async fn simple_reply(&mut self, data_len: usize) -> (u32, u64, Vec<u8>) {
        let h = decode_simple_reply(&self.read_exact(16).await).expect("simple reply magic");
        let data = if h.error == 0 { self.read_exact(data_len).await } else { Vec::new() };
        (h.error, h.cookie, data)
    }

    pub(crate) async fn chunk(&mut self) -> (ChunkHeader, Vec<u8>) {
        let h = decode_chunk_header(&self.read_exact(20).await).expect("structured reply magic");
        let payload = self.read_exact(h.payload_len as usize).await;
        (h, payload)
    }

    /// Reads structured chunks until DONE; returns them.
    pub(crate) async fn chunks(&mut self) -> Vec<(ChunkHeader, Vec<u8>)> {
        let mut all = Vec::new();
        loop {
            let c = self.chunk().await;
            let done = c.0.flags & reply_flags::DONE != 0;
            all.push(c);
            if done {
                return all;
            }
        }
    }

    /// A READ that must succeed with simple replies.
    pub(crate) async fn read_ok(&mut self, offset: u64, len: u32) -> Vec<u8> {
        self.request(0, cmd::READ, 0xabc, offset, len, &[]).await;
        let (error, cookie, data) = self.simple_reply(len as usize).await;
        assert_eq!((error, cookie), (0, 0xabc));
        data
    }
}

/// A request header followed by `payload`.
pub(crate) fn request_message(flags: u16, command: u16, cookie: u64, offset: u64, len: u32, payload: &[u8]) -> Vec<u8> {
    let mut msg = Vec::with_capacity(REQUEST_HEADER_LEN + payload.len());
    msg.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
    msg.extend_from_slice(&flags.to_be_bytes());
    msg.extend_from_slice(&command.to_be_bytes());
    msg.extend_from_slice(&cookie.to_be_bytes());
    msg.extend_from_slice(&offset.to_be_bytes());
    msg.extend_from_slice(&len.to_be_bytes());
    msg.extend_from_slice(payload);
    msg
}

pub(crate) fn go_data(name: &str, infos: &[u16]) -> Vec<u8> {
    let mut d = (name.len() as u32).to_be_bytes().to_vec();
    d.extend_from_slice(name.as_bytes());
    d.extend_from_slice(&(infos.len() as u16).to_be_bytes());
    for i in infos {
        d.extend_from_slice(&i.to_be_bytes());
    }
    d
}

pub(crate) fn meta_query(export: &str, queries: &[&str]) -> Vec<u8> {
    let mut d = (export.len() as u32).to_be_bytes().to_vec();
    d.extend_from_slice(export.as_bytes());
    d.extend_from_slice(&(queries.len() as u32).to_be_bytes());
    for q in queries {
        d.extend_from_slice(&(q.len() as u32).to_be_bytes());
        d.extend_from_slice(q.as_bytes());
    }
    d
}

fn error_of_chunk(c: &(ChunkHeader, Vec<u8>)) -> u32 {
    assert!(c.0.chunk_type & 0x8000 != 0, "not an error chunk: {:?}", c.0);
    u32::from_be_bytes(c.1[..4].try_into().unwrap())
}

async fn standard_server(config: ServerConfig) -> (ServerHandle, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let (exports, _) = standard_exports(dir.path()).await;
    (ServerHandle::start(exports, config).await, dir)
}

fn quick_config() -> ServerConfig {
    ServerConfig { handshake_timeout: Duration::from_millis(500), ..ServerConfig::default() }
}

/// The server still serves a normal client.
async fn assert_alive(server: &ServerHandle) {
    let mut c = Raw::connect(server).await;
    let (size, _) = c.go("mem", false, None).await;
    assert_eq!(size, 64 << 20);
    assert_eq!(c.read_ok(0, 512).await.len(), 512);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_and_bad_flags_close_the_connection() {
    let (server, _dir) = standard_server(quick_config()).await;
    // Unknown client flag bits.
    let mut c = Raw::connect(&server).await;
    c.start(0x8000_0001).await;
    c.expect_closed().await;
    // Garbage instead of an option header.
    let mut c = Raw::connect(&server).await;
    c.start(3).await;
    c.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await;
    c.expect_closed().await;
    // Non-fixed-newstyle client sending anything but EXPORT_NAME.
    let mut c = Raw::connect(&server).await;
    c.start(0).await;
    c.option(opt::LIST, &[]).await;
    c.expect_closed().await;
    // Garbage request magic and an extended header that was never negotiated.
    for magic in [0xdead_beef_u32, EXTENDED_REQUEST_MAGIC] {
        let mut c = Raw::connect(&server).await;
        c.go("mem", true, None).await;
        let mut msg = magic.to_be_bytes().to_vec();
        msg.extend_from_slice(&[0u8; 28]);
        c.send(&msg).await;
        c.expect_closed().await;
    }
    assert_alive(&server).await;
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncated_and_stalled_handshakes() {
    let (server, _dir) = standard_server(quick_config()).await;
    // Partial messages then close: the server must just drop them.
    for prefix in [&[0u8, 0][..], &[0, 0, 0, 3, 0x49, 0x48], &[0, 0, 0, 3]] {
        let mut c = Raw::connect(&server).await;
        c.greeting().await;
        c.send(prefix).await;
        drop(c);
    }
    let mut c = Raw::connect(&server).await;
    c.start(3).await;
    let mut msg = IHAVEOPT.to_be_bytes().to_vec();
    msg.extend_from_slice(&opt::GO.to_be_bytes());
    msg.extend_from_slice(&100u32.to_be_bytes());
    msg.extend_from_slice(&[0; 10]);
    c.send(&msg).await;
    drop(c);
    // Stalled mid-handshake: closed by the handshake timeout (500 ms here).
    let started = Instant::now();
    let mut c = Raw::connect(&server).await;
    c.greeting().await;
    c.send(&[0, 0]).await;
    c.expect_closed().await;
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(400), "closed too early: {waited:?}");
    // A client that never sends anything is also closed.
    let mut c = Raw::connect(&server).await;
    c.greeting().await;
    c.expect_closed().await;
    assert_alive(&server).await;
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn option_replies_are_byte_exact() {
    let (server, _dir) = standard_server(quick_config()).await;
    let mut c = Raw::connect(&server).await;
    c.start(3).await;
    // Unknown option with data: ERR_UNSUP echoing the option, then the stream is in sync.
    c.option(0x0765_4321, b"some data").await;
    let (option, reply, _) = c.option_reply().await;
    assert_eq!((option, reply), (0x0765_4321, rep::ERR_UNSUP));
    c.option(opt::PEEK_EXPORT, &[]).await;
    assert_eq!(c.option_reply().await.1, rep::ERR_UNSUP);
    c.option(opt::STARTTLS, &[]).await;
    assert_eq!(c.option_reply().await.1, rep::ERR_POLICY);
    c.option(opt::STARTTLS, b"x").await;
    assert_eq!(c.option_reply().await.1, rep::ERR_INVALID);
    // META_CONTEXT before STRUCTURED_REPLY.
    c.option(opt::SET_META_CONTEXT, &meta_query("mem", &["base:allocation"])).await;
    assert_eq!(c.option_reply().await.1, rep::ERR_INVALID);
    c.option(opt::STRUCTURED_REPLY, &[]).await;
    assert_eq!(c.option_reply().await.1, rep::ACK);
    c.option(opt::STRUCTURED_REPLY, &[]).await;
    assert_eq!(c.option_reply().await.1, rep::ERR_INVALID);
    c.option(opt::STRUCTURED_REPLY, b"data").await;
    assert_eq!(c.option_reply().await.1, rep::ERR_INVALID);
    // SET_META_CONTEXT: one reply with a non-zero id, then ACK; LIST with data is invalid.
    c.option(opt::SET_META_CONTEXT, &meta_query("mem", &["base:allocation", "x-other:thing"])).await;
    let replies = c.option_replies().await;
    assert_eq!(replies.len(), 2);
    assert_eq!(replies[0].1, rep::META_CONTEXT);
    assert_ne!(u32::from_be_bytes(replies[0].2[..4].try_into().unwrap()), 0);
    assert_eq!(&replies[0].2[4..], b"base:allocation");
    c.option(opt::SET_META_CONTEXT, &meta_query("nope", &["base:allocation"])).await;
    assert_eq!(c.option_reply().await.1, rep::ERR_UNKNOWN);
    c.option(opt::LIST_META_CONTEXT, &meta_query("mem", &["nocolon"])).await;
    assert_eq!(c.option_reply().await.1, rep::ERR_INVALID);
    c.option(opt::LIST, b"x").await;
    assert_eq!(c.option_reply().await.1, rep::ERR_INVALID);
    c.option(opt::LIST, &[]).await;
    let replies = c.option_replies().await;
    assert_eq!(replies.len(), 7, "6 exports + ACK");
    assert!(replies[..6].iter().all(|r| r.1 == rep::SERVER));
    // ABORT: ACK, then the server closes.
    c.option(opt::ABORT, &[]).await;
    assert_eq!(c.option_reply().await, (opt::ABORT, rep::ACK, vec![]));
    c.expect_closed().await;
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn absurd_option_lengths() {
    let (server, _dir) = standard_server(quick_config()).await;
    let mut c = Raw::connect(&server).await;
    c.start(3).await;
    // 1 MiB of option data: skipped without buffering, ERR_TOO_BIG, still in sync.
    c.option(opt::INFO, &vec![0x55; 1 << 20]).await;
    assert_eq!(c.option_reply().await.1, rep::ERR_TOO_BIG);
    // Lengths inside the payload that point far beyond it.
    let mut bad_go = u32::MAX.to_be_bytes().to_vec();
    bad_go.extend_from_slice(&[0; 8]);
    c.option(opt::GO, &bad_go).await;
    assert_eq!(c.option_reply().await.1, rep::ERR_INVALID);
    let mut bad_count = go_data("mem", &[]);
    bad_count.truncate(bad_count.len() - 2);
    bad_count.extend_from_slice(&u16::MAX.to_be_bytes());
    c.option(opt::INFO, &bad_count).await;
    assert_eq!(c.option_reply().await.1, rep::ERR_INVALID);
    c.option(opt::STRUCTURED_REPLY, &[]).await;
    c.option_reply().await;
    let mut bad_queries = 3u32.to_be_bytes().to_vec();
    bad_queries.extend_from_slice(b"mem");
    bad_queries.extend_from_slice(&u32::MAX.to_be_bytes());
    c.option(opt::LIST_META_CONTEXT, &bad_queries).await;
    assert_eq!(c.option_reply().await.1, rep::ERR_INVALID);
    let long_name = "n".repeat(5000);
    c.option(opt::INFO, &go_data(&long_name, &[])).await;
    assert_eq!(c.option_reply().await.1, rep::ERR_TOO_BIG);
    // Still usable: GO works.
    c.option(opt::GO, &go_data("mem", &[info::BLOCK_SIZE])).await;
    assert_eq!(c.option_replies().await.last().unwrap().1, rep::ACK);
    c.request(0, cmd::READ, 9, 0, 4096, &[]).await;
    let chunks = c.chunks().await;
    assert_eq!((chunks[0].0.cookie, chunks[0].0.chunk_type), (9, reply_type::OFFSET_HOLE));

    // Options declaring 2 GiB and 4 GiB that never arrive: ERR_TOO_BIG at once, then closed
    // (not read through until the handshake timeout).
    for declared in [2u32 << 30, u32::MAX] {
        let mut c = Raw::connect(&server).await;
        c.start(3).await;
        let mut msg = IHAVEOPT.to_be_bytes().to_vec();
        msg.extend_from_slice(&0x1234u32.to_be_bytes());
        msg.extend_from_slice(&declared.to_be_bytes());
        c.send(&msg).await;
        c.send(&[0; 4096]).await;
        let asked = Instant::now();
        assert_eq!(c.option_reply().await.1, rep::ERR_TOO_BIG);
        c.expect_closed().await;
        // (Reading it through, the server would only have closed at the handshake timeout,
        // without a reply: the ERR_TOO_BIG above is what shows it answered at once.)
        let took = asked.elapsed();
        assert!(took < Duration::from_secs(2), "answered promptly: {took:?}");
    }
    // EXPORT_NAME longer than any name: closed (it cannot be answered with an error).
    let mut c = Raw::connect(&server).await;
    c.start(3).await;
    c.option(opt::EXPORT_NAME, &vec![b'a'; 100_000]).await;
    c.expect_closed().await;
    assert_alive(&server).await;
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn export_name_with_and_without_zeroes() {
    let (server, _dir) = standard_server(quick_config()).await;
    // FIXED_NEWSTYLE without NO_ZEROES: 8 + 2 + 124 bytes.
    let mut c = Raw::connect(&server).await;
    c.start(1).await;
    c.option(opt::EXPORT_NAME, b"ro").await;
    let reply = c.read_exact(134).await;
    assert_eq!(u64::from_be_bytes(reply[..8].try_into().unwrap()), 1 << 20);
    let flags = u16::from_be_bytes(reply[8..10].try_into().unwrap());
    assert_ne!(flags & tflags::READ_ONLY, 0);
    assert!(reply[10..].iter().all(|&b| b == 0));
    assert_eq!(c.read_ok(0, 512).await, pattern(9, 512));
    // NO_ZEROES: exactly 10 bytes, then the first reply follows directly.
    let mut c = Raw::connect(&server).await;
    c.start(3).await;
    c.option(opt::EXPORT_NAME, b"").await;
    let reply = c.read_exact(10).await;
    assert_eq!(u64::from_be_bytes(reply[..8].try_into().unwrap()), 64 << 20, "empty name = default export");
    assert_eq!(c.read_ok(0, 512).await.len(), 512);
    // Non-fixed newstyle client.
    let mut c = Raw::connect(&server).await;
    c.start(0).await;
    c.option(opt::EXPORT_NAME, b"aligned").await;
    assert_eq!(u64::from_be_bytes(c.read_exact(134).await[..8].try_into().unwrap()), 1 << 20);
    // Unknown export: the only possible answer is closing.
    let mut c = Raw::connect(&server).await;
    c.start(3).await;
    c.option(opt::EXPORT_NAME, b"missing").await;
    c.expect_closed().await;
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn info_and_go_answer_identically() {
    let (server, _dir) = standard_server(quick_config()).await;
    let mut c = Raw::connect(&server).await;
    c.start(3).await;
    c.option(opt::STRUCTURED_REPLY, &[]).await;
    c.option_reply().await;
    let infos = [info::NAME, info::DESCRIPTION, info::BLOCK_SIZE, 0x7777];
    c.option(opt::INFO, &go_data("", &infos)).await;
    let info_replies: Vec<_> = c.option_replies().await.into_iter().map(|(_, t, d)| (t, d)).collect();
    c.option(opt::GO, &go_data("", &infos)).await;
    let go_replies: Vec<_> = c.option_replies().await.into_iter().map(|(_, t, d)| (t, d)).collect();
    assert_eq!(info_replies, go_replies);
    let texts: Vec<_> = info_replies.iter().filter(|(t, _)| *t == rep::INFO).map(|(_, d)| d.clone()).collect();
    assert!(texts.iter().any(|d| d[..2] == info::NAME.to_be_bytes() && &d[2..] == b"mem"));
    assert!(texts.iter().any(|d| d[..2] == info::DESCRIPTION.to_be_bytes() && &d[2..] == b"the main test disk"));
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_lengths_and_offsets_at_the_limits() {
    let (server, _dir) = standard_server(quick_config()).await;
    let size = 64u64 << 20;
    for structured in [false, true] {
        let mut c = Raw::connect(&server).await;
        c.go("mem", structured, None).await;
        let cases: Vec<(u16, u16, u64, u32, Vec<u8>, u32)> = vec![
            (0, cmd::READ, 0, u32::MAX, vec![], errno::EINVAL),
            (0, cmd::READ, u64::MAX, 1, vec![], errno::EINVAL),
            (0, cmd::READ, u64::MAX - 511, 1024, vec![], errno::EINVAL),
            (0, cmd::READ, size, 0, vec![], 0),
            (0, cmd::WRITE, u64::MAX - 511, 512, vec![7; 512], errno::ENOSPC),
            (0, cmd::WRITE, size - 512, 1024, vec![7; 1024], errno::ENOSPC),
            (0, cmd::WRITE_ZEROES, u64::MAX - 4095, 8192, vec![], errno::ENOSPC),
            (0, cmd::TRIM, 0, u32::MAX, vec![], errno::EINVAL),
            (0, cmd::CACHE, u64::MAX, u32::MAX, vec![], errno::EINVAL),
            (0, cmd::BLOCK_STATUS, 0, 4096, vec![], errno::EINVAL),
            (0, 99, 0, 0, vec![], errno::EINVAL),
            (0x8000, cmd::READ, 0, 512, vec![], errno::EINVAL),
            (0, cmd::FLUSH, 1, 0, vec![], errno::EINVAL),
        ];
        for (i, (flags, command, offset, len, payload, want)) in cases.into_iter().enumerate() {
            let cookie = 0x1000 + i as u64;
            c.request(flags, command, cookie, offset, len, &payload).await;
            if structured {
                let chunks = c.chunks().await;
                assert!(chunks.iter().all(|ch| ch.0.cookie == cookie));
                if want == 0 {
                    assert_eq!(chunks.last().unwrap().0.chunk_type, reply_type::NONE);
                } else {
                    assert_eq!(chunks.len(), 1);
                    assert_eq!(error_of_chunk(&chunks[0]), want, "case {i}");
                }
            } else {
                let (error, got_cookie, _) = c.simple_reply(0).await;
                assert_eq!((error, got_cookie), (want, cookie), "case {i}");
            }
            // After each refusal the connection is still in sync.
            if structured {
                c.request(0, cmd::READ, 1, 0, 512, &[]).await;
                let chunks = c.chunks().await;
                assert_eq!(chunks[0].0.cookie, 1);
            } else {
                assert_eq!(c.read_ok(0, 512).await.len(), 512);
            }
        }
        // A 64 MiB WRITE (the maximum) is accepted.
        let big = pattern(3, 64 << 20);
        c.request(0, cmd::WRITE, 5, 0, 64 << 20, &big).await;
        // Successful non-READ replies are simple replies even when structured ones were negotiated.
        assert_eq!(c.simple_reply(0).await, (0, 5, vec![]));
        // A WRITE announcing 2^32-1 bytes of payload is a denial of service: hard disconnect.
        c.request(0, cmd::WRITE, 6, 0, u32::MAX, &[]).await;
        c.expect_closed().await;
        // So is a payload just over 64 MiB.
        let mut c = Raw::connect(&server).await;
        c.go("mem", structured, None).await;
        c.request(0, cmd::WRITE, 7, 0, (64 << 20) + 1, &[]).await;
        c.expect_closed().await;
    }
    assert_alive(&server).await;
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_do_not_negotiate_block_sizes_get_a_minimum_of_one() {
    let device = Arc::new(MemoryDevice::new(1 << 20).block_sizes(4096, 65536, 0).byte_granular(true));
    let server = ServerHandle::start(vec![Export::new("bytes", device)], quick_config()).await;
    // GO without NBD_INFO_BLOCK_SIZE: the unasked block size info says 1, and 1-byte I/O works.
    let mut c = Raw::connect(&server).await;
    c.start(3).await;
    c.option(opt::GO, &go_data("bytes", &[])).await;
    let replies = c.option_replies().await;
    let sizes = replies.iter().find(|r| r.1 == rep::INFO && r.2[..2] == info::BLOCK_SIZE.to_be_bytes()).unwrap();
    assert_eq!(u32::from_be_bytes(sizes.2[2..6].try_into().unwrap()), 1, "minimum block");
    c.request(0, cmd::WRITE, 1, 4097, 3, b"abc").await;
    assert_eq!(c.simple_reply(0).await, (0, 1, vec![]));
    c.request(0, cmd::READ, 2, 4096, 5, &[]).await;
    assert_eq!(c.simple_reply(5).await, (0, 2, b"\0abc\0".to_vec()));
    // EXPORT_NAME negotiates nothing either.
    let mut c = Raw::connect(&server).await;
    c.start(3).await;
    c.option(opt::EXPORT_NAME, b"bytes").await;
    let _size_and_flags = c.read_exact(10).await;
    assert_eq!(c.read_ok(4098, 1).await, b"b");
    // A client that asked keeps the device's 4096.
    let mut c = Raw::connect(&server).await;
    c.start(3).await;
    c.option(opt::GO, &go_data("bytes", &[info::BLOCK_SIZE])).await;
    let replies = c.option_replies().await;
    let sizes = replies.iter().find(|r| r.1 == rep::INFO && r.2[..2] == info::BLOCK_SIZE.to_be_bytes()).unwrap();
    assert_eq!(u32::from_be_bytes(sizes.2[2..6].try_into().unwrap()), 4096);
    c.request(0, cmd::READ, 3, 4097, 3, &[]).await;
    assert_eq!(c.simple_reply(0).await.0, errno::EINVAL);
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn block_status_needs_a_context_for_the_same_export() {
    let (server, _dir) = standard_server(quick_config()).await;
    let mut c = Raw::connect(&server).await;
    c.go("mem", true, Some("ro")).await;
    c.request(0, cmd::BLOCK_STATUS, 1, 0, 4096, &[]).await;
    let chunks = c.chunks().await;
    assert_eq!(error_of_chunk(&chunks[0]), errno::EINVAL);
    let mut c = Raw::connect(&server).await;
    c.go("mem", true, Some("mem")).await;
    c.request(0, cmd::BLOCK_STATUS, 2, 0, 4096, &[]).await;
    let chunks = c.chunks().await;
    assert_eq!(chunks.len(), 1);
    assert_eq!(chunks[0].0.chunk_type, reply_type::BLOCK_STATUS);
    assert_eq!(chunks[0].1.len(), 12);
    assert_eq!(&chunks[0].1[4..], &[0, 0, 0x10, 0, 0, 0, 0, 3], "one 4096-byte hole+zero extent");
    server.stop().await.unwrap();
}

/// A device whose reads and writes wait until the test releases them, counting arrivals.
struct GatedDevice {
    inner: MemoryDevice,
    gates: Mutex<HashMap<u64, oneshot::Sender<()>>>,
    arrived: AtomicUsize,
}

impl GatedDevice {
    fn new(size: u64) -> Arc<Self> {
        Arc::new(Self {
            inner: MemoryDevice::new(size),
            gates: Mutex::new(HashMap::new()),
            arrived: AtomicUsize::new(0),
        })
    }

    async fn gate(&self, offset: u64) {
        let (tx, rx) = oneshot::channel();
        self.gates.lock().unwrap().insert(offset, tx);
        self.arrived.fetch_add(1, Ordering::SeqCst);
        let _ = rx.await;
    }

    fn arrived(&self) -> usize {
        self.arrived.load(Ordering::SeqCst)
    }

    async fn wait_arrived(&self, n: usize) {
        let start = Instant::now();
        while self.arrived() < n {
            assert!(start.elapsed() < TIMEOUT, "only {} of {n} requests reached the device", self.arrived());
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    fn release(&self, offset: u64) {
        let tx = self.gates.lock().unwrap().remove(&offset).expect("request at offset is waiting");
        tx.send(()).unwrap();
    }
}

impl BlockDevice for GatedDevice {
    fn info(&self) -> DeviceInfo {
        self.inner.info()
    }
    fn read(&self, offset: u64, len: u32) -> DeviceFuture<'_, DeviceResult<Vec<ReadChunk>>> {
        Box::pin(async move {
            self.gate(offset).await;
            self.inner.read(offset, len).await
        })
    }
    fn write(&self, offset: u64, data: Bytes, fua: bool) -> DeviceFuture<'_, DeviceResult<()>> {
        Box::pin(async move {
            self.gate(offset).await;
            self.inner.write(offset, data, fua).await
        })
    }
    fn flush(&self) -> DeviceFuture<'_, DeviceResult<()>> {
        self.inner.flush()
    }
    fn trim(&self, offset: u64, len: u64, fua: bool) -> DeviceFuture<'_, DeviceResult<()>> {
        self.inner.trim(offset, len, fua)
    }
    fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> DeviceFuture<'_, DeviceResult<()>> {
        self.inner.write_zeroes(offset, len, flags)
    }
    fn block_status(&self, offset: u64, len: u64) -> DeviceFuture<'_, DeviceResult<Vec<Extent>>> {
        self.inner.block_status(offset, len)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_requests_all_reach_the_device_and_replies_follow_completion_order() {
    let device = GatedDevice::new(64 << 20);
    let server = ServerHandle::start(vec![Export::new("gated", device.clone())], ServerConfig::default()).await;
    let mut c = Raw::connect(&server).await;
    c.go("gated", false, None).await;
    const N: u64 = 200;
    for i in 0..N {
        c.request(0, cmd::READ, i, i * 4096, 4096, &[]).await;
    }
    // All 200 are in flight at the device at once (>= 128 required).
    device.wait_arrived(N as usize).await;
    // Complete them in reverse order: replies must come back in that order.
    for i in (0..N).rev() {
        device.release(i * 4096);
        let (error, cookie, data) = c.simple_reply(4096).await;
        assert_eq!((error, cookie, data.len()), (0, i, 4096));
    }
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_in_flight_are_bounded_and_apply_backpressure() {
    let device = GatedDevice::new(256 << 20);
    let config = ServerConfig { max_in_flight_bytes: 64 << 20, ..ServerConfig::default() };
    let server = ServerHandle::start(vec![Export::new("gated", device.clone())], config).await;
    let mut c = Raw::connect(&server).await;
    c.go("gated", false, None).await;
    let len = 32u32 << 20;
    // Four 32 MiB reads: only two fit in the 64 MiB budget.
    for i in 0..4u64 {
        c.request(0, cmd::READ, i, i * u64::from(len), len, &[]).await;
    }
    device.wait_arrived(2).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(device.arrived(), 2, "a third read was issued beyond the byte budget");
    device.release(0);
    let (error, cookie, _) = c.simple_reply(len as usize).await;
    assert_eq!((error, cookie), (0, 0));
    device.wait_arrived(3).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(device.arrived(), 3);
    for i in 1..4u64 {
        if i == 3 {
            device.wait_arrived(4).await;
        }
        device.release(i * u64::from(len));
        let (error, cookie, _) = c.simple_reply(len as usize).await;
        assert_eq!((error, cookie), (0, i));
    }
    // Writes: the third payload is not even read from the socket until room frees up.
    let payload = vec![1u8; len as usize];
    let (mut rd, mut wr) = tokio::io::split(c.stream);
    let sender = tokio::spawn(async move {
        for i in 0..3u64 {
            let mut msg = REQUEST_MAGIC.to_be_bytes().to_vec();
            msg.extend_from_slice(&0u16.to_be_bytes());
            msg.extend_from_slice(&cmd::WRITE.to_be_bytes());
            msg.extend_from_slice(&(100 + i).to_be_bytes());
            msg.extend_from_slice(&((128u64 << 20) | (i * u64::from(len))).to_be_bytes());
            msg.extend_from_slice(&len.to_be_bytes());
            wr.write_all(&msg).await.unwrap();
            wr.write_all(&payload).await.unwrap();
        }
        wr
    });
    device.wait_arrived(6).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(device.arrived(), 6, "a third write was accepted beyond the byte budget");
    device.release(128 << 20);
    device.wait_arrived(7).await;
    device.release((128 << 20) + u64::from(len));
    device.release((128 << 20) + 2 * u64::from(len));
    let _wr = sender.await.unwrap();
    for _ in 0..3 {
        let mut h = [0u8; 16];
        rd.read_exact(&mut h).await.unwrap();
        let reply = decode_simple_reply(&h).unwrap();
        assert_eq!(reply.error, 0);
    }
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_limit_closes_excess_connections() {
    let (server, _dir) = standard_server(ServerConfig { max_connections: 2, ..ServerConfig::default() }).await;
    let mut a = Raw::connect(&server).await;
    a.greeting().await;
    let mut b = Raw::connect(&server).await;
    b.greeting().await;
    let mut c = Raw::connect(&server).await;
    c.expect_closed().await;
    drop(a);
    // Once a slot frees up, new connections are served again.
    let start = Instant::now();
    loop {
        let mut d = Raw::connect(&server).await;
        let mut first = [0u8; 1];
        match tokio::time::timeout(TIMEOUT, d.stream.read(&mut first)).await {
            Ok(Ok(1)) => break,
            _ => assert!(start.elapsed() < TIMEOUT, "no slot was freed"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The first connections are still being served.
    b.send(&3u32.to_be_bytes()).await;
    b.option(opt::LIST, &[]).await;
    assert_eq!(b.option_replies().await.len(), 7);
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_finishes_in_flight_requests_then_flushes_and_closes() {
    let device = GatedDevice::new(64 << 20);
    let server = ServerHandle::start(vec![Export::new("gated", device.clone())], ServerConfig::default()).await;
    let addr = server.addr;
    let mut c = Raw::connect(&server).await;
    c.go("gated", false, None).await;
    c.request(0, cmd::WRITE, 42, 8192, 4096, &pattern(5, 4096)).await;
    device.wait_arrived(1).await;
    let flushes_before = device.inner.flush_count();
    let stopping = tokio::spawn(server.stop());
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!stopping.is_finished(), "shutdown did not wait for the in-flight write");
    // New connections are no longer accepted.
    if let Ok(mut s) = TcpStream::connect(addr).await {
        let mut buf = [0u8; 1];
        let n = tokio::time::timeout(TIMEOUT, s.read(&mut buf)).await.expect("refused in time").unwrap_or(0);
        assert_eq!(n, 0, "a connection was accepted during shutdown");
    }
    device.release(8192);
    let (error, cookie, _) = c.simple_reply(0).await;
    assert_eq!((error, cookie), (0, 42), "in-flight write completed and was answered");
    c.expect_closed().await;
    stopping.await.unwrap().unwrap();
    assert!(device.inner.flush_count() > flushes_before, "device flushed at shutdown");
    let data = device.inner.read(8192, 4096).await.unwrap();
    assert_eq!(data, vec![ReadChunk::Data(Bytes::from(pattern(5, 4096)))]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unix_socket_listener_serves_too() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nbd.sock");
    let listener = tokio::net::UnixListener::bind(&path).unwrap();
    let server =
        Server::new(vec![Export::new("u", Arc::new(MemoryDevice::new(1 << 20)))], ServerConfig::default()).unwrap();
    let (tx, rx) = oneshot::channel::<()>();
    let serving = tokio::spawn({
        let server = server.clone();
        async move {
            server
                .serve(listener, async move {
                    let _ = rx.await;
                })
                .await
        }
    });
    let stream = tokio::net::UnixStream::connect(&path).await.unwrap();
    let mut c = Raw { stream };
    let (size, _) = c.go("", true, None).await;
    assert_eq!(size, 1 << 20);
    c.request(0, cmd::WRITE, 1, 512, 512, &pattern(8, 512)).await;
    assert_eq!(decode_simple_reply(&c.read_exact(16).await).unwrap().error, 0);
    c.request(0, cmd::READ, 2, 512, 512, &[]).await;
    let chunks = c.chunks().await;
    assert_eq!(chunks[0].0.chunk_type, reply_type::OFFSET_DATA);
    assert_eq!(&chunks[0].1[8..], &pattern(8, 512)[..]);
    c.request(0, cmd::DISC, 3, 0, 0, &[]).await;
    c.expect_closed().await;
    tx.send(()).unwrap();
    serving.await.unwrap().unwrap();
}

/// An extended request header: 32 bytes, 64-bit length.
fn ext_request(flags: u16, command: u16, cookie: u64, offset: u64, len: u64, payload: &[u8]) -> Vec<u8> {
    let mut m = EXTENDED_REQUEST_MAGIC.to_be_bytes().to_vec();
    m.extend_from_slice(&flags.to_be_bytes());
    m.extend_from_slice(&command.to_be_bytes());
    m.extend_from_slice(&cookie.to_be_bytes());
    m.extend_from_slice(&offset.to_be_bytes());
    m.extend_from_slice(&len.to_be_bytes());
    m.extend_from_slice(payload);
    m
}

impl<S: AsyncRead + AsyncWrite + Unpin> Raw<S> {
    /// One extended reply chunk: header, the offset it repeats, payload.
    async fn ext_chunk(&mut self) -> (ChunkHeader, u64, Vec<u8>) {
        let raw = self.read_exact(32).await;
        let (h, offset) = decode_extended_chunk_header(&raw).expect("extended reply magic");
        let payload = self.read_exact(h.payload_len as usize).await;
        (h, offset, payload)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extended_headers_byte_exact_with_64_bit_lengths() {
    // The order qemu >= 8.2 and libnbd >= 1.18 use: EXTENDED_HEADERS first (no
    // STRUCTURED_REPLY after its ACK), SET_META_CONTEXT, GO.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.img");
    std::fs::File::create(&path).and_then(|f| f.set_len(8 << 30)).unwrap();
    let device = Arc::new(nbd_server::FileDevice::open(&path, false).unwrap());
    let server = ServerHandle::start(vec![Export::new("big", device)], quick_config()).await;
    let mut c = Raw::connect(&server).await;
    c.start(3).await;
    c.option(opt::EXTENDED_HEADERS, b"x").await;
    assert_eq!(c.option_reply().await.1, rep::ERR_INVALID, "the option takes no data");
    c.option(opt::EXTENDED_HEADERS, &[]).await;
    assert_eq!(c.option_reply().await, (opt::EXTENDED_HEADERS, rep::ACK, vec![]));
    c.option(opt::EXTENDED_HEADERS, &[]).await;
    assert_eq!(c.option_reply().await.1, rep::ERR_INVALID, "already negotiated");
    c.option(opt::STRUCTURED_REPLY, &[]).await;
    assert_eq!(c.option_reply().await.1, rep::ERR_EXT_HEADER_REQD);
    c.option(opt::SET_META_CONTEXT, &meta_query("big", &["base:allocation"])).await;
    assert_eq!(c.option_replies().await.len(), 2, "META_CONTEXT needs no STRUCTURED_REPLY here");
    c.option(opt::GO, &go_data("big", &[info::BLOCK_SIZE])).await;
    assert_eq!(c.option_replies().await.last().unwrap().1, rep::ACK);

    let at = 6u64 << 30;
    // WRITE with PAYLOAD_LEN: a NONE chunk with DONE (never a simple reply), repeating the offset.
    c.send(&ext_request(cmd_flags::PAYLOAD_LEN, cmd::WRITE, 1, at, 4096, &pattern(3, 4096))).await;
    let (h, offset, payload) = c.ext_chunk().await;
    assert_eq!(
        (h.chunk_type, h.flags, h.cookie, offset, payload.len()),
        (reply_type::NONE, reply_flags::DONE, 1, at, 0)
    );
    // READ: OFFSET_DATA, the offset in the header and in the payload.
    c.send(&ext_request(0, cmd::READ, 2, at, 4096, &[])).await;
    let (h, offset, payload) = c.ext_chunk().await;
    assert_eq!(
        (h.chunk_type, h.flags & reply_flags::DONE, h.cookie, offset),
        (reply_type::OFFSET_DATA, reply_flags::DONE, 2, at)
    );
    assert_eq!(u64::from_be_bytes(payload[..8].try_into().unwrap()), at);
    assert_eq!(&payload[8..], &pattern(3, 4096)[..]);
    // WRITE_ZEROES over more than 4 GiB in one request, short of the data, then over it.
    c.send(&ext_request(0, cmd::WRITE_ZEROES, 3, 0, at, &[])).await;
    assert_eq!(c.ext_chunk().await.0.chunk_type, reply_type::NONE);
    c.send(&ext_request(0, cmd::READ, 4, at, 4096, &[])).await;
    assert_eq!(&c.ext_chunk().await.2[8..], &pattern(3, 4096)[..], "the data past the zeroed range stays");
    c.send(&ext_request(0, cmd::WRITE_ZEROES, 5, 0, 7 << 30, &[])).await;
    assert_eq!(c.ext_chunk().await.0.chunk_type, reply_type::NONE);
    c.send(&ext_request(0, cmd::READ, 6, at, 4096, &[])).await;
    let (h, _, payload) = c.ext_chunk().await;
    match h.chunk_type {
        reply_type::OFFSET_HOLE => assert_eq!(u32::from_be_bytes(payload[8..12].try_into().unwrap()), 4096),
        reply_type::OFFSET_DATA => assert!(payload[8..].iter().all(|&b| b == 0)),
        other => panic!("chunk type {other}"),
    }
    // BLOCK_STATUS over the whole 8 GiB: BLOCK_STATUS_EXT, 64-bit descriptors.
    c.send(&ext_request(0, cmd::BLOCK_STATUS, 7, 0, 8 << 30, &[])).await;
    let (h, offset, payload) = c.ext_chunk().await;
    assert_eq!((h.chunk_type, h.flags, offset), (reply_type::BLOCK_STATUS_EXT, reply_flags::DONE, 0));
    let count = u32::from_be_bytes(payload[4..8].try_into().unwrap()) as usize;
    assert!(count >= 1 && payload.len() == 8 + 16 * count, "{} bytes for {count} descriptors", payload.len());
    let first_len = u64::from_be_bytes(payload[8..16].try_into().unwrap());
    let first_flags = u64::from_be_bytes(payload[16..24].try_into().unwrap());
    assert!(first_len > 0 && first_flags < 1 << 32, "{first_len} {first_flags:#x}");
    // A payload on a READ is read (the stream stays in step) and refused with an error chunk.
    c.send(&ext_request(cmd_flags::PAYLOAD_LEN, cmd::READ, 8, 0, 8, b"12345678")).await;
    let (h, offset, payload) = c.ext_chunk().await;
    assert_eq!((h.chunk_type, h.cookie, offset), (reply_type::ERROR, 8, 0));
    assert_eq!(u32::from_be_bytes(payload[..4].try_into().unwrap()), errno::EINVAL);
    // A READ beyond the maximum payload is refused, the connection kept.
    c.send(&ext_request(0, cmd::READ, 9, 0, 5 << 30, &[])).await;
    assert_eq!(c.ext_chunk().await.0.chunk_type, reply_type::ERROR);
    // A WRITE without PAYLOAD_LEN is taken as meaning it (as qemu does).
    c.send(&ext_request(0, cmd::WRITE, 10, 0, 512, &[9; 512])).await;
    assert_eq!(c.ext_chunk().await.0.chunk_type, reply_type::NONE);
    c.send(&ext_request(0, cmd::FLUSH, 11, 0, 0, &[])).await;
    assert_eq!(c.ext_chunk().await.0.chunk_type, reply_type::NONE);
    // A compact header after extended headers desynchronises the stream: closed (once 32
    // bytes are in, as the server reads 32-byte headers).
    c.request(0, cmd::READ, 12, 0, 512, &[0; 4]).await;
    c.expect_closed().await;
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extended_headers_then_export_name_closes() {
    let (server, _dir) = standard_server(quick_config()).await;
    let mut c = Raw::connect(&server).await;
    c.start(3).await;
    c.option(opt::EXTENDED_HEADERS, &[]).await;
    assert_eq!(c.option_reply().await.1, rep::ACK);
    c.option(opt::EXPORT_NAME, b"mem").await;
    c.expect_closed().await;
    assert_alive(&server).await;
    server.stop().await.unwrap();
}

/// A device that counts the WRITE bytes it got in place (received into its mapping).
struct CountingInPlace {
    inner: nbd_server::FileDevice,
    received_bytes: AtomicUsize,
}

impl BlockDevice for CountingInPlace {
    fn info(&self) -> DeviceInfo {
        self.inner.info()
    }
    fn read(&self, offset: u64, len: u32) -> DeviceFuture<'_, DeviceResult<Vec<ReadChunk>>> {
        self.inner.read(offset, len)
    }
    fn write(&self, offset: u64, data: Bytes, fua: bool) -> DeviceFuture<'_, DeviceResult<()>> {
        self.inner.write(offset, data, fua)
    }
    fn write_targets(&self, offset: u64, len: u32) -> DeviceFuture<'_, DeviceResult<Option<Vec<WriteTarget>>>> {
        self.inner.write_targets(offset, len)
    }
    fn write_received(&self, offset: u64, len: u32, fua: bool) -> DeviceFuture<'_, DeviceResult<()>> {
        self.received_bytes.fetch_add(len as usize, Ordering::Relaxed);
        self.inner.write_received(offset, len, fua)
    }
    fn flush(&self) -> DeviceFuture<'_, DeviceResult<()>> {
        self.inner.flush()
    }
    fn trim(&self, offset: u64, len: u64, fua: bool) -> DeviceFuture<'_, DeviceResult<()>> {
        self.inner.trim(offset, len, fua)
    }
    fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> DeviceFuture<'_, DeviceResult<()>> {
        self.inner.write_zeroes(offset, len, flags)
    }
}

/// A device that takes in-place writes in 4 KiB targets, each 4 MiB further into its
/// tmpfs file than the request offset: many targets per request (more than one `recvmsg`
/// takes at once for 32 MiB), with the already-buffered start of a payload spanning several.
struct FourKibTargets {
    file: Arc<std::fs::File>,
    mapping: Arc<nbd_server::FileMapping>,
    size: u64,
    received_bytes: AtomicUsize,
}

const SHIFT: u64 = 4 << 20;

impl BlockDevice for FourKibTargets {
    fn info(&self) -> DeviceInfo {
        DeviceInfo::full_featured(self.size, "4 KiB targets".into())
    }
    fn read(&self, offset: u64, len: u32) -> DeviceFuture<'_, DeviceResult<Vec<ReadChunk>>> {
        use std::os::unix::fs::FileExt;
        let mut data = vec![0u8; len as usize];
        self.file.read_exact_at(&mut data, offset + SHIFT).unwrap();
        Box::pin(std::future::ready(Ok(vec![ReadChunk::Data(Bytes::from(data))])))
    }
    fn write(&self, offset: u64, data: Bytes, _fua: bool) -> DeviceFuture<'_, DeviceResult<()>> {
        use std::os::unix::fs::FileExt;
        self.file.write_all_at(&data, offset + SHIFT).unwrap();
        Box::pin(std::future::ready(Ok(())))
    }
    fn write_targets(&self, offset: u64, len: u32) -> DeviceFuture<'_, DeviceResult<Option<Vec<WriteTarget>>>> {
        let targets = (0..len.div_ceil(4096))
            .map(|i| {
                let at = u64::from(i) * 4096;
                let piece = (len - i * 4096).min(4096);
                WriteTarget { mapping: self.mapping.clone(), offset: offset + at + SHIFT, len: piece }
            })
            .collect();
        Box::pin(std::future::ready(Ok(Some(targets))))
    }
    fn write_received(&self, _offset: u64, len: u32, _fua: bool) -> DeviceFuture<'_, DeviceResult<()>> {
        self.received_bytes.fetch_add(len as usize, Ordering::Relaxed);
        Box::pin(std::future::ready(Ok(())))
    }
    fn flush(&self) -> DeviceFuture<'_, DeviceResult<()>> {
        Box::pin(std::future::ready(Ok(())))
    }
    fn trim(&self, _: u64, _: u64, _: bool) -> DeviceFuture<'_, DeviceResult<()>> {
        Box::pin(std::future::ready(Ok(())))
    }
    fn write_zeroes(&self, _: u64, _: u64, _: ZeroFlags) -> DeviceFuture<'_, DeviceResult<()>> {
        Box::pin(std::future::ready(Err(nbd_server::DeviceError::new(nbd_server::DeviceErrorKind::Io, "unused"))))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payloads_received_into_many_targets_land_in_order() {
    let shm = tempfile::NamedTempFile::new_in("/dev/shm").expect("a file on /dev/shm (tmpfs)");
    let size = 48u64 << 20;
    shm.as_file().set_len(size + SHIFT).unwrap();
    let file = Arc::new(shm.reopen().unwrap());
    let mapping = Arc::new(nbd_server::FileMapping::new(file.clone()).unwrap());
    let device = Arc::new(FourKibTargets { file: file.clone(), mapping, size, received_bytes: AtomicUsize::new(0) });
    let server = ServerHandle::start(vec![Export::new("t", device.clone())], ServerConfig::default()).await;
    let mut c = Raw::connect(&server).await;
    c.go("t", false, None).await;
    // Pipelined, at unaligned offsets; the small one is copied, the others received in place.
    let writes = [(0u64, 130 << 10), (5_000_001, 1 << 20), (7 << 20, 32 << 20), (40 << 20, 200_000), (41 << 20, 4096)];
    for (i, &(offset, len)) in writes.iter().enumerate() {
        c.request(0, cmd::WRITE, i as u64, offset, len as u32, &pattern(60 + i as u64, len)).await;
    }
    let mut answered: Vec<u64> = Vec::new();
    for _ in writes {
        let (error, cookie, _) = c.simple_reply(0).await;
        assert_eq!(error, 0, "cookie {cookie}");
        answered.push(cookie);
    }
    answered.sort();
    assert_eq!(answered, (0..writes.len() as u64).collect::<Vec<_>>());
    for (i, &(offset, len)) in writes.iter().enumerate() {
        let want = pattern(60 + i as u64, len);
        let mut got = vec![0u8; len];
        std::os::unix::fs::FileExt::read_exact_at(&*file, &mut got, offset + SHIFT).unwrap();
        assert!(got == want, "write {i} ({len} bytes at {offset}) landed wrong");
    }
    // From 1 MiB on, a payload cannot have been buffered whole with its header.
    let received = device.received_bytes.load(Ordering::Relaxed);
    let sure: usize = writes.iter().map(|w| w.1).filter(|&len| len >= 1 << 20).sum();
    let may: usize = writes.iter().map(|w| w.1).filter(|&len| len >= 128 << 10).sum();
    assert!((sure..=may).contains(&received), "received in place: {received} of {sure}..={may}");
    server.stop().await.unwrap();
}

/// Large WRITE payloads are received whole (the server asks the kernel not to wake it for
/// less than the rest of the payload), into a buffer ("mem") or straight into the mapped
/// pages of a tmpfs file ("counted"): whatever pieces and pauses they arrive in, each is
/// answered without anything more being sent, and lands intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_write_payloads_arriving_in_pieces_are_answered() {
    const KIB: usize = 1024;
    let shm = tempfile::NamedTempFile::new_in("/dev/shm").expect("a file on /dev/shm (tmpfs)");
    shm.as_file().set_len(64 << 20).unwrap();
    let file = nbd_server::FileDevice::open(shm.path(), false).unwrap();
    assert!(file.receive_writes_in_place(), "tmpfs writes of 128 KiB and more are received in place");
    let shm_device = Arc::new(CountingInPlace { inner: file, received_bytes: AtomicUsize::new(0) });
    let dir = tempfile::tempdir().unwrap();
    let (mut exports, _) = standard_exports(dir.path()).await;
    exports.push(Export::new("counted", shm_device.clone()));
    let server = ServerHandle::start(exports, ServerConfig::default()).await;
    // (payload length, sizes of the first pieces; one more piece holds the rest). The
    // header goes with the first piece.
    let cases: [(usize, &[usize]); 7] = [
        (1024 * KIB, &[0, 900 * KIB, 100 * KIB]), // header alone, then a rest under 128 KiB
        (1024 * KIB, &[924 * KIB]),               // most at once, then a rest under 128 KiB
        (1024 * KIB, &[10 * KIB, 1]),
        (4096 * KIB, &[64 * KIB, 64 * KIB, 3000 * KIB]),
        (128 * KIB, &[64 * KIB]),
        (130 * KIB, &[130 * KIB]), // all at once, partly buffered with the header
        (32 * 1024 * KIB, &[5000 * KIB, 20000 * KIB]), // the largest payload, over the kernel's cap
    ];
    for export in ["mem", "counted"] {
        let mut c = Raw::connect(&server).await;
        c.go(export, false, None).await;
        let mut offset = 0u64;
        for (i, (len, sizes)) in cases.into_iter().enumerate() {
            let data = pattern(40 + i as u64, len);
            let message = request_message(0, cmd::WRITE, i as u64, offset, len as u32, &data);
            let mut rest = &message[..];
            for (n, &size) in sizes.iter().chain([&usize::MAX]).enumerate() {
                let with_header = if n == 0 { REQUEST_HEADER_LEN } else { 0 };
                let (piece, tail) = rest.split_at(size.saturating_add(with_header).min(rest.len()));
                c.send(piece).await;
                rest = tail;
                tokio::time::sleep(Duration::from_millis(30)).await;
            }
            let (error, cookie, _) = c.simple_reply(0).await;
            assert_eq!((error, cookie), (0, i as u64), "{export} case {i}: answered with nothing more sent");
            for at in (0..len).step_by(1 << 20) {
                let n = (len - at).min(1 << 20);
                let got = c.read_ok(offset + at as u64, n as u32).await;
                assert!(got == data[at..at + n], "{export} case {i}: bytes at {at}");
            }
            offset += len as u64;
        }
    }
    // A payload that arrived whole with its header is taken from the buffer; from 1 MiB on
    // none can be, so those are surely received in place.
    let received = shm_device.received_bytes.load(Ordering::Relaxed);
    let large: usize = cases.iter().map(|(len, _)| *len).filter(|&len| len >= 1 << 20).sum();
    let total: usize = cases.iter().map(|(len, _)| len).sum();
    assert!((large..=total).contains(&received), "received in place: {received} of {large}..={total}");
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_ranges_are_sent_whole_or_the_connection_closes() {
    const MIB: usize = 1 << 20;
    let shm = tempfile::NamedTempFile::new_in("/dev/shm").expect("a file on /dev/shm (tmpfs)");
    let data = pattern(11, 4 * MIB);
    std::fs::write(shm.path(), &data).unwrap();
    let device = nbd_server::FileDevice::open(shm.path(), false).unwrap();
    assert!(device.send_file_reads(), "tmpfs reads of 128 KiB and more go out as file ranges");
    let server = ServerHandle::start(vec![Export::new("shm", Arc::new(device))], ServerConfig::default()).await;

    // Pipelined large (file range) and small (pread) reads, both framings: every reply whole.
    for structured in [false, true] {
        let mut c = Raw::connect(&server).await;
        c.go("shm", structured, None).await;
        let reads: Vec<(u64, u32)> =
            (0..12u64).map(|i| if i % 3 == 2 { (i * 4096 + 512, 4096) } else { (i * 99_999, MIB as u32) }).collect();
        for (i, &(offset, len)) in reads.iter().enumerate() {
            c.request(0, cmd::READ, i as u64, offset, len, &[]).await;
        }
        let mut seen = HashMap::new();
        for _ in &reads {
            let (cookie, got) = if structured {
                let chunks = c.chunks().await;
                assert_eq!(chunks.len(), 1, "one OFFSET_DATA chunk with DONE");
                assert_eq!(chunks[0].0.chunk_type, reply_type::OFFSET_DATA);
                (chunks[0].0.cookie, chunks[0].1[8..].to_vec())
            } else {
                let h = decode_simple_reply(&c.read_exact(16).await).unwrap();
                assert_eq!(h.error, 0);
                (h.cookie, c.read_exact(reads[h.cookie as usize].1 as usize).await)
            };
            let (offset, len) = reads[cookie as usize];
            assert!(got == data[offset as usize..offset as usize + len as usize], "cookie {cookie}: wrong bytes");
            assert!(seen.insert(cookie, ()).is_none(), "cookie {cookie} answered twice");
        }
    }

    // A large write is received into a mapping of the file (made now, at the file's size).
    let mut c = Raw::connect(&server).await;
    c.go("shm", false, None).await;
    c.request(0, cmd::WRITE, 7, 3 * MIB as u64, MIB as u32, &data[3 * MIB..]).await;
    assert_eq!(c.simple_reply(0).await.0, 0);

    // The file shrinks under the server: the promised bytes cannot be sent, so the
    // connection ends short of them; no padding, no panic, other connections unaffected.
    std::fs::OpenOptions::new().write(true).open(shm.path()).unwrap().set_len(MIB as u64 + MIB as u64 / 2).unwrap();
    let mut c = Raw::connect(&server).await;
    c.go("shm", false, None).await;
    c.request(0, cmd::READ, 1, MIB as u64, MIB as u32, &[]).await;
    let mut received = Vec::new();
    tokio::time::timeout(TIMEOUT, c.stream.read_to_end(&mut received)).await.expect("closed in time").ok();
    assert!(received.len() < 16 + MIB, "a short file must not yield a whole reply ({} bytes)", received.len());
    if received.len() > 16 {
        assert!(received[16..] == data[MIB..MIB + received.len() - 16], "what was sent is the file's bytes");
    }
    // A write into mapped pages past the new end: the kernel's copy faults there (EFAULT,
    // no SIGBUS), so what is left of the payload is written with pwrite, which extends the
    // file as any write would; the write is answered and reads back. One write lies wholly
    // past the end, two straddle it (the copy stops short at the fault; in the second, with
    // most of the payload buffered with the header, less than 128 KiB is left to receive).
    let mut c = Raw::connect(&server).await;
    c.go("shm", false, None).await;
    let new_end = MIB as u64 + MIB as u64 / 2;
    for (cookie, offset, len) in
        [(8u64, 2 * MIB as u64, MIB), (9, new_end - 256 * 1024, MIB), (10, new_end - 100 * 1024, 130 * 1024)]
    {
        std::fs::OpenOptions::new().write(true).open(shm.path()).unwrap().set_len(new_end).unwrap();
        let payload = pattern(20 + cookie, len);
        c.request(0, cmd::WRITE, cookie, offset, len as u32, &payload).await;
        assert_eq!(c.simple_reply(0).await, (0, cookie, vec![]), "write at {offset} answered");
        assert!(c.read_ok(offset, len as u32).await == payload, "write at {offset} reads back");
    }
    let mut c = Raw::connect(&server).await;
    c.go("shm", false, None).await;
    assert!(c.read_ok(0, 4096).await == data[..4096]);
    server.stop().await.unwrap();
}

/// Clients that stall while holding the whole byte pool — one never reads the replies to its
/// READs, one announces a 64 MiB WRITE and sends nothing — are closed after the stall timeout,
/// so a normal client's 64 MiB READ, which needs the pool, is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_stall_holding_the_pool_are_closed_after_the_stall_timeout() {
    let config = ServerConfig {
        max_in_flight_bytes: 128 << 20,
        stall_timeout: Duration::from_secs(1),
        ..ServerConfig::default()
    };
    let server = ServerHandle::start(vec![Export::new("mem", Arc::new(MemoryDevice::new(256 << 20)))], config).await;
    // Each may hold its share: max(pool / 4, 64 MiB) = 64 MiB, half the pool.
    let mut reader = Raw::connect(&server).await;
    reader.go("mem", false, None).await;
    for k in 0..16u64 {
        reader.request(0, cmd::READ, k, k * (8 << 20), 8 << 20, &[]).await;
    }
    let mut writer = Raw::connect(&server).await;
    writer.go("mem", false, None).await;
    writer.send(&request_message(0, cmd::WRITE, 1, 0, 64 << 20, b"only a little")).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    let mut c = Raw::connect(&server).await;
    c.go("mem", false, None).await;
    c.request(0, cmd::READ, 7, 0, 64 << 20, &[]).await;
    let (error, cookie, data) = tokio::time::timeout(Duration::from_secs(20), c.simple_reply(64 << 20))
        .await
        .expect("the 64 MiB READ is answered once the stalled clients are closed");
    assert_eq!((error, cookie, data.len()), (0, 7, 64 << 20));
    println!("answered after {:?}", started.elapsed());
    // Both stalled connections were closed: the writer sees EOF; the reader gets what the
    // socket buffers held, then EOF or a reset.
    writer.expect_closed().await;
    let mut sink = Vec::new();
    let drained = tokio::time::timeout(TIMEOUT, reader.stream.read_to_end(&mut sink)).await;
    assert!(drained.is_ok(), "the stalled reader's connection was closed");
    server.stop().await.unwrap();
}

/// 20 clients that stall — 10 never read the replies to their 8 MiB READs, 5 announce a 32 MiB
/// WRITE and never send its payload, 5 stop in the handshake — hold only their fair share of
/// the byte budget: for 30 s a normal client's 4 KiB write+read pairs are each answered within
/// 2 s (before the fair share, the stalled READs took the whole 256 MiB pool and the normal
/// client waited until they went away).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_clients_do_not_starve_a_normal_one() {
    let config = ServerConfig { handshake_timeout: Duration::from_secs(120), ..ServerConfig::default() };
    let server = ServerHandle::start(vec![Export::new("mem", Arc::new(MemoryDevice::new(512 << 20)))], config).await;
    let mut stalled = Vec::new();
    for _ in 0..10 {
        let mut c = Raw::connect(&server).await;
        c.go("mem", false, None).await;
        for k in 0..32u64 {
            c.request(0, cmd::READ, k, (k % 60) * (8 << 20), 8 << 20, &[]).await;
        }
        stalled.push(c);
    }
    for i in 0..5u64 {
        let mut c = Raw::connect(&server).await;
        c.go("mem", false, None).await;
        c.send(&request_message(0, cmd::WRITE, i, 0, 32 << 20, &[])).await;
        stalled.push(c);
    }
    for _ in 0..5 {
        let mut c = Raw::connect(&server).await;
        c.greeting().await;
        stalled.push(c);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;

    let mut normal = Raw::connect(&server).await;
    normal.go("mem", false, None).await;
    let started = Instant::now();
    let mut pairs = 0u64;
    while started.elapsed() < Duration::from_secs(30) {
        let offset = (pairs % 1024) * 4096 + (500 << 20);
        let data = pattern(pairs, 4096);
        let asked = Instant::now();
        let pair = async {
            normal.request(0, cmd::WRITE, 2 * pairs, offset, 4096, &data).await;
            let (error, cookie, _) = normal.simple_reply(0).await;
            assert_eq!((error, cookie), (0, 2 * pairs));
            normal.read_ok(offset, 4096).await
        };
        let back = tokio::time::timeout(Duration::from_secs(2), pair)
            .await
            .unwrap_or_else(|_| panic!("pair {pairs} not answered within 2 s while 20 clients stall"));
        assert!(back == data, "pair {pairs}: read back what was written");
        assert!(asked.elapsed() < Duration::from_secs(2));
        pairs += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(pairs > 100, "only {pairs} pairs in 30 s");
    drop(stalled);
    server.stop().await.unwrap();
}

/// With `idle_timeout`, a connection that sends nothing is closed; one whose request is still
/// in flight is not, however long the device takes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_are_closed_after_the_idle_timeout() {
    let device = GatedDevice::new(16 << 20);
    let config = ServerConfig { idle_timeout: Some(Duration::from_millis(300)), ..ServerConfig::default() };
    let server = ServerHandle::start(vec![Export::new("gated", device.clone())], config).await;
    let mut idle = Raw::connect(&server).await;
    idle.go("gated", false, None).await;
    let since = Instant::now();
    idle.expect_closed().await;
    assert!(since.elapsed() >= Duration::from_millis(250), "closed too early: {:?}", since.elapsed());

    let mut busy = Raw::connect(&server).await;
    busy.go("gated", false, None).await;
    busy.request(0, cmd::READ, 1, 0, 4096, &[]).await;
    device.wait_arrived(1).await;
    tokio::time::sleep(Duration::from_millis(900)).await;
    device.release(0);
    let (error, cookie, _) = busy.simple_reply(4096).await;
    assert_eq!((error, cookie), (0, 1), "a request in flight keeps the connection");
    busy.expect_closed().await;
    server.stop().await.unwrap();
}
