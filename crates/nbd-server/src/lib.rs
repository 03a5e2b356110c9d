//! nbd-server: the NBD protocol, for any [`device::BlockDevice`]. (skeleton: the protocol
//! owner fills in connection, handshake, transmission, listener.)

pub mod device;
