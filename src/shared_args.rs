//! Argument groups and value types that several commands share (serve, bench, quickstart,
//! check): how members are opened and which write cache runs. The command definitions
//! (cli.rs, bench/args.rs) use them; they import nothing from either.

use clap::{Args, ValueEnum};
use member_io::IoEngine;

use crate::size::parse_size;

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum CacheMode {
    /// Acknowledge writes once they are on the members (safe; default).
    #[default]
    Writethrough,
    /// Acknowledge writes from memory and write them back later: faster, but writes not
    /// yet flushed are LOST if raidnbd dies.
    Writeback,
}

#[derive(Args, Debug, Clone, Default)]
pub struct MemberIoArgs {
    /// I/O engine for the members [default: auto].
    #[arg(long, value_enum)]
    pub io: Option<IoEngine>,
    /// Throttle each member to this bandwidth, bytes/s (e.g. 20M), like a cloud volume.
    #[arg(long, value_parser = parse_size, value_name = "RATE")]
    pub member_bw: Option<u64>,
    /// Throttle each member to this many I/O operations per second (e.g. 200).
    #[arg(long, value_name = "N")]
    pub member_iops: Option<u64>,
    /// Throttle all members of an export together to this bandwidth, bytes/s: the host's own
    /// link to its volumes, which striping cannot widen.
    #[arg(long, value_parser = parse_size, value_name = "RATE")]
    pub export_bw: Option<u64>,
    /// Open members with buffered I/O instead of O_DIRECT.
    #[arg(long)]
    pub buffered: bool,
    /// NBD members: opening one (connect, handshake, identity) and every request must finish
    /// within this; a lost or stalled connection is reconnected and its requests re-sent for
    /// up to this long before the member counts as failed (`30s`, `500ms`, `2m`; a plain
    /// number is seconds) [default: 30s].
    #[arg(long, value_name = "DURATION", value_parser = crate::duration::parse_duration)]
    pub member_timeout: Option<std::time::Duration>,
}
