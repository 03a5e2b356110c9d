//! Generic netlink (genetlink(7)) as far as the kernel's NBD family needs it: a socket,
//! family and multicast-group lookup through the controller, requests answered by an ACK
//! (or an errno), attributes built and parsed with their 4-byte alignment, and received
//! multicast messages. Written here because the crates that exist attach a device but do
//! not reconfigure it or listen for dead links.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

const NETLINK_GENERIC: libc::c_int = 16;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;
const GENL_ID_CTRL: u16 = 0x10;
const CTRL_CMD_GETFAMILY: u8 = 3;
const CTRL_ATTR_FAMILY_ID: u16 = 1;
const CTRL_ATTR_FAMILY_NAME: u16 = 2;
const CTRL_ATTR_MCAST_GROUPS: u16 = 7;
const CTRL_ATTR_MCAST_GRP_NAME: u16 = 1;
const CTRL_ATTR_MCAST_GRP_ID: u16 = 2;
const NLA_F_NESTED: u16 = 0x8000;
const NLA_TYPE_MASK: u16 = 0x3fff;
const SOL_NETLINK: libc::c_int = 270;
const NETLINK_ADD_MEMBERSHIP: libc::c_int = 1;
const NLMSG_HEADER_LEN: usize = 16;
const GENL_HEADER_LEN: usize = 4;
/// Receive buffer: the NBD family's messages are a few dozen bytes; the controller's reply
/// for a family is well under 1 KiB.
const RECV_BUFFER_BYTES: usize = 16 * 1024;

/// Attributes of one message, built in order.
#[derive(Default)]
pub struct Attrs(Vec<u8>);

impl Attrs {
    pub fn u32(mut self, kind: u16, value: u32) -> Self {
        self.put(kind, &value.to_ne_bytes());
        self
    }

    pub fn u64(mut self, kind: u16, value: u64) -> Self {
        self.put(kind, &value.to_ne_bytes());
        self
    }

    pub fn string(mut self, kind: u16, value: &str) -> Self {
        let mut bytes = value.as_bytes().to_vec();
        bytes.push(0);
        self.put(kind, &bytes);
        self
    }

    pub fn nested(mut self, kind: u16, inner: Attrs) -> Self {
        self.put(kind | NLA_F_NESTED, &inner.0);
        self
    }

    fn put(&mut self, kind: u16, payload: &[u8]) {
        let len = 4 + payload.len();
        self.0.extend_from_slice(&(len as u16).to_ne_bytes());
        self.0.extend_from_slice(&kind.to_ne_bytes());
        self.0.extend_from_slice(payload);
        self.0.resize(align4(self.0.len()), 0);
    }
}

fn align4(n: usize) -> usize {
    (n + 3) & !3
}

/// The attributes in `bytes` as (type without flags, payload); stops at the first malformed one.
pub fn parse_attrs(mut bytes: &[u8]) -> Vec<(u16, &[u8])> {
    let mut out = Vec::new();
    while bytes.len() >= 4 {
        let len = u16::from_ne_bytes([bytes[0], bytes[1]]) as usize;
        let kind = u16::from_ne_bytes([bytes[2], bytes[3]]) & NLA_TYPE_MASK;
        if len < 4 || len > bytes.len() {
            break;
        }
        out.push((kind, &bytes[4..len]));
        bytes = &bytes[align4(len).min(bytes.len())..];
    }
    out
}

pub fn attr_u32(payload: &[u8]) -> Option<u32> {
    Some(u32::from_ne_bytes(payload.get(..4)?.try_into().ok()?))
}

/// One generic netlink message received: its family, command and attribute bytes.
pub struct Message {
    pub family: u16,
    pub command: u8,
    pub attrs: Vec<u8>,
}

/// A NETLINK_GENERIC socket.
pub struct GenlSocket {
    fd: OwnedFd,
    next_seq: u32,
}

/// A family's id and its multicast groups (name, id).
pub struct Family {
    pub id: u16,
    pub groups: Vec<(String, u32)>,
}

