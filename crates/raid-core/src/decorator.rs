//! Member decorators without the forwarding: a [`Decoration`] says what a wrapper adds
//! around each operation (wait, fail, count), and [`Decorated`] forwards every [`Member`]
//! method to the inner member through it. Throttling, fault injection and metrics are
//! decorations (member-io, the binary); a new one writes its hooks only.
//!
//! Rules every decorated member keeps:
//! - a failed [`Gate`] fails the operation before it reaches the inner member, and the
//!   buffer comes back untouched;
//! - the in-place paths (`memory_file*`) are closed (`None`) unless the decoration opts in
//!   with [`Decoration::in_place`]: a throttle or a fault injector must see every byte;
//! - a decoration may change the bytes a read returns ([`Decoration::after_read`]) or
//!   store others than a write carries ([`Decoration::stored_instead`]): fault injection of
//!   a member that is wrong without an error. The caller's buffers are never changed by a
//!   write.

use std::fs::File;
use std::io;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;

use crate::allocation::Allocation;
use crate::buf::AlignedBuf;
use crate::member::{BufResult, IoFuture, Member};

/// What kind of member operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpKind {
    Read,
    Write,
    Flush,
    Discard,
    WriteZeroes,
}

impl OpKind {
    pub const ALL: [OpKind; 5] = [OpKind::Read, OpKind::Write, OpKind::Flush, OpKind::Discard, OpKind::WriteZeroes];

    /// Lower-case name, as in logs and metric labels.
    pub fn name(self) -> &'static str {
        match self {
            OpKind::Read => "read",
            OpKind::Write => "write",
            OpKind::Flush => "flush",
            OpKind::Discard => "discard",
            OpKind::WriteZeroes => "write_zeroes",
        }
    }
}

/// One member operation as a decoration sees it (`len_bytes` 0 for a flush).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemberOp {
    pub kind: OpKind,
    pub offset_bytes: u64,
    pub len_bytes: u64,
}

/// What happens before an operation reaches the inner member.
pub enum Gate<'a> {
    /// Go on at once (no allocation on the common path).
    Pass,
    /// Fail the operation with this error.
    Fail(io::Error),
    /// Wait for this future first; its error fails the operation.
    Wait(IoFuture<'a, io::Result<()>>),
}

/// The hooks of a member decorator.
pub trait Decoration: Send + Sync {
    /// Called before every operation.
    fn gate(&self, op: MemberOp) -> Gate<'_> {
        let _ = op;
        Gate::Pass
    }

    /// Called when an operation that passed the gate has finished.
    fn finished(&self, op: MemberOp, started: Instant, ok: bool) {
        let _ = (op, started, ok);
    }

    /// Whether [`after_read`](Self::after_read) or [`stored_instead`](Self::stored_instead)
    /// may act (the data path only goes through them then). `false` by default.
    fn alters_data(&self) -> bool {
        false
    }

    /// The bytes a successful read returned, before the engine sees them: a decoration may
    /// change them (fault injection: a member that returns wrong bytes without an error).
    /// Nothing by default.
    fn after_read(&self, op: MemberOp, data: &mut [u8]) {
        let _ = (op, data);
    }

    /// The bytes a write is about to store: `Some` stores these instead (fault injection: a
    /// member that stores wrong bytes, as bit rot or a misdirected write). `None` by default.
    fn stored_instead(&self, op: MemberOp, data: &[u8]) -> Option<AlignedBuf> {
        let _ = (op, data);
        None
    }

    /// Whether the in-place paths stay open through this decoration; `kind` is `Read` for
    /// `memory_file` and `Write` for `memory_file_for_write`, and the call may count the
    /// bytes handed out. Default: closed.
    fn in_place(&self, kind: OpKind, len_bytes: u64) -> bool {
        let _ = (kind, len_bytes);
        false
    }
}

/// `inner` with `decoration` around every operation.
pub struct Decorated<M, D> {
    inner: M,
    decoration: D,
}

impl<M: Member, D: Decoration> Decorated<M, D> {
    pub fn new(inner: M, decoration: impl Into<D>) -> Self {
        Self { inner, decoration: decoration.into() }
    }

    pub fn inner(&self) -> &M {
        &self.inner
    }

    pub fn decoration(&self) -> &D {
        &self.decoration
    }

