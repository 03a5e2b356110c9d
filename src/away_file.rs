//! Where `serve` keeps each array's away record (raid-core's `engine::AwayStore`): a file
//! `<state dir>/<array uuid>.away`, outside the members, where md never looks.
//!
//! The state directory is `--state-dir`, else systemd's `$STATE_DIRECTORY` (the unit's
//! `StateDirectory=raidnbd`), else `/var/lib/raidnbd`. A save writes a temporary file,
//! fsyncs it, renames it over the record and fsyncs the directory, so a crash leaves the old
//! record or the new one. Without a usable directory the record is kept in memory only (a
//! member that returns after a restart is then rebuilt whole), with a warning.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use raid_core::Member;
use raid_core::engine::{Array, AwayStart, AwayStore};
use raid_core::member::IoFuture;

/// The state directory to use.
pub fn state_dir(flag: Option<&Path>) -> PathBuf {
    if let Some(dir) = flag {
        return dir.to_path_buf();
    }
    // systemd passes a colon-separated list; ours names one directory.
    match std::env::var_os("STATE_DIRECTORY") {
        Some(v) if !v.is_empty() => PathBuf::from(v.to_string_lossy().split(':').next().unwrap_or_default()),
        _ => PathBuf::from("/var/lib/raidnbd"),
    }
}

pub struct FileAwayStore {
    path: PathBuf,
}

impl FileAwayStore {
    pub fn new(dir: &Path, uuid: &str) -> Self {
        Self { path: dir.join(format!("{uuid}.away")) }
    }

    /// The stored record, if there is one.
    pub fn load(&self) -> io::Result<Option<Vec<u8>>> {
        match std::fs::read(&self.path) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }
}

fn sync_dir(path: &Path) -> io::Result<()> {
    std::fs::File::open(path.parent().unwrap_or(Path::new(".")))?.sync_all()
}

fn save(path: &Path, image: &[u8]) -> io::Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("away.tmp");
    let mut file = std::fs::File::create(&tmp)?;
    file.write_all(image)?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)?;
    sync_dir(path)
}

fn remove(path: &Path) -> io::Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => sync_dir(path),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

async fn blocking(f: impl FnOnce() -> io::Result<()> + Send + 'static) -> io::Result<()> {
    tokio::task::spawn_blocking(f).await.unwrap_or_else(|e| Err(io::Error::other(e)))
}

impl AwayStore for FileAwayStore {
    fn save<'a>(&'a self, image: &'a [u8]) -> IoFuture<'a, io::Result<()>> {
        let (path, image) = (self.path.clone(), image.to_vec());
        Box::pin(blocking(move || save(&path, &image)))
    }

    fn remove(&self) -> IoFuture<'_, io::Result<()>> {
        let path = self.path.clone();
        Box::pin(blocking(move || remove(&path)))
    }
}

/// Starts the away record of `array` (assembled with `events`, clean or not) from the file in
/// `dir`, and logs how.
pub async fn track(array: &Array<dyn Member>, dir: &Path, uuid: &str, events: u64, clean: bool) -> AwayStart {
    let store = match std::fs::create_dir_all(dir) {
        Ok(()) => Some(FileAwayStore::new(dir, uuid)),
        Err(e) => {
            tracing::warn!(
                "state directory {}: {e}; the away record is kept in memory only (give --state-dir)",
                dir.display()
            );
            None
        }
    };
    let stored = match store.as_ref().map(FileAwayStore::load).transpose() {
        Ok(stored) => stored.flatten(),
        Err(e) => {
            tracing::warn!("cannot read the away record in {}: {e}", dir.display());
            None
        }
    };
    let store = store.map(|s| Arc::new(s) as Arc<dyn AwayStore>);
    let start = array.admin().track_away(store, stored.as_deref(), events, clean).await;
    match &start {
        AwayStart::Off | AwayStart::Idle => tracing::debug!("away record: {start}"),
        AwayStart::Untracked(_) => tracing::warn!("away record: {start}"),
        _ => tracing::info!("away record: {start}"),
    }
    start
}