impl GenlSocket {
    pub fn open(nonblocking: bool) -> io::Result<Self> {
        let flags = libc::SOCK_RAW | libc::SOCK_CLOEXEC | if nonblocking { libc::SOCK_NONBLOCK } else { 0 };
        // SAFETY: socket(2) with constant arguments; the result is checked before use.
        let raw = unsafe { libc::socket(libc::AF_NETLINK, flags, NETLINK_GENERIC) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a new descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: an all-zero sockaddr_nl is valid; the kernel assigns the port id.
        let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        addr.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        // SAFETY: `addr` is a valid sockaddr_nl of the size passed.
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&addr as *const libc::sockaddr_nl).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Self { fd, next_seq: 1 })
    }

    /// Looks `name` up through the controller; NotFound when the kernel has no such family
    /// (for "nbd": the module is not loaded).
    pub fn family(&mut self, name: &str) -> io::Result<Family> {
        let replies = self
            .request(GENL_ID_CTRL, CTRL_CMD_GETFAMILY, 2, Attrs::default().string(CTRL_ATTR_FAMILY_NAME, name))
            .map_err(|e| match e.raw_os_error() {
                Some(libc::ENOENT) => {
                    io::Error::new(io::ErrorKind::NotFound, format!("no generic netlink family {name:?}"))
                }
                _ => e,
            })?;
        let reply = replies.first().ok_or_else(|| io::Error::other("the controller sent no family"))?;
        let mut family = Family { id: 0, groups: Vec::new() };
        for (kind, payload) in parse_attrs(&reply.attrs) {
            match kind {
                CTRL_ATTR_FAMILY_ID if payload.len() >= 2 => family.id = u16::from_ne_bytes([payload[0], payload[1]]),
                CTRL_ATTR_MCAST_GROUPS => {
                    for (_, group) in parse_attrs(payload) {
                        let mut name = None;
                        let mut id = None;
                        for (k, p) in parse_attrs(group) {
                            match k {
                                CTRL_ATTR_MCAST_GRP_NAME => {
                                    name = Some(String::from_utf8_lossy(p).trim_end_matches('\0').to_string())
                                }
                                CTRL_ATTR_MCAST_GRP_ID => id = attr_u32(p),
                                _ => {}
                            }
                        }
                        if let (Some(name), Some(id)) = (name, id) {
                            family.groups.push((name, id));
                        }
                    }
                }
                _ => {}
            }
        }
        if family.id == 0 {
            return Err(io::Error::other(format!("the controller named no id for family {name:?}")));
        }
        Ok(family)
    }

    pub fn join_group(&self, group: u32) -> io::Result<()> {
        // SAFETY: setsockopt with a u32 value of the size passed.
        let rc = unsafe {
            libc::setsockopt(
                self.fd.as_raw_fd(),
                SOL_NETLINK,
                NETLINK_ADD_MEMBERSHIP,
                (&group as *const u32).cast(),
                std::mem::size_of::<u32>() as libc::socklen_t,
            )
        };
        if rc < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
    }

    /// Sends a request with ACK asked for and waits for the ACK: the messages of the family
    /// that came before it, or the errno it carries.
    pub fn request(&mut self, family: u16, command: u8, version: u8, attrs: Attrs) -> io::Result<Vec<Message>> {
        let seq = self.next_seq;
        self.next_seq = self.next_seq.wrapping_add(1);
        let len = NLMSG_HEADER_LEN + GENL_HEADER_LEN + attrs.0.len();
        let mut msg = Vec::with_capacity(len);
        msg.extend_from_slice(&(len as u32).to_ne_bytes());
        msg.extend_from_slice(&family.to_ne_bytes());
        msg.extend_from_slice(&(NLM_F_REQUEST | NLM_F_ACK).to_ne_bytes());
        msg.extend_from_slice(&seq.to_ne_bytes());
        msg.extend_from_slice(&0u32.to_ne_bytes());
        msg.extend_from_slice(&[command, version, 0, 0]);
        msg.extend_from_slice(&attrs.0);
        // SAFETY: `msg` is a valid buffer of `msg.len()` bytes.
        let sent = unsafe { libc::send(self.fd.as_raw_fd(), msg.as_ptr().cast(), msg.len(), 0) };
        if sent < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut replies = Vec::new();
        loop {
            for m in self.recv_raw()? {
                match m {
                    Raw::Ack { seq: s, errno } if s == seq => {
                        return if errno == 0 { Ok(replies) } else { Err(io::Error::from_raw_os_error(errno)) };
                    }
                    Raw::Genl { seq: s, message } if s == seq => replies.push(message),
                    _ => {}
                }
            }
        }
    }

    /// The generic netlink messages in the next datagram (multicast events on a socket that
    /// joined a group). WouldBlock on a nonblocking socket with nothing queued; ENOBUFS when
    /// the kernel dropped messages because the socket's buffer was full.
    pub fn receive(&self) -> io::Result<Vec<Message>> {
        Ok(self
            .recv_raw()?
            .into_iter()
            .filter_map(|m| match m {
                Raw::Genl { message, .. } => Some(message),
                Raw::Ack { .. } => None,
            })
            .collect())
    }

    fn recv_raw(&self) -> io::Result<Vec<Raw>> {
        let mut buf = vec![0u8; RECV_BUFFER_BYTES];
        // SAFETY: `buf` is a valid, writable buffer of `buf.len()` bytes.
        let n = unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut rest = &buf[..n as usize];
        let mut out = Vec::new();
        while rest.len() >= NLMSG_HEADER_LEN {
            let len = u32::from_ne_bytes(rest[0..4].try_into().expect("4 bytes")) as usize;
            let kind = u16::from_ne_bytes([rest[4], rest[5]]);
            let seq = u32::from_ne_bytes(rest[8..12].try_into().expect("4 bytes"));
            if len < NLMSG_HEADER_LEN || len > rest.len() {
                break;
            }
            let body = &rest[NLMSG_HEADER_LEN..len];
            match kind {
                NLMSG_ERROR if body.len() >= 4 => {
                    let code = i32::from_ne_bytes(body[..4].try_into().expect("4 bytes"));
                    out.push(Raw::Ack { seq, errno: -code });
                }
                NLMSG_DONE | NLMSG_ERROR => {}
                family if body.len() >= GENL_HEADER_LEN => out.push(Raw::Genl {
                    seq,
                    message: Message { family, command: body[0], attrs: body[GENL_HEADER_LEN..].to_vec() },
                }),
                _ => {}
            }
            rest = &rest[align4(len).min(rest.len())..];
        }
        Ok(out)
    }
}

