//! End-to-end tests of the `raidnbd` binary: one test binary (link time matters on two
//! cores), one module per area.

mod util;

mod cli_errors;
mod crash;
mod ctl_rebuild;
mod serve_clients;
