//! End-to-end tests of the `raidnbd` binary: one test binary (link time matters on two
//! cores), one module per area.

mod util;

mod bench;
mod cli_errors;
mod crash;
mod ctl_rebuild;
mod fairness;
mod grow;
mod hostile_server;
mod integrity;
mod io_shape;
mod journal;
mod level;
mod md_today;
mod metrics;
mod misbehaving_members;
mod remote_members;
mod restart;
mod serve_clients;
mod service;
mod shrink;
mod sparse;
mod tls;
mod write_cache;