impl AsRawFd for GenlSocket {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

enum Raw {
    Ack { seq: u32, errno: i32 },
    Genl { seq: u32, message: Message },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_are_aligned_nested_and_parsed_back() {
        let inner = Attrs::default().u32(1, 7);
        let attrs = Attrs::default().string(2, "nbd").nested(7, inner).u64(3, 1 << 40);
        assert_eq!(attrs.0.len() % 4, 0);
        let parsed = parse_attrs(&attrs.0);
        assert_eq!(parsed.len(), 3);
        assert_eq!(parsed[0], (2, &b"nbd\0"[..]));
        assert_eq!(parsed[1].0, 7, "the nested flag is masked off");
        assert_eq!(attr_u32(parse_attrs(parsed[1].1)[0].1), Some(7));
        assert_eq!(parsed[2].1, &(1u64 << 40).to_ne_bytes()[..]);
    }

    #[test]
    fn the_kernels_controller_names_itself() {
        let mut socket = GenlSocket::open(false).expect("a generic netlink socket");
        let family = socket.family("nlctrl").expect("the controller's own family");
        assert_eq!(family.id, GENL_ID_CTRL);
        assert!(family.groups.iter().any(|(name, _)| name == "notify"), "groups: {:?}", family.groups);
        let missing = socket.family("nosuchfamily").err().expect("an unknown family is an error");
        assert_eq!(missing.kind(), io::ErrorKind::NotFound, "{missing}");
    }

    #[test]
    fn malformed_attributes_stop_the_parse_without_panicking() {
        assert!(parse_attrs(&[0xff, 0xff, 1, 0, 0]).is_empty());
        assert!(parse_attrs(&[2, 0, 1, 0]).is_empty());
        assert_eq!(parse_attrs(&[4, 0, 1, 0, 9]).len(), 1);
    }
}
