//! Test harness: servers on 127.0.0.1:0 with the standard exports, tool lookup, patterns.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use nbd_server::{BlockDevice, DeviceErrorKind, Export, FileDevice, MemoryDevice, Server, ServerConfig};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// Same bytes as `pattern()` in tests/py/nbdtest.py.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let block: Vec<u8> = (0..4096u64).map(|i| ((seed * 131 + i * 7 + (i >> 8)) & 0xff) as u8).collect();
    block.iter().copied().cycle().take(len).collect()
}

/// The devices behind the standard exports, for assertions.
pub struct StandardDevices {
    pub mem: Arc<MemoryDevice>,
    pub file_path: PathBuf,
}

/// Exports used by the Python scripts (sizes mirror `EXPORT_SIZES` in nbdtest.py):
/// `mem` 64 MiB (first, so the default export), `ro` 1 MiB read-only with pattern 9,
/// `bad` 1 MiB with injected errors, `aligned` 1 MiB with 4 KiB minimum block, a stripe
/// of 3 x 64 KiB as preferred block and a 64 KiB device payload limit, `file` 16 MiB file
/// (reads of 128 KiB and more sent as file ranges).
pub async fn standard_exports(dir: &Path) -> (Vec<Export>, StandardDevices) {
    let mem = Arc::new(MemoryDevice::new(64 << 20));
    let ro = Arc::new(MemoryDevice::new(1 << 20).read_only(true));
    ro.write(0, Bytes::from(pattern(9, 1 << 20)), false).await.expect("prefill ro");
    let bad = Arc::new(MemoryDevice::new(1 << 20));
    bad.inject_error(64 << 10..128 << 10, DeviceErrorKind::Io);
    bad.inject_error(128 << 10..192 << 10, DeviceErrorKind::NoSpace);
    bad.inject_error(192 << 10..256 << 10, DeviceErrorKind::NotSupported);
    bad.inject_error(256 << 10..320 << 10, DeviceErrorKind::ReadOnly);
    let aligned = Arc::new(MemoryDevice::new(1 << 20).block_sizes(4096, 3 * 65536, 65536));
    let file_path = dir.join("file.img");
    std::fs::File::create(&file_path).and_then(|f| f.set_len(16 << 20)).expect("create file.img");
    let mut file = FileDevice::open(&file_path, false).expect("open file.img");
    // Large reads go out with sendfile whatever filesystem the temporary directory is on.
    file.set_send_file_reads(true);
    let file = Arc::new(file);
    // A file on tmpfs: large reads go out from a mapping of it, large writes are received
    // into it. (Unlinked at once; the open file keeps it.)
    let shm_file = tempfile::NamedTempFile::new_in("/dev/shm").expect("a file on /dev/shm (tmpfs)");
    shm_file.as_file().set_len(16 << 20).expect("size the shm file");
    let shm = FileDevice::open(shm_file.path(), false).expect("open the shm file");
    assert!(shm.receive_writes_in_place() && shm.send_file_reads(), "tmpfs I/O goes in place");
    let exports = vec![
        Export::new("mem", mem.clone()).with_description("the main test disk"),
        Export::new("ro", ro),
        Export::new("bad", bad),
        Export::new("aligned", aligned),
        Export::new("file", file),
        Export::new("shm", Arc::new(shm)),
    ];
    (exports, StandardDevices { mem, file_path })
}

/// A server running in the current tokio runtime.
pub struct ServerHandle {
    pub addr: SocketAddr,
    shutdown: Option<oneshot::Sender<()>>,
    join: Option<JoinHandle<nbd_server::Result<()>>>,
}

impl ServerHandle {
    pub async fn start(exports: Vec<Export>, config: ServerConfig) -> Self {
        Self::start_with_tls(exports, config, None).await
    }

    pub async fn start_with_tls(exports: Vec<Export>, config: ServerConfig, tls: Option<nbd_server::Tls>) -> Self {
        let server = Server::with_tls(exports, config, tls).expect("valid server config");
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = oneshot::channel::<()>();
        let join = tokio::spawn(async move {
            server
                .serve(listener, async move {
                    let _ = rx.await;
                })
                .await
        });
        Self { addr, shutdown: Some(tx), join: Some(join) }
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Triggers shutdown and waits for `serve` to return.
    pub async fn stop(mut self) -> nbd_server::Result<()> {
        let _ = self.shutdown.take().expect("not stopped").send(());
        let join = self.join.take().expect("not stopped");
        tokio::time::timeout(Duration::from_secs(20), join).await.expect("server stopped in time").expect("serve task")
    }
}

/// A server with its own runtime, for tests that run blocking client processes.
pub struct TestServer {
    pub runtime: tokio::runtime::Runtime,
    pub handle: Option<ServerHandle>,
    pub devices: StandardDevices,
    _dir: tempfile::TempDir,
}

impl TestServer {
    pub fn standard() -> Self {
        Self::standard_with(ServerConfig::default())
    }

    pub fn standard_with(config: ServerConfig) -> Self {
        let runtime =
            tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
        let dir = tempfile::tempdir().expect("tempdir");
        let (handle, devices) = runtime.block_on(async {
            let (exports, devices) = standard_exports(dir.path()).await;
            (ServerHandle::start(exports, config).await, devices)
        });
        Self { runtime, handle: Some(handle), devices, _dir: dir }
    }

    pub fn port(&self) -> u16 {
        self.handle.as_ref().expect("running").port()
    }

    pub fn uri(&self, export: &str) -> String {
        format!("nbd://127.0.0.1:{}/{export}", self.port())
    }

    pub fn stop(mut self) {
        let handle = self.handle.take().expect("running");
        self.runtime.block_on(handle.stop()).expect("clean shutdown");
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(handle) = self.handle.take() {
            let _ = self.runtime.block_on(handle.stop());
        }
    }
}

/// Finds `program` on PATH (or as an absolute path), failing with the package to install.
pub fn require_tool(program: &str, debian_package: &str) -> PathBuf {
    let candidates: Vec<PathBuf> = if program.starts_with('/') {
        vec![PathBuf::from(program)]
    } else {
        let path = std::env::var_os("PATH").unwrap_or_default();
        let mut dirs: Vec<PathBuf> = std::env::split_paths(&path).collect();
        dirs.extend(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from));
        dirs.into_iter().map(|d| d.join(program)).collect()
    };
    candidates.into_iter().find(|p| p.is_file()).unwrap_or_else(|| {
        panic!("`{program}` is not installed: apt-get install {debian_package}");
    })
}

/// Runs a command, printing its output, and panics unless it succeeded.
pub fn run_ok(cmd: &mut Command) -> Output {
    let output = cmd.output().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    println!("$ {cmd:?}\n{stdout}{stderr}");
    assert!(output.status.success(), "{cmd:?} failed with {}:\n{stdout}\n{stderr}", output.status);
    output
}
