//! The kernel's NBD netlink family (`include/uapi/linux/nbd-netlink.h`): attach sockets to
//! `/dev/nbdN` (`NBD_CMD_CONNECT`), replace dead ones (`NBD_CMD_RECONFIGURE`), detach
//! (`NBD_CMD_DISCONNECT`), and the `NBD_CMD_LINK_DEAD` events of the `nbd_mc_group`
//! multicast group, sent once for each connection the driver finds dead.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::Duration;

use super::netlink::{Attrs, GenlSocket, Message, attr_u32, parse_attrs};

const FAMILY: &str = "nbd";
const GROUP: &str = "nbd_mc_group";
const VERSION: u8 = 1;

const CMD_CONNECT: u8 = 1;
const CMD_DISCONNECT: u8 = 2;
const CMD_RECONFIGURE: u8 = 3;
const CMD_LINK_DEAD: u8 = 4;

const ATTR_INDEX: u16 = 1;
const ATTR_SIZE_BYTES: u16 = 2;
const ATTR_BLOCK_SIZE_BYTES: u16 = 3;
const ATTR_TIMEOUT: u16 = 4;
const ATTR_SERVER_FLAGS: u16 = 5;
const ATTR_SOCKETS: u16 = 7;
const ATTR_DEAD_CONN_TIMEOUT: u16 = 8;
const SOCK_ITEM: u16 = 1;
const SOCK_FD: u16 = 1;

/// What the driver is told about the device when it is attached.
pub struct DeviceSetup {
    pub index: u32,
    pub size_bytes: u64,
    pub block_size_bytes: u64,
    /// The export's transmission flags, as the server sent them.
    pub server_flags: u64,
    /// A request unanswered this long is requeued and its connection marked dead.
    pub request_timeout: Duration,
    /// How long requests wait for a connection to be replaced when none is alive.
    pub dead_conn_timeout: Duration,
}

/// The NBD family: one socket for requests, one for the link-dead events.
pub struct NbdFamily {
    requests: GenlSocket,
    id: u16,
}

impl NbdFamily {
    /// Looks the family up and joins its multicast group on `events` (a nonblocking socket
    /// the caller polls); joined before any device is attached, so no event is missed.
    pub fn open(events: &GenlSocket) -> io::Result<Self> {
        let mut requests = GenlSocket::open(false)?;
        let family = requests.family(FAMILY).map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => io::Error::new(
                io::ErrorKind::NotFound,
                "it is not loaded: run `modprobe nbd` (the nbd module of the running kernel)",
            ),
            _ => e,
        })?;
        let group = family
            .groups
            .iter()
            .find(|(name, _)| name == GROUP)
            .map(|(_, id)| *id)
            .ok_or_else(|| io::Error::other(format!("the NBD family has no {GROUP:?} multicast group")))?;
        events.join_group(group)?;
        Ok(Self { requests, id: family.id })
    }

    pub fn connect(&mut self, setup: &DeviceSetup, sockets: &[OwnedFd]) -> io::Result<()> {
        let attrs = Attrs::default()
            .u32(ATTR_INDEX, setup.index)
            .u64(ATTR_SIZE_BYTES, setup.size_bytes)
            .u64(ATTR_BLOCK_SIZE_BYTES, setup.block_size_bytes)
            .u64(ATTR_SERVER_FLAGS, setup.server_flags)
            .u64(ATTR_TIMEOUT, setup.request_timeout.as_secs().max(1))
            .u64(ATTR_DEAD_CONN_TIMEOUT, setup.dead_conn_timeout.as_secs())
            .nested(ATTR_SOCKETS, socket_items(sockets));
        self.requests.request(self.id, CMD_CONNECT, VERSION, attrs).map(drop)
    }

    /// Gives the driver `socket` in place of a dead connection of device `index` (the
    /// driver ignores it when none is dead).
    pub fn reconfigure(&mut self, index: u32, socket: &OwnedFd) -> io::Result<()> {
        let attrs =
            Attrs::default().u32(ATTR_INDEX, index).nested(ATTR_SOCKETS, socket_items(std::slice::from_ref(socket)));
        self.requests.request(self.id, CMD_RECONFIGURE, VERSION, attrs).map(drop)
    }

    pub fn disconnect(&mut self, index: u32) -> io::Result<()> {
        self.requests.request(self.id, CMD_DISCONNECT, VERSION, Attrs::default().u32(ATTR_INDEX, index)).map(drop)
    }

    /// The device whose connection died, when `message` is a link-dead event of this family.
    pub fn link_dead(&self, message: &Message) -> Option<u32> {
        if message.family != self.id || message.command != CMD_LINK_DEAD {
            return None;
        }
        parse_attrs(&message.attrs).into_iter().find(|(kind, _)| *kind == ATTR_INDEX).and_then(|(_, p)| attr_u32(p))
    }
}

fn socket_items(sockets: &[OwnedFd]) -> Attrs {
    sockets.iter().fold(Attrs::default(), |items, socket| {
        items.nested(SOCK_ITEM, Attrs::default().u32(SOCK_FD, socket.as_raw_fd() as u32))
    })
}
