//! `raidnbd quickstart`: the embedded default for a first run. Four sparse 1 GiB member
//! files in a directory, a RAID5 over them (created once, reused afterwards), served on
//! 127.0.0.1:10809 as export "quickstart", with the commands that attach it printed.

use std::path::Path;

use anyhow::{Result, bail};

use crate::cli::{CreateArgs, ListenAddr, QuickstartArgs, ServeArgs};

pub const EXPORT: &str = "quickstart";
const MEMBERS: usize = 4;
const MEMBER_BYTES: u64 = 1 << 30;

pub async fn run(args: QuickstartArgs) -> Result<()> {
    std::fs::create_dir_all(&args.dir).map_err(|e| anyhow::anyhow!("cannot create {}: {e}", args.dir.display()))?;
    let paths: Vec<String> =
        (0..MEMBERS).map(|i| args.dir.join(format!("member{i}.img")).to_string_lossy().into_owned()).collect();
    let existing = paths.iter().filter(|p| Path::new(p).exists()).count();
    if existing == 0 {
        crate::create::run(CreateArgs {
            level: "5".into(),
            layout: None,
            chunk: Some(64 << 10),
            size: Some(MEMBER_BYTES),
            name: Some(EXPORT.into()),
            force: false,
            consistency_policy: None,
            integrity: None,
            write_journal: None,
            bitmap: None,
            bitmap_chunk: None,
            write_mostly: Vec::new(),
            members: paths.clone(),
        })
        .await?;
    } else if existing < MEMBERS {
        bail!("{} holds only some of the quickstart members; remove it or pick another --dir", args.dir.display());
    } else {
        println!("reusing the quickstart array in {}", args.dir.display());
    }
    let url = format!("nbd://{}/{EXPORT}", args.listen);
    let exe = std::env::current_exe().map(|p| p.display().to_string()).unwrap_or_else(|_| "raidnbd".into());
    println!(
        "\nServing a RAID5 of 4 x 1 GiB sparse members ({}) as export '{EXPORT}' on {}. Stop with Ctrl-C.\n\n\
         Look at it:       nbdinfo {url}\n\
         Use it from qemu: qemu-img info {url}\n\
         \x20                 qemu-system-x86_64 ... -drive file={url},format=raw,if=virtio\n\
         Attach as a disk: sudo modprobe nbd && sudo {exe} attach {url} /dev/nbd0 -C 2\n\
         \x20                 (it stays, reconnecting if raidnbd restarts; Ctrl-C detaches after umount)\n\
         \x20                 sudo mkfs.ext4 -E stride=16,stripe_width=48 /dev/nbd0 && sudo mount /dev/nbd0 /mnt\n",
        args.dir.display(),
        args.listen
    );
    crate::serve::run(ServeArgs {
        listen: vec![ListenAddr::Tcp(args.listen)],
        export: Some(EXPORT.into()),
        members: paths,
        ..ServeArgs::default()
    })
    .await
}
