//! A hostile NBD member server, written for the tests: an honest server of an in-memory
//! export (fixed newstyle, structured replies, READ / WRITE / FLUSH / TRIM / WRITE_ZEROES)
//! until it is armed with a [`Misbehaviour`]; then it misbehaves on the connections it has
//! and on every new one, until disarmed. Arming drops the connections it has, so the
//! client meets the misbehaviour at once, at reconnect time included.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::BytesMut;
use nbd_server::protocol::consts::{STRUCTURED_REPLY_MAGIC, cmd, opt, rep, reply_flags, reply_type, tflags};
use nbd_server::protocol::framing::Framing;
use nbd_server::protocol::handshake_codec::{
    OPTION_HEADER_LEN, decode_option_header, encode_greeting, info_export_data, put_option_reply,
};
use nbd_server::protocol::request::{REQUEST_HEADER_LEN, decode_request_header};

/// What the server does wrong once armed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Misbehaviour {
    Honest,
    /// Accepts, then sends nothing (not even the greeting).
    StallBeforeHandshake,
    /// Greets, then never answers an option.
    StallInOptions,
    /// Negotiates, then never answers a request (also the identity read of a reconnect).
    StallRequests,
    /// Answers a READ with its header and half its data, then nothing.
    StallMidReply,
    /// Sends every reply one byte every 100 ms.
    Drip,
    /// Accepts and closes at once.
    CloseAfterAccept,
    /// Answers the first request of each connection, then closes it.
    CloseAfterFirstReply,
    /// READ replies for another cookie.
    WrongCookie,
    /// READ data chunks 512 bytes longer than the request.
    WrongLength,
    /// READ data chunks at an offset whose end passes 2^64.
    OverflowingOffset,
    /// READ replies as valid chunks in reverse order (allowed: the data stays right).
    ChunksOutOfOrder,
    /// A chunk whose length field says almost 4 GiB.
    OversizedPayload,
    /// A chunk of a type the protocol does not have.
    UnknownReplyType,
    /// READs answered with an error chunk of an errno the protocol does not have.
    UnknownErrorCode,
}

struct State {
    data: Mutex<Vec<u8>>,
    mode: Mutex<Misbehaviour>,
    /// Streams of the connections open now (to drop them when armed).
    open: Mutex<Vec<TcpStream>>,
    accepts: AtomicU64,
}

/// The server; its thread runs until the test process ends.
pub struct HostileServer {
    pub port: u16,
    state: Arc<State>,
}

impl HostileServer {
    /// An honest export of `len_bytes` zero bytes on 127.0.0.1.
    pub fn start(len_bytes: usize) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("address").port();
        let state = Arc::new(State {
            data: Mutex::new(vec![0u8; len_bytes]),
            mode: Mutex::new(Misbehaviour::Honest),
            open: Mutex::new(Vec::new()),
            accepts: AtomicU64::new(0),
        });
        let shared = state.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                shared.accepts.fetch_add(1, Ordering::Relaxed);
                let state = shared.clone();
                std::thread::spawn(move || {
                    let _ = serve(&state, stream);
                });
            }
        });
        Self { port, state }
    }

    pub fn uri(&self) -> String {
        format!("nbd://127.0.0.1:{}/", self.port)
    }

    /// Misbehaves from now on, on new connections and (dropped now) old ones.
    pub fn arm(&self, mode: Misbehaviour) {
        *self.state.mode.lock().unwrap() = mode;
        for s in self.state.open.lock().unwrap().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    /// Connections accepted so far.
    pub fn accepts(&self) -> u64 {
        self.state.accepts.load(Ordering::Relaxed)
    }
}

fn mode(state: &State) -> Misbehaviour {
    *state.mode.lock().unwrap()
}

/// Holds the connection open, sending nothing, until it is dropped (armed again) or the
/// client gives up.
fn stall(stream: &mut TcpStream) -> std::io::Result<()> {
    let mut sink = [0u8; 4096];
    while stream.read(&mut sink)? > 0 {}
    Ok(())
}

/// One connection; it is shut down at the end (the clone kept for `arm` would hold it open).
fn serve(state: &State, mut stream: TcpStream) -> std::io::Result<()> {
    state.open.lock().unwrap().push(stream.try_clone()?);
    let served = negotiate(state, &mut stream);
    let _ = stream.shutdown(Shutdown::Both);
    served
}

fn negotiate(state: &State, stream: &mut TcpStream) -> std::io::Result<()> {
    match mode(state) {
        Misbehaviour::CloseAfterAccept => return Ok(()),
        Misbehaviour::StallBeforeHandshake => return stall(stream),
        _ => {}
    }
    stream.write_all(&encode_greeting())?;
    let mut flags = [0u8; 4];
    stream.read_exact(&mut flags)?;
    if mode(state) == Misbehaviour::StallInOptions {
        return stall(stream);
    }
    let size = state.data.lock().unwrap().len() as u64;
    loop {
        let mut h = [0u8; OPTION_HEADER_LEN];
        stream.read_exact(&mut h)?;
        let h = decode_option_header(&h).expect("an option").expect("whole");
        let mut data = vec![0u8; h.data_len as usize];
        stream.read_exact(&mut data)?;
        let mut out = BytesMut::new();
        match h.code {
            opt::STRUCTURED_REPLY => put_option_reply(&mut out, h.code, rep::ACK, &[]),
            opt::GO => {
                let flags = tflags::HAS_FLAGS
                    | tflags::SEND_FLUSH
                    | tflags::SEND_FUA
                    | tflags::SEND_TRIM
                    | tflags::SEND_WRITE_ZEROES;
                put_option_reply(&mut out, opt::GO, rep::INFO, &info_export_data(size, flags));
                put_option_reply(&mut out, opt::GO, rep::ACK, &[]);
                stream.write_all(&out)?;
                break;
            }
            opt::ABORT => return Ok(()),
            other => put_option_reply(&mut out, other, rep::ERR_UNSUP, &[]),
        }
        stream.write_all(&out)?;
    }
    transmission(state, stream)
}

