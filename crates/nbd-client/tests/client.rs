//! The client against real servers (nbdkit's memory plugin, qemu-nbd over a Unix socket,
//! this project's nbd-server) and against a hostile one that breaks the protocol in each
//! way a READ's reply can: the client answers with an error, never with wrong bytes.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use futures::future::join_all;
use nbd_client::{Client, ClientConfig, ClientError, ExportAddress};
use nbd_server::protocol::consts::{STRUCTURED_REPLY_MAGIC, opt, rep, reply_flags, reply_type, tflags};
use nbd_server::protocol::framing::Framing;
use nbd_server::protocol::handshake_codec::{
    OPTION_HEADER_LEN, decode_option_header, encode_greeting, info_export_data, put_option_reply,
};
use nbd_server::protocol::request::{REQUEST_HEADER_LEN, decode_request_header};
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

fn require(tool: &str, package: &str) {
    let found =
        std::env::var_os("PATH").map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file())).unwrap_or(false);
    assert!(found, "{tool} is required: apt-get install {package}");
}

/// A server process, killed on drop.
struct Peer {
    child: Child,
    _dir: tempfile::TempDir,
    socket: PathBuf,
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn wait_for(path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !path.exists() {
        assert!(Instant::now() < deadline, "{} did not appear", path.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `nbdkit --exit-with-parent -U SOCKET ARGS...`.
fn nbdkit(args: &[&str]) -> Peer {
    require("nbdkit", "nbdkit");
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("nbdkit.sock");
    let child = Command::new("nbdkit")
        .args(["-f", "--exit-with-parent", "-U"])
        .arg(&socket)
        .args(args)
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start nbdkit");
    wait_for(&socket);
    Peer { child, _dir: dir, socket }
}

fn unix_address(peer: &Peer, export: &str) -> ExportAddress {
    ExportAddress::parse(&format!("nbd+unix:///{export}?socket={}", peer.socket.display())).unwrap()
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..len).map(|_| rng.random()).collect()
}

/// Pipelined random writes and reads checked against a model, then FLUSH, TRIM,
/// WRITE_ZEROES, FUA, and requests the export cannot take.
async fn exercise(client: &Client, seed: u64) {
    let size = client.details().size_bytes;
    let mut model = client.read(0, size as u32).await.expect("read the export");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    for round in 0..4u64 {
        // Disjoint writes in flight together.
        let slots = 32u64;
        let slot = size / slots;
        let writes: Vec<(u64, Vec<u8>)> = (0..slots)
            .map(|i| {
                let len = 512 * rng.random_range(1..=(slot / 512).min(512));
                let offset = i * slot + 512 * rng.random_range(0..=(slot - len) / 512);
                (offset, pattern(seed * 1000 + round * 100 + i, len as usize))
            })
            .collect();
        let results =
            join_all(writes.iter().map(|(off, d)| client.write(*off, Bytes::from(d.clone()), round % 2 == 0))).await;
        for r in results {
            r.expect("write");
        }
        for (off, d) in &writes {
            model[*off as usize..*off as usize + d.len()].copy_from_slice(d);
        }
        let reads: Vec<(u64, u32)> = (0..16)
            .map(|_| {
                let len = 512 * rng.random_range(1..=256u32);
                (512 * rng.random_range(0..(size - u64::from(len)) / 512), len)
            })
            .collect();
        let got = join_all(reads.iter().map(|&(off, len)| client.read(off, len))).await;
        for ((off, len), data) in reads.iter().zip(got) {
            assert!(
                data.expect("read") == model[*off as usize..(*off + u64::from(*len)) as usize],
                "read at {off}+{len}"
            );
        }
    }
    client.flush().await.expect("flush");
    if client.details().can(tflags::SEND_WRITE_ZEROES) {
        client.write_zeroes(4096, 8192, true, false).await.expect("write zeroes");
        model[4096..4096 + 8192].fill(0);
    }
    if client.details().can(tflags::SEND_TRIM) {
        client.trim(1 << 20, 4096, false).await.expect("trim is a hint and must not fail");
        let back = client.read(1 << 20, 4096).await.unwrap();
        model[1 << 20..(1 << 20) + 4096].copy_from_slice(&back);
    }
    assert!(client.read(0, size as u32).await.unwrap() == model, "whole export");
    // Block status, where the server took base:allocation: in order, at least one extent,
    // and every zero it claims reads as zero.
    if client.details().allocation_context.is_some() {
        let mut at = 0u64;
        while at < size {
            let extents = client.block_status(at, (size - at) as u32).await.expect("block status");
            assert!(!extents.is_empty());
            for (n, flags) in extents {
                let range = &model[at as usize..(at + u64::from(n)) as usize];
                assert!(flags & 2 == 0 || range.iter().all(|&b| b == 0), "zero claimed over data at {at}+{n}");
                at += u64::from(n);
            }
        }
    }
    // What the export cannot take fails that request only.
    assert!(matches!(client.read(size - 512, 1024).await, Err(ClientError::Invalid { .. })));
    assert!(matches!(client.read(0, client.details().max_payload_bytes + 512).await, Err(ClientError::Invalid { .. })));
    assert!(client.read(0, 512).await.is_ok(), "the connection goes on");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn talks_to_nbdkit_memory() {
    let peer = nbdkit(&["memory", "16M"]);
    let client = Client::connect(&unix_address(&peer, ""), &ClientConfig::default()).await.expect("connect");
    let d = *client.details();
    assert_eq!(d.size_bytes, 16 << 20);
    assert!(d.framing.structured() && d.can(tflags::SEND_FLUSH) && d.can(tflags::SEND_FUA));
    assert!(d.allocation_context.is_some(), "nbdkit takes base:allocation");
    exercise(&client, 1).await;
    client.disconnect().await.unwrap();
}

/// A handoff (the socket `raidnbd attach` gives the kernel) negotiates simple replies even
/// with a server that offers structured ones, and the socket then answers a READ with a
/// simple reply, blocking, as the kernel's driver expects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handoff_speaks_simple_replies() {
    use nbd_server::protocol::client_codec::encode_request_header;
    use nbd_server::protocol::consts::{SIMPLE_REPLY_MAGIC, cmd};
    use nbd_server::protocol::request::RequestHeader;
    use std::io::{Read, Write};
    let peer = nbdkit(&["memory", "1M"]);
    let address = unix_address(&peer, "");
    let client = Client::connect(&address, &ClientConfig::default()).await.expect("connect");
    client.write(4096, Bytes::from(vec![0x5a; 4096]), true).await.unwrap();
    assert!(client.details().framing.structured(), "nbdkit offers structured replies");
    let handoff = nbd_client::handoff(&address, Duration::from_secs(10)).await.expect("handoff");
    assert_eq!(handoff.details.framing, Framing::Simple);
    assert_eq!(handoff.details.allocation_context, None, "no meta context without structured replies");
    assert_eq!(handoff.details.size_bytes, 1 << 20);
    let mut socket = std::os::unix::net::UnixStream::from(handoff.socket);
    let read = RequestHeader { flags: 0, command: cmd::READ, cookie: 0xfeed, offset: 4096, length: 4096 };
    let reply = tokio::task::spawn_blocking(move || {
        socket.write_all(&encode_request_header(&read)).unwrap();
        let mut reply = vec![0u8; 16 + 4096];
        socket.read_exact(&mut reply).unwrap();
        reply
    })
    .await
    .unwrap();
    assert_eq!(u32::from_be_bytes(reply[..4].try_into().unwrap()), SIMPLE_REPLY_MAGIC);
    assert_eq!(u32::from_be_bytes(reply[4..8].try_into().unwrap()), 0, "no error");
    assert_eq!(u64::from_be_bytes(reply[8..16].try_into().unwrap()), 0xfeed);
    assert!(reply[16..].iter().all(|&b| b == 0x5a), "the bytes written before");
    let tls = ExportAddress::parse("nbds://alice@127.0.0.1:1/x?tls-psk-file=/k.psk").unwrap();
    let refused = nbd_client::handoff(&tls, Duration::from_secs(1)).await.unwrap_err();
    assert!(refused.to_string().contains("cannot speak TLS"), "{refused}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn talks_to_qemu_nbd() {
    require("qemu-nbd", "qemu-utils");
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("disk.raw");
    std::fs::File::create(&image).unwrap().set_len(8 << 20).unwrap();
    let socket = dir.path().join("qemu.sock");
    let child = Command::new("qemu-nbd")
        .args(["-f", "raw", "-x", "disk", "-k"])
        .arg(&socket)
        .arg(&image)
        .spawn()
        .expect("start qemu-nbd");
    wait_for(&socket);
    let peer = Peer { child, _dir: dir, socket };
    let client = Client::connect(&unix_address(&peer, "disk"), &ClientConfig::default()).await.expect("connect");
    assert_eq!(client.details().size_bytes, 8 << 20);
    // qemu-nbd speaks extended headers since 8.2 (qemu 10 from bookworm-backports here).
    let version = String::from_utf8(Command::new("qemu-nbd").arg("--version").output().unwrap().stdout).unwrap();
    let (major, minor) = qemu_version(&version);
    let expected = if (major, minor) >= (8, 2) { Framing::Extended } else { Framing::Structured };
    assert_eq!(client.details().framing, expected, "qemu-nbd {major}.{minor}");
    exercise(&client, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn talks_to_this_projects_server_over_tcp() {
    let device = Arc::new(nbd_server::MemoryDevice::new(8 << 20));
    let server = nbd_server::Server::new(vec![nbd_server::Export::new("m", device)], Default::default()).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { server.serve(listener, std::future::pending()).await });
    let address = ExportAddress::parse(&format!("nbd://127.0.0.1:{port}/m")).unwrap();
    let client = Client::connect(&address, &ClientConfig::default()).await.expect("connect");
    assert_eq!(client.details().framing, Framing::Extended, "this project's server has extended headers");
    exercise(&client, 3).await;
    // An export that does not exist is refused by name.
    let missing = ExportAddress::parse(&format!("nbd://127.0.0.1:{port}/nope")).unwrap();
    let refused = Client::connect(&missing, &ClientConfig::default()).await.err().expect("refused");
    assert!(matches!(refused, ClientError::Refused { .. }), "{refused}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_dies_fails_the_requests_in_flight() {
    // Every request takes 2 s, so some are in flight when the server is killed.
    let mut peer = nbdkit(&["--filter=delay", "memory", "4M", "rdelay=2", "wdelay=2"]);
    let client = Arc::new(Client::connect(&unix_address(&peer, ""), &ClientConfig::default()).await.unwrap());
    let reads: Vec<_> = (0..4u64)
        .map(|i| {
            let c = client.clone();
            tokio::spawn(async move { c.read(i * 4096, 4096).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    peer.child.kill().unwrap();
    for r in reads {
        let result = tokio::time::timeout(Duration::from_secs(10), r).await.expect("no hang").unwrap();
        assert!(matches!(result, Err(ClientError::ConnectionLost { .. })), "{result:?}");
    }
    assert!(client.closed().is_some());
    assert!(matches!(client.read(0, 512).await, Err(ClientError::ConnectionLost { .. })), "later requests fail too");
}

/// (major, minor) of `qemu-nbd --version`'s first line ("qemu-nbd 10.0.2 (...)").
fn qemu_version(text: &str) -> (u32, u32) {
    let version = text.split_whitespace().nth(1).expect("a version");
    let mut parts = version.split('.').map(|p| p.parse::<u32>().expect("a number"));
    (parts.next().unwrap(), parts.next().unwrap())
}

/// A server that negotiates properly, then answers the first READ with `reply(cookie, offset, len)`.
async fn hostile(reply: fn(u64, u64, u32) -> Vec<u8>) -> Result<Vec<u8>, ClientError> {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        s.write_all(&encode_greeting()).await.unwrap();
        let mut flags = [0u8; 4];
        s.read_exact(&mut flags).await.unwrap();
        // Structured replies (no extended headers, no meta context), then GO.
        loop {
            let mut h = [0u8; OPTION_HEADER_LEN];
            s.read_exact(&mut h).await.unwrap();
            let h = decode_option_header(&h).unwrap().unwrap();
            let mut data = vec![0u8; h.data_len as usize];
            s.read_exact(&mut data).await.unwrap();
            let mut out = BytesMut::new();
            match h.code {
                opt::GO => {
                    let flags = tflags::HAS_FLAGS | tflags::SEND_FLUSH;
                    put_option_reply(&mut out, opt::GO, rep::INFO, &info_export_data(1 << 20, flags));
                }
                opt::EXTENDED_HEADERS | opt::SET_META_CONTEXT => {
                    put_option_reply(&mut out, h.code, rep::ERR_UNSUP, &[])
                }
                _ => {}
            }
            if h.code != opt::EXTENDED_HEADERS && h.code != opt::SET_META_CONTEXT {
                put_option_reply(&mut out, h.code, rep::ACK, &[]);
            }
            s.write_all(&out).await.unwrap();
            if h.code == opt::GO {
                break;
            }
        }
        let mut h = [0u8; REQUEST_HEADER_LEN];
        s.read_exact(&mut h).await.unwrap();
        let h = decode_request_header(&h, nbd_server::protocol::framing::Framing::Structured).unwrap().unwrap();
        let _ = s.write_all(&reply(h.cookie, h.offset, h.length as u32)).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
    });
    let address = ExportAddress::parse(&format!("nbd://127.0.0.1:{port}/")).unwrap();
    let client = Client::connect(&address, &ClientConfig::default()).await.expect("connect");
    tokio::time::timeout(Duration::from_secs(10), client.read(4096, 4096)).await.expect("no hang")
}

fn chunk(flags: u16, kind: u16, cookie: u64, payload: &[u8]) -> Vec<u8> {
    let mut out = BytesMut::new();
    out.put_u32(STRUCTURED_REPLY_MAGIC);
    out.put_u16(flags);
    out.put_u16(kind);
    out.put_u64(cookie);
    out.put_u32(payload.len() as u32);
    out.put_slice(payload);
    out.to_vec()
}

fn data_chunk(flags: u16, cookie: u64, offset: u64, data: &[u8]) -> Vec<u8> {
    let mut payload = offset.to_be_bytes().to_vec();
    payload.extend_from_slice(data);
    chunk(flags, reply_type::OFFSET_DATA, cookie, &payload)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_server_gets_an_error_never_wrong_bytes() {
    // A well-formed reply in two chunks and a hole, to show the hostile rig works.
    let ok = hostile(|cookie, offset, _| {
        let mut r = data_chunk(0, cookie, offset + 2048, &[7u8; 2048]);
        let mut hole = (offset).to_be_bytes().to_vec();
        hole.extend_from_slice(&1024u32.to_be_bytes());
        r.extend(chunk(0, reply_type::OFFSET_HOLE, cookie, &hole));
        r.extend(data_chunk(reply_flags::DONE, cookie, offset + 1024, &[9u8; 1024]));
        r
    })
    .await
    .expect("a valid reply");
    assert!(ok[..1024] == [0u8; 1024] && ok[1024..2048] == [9u8; 1024] && ok[2048..] == [7u8; 2048]);

    type Reply = fn(u64, u64, u32) -> Vec<u8>;
    let cases: [(&str, Reply); 15] = [
        ("data whose offset plus length passes 2^64", |c, _, l| {
            data_chunk(reply_flags::DONE, c, u64::MAX - 100, &vec![1u8; l as usize])
        }),
        ("a hole whose offset plus length passes 2^64", |c, _, _| {
            let mut hole = (u64::MAX - 100).to_be_bytes().to_vec();
            hole.extend_from_slice(&4096u32.to_be_bytes());
            chunk(reply_flags::DONE, reply_type::OFFSET_HOLE, c, &hole)
        }),
        ("a hole before the request", |c, o, l| {
            let mut hole = (o - 512).to_be_bytes().to_vec();
            hole.extend_from_slice(&l.to_be_bytes());
            chunk(reply_flags::DONE, reply_type::OFFSET_HOLE, c, &hole)
        }),
        ("unknown reply flags", |c, o, l| data_chunk(reply_flags::DONE | 0x4, c, o, &vec![1u8; l as usize])),
        ("an unknown chunk type", |c, _, _| chunk(reply_flags::DONE, 77, c, &[0u8; 16])),
        ("a NONE chunk with a payload", |c, _, _| chunk(reply_flags::DONE, reply_type::NONE, c, &[0u8; 8])),
        ("an error chunk at an offset outside the request", |c, o, _| {
            let mut payload = 5u32.to_be_bytes().to_vec();
            payload.extend_from_slice(&0u16.to_be_bytes());
            payload.extend_from_slice(&(o + 1_000_000).to_be_bytes());
            chunk(reply_flags::DONE, reply_type::ERROR_OFFSET, c, &payload)
        }),
        ("a simple error reply to a READ after structured replies", |c, _, _| {
            let mut r = nbd_server::protocol::consts::SIMPLE_REPLY_MAGIC.to_be_bytes().to_vec();
            r.extend_from_slice(&5u32.to_be_bytes());
            r.extend_from_slice(&c.to_be_bytes());
            r
        }),
        ("data outside the request", |c, o, l| data_chunk(reply_flags::DONE, c, o + u64::from(l), &[1u8; 512])),
        ("data overlapping earlier data", |c, o, l| {
            let mut r = data_chunk(0, c, o, &vec![1u8; l as usize]);
            r.extend(data_chunk(reply_flags::DONE, c, o, &[2u8; 512]));
            r
        }),
        ("DONE before the request is covered", |c, o, _| data_chunk(reply_flags::DONE, c, o, &[1u8; 512])),
        ("a cookie not in flight", |c, o, l| data_chunk(reply_flags::DONE, c + 1, o, &vec![1u8; l as usize])),
        ("a chunk far longer than the request", |c, _, _| {
            let mut r = chunk(reply_flags::DONE, reply_type::OFFSET_DATA, c, &[]);
            r[16..20].copy_from_slice(&u32::MAX.to_be_bytes());
            r
        }),
        ("a simple reply to a READ after structured replies", |c, _, _| {
            let mut r = nbd_server::protocol::consts::SIMPLE_REPLY_MAGIC.to_be_bytes().to_vec();
            r.extend_from_slice(&0u32.to_be_bytes());
            r.extend_from_slice(&c.to_be_bytes());
            r.extend_from_slice(&[0u8; 4096]);
            r
        }),
        ("bad magic", |_, _, _| vec![0xde, 0xad, 0xbe, 0xef, 0, 0, 0, 0]),
    ];
    for (what, reply) in cases {
        let result = hostile(reply).await;
        assert!(
            matches!(result, Err(ClientError::Protocol { .. })),
            "{what}: the READ must fail with a protocol violation, got {:?}",
            result.map(|d| d.len())
        );
    }
    // An error chunk fails the READ with the server's errno, and only that request.
    let err = hostile(|c, o, _| {
        let mut payload = 5u32.to_be_bytes().to_vec(); // EIO
        payload.extend_from_slice(&4u16.to_be_bytes());
        payload.extend_from_slice(b"oops");
        payload.extend_from_slice(&o.to_be_bytes());
        chunk(reply_flags::DONE, reply_type::ERROR_OFFSET, c, &payload)
    })
    .await
    .unwrap_err();
    assert!(matches!(err, ClientError::Errno { errno: 5, .. }), "{err}");
}