    /// Runs `io` (which starts the inner member's operation: some members do the work when
    /// called, not when polled) once the gate has passed.
    fn run<'a>(
        &'a self,
        op: MemberOp,
        io: impl FnOnce() -> IoFuture<'a, io::Result<()>> + Send + 'a,
    ) -> IoFuture<'a, io::Result<()>> {
        let gate = self.decoration.gate(op);
        Box::pin(async move {
            match gate {
                Gate::Pass => {}
                Gate::Fail(e) => return Err(e),
                Gate::Wait(wait) => wait.await?,
            }
            let started = Instant::now();
            let result = io().await;
            self.decoration.finished(op, started, result.is_ok());
            result
        })
    }

    /// Like `run` for operations that carry a buffer: the buffer goes to the inner member
    /// only once the gate has passed, so a failed gate hands it back untouched.
    fn run_buf<'a>(
        &'a self,
        op: MemberOp,
        buf: AlignedBuf,
        io: impl FnOnce(AlignedBuf) -> IoFuture<'a, BufResult> + Send + 'a,
    ) -> IoFuture<'a, BufResult> {
        let gate = self.decoration.gate(op);
        Box::pin(async move {
            let gated = match gate {
                Gate::Pass => Ok(()),
                Gate::Fail(e) => Err(e),
                Gate::Wait(wait) => wait.await,
            };
            if let Err(e) = gated {
                return (Err(e), buf);
            }
            let started = Instant::now();
            let (result, buf) = io(buf).await;
            self.decoration.finished(op, started, result.is_ok());
            (result, buf)
        })
    }
}

impl<M: Member, D: Decoration> Member for Decorated<M, D> {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn len_bytes(&self) -> u64 {
        self.inner.len_bytes()
    }

