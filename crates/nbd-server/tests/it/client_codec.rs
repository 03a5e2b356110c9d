//! The client-side codecs (`protocol::client_codec`) are enough to speak to a real server:
//! a minimal client built from them alone negotiates structured replies and GO with block
//! sizes, then WRITEs with FUA, READs back (structured data chunks), FLUSHes, reads past the
//! end (an error chunk) and disconnects — against this crate's server.

use std::sync::Arc;

use bytes::BytesMut;
use nbd_server::protocol::client_codec::{
    ExportInfo, decode_error_chunk, decode_greeting, decode_info, decode_offset_data, decode_option_reply_header,
    encode_client_flags, encode_request_header, go_option_data, put_option,
};
use nbd_server::protocol::consts::{cmd, cmd_flags, info, opt, rep, reply_flags, reply_type};
use nbd_server::protocol::handshake_codec::{ClientFlags, GREETING_LEN, OPTION_REPLY_HEADER_LEN};
use nbd_server::protocol::reply::{decode_chunk_header, decode_simple_reply};
use nbd_server::protocol::request::RequestHeader;
use nbd_server::{Export, MemoryDevice, ServerConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::util::{ServerHandle, pattern};

async fn read_exact(s: &mut TcpStream, n: usize) -> Vec<u8> {
    let mut buf = vec![0u8; n];
    s.read_exact(&mut buf).await.expect("server closed early");
    buf
}

/// Reads one option reply: (header, data).
async fn option_reply(s: &mut TcpStream) -> (nbd_server::protocol::client_codec::OptionReplyHeader, Vec<u8>) {
    let header = read_exact(s, OPTION_REPLY_HEADER_LEN).await;
    let h = decode_option_reply_header(&header).unwrap().unwrap();
    let data = read_exact(s, h.data_len as usize).await;
    (h, data)
}

/// Reads structured chunks for one request until DONE: (data, error).
async fn structured_reply(s: &mut TcpStream, cookie: u64) -> (Vec<(u64, Vec<u8>)>, Option<(u32, String)>) {
    let mut data = Vec::new();
    let mut error = None;
    loop {
        let header = decode_chunk_header(&read_exact(s, 20).await).expect("a chunk header");
        assert_eq!(header.cookie, cookie);
        let payload = read_exact(s, header.payload_len as usize).await;
        match header.chunk_type {
            reply_type::OFFSET_DATA => data.push((decode_offset_data(&payload).unwrap(), payload[8..].to_vec())),
            reply_type::ERROR | reply_type::ERROR_OFFSET => {
                let (errno, message, _) = decode_error_chunk(&payload, header.chunk_type == reply_type::ERROR_OFFSET)
                    .expect("a well-formed error chunk");
                error = Some((errno, message));
            }
            reply_type::NONE => {}
            other => panic!("unexpected chunk type {other}"),
        }
        if header.flags & reply_flags::DONE != 0 {
            return (data, error);
        }
    }
}

async fn send_request(s: &mut TcpStream, command: u16, flags: u16, cookie: u64, offset: u64, length: u32) {
    let header = RequestHeader { flags, command, cookie, offset, length: length.into() };
    s.write_all(&encode_request_header(&header)).await.unwrap();
}

#[tokio::test]
async fn a_client_made_of_the_client_codecs_talks_to_the_server() {
    const SIZE: u64 = 4 << 20;
    let server =
        ServerHandle::start(vec![Export::new("disk", Arc::new(MemoryDevice::new(SIZE)))], ServerConfig::default())
            .await;
    let mut s = TcpStream::connect(server.addr).await.unwrap();

    let greeting = decode_greeting(&read_exact(&mut s, GREETING_LEN).await).unwrap().unwrap();
    assert!(greeting.fixed_newstyle);
    s.write_all(&encode_client_flags(ClientFlags { fixed_newstyle: true, no_zeroes: greeting.no_zeroes }))
        .await
        .unwrap();

    let mut out = BytesMut::new();
    put_option(&mut out, opt::STRUCTURED_REPLY, &[]);
    put_option(&mut out, opt::GO, &go_option_data("disk", &[info::BLOCK_SIZE]));
    s.write_all(&out).await.unwrap();
    let (h, _) = option_reply(&mut s).await;
    assert_eq!((h.option, h.reply_type), (opt::STRUCTURED_REPLY, rep::ACK));
    let mut size = None;
    let mut block = None;
    loop {
        let (h, data) = option_reply(&mut s).await;
        assert_eq!(h.option, opt::GO);
        assert!(!h.is_error(), "GO refused: {}", String::from_utf8_lossy(&data));
        if h.reply_type == rep::ACK {
            break;
        }
        assert_eq!(h.reply_type, rep::INFO);
        match decode_info(&data).unwrap() {
            ExportInfo::Export { size_bytes, .. } => size = Some(size_bytes),
            ExportInfo::BlockSize { min_bytes, preferred_bytes, max_payload_bytes } => {
                block = Some((min_bytes, preferred_bytes, max_payload_bytes))
            }
            _ => {}
        }
    }
    assert_eq!(size, Some(SIZE));
    let (min, _, max) = block.expect("block sizes were asked for");
    assert!(min >= 1 && max >= 1 << 20);

    // WRITE with FUA (simple reply header: structured replies still use it for non-READs).
    let data = pattern(7, 64 << 10);
    send_request(&mut s, cmd::WRITE, cmd_flags::FUA, 1, 8192, data.len() as u32).await;
    s.write_all(&data).await.unwrap();
    let reply = decode_simple_reply(&read_exact(&mut s, 16).await).expect("a simple reply");
    assert_eq!((reply.cookie, reply.error), (1, 0));

    send_request(&mut s, cmd::READ, 0, 2, 8192, data.len() as u32).await;
    let (chunks, error) = structured_reply(&mut s, 2).await;
    assert!(error.is_none());
    let mut back = vec![0u8; data.len()];
    for (offset, bytes) in chunks {
        let at = (offset - 8192) as usize;
        back[at..at + bytes.len()].copy_from_slice(&bytes);
    }
    assert!(back == data, "read back what was written");

    send_request(&mut s, cmd::FLUSH, 0, 3, 0, 0).await;
    let reply = decode_simple_reply(&read_exact(&mut s, 16).await).expect("a simple reply");
    assert_eq!((reply.cookie, reply.error), (3, 0));

    // Past the end: an error chunk, and the connection goes on.
    send_request(&mut s, cmd::READ, 0, 4, SIZE, 4096).await;
    let (_, error) = structured_reply(&mut s, 4).await;
    assert!(error.is_some_and(|(errno, _)| errno != 0), "an error for a read past the end");

    send_request(&mut s, cmd::DISC, 0, 5, 0, 0).await;
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).await.unwrap();
    assert!(rest.is_empty(), "nothing after DISC");
    server.stop().await.unwrap();
}
