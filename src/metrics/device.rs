//! `MeteredDevice`: wraps any NBD [`BlockDevice`] and records every request the server
//! hands it (per command: completions, errors, bytes, latency; requests in flight).
//!
//! It sits between the NBD server and the export's device, so it measures what clients
//! see, after the server's own checks. Every trait method is forwarded, including the ones
//! with default bodies (`cache`, `block_status`), so wrapping changes no behaviour.
//! READ bytes answered as file ranges (sent from the files' pages) are counted apart as well.
//! The cost per request: two clock reads, a few relaxed atomic adds, and one boxed future
//! (the trait returns boxed futures, so the wrapper cannot reuse the inner one's box).

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Instant;

use bytes::Bytes;
use nbd_server::device::{
    BlockDevice, DeviceFuture, DeviceInfo, DeviceResult, Extent, ReadChunk, WriteTarget, ZeroFlags,
};

use super::op_stats::OpStats;

/// The NBD commands a device sees, as labelled in the metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Read,
    Write,
    Flush,
    Trim,
    WriteZeroes,
    Cache,
    BlockStatus,
}

impl Command {
    pub const ALL: [Command; 7] = [
        Command::Read,
        Command::Write,
        Command::Flush,
        Command::Trim,
        Command::WriteZeroes,
        Command::Cache,
        Command::BlockStatus,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Command::Read => "read",
            Command::Write => "write",
            Command::Flush => "flush",
            Command::Trim => "trim",
            Command::WriteZeroes => "write_zeroes",
            Command::Cache => "cache",
            Command::BlockStatus => "block_status",
        }
    }
}

/// Request statistics of one export.
#[derive(Debug, Default)]
pub struct ExportStats {
    ops: [OpStats; Command::ALL.len()],
    in_flight: AtomicI64,
    /// READ bytes answered as file ranges (sent from the member files' pages).
    read_in_place_bytes: AtomicU64,
    /// WRITE bytes received straight into member files.
    write_in_place_bytes: AtomicU64,
}

impl ExportStats {
    pub fn op(&self, command: Command) -> &OpStats {
        &self.ops[command as usize]
    }

    pub fn in_flight(&self) -> i64 {
        self.in_flight.load(Ordering::Relaxed)
    }

    pub fn read_in_place_bytes(&self) -> u64 {
        self.read_in_place_bytes.load(Ordering::Relaxed)
    }

    pub fn write_in_place_bytes(&self) -> u64 {
        self.write_in_place_bytes.load(Ordering::Relaxed)
    }
}

/// Counts a request in flight until dropped (completed or abandoned).
struct InFlight<'a>(&'a AtomicI64);

impl<'a> InFlight<'a> {
    fn enter(counter: &'a AtomicI64) -> Self {
        counter.fetch_add(1, Ordering::Relaxed);
        Self(counter)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

pub struct MeteredDevice {
    inner: Arc<dyn BlockDevice>,
    stats: Arc<ExportStats>,
}

impl MeteredDevice {
    pub fn new(inner: Arc<dyn BlockDevice>, stats: Arc<ExportStats>) -> Self {
        Self { inner, stats }
    }

    /// Runs `request` and records it under `command`; `bytes` count when it succeeds.
    fn metered<'a, T: Send + 'a>(
        &'a self,
        command: Command,
        bytes: u64,
        request: impl Future<Output = DeviceResult<T>> + Send + 'a,
    ) -> DeviceFuture<'a, DeviceResult<T>> {
        let started = Instant::now();
        let in_flight = InFlight::enter(&self.stats.in_flight);
        Box::pin(async move {
            let result = request.await;
            self.stats.op(command).record(started, result.is_ok(), bytes);
            drop(in_flight);
            result
        })
    }
}

impl BlockDevice for MeteredDevice {
    fn info(&self) -> DeviceInfo {
        self.inner.info()
    }

    fn read(&self, offset: u64, len: u32) -> DeviceFuture<'_, DeviceResult<Vec<ReadChunk>>> {
        let read = self.inner.read(offset, len);
        self.metered(Command::Read, u64::from(len), async move {
            let chunks = read.await?;
            let in_place: usize = chunks.iter().filter(|c| matches!(c, ReadChunk::File(_))).map(ReadChunk::len).sum();
            self.stats.read_in_place_bytes.fetch_add(in_place as u64, Ordering::Relaxed);
            Ok(chunks)
        })
    }