fn simple_reply(cookie: u64, error: u32) -> Vec<u8> {
    let mut r = nbd_server::protocol::consts::SIMPLE_REPLY_MAGIC.to_be_bytes().to_vec();
    r.extend_from_slice(&error.to_be_bytes());
    r.extend_from_slice(&cookie.to_be_bytes());
    r
}

fn chunk(flags: u16, kind: u16, cookie: u64, payload: &[u8]) -> Vec<u8> {
    let mut r = STRUCTURED_REPLY_MAGIC.to_be_bytes().to_vec();
    r.extend_from_slice(&flags.to_be_bytes());
    r.extend_from_slice(&kind.to_be_bytes());
    r.extend_from_slice(&cookie.to_be_bytes());
    r.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    r.extend_from_slice(payload);
    r
}

fn data_chunk(flags: u16, cookie: u64, offset: u64, data: &[u8]) -> Vec<u8> {
    let mut payload = offset.to_be_bytes().to_vec();
    payload.extend_from_slice(data);
    chunk(flags, reply_type::OFFSET_DATA, cookie, &payload)
}

/// A READ's reply as `mode` sends it.
fn read_reply(mode: Misbehaviour, cookie: u64, offset: u64, data: &[u8]) -> Vec<u8> {
    let done = reply_flags::DONE;
    match mode {
        Misbehaviour::WrongCookie => data_chunk(done, cookie ^ 0x5a5a, offset, data),
        Misbehaviour::WrongLength => data_chunk(done, cookie, offset, &[data, &[0xee; 512]].concat()),
        Misbehaviour::OverflowingOffset => data_chunk(done, cookie, u64::MAX - 511, data),
        Misbehaviour::ChunksOutOfOrder if data.len() >= 1024 => {
            let half = data.len() / 2 / 512 * 512;
            let mut r = data_chunk(0, cookie, offset + half as u64, &data[half..]);
            r.extend(data_chunk(done, cookie, offset, &data[..half]));
            r
        }
        Misbehaviour::OversizedPayload => {
            let mut r = chunk(done, reply_type::OFFSET_DATA, cookie, &offset.to_be_bytes());
            r[16..20].copy_from_slice(&0xffff_fff0u32.to_be_bytes());
            r
        }
        Misbehaviour::UnknownReplyType => chunk(done, 0x77, cookie, data),
        Misbehaviour::UnknownErrorCode => {
            let mut payload = 4242u32.to_be_bytes().to_vec();
            payload.extend_from_slice(&3u16.to_be_bytes());
            payload.extend_from_slice(b"odd");
            chunk(done, reply_type::ERROR, cookie, &payload)
        }
        _ => data_chunk(done, cookie, offset, data),
    }
}

fn transmission(state: &State, stream: &mut TcpStream) -> std::io::Result<()> {
    let mut answered = 0u64;
    loop {
        let mut h = [0u8; REQUEST_HEADER_LEN];
        stream.read_exact(&mut h)?;
        let Ok(Some(h)) = decode_request_header(&h, Framing::Structured) else { return Ok(()) };
        let (offset, len) = (h.offset, h.length as usize);
        let mut payload = Vec::new();
        if h.command == cmd::WRITE {
            payload = vec![0u8; len];
            stream.read_exact(&mut payload)?;
        }
        let mode = mode(state);
        match mode {
            Misbehaviour::StallRequests => return stall(stream),
            Misbehaviour::CloseAfterFirstReply if answered > 0 => return Ok(()),
            _ => {}
        }
        let in_range = offset.checked_add(len as u64).is_some_and(|e| e <= state.data.lock().unwrap().len() as u64);
        let reply = match h.command {
            cmd::DISC => return Ok(()),
            _ if !in_range && h.command != cmd::FLUSH => simple_reply(h.cookie, 22),
            cmd::READ => {
                let data = state.data.lock().unwrap()[offset as usize..offset as usize + len].to_vec();
                if mode == Misbehaviour::StallMidReply {
                    let r = data_chunk(reply_flags::DONE, h.cookie, offset, &data);
                    stream.write_all(&r[..20 + 8 + len / 2])?;
                    return stall(stream);
                }
                read_reply(mode, h.cookie, offset, &data)
            }
            cmd::WRITE => {
                state.data.lock().unwrap()[offset as usize..offset as usize + len].copy_from_slice(&payload);
                simple_reply(h.cookie, 0)
            }
            cmd::TRIM | cmd::WRITE_ZEROES => {
                state.data.lock().unwrap()[offset as usize..offset as usize + len].fill(0);
                simple_reply(h.cookie, 0)
            }
            cmd::FLUSH => simple_reply(h.cookie, 0),
            _ => simple_reply(h.cookie, 22),
        };
        if mode == Misbehaviour::Drip {
            for byte in reply {
                stream.write_all(&[byte])?;
                std::thread::sleep(Duration::from_millis(100));
            }
        } else {
            stream.write_all(&reply)?;
        }
        answered += 1;
    }
}
