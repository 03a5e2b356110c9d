//! `raidnbd grow --add MEMBER... MEMBERS...`: grows an array at rest by members (md's
//! reshape, as `mdadm --grow --raid-devices N --add MEMBER` with the array stopped), then
//! moves the data to the end with a progress line. Interrupted (Ctrl-C, a crash), the next
//! `grow`, `serve` or the kernel continues from where the superblocks say; a reshape already
//! in progress is continued (with no `--add`).
//! A running array grows with `raidnbd ctl grow` (control.rs), which shares [`check_count`].

use std::io::IsTerminal;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Result, anyhow, bail};
use raid_core::Member;
use raid_core::engine::{Array, MaintenanceWork, Step};

use crate::cli::{GrowArgs, MemberIoArgs};
use crate::open::{MemberOpenOptions, open_array, open_member};
use crate::size::human_bytes;

/// Bytes moved per step (one window: a checkpoint each).
const STEP_BYTES: u64 = 16 << 20;

/// `--raid-devices`, when given, must be the members now plus those added.
pub fn check_count(array: &Array<dyn Member>, raid_devices: Option<usize>, added: usize) -> Result<()> {
    let now = array.geometry().raid_disks();
    match raid_devices {
        Some(n) if n != now + added => bail!(
            "--raid-devices {n}: the array has {now} members and {added} are added; raidnbd grows onto the members \
             given with --add"
        ),
        _ => Ok(()),
    }
}

pub async fn run(args: GrowArgs) -> Result<()> {
    let options = MemberOpenOptions { io: MemberIoArgs::default(), ..MemberOpenOptions::default() };
    let opened = open_array(&args.members, &options, false, false).await?;
    let array = opened.array;
    let name = opened.assembly.metadata.name();
    if array.is_read_only() {
        bail!("{name} can only be served read-only now (see the log): it is not grown");
    }
    if array.shape().reshape().is_none() {
        check_count(&array, args.grow.raid_devices, args.grow.add.len())?;
        let mut members: Vec<Arc<dyn Member>> = Vec::with_capacity(args.grow.add.len());
        for path in &args.grow.add {
            members.push(open_member(path, &options).await?);
        }
        array.admin().grow(members).await.map_err(|e| anyhow!("{e}"))?;
    } else {
        eprintln!("{name}: a reshape is in progress: continuing it");
    }
    let started = Instant::now();
    let tty = std::io::stderr().is_terminal();
    let mut last_percent = None;
    let result = loop {
        match array.maintenance().step(STEP_BYTES).await {
            Ok(Step::Finished(MaintenanceWork::Reshape)) => break Ok(()),
            Ok(Step::Worked { work: MaintenanceWork::Reshape, .. }) => {}
            Ok(other) => break Err(anyhow!("unexpected background work while growing: {other:?}")),
            Err(e) => break Err(anyhow!("{e}")),
        }
        let status = array.maintenance().status();
        let percent = status.done * 100 / status.total.max(1);
        if last_percent != Some(percent) && (tty || percent % 10 == 0) {
            eprint!(
                "{}grow: {percent}% ({} of {})",
                if tty { "\r" } else { "" },
                human_bytes(status.done * 512),
                human_bytes(status.total * 512)
            );
            if !tty {
                eprintln!();
            }
            last_percent = Some(percent);
        }
    };
    if tty {
        eprintln!();
    }
    // Whatever else is due (a resync after an unclean stop) is left to the next serve.
    array.shutdown().await.map_err(|e| anyhow!("{e}"))?;
    result?;
    println!(
        "grown {name}: {} members, {} in {:.1}s",
        array.geometry().raid_disks(),
        human_bytes(array.size_bytes()),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