    fn refresh_len(&self) -> IoFuture<'_, io::Result<u64>> {
        self.inner.refresh_len()
    }

    fn alignment(&self) -> usize {
        self.inner.alignment()
    }

    fn memory_alignment(&self) -> usize {
        self.inner.memory_alignment()
    }

    fn read_at(&self, offset_bytes: u64, buf: AlignedBuf) -> IoFuture<'_, BufResult> {
        let op = MemberOp { kind: OpKind::Read, offset_bytes, len_bytes: buf.len() as u64 };
        if !self.decoration.alters_data() {
            return self.run_buf(op, buf, move |buf| self.inner.read_at(offset_bytes, buf));
        }
        self.run_buf(op, buf, move |buf| {
            Box::pin(async move {
                let (result, mut buf) = self.inner.read_at(offset_bytes, buf).await;
                if result.is_ok() {
                    self.decoration.after_read(op, buf.as_mut_slice());
                }
                (result, buf)
            })
        })
    }

    fn write_at(&self, offset_bytes: u64, buf: AlignedBuf, fua: bool) -> IoFuture<'_, BufResult> {
        let op = MemberOp { kind: OpKind::Write, offset_bytes, len_bytes: buf.len() as u64 };
        if !self.decoration.alters_data() {
            return self.run_buf(op, buf, move |buf| self.inner.write_at(offset_bytes, buf, fua));
        }
        self.run_buf(op, buf, move |buf| {
            Box::pin(async move {
                match self.decoration.stored_instead(op, buf.as_slice()) {
                    // Other bytes go to the member; the caller gets its own buffer back.
                    Some(instead) => (self.inner.write_at(offset_bytes, instead, fua).await.0, buf),
                    None => self.inner.write_at(offset_bytes, buf, fua).await,
                }
            })
        })
    }

    fn write_slice_at<'a>(&'a self, offset_bytes: u64, data: &'a [u8], fua: bool) -> IoFuture<'a, io::Result<()>> {
        let op = MemberOp { kind: OpKind::Write, offset_bytes, len_bytes: data.len() as u64 };
        if !self.decoration.alters_data() {
            return self.run(op, move || self.inner.write_slice_at(offset_bytes, data, fua));
        }
        self.run(op, move || match self.decoration.stored_instead(op, data) {
            Some(instead) => Box::pin(async move { self.inner.write_at(offset_bytes, instead, fua).await.0 }),
            None => self.inner.write_slice_at(offset_bytes, data, fua),
        })
    }

    fn write_shared_at(&self, offset_bytes: u64, pieces: Vec<Bytes>, fua: bool) -> IoFuture<'_, io::Result<()>> {
        let len_bytes = pieces.iter().map(Bytes::len).sum::<usize>() as u64;
        let op = MemberOp { kind: OpKind::Write, offset_bytes, len_bytes };
        if !self.decoration.alters_data() {
            return self.run(op, move || self.inner.write_shared_at(offset_bytes, pieces, fua));
        }
        self.run(op, move || {
            Box::pin(async move {
                let joined = crate::member::join_pieces(&pieces);
                match self.decoration.stored_instead(op, joined.as_slice()) {
                    Some(instead) => self.inner.write_at(offset_bytes, instead, fua).await.0,
                    None => self.inner.write_at(offset_bytes, joined, fua).await.0,
                }
            })
        })
    }

    fn memory_file(&self, offset_bytes: u64, len_bytes: u64) -> Option<Arc<File>> {
        let file = self.inner.memory_file(offset_bytes, len_bytes)?;
        self.decoration.in_place(OpKind::Read, len_bytes).then_some(file)
    }

    fn memory_file_for_write(&self, offset_bytes: u64, len_bytes: u64) -> Option<Arc<File>> {
        let file = self.inner.memory_file_for_write(offset_bytes, len_bytes)?;
        self.decoration.in_place(OpKind::Write, len_bytes).then_some(file)
    }

    fn flush(&self) -> IoFuture<'_, io::Result<()>> {
        let op = MemberOp { kind: OpKind::Flush, offset_bytes: 0, len_bytes: 0 };
        self.run(op, || self.inner.flush())
    }

    fn discard(&self, offset_bytes: u64, len_bytes: u64) -> IoFuture<'_, io::Result<()>> {
        let op = MemberOp { kind: OpKind::Discard, offset_bytes, len_bytes };
        self.run(op, move || self.inner.discard(offset_bytes, len_bytes))
    }

    fn write_zeroes(&self, offset_bytes: u64, len_bytes: u64) -> IoFuture<'_, io::Result<()>> {
        let op = MemberOp { kind: OpKind::WriteZeroes, offset_bytes, len_bytes };
        self.run(op, move || self.inner.write_zeroes(offset_bytes, len_bytes))
    }

    fn cache(&self, offset_bytes: u64, len_bytes: u64) -> IoFuture<'_, io::Result<()>> {
        self.inner.cache(offset_bytes, len_bytes)
    }

    fn zeroes_fast(&self) -> bool {
        self.inner.zeroes_fast()
    }

    /// Passed on ungated: it reads no data, so a throttle need not pace it nor a fault
    /// injector fail it.
    fn allocation(&self, offset_bytes: u64, len_bytes: u64) -> IoFuture<'_, io::Result<Vec<Allocation>>> {
        self.inner.allocation(offset_bytes, len_bytes)
    }

    fn retire(&self, why: &str) {
        self.inner.retire(why)
    }

    fn integrity(&self) -> Option<crate::integrity::IntegrityReport> {
        self.inner.integrity()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use futures::executor::block_on;

    use super::*;
    use crate::member::MemoryMember;

    /// Fails writes, records what finished.
    #[derive(Default)]
    struct Recorder {
        fail_writes: bool,
        finished: Mutex<Vec<(OpKind, u64, bool)>>,
    }

    impl Decoration for Recorder {
        fn gate(&self, op: MemberOp) -> Gate<'_> {
            if self.fail_writes && op.kind != OpKind::Read {
                Gate::Fail(io::Error::other("injected"))
            } else {
                Gate::Pass
            }
        }
        fn finished(&self, op: MemberOp, _started: Instant, ok: bool) {
            self.finished.lock().unwrap().push((op.kind, op.len_bytes, ok));
        }
    }

    #[test]
    fn a_failed_gate_never_reaches_the_inner_member() {
        let m = Decorated::<_, Recorder>::new(
            MemoryMember::new("m", 8192),
            Recorder { fail_writes: true, ..Default::default() },
        );
        let (res, buf) = block_on(m.write_at(0, AlignedBuf::from_slice(&[7; 4096]), false));
        assert!(res.is_err());
        assert_eq!(buf.as_slice(), &[7; 4096][..], "the buffer comes back untouched");
        // MemoryMember writes when called, not when polled: the gate must come first.
        assert!(block_on(m.write_slice_at(0, &[9; 512], false)).is_err());
        assert!(block_on(m.write_zeroes(0, 512)).is_err() && block_on(m.discard(0, 512)).is_err());
        assert!(m.inner().snapshot().iter().all(|&b| b == 0), "nothing reached the member");
        assert!(m.decoration().finished.lock().unwrap().is_empty());
    }

    #[test]
    fn operations_pass_through_and_are_reported() {
        let m = Decorated::<_, Recorder>::new(MemoryMember::new("m", 8192), Recorder::default());
        assert_eq!((m.name(), m.len_bytes(), m.alignment()), ("m", 8192, 1));
        block_on(m.write_slice_at(512, &[3; 512], true)).unwrap();
        let (res, buf) = block_on(m.read_at(512, AlignedBuf::zeroed(512)));
        res.unwrap();
        assert_eq!(buf.as_slice(), &[3; 512][..]);
        block_on(m.flush()).unwrap();
        let (res, _) = block_on(m.read_at(8192, AlignedBuf::zeroed(512)));
        assert!(res.is_err());
        assert_eq!(
            *m.decoration().finished.lock().unwrap(),
            vec![
                (OpKind::Write, 512, true),
                (OpKind::Read, 512, true),
                (OpKind::Flush, 0, true),
                (OpKind::Read, 512, false)
            ]
        );
        assert!(m.memory_file(0, 512).is_none(), "in-place paths are closed by default");
    }
}