    fn write(&self, offset: u64, data: Bytes, fua: bool) -> DeviceFuture<'_, DeviceResult<()>> {
        let len = data.len() as u64;
        self.metered(Command::Write, len, self.inner.write(offset, data, fua))
    }

    fn payload_alignment(&self) -> usize {
        self.inner.payload_alignment()
    }

    fn write_targets(&self, offset: u64, len: u32) -> DeviceFuture<'_, DeviceResult<Option<Vec<WriteTarget>>>> {
        self.inner.write_targets(offset, len)
    }

    fn write_received(&self, offset: u64, len: u32, fua: bool) -> DeviceFuture<'_, DeviceResult<()>> {
        let done = self.inner.write_received(offset, len, fua);
        self.metered(Command::Write, u64::from(len), async move {
            done.await?;
            self.stats.write_in_place_bytes.fetch_add(u64::from(len), Ordering::Relaxed);
            Ok(())
        })
    }

    fn flush(&self) -> DeviceFuture<'_, DeviceResult<()>> {
        self.metered(Command::Flush, 0, self.inner.flush())
    }

    fn trim(&self, offset: u64, len: u64, fua: bool) -> DeviceFuture<'_, DeviceResult<()>> {
        self.metered(Command::Trim, len, self.inner.trim(offset, len, fua))
    }

    fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> DeviceFuture<'_, DeviceResult<()>> {
        self.metered(Command::WriteZeroes, len, self.inner.write_zeroes(offset, len, flags))
    }

    fn cache(&self, offset: u64, len: u64) -> DeviceFuture<'_, DeviceResult<()>> {
        self.metered(Command::Cache, len, self.inner.cache(offset, len))
    }

    fn block_status(&self, offset: u64, len: u64) -> DeviceFuture<'_, DeviceResult<Vec<Extent>>> {
        self.metered(Command::BlockStatus, 0, self.inner.block_status(offset, len))
    }

    fn meta_contexts(&self) -> &'static [&'static str] {
        self.inner.meta_contexts()
    }

    fn context_status(&self, index: usize, offset: u64, len: u64) -> DeviceFuture<'_, DeviceResult<Vec<(u64, u32)>>> {
        self.inner.context_status(index, offset, len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nbd_server::device::DeviceErrorKind;
    use nbd_server::memory_device::MemoryDevice;

    #[tokio::test]
    async fn records_what_the_inner_device_did() {
        let stats = Arc::new(ExportStats::default());
        let inner: Arc<dyn BlockDevice> = Arc::new(MemoryDevice::new(1 << 20));
        let dev = MeteredDevice::new(inner.clone(), stats.clone());
        assert_eq!(dev.info(), inner.info());
        dev.write(4096, Bytes::from(vec![7u8; 8192]), false).await.unwrap();
        let data = dev.read(4096, 8192).await.unwrap();
        assert_eq!(data.iter().map(ReadChunk::len).sum::<usize>(), 8192);
        dev.flush().await.unwrap();
        dev.write_zeroes(0, 4096, ZeroFlags::default()).await.unwrap();
        dev.block_status(0, 4096).await.unwrap();
        let write = stats.op(Command::Write);
        assert_eq!((write.completed(), write.errors(), write.bytes()), (1, 0, 8192));
        assert_eq!(stats.op(Command::Read).bytes(), 8192);
        assert_eq!(stats.op(Command::Flush).completed(), 1);
        assert_eq!(stats.op(Command::WriteZeroes).bytes(), 4096);
        assert_eq!(stats.op(Command::BlockStatus).completed(), 1);
        assert_eq!(stats.op(Command::Trim).completed(), 0);
        assert_eq!(stats.in_flight(), 0);
        // A failing range: an error, no bytes.
        let memory = Arc::new(MemoryDevice::new(1 << 20));
        memory.inject_error(0..4096, DeviceErrorKind::Io);
        let dev = MeteredDevice::new(memory, stats.clone());
        let err = dev.read(0, 4096).await.expect_err("injected error");
        assert_eq!(err.kind, DeviceErrorKind::Io);
        let read = stats.op(Command::Read);
        assert_eq!((read.completed(), read.errors(), read.bytes()), (2, 1, 8192));
        assert_eq!(stats.in_flight(), 0);
    }

    /// A device with its own meta context and an alignment wish, to see them through.
    struct Wishful(MemoryDevice);

    impl BlockDevice for Wishful {
        fn info(&self) -> DeviceInfo {
            self.0.info()
        }
        fn read(&self, offset: u64, len: u32) -> DeviceFuture<'_, DeviceResult<Vec<ReadChunk>>> {
            self.0.read(offset, len)
        }
        fn write(&self, offset: u64, data: Bytes, fua: bool) -> DeviceFuture<'_, DeviceResult<()>> {
            self.0.write(offset, data, fua)
        }
        fn payload_alignment(&self) -> usize {
            512
        }
        fn flush(&self) -> DeviceFuture<'_, DeviceResult<()>> {
            self.0.flush()
        }
        fn trim(&self, offset: u64, len: u64, fua: bool) -> DeviceFuture<'_, DeviceResult<()>> {
            self.0.trim(offset, len, fua)
        }
        fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> DeviceFuture<'_, DeviceResult<()>> {
            self.0.write_zeroes(offset, len, flags)
        }
        fn meta_contexts(&self) -> &'static [&'static str] {
            &["test:context"]
        }
        fn context_status(&self, _: usize, _: u64, len: u64) -> DeviceFuture<'_, DeviceResult<Vec<(u64, u32)>>> {
            Box::pin(std::future::ready(Ok(vec![(len, 3)])))
        }
    }

    /// What the metered device does not measure, it passes through: the inner device's meta
    /// contexts (`raidnbd:sync`) and payload alignment stay visible with `--metrics`.
    #[tokio::test]
    async fn passes_through_what_it_does_not_measure() {
        let stats = Arc::new(ExportStats::default());
        let dev = MeteredDevice::new(Arc::new(Wishful(MemoryDevice::new(1 << 20))), stats);
        assert_eq!(dev.meta_contexts(), ["test:context"]);
        assert_eq!(dev.context_status(0, 0, 4096).await.unwrap(), [(4096, 3)]);
        assert_eq!(dev.payload_alignment(), 512);
    }

    #[tokio::test]
    async fn an_abandoned_request_leaves_no_request_in_flight() {
        let stats = Arc::new(ExportStats::default());
        let dev = MeteredDevice::new(Arc::new(MemoryDevice::new(1 << 20)), stats.clone());
        let pending = dev.read(0, 4096);
        assert_eq!(stats.in_flight(), 1);
        drop(pending);
        assert_eq!(stats.in_flight(), 0);
        assert_eq!(stats.op(Command::Read).completed(), 0);
    }
}
