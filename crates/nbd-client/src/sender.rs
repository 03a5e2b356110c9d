//! The sending side of a connection: one task owns the socket's write half and sends what
//! the requests queue, as many queued requests per gathering write as it takes (up to
//! [`BATCH_PIECES`] buffers): at queue depth 32 that is a few `writev`s instead of 32 writes
//! of a header each, and a payload goes out from the caller's shared pieces, not a copy.
//!
//! A request is queued whole (header and payload) before its caller can be dropped, and sent
//! whole by the task: a cancelled caller never leaves half a request on the wire. The queue
//! is unbounded in messages but not in bytes: a data request holds the client's in-flight
//! byte budget from before it is queued until its reply is in. A failed send closes the
//! connection for every request (`Shared::close`).

use std::collections::VecDeque;
use std::io;
use std::sync::Arc;

use bytes::{Buf, Bytes};
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};

use crate::shared::{Closed, Shared};

/// Most buffers (headers and payload pieces) one gathering write takes.
const BATCH_PIECES: usize = 64;

/// What the sender is asked to send.
pub(crate) enum Outgoing {
    /// A request: its header, then its payload's pieces.
    Request(Bytes, Vec<Bytes>),
    /// NBD_CMD_DISC, then the write side is shut down; the outcome is reported.
    Disconnect(Bytes, oneshot::Sender<io::Result<()>>),
}

/// Sends what comes through `rx` on `writer` until every sender is gone, a send fails or the
/// client said goodbye.
pub(crate) async fn send_requests<W: AsyncWrite + Unpin>(
    mut writer: W,
    mut rx: mpsc::UnboundedReceiver<Outgoing>,
    shared: Arc<Shared>,
) {
    while let Some(first) = rx.recv().await {
        let mut batch = Pieces::default();
        let mut goodbye = None;
        let mut next = Some(first);
        while let Some(message) = next.take() {
            match message {
                Outgoing::Request(header, payload) => batch.push(header, payload),
                Outgoing::Disconnect(header, done) => {
                    batch.push(header, Vec::new());
                    goodbye = Some(done);
                    break;
                }
            }
            if batch.0.len() < BATCH_PIECES {
                next = rx.try_recv().ok();
            }
        }
        let sent = async {
            writer.write_all_buf(&mut batch).await?;
            writer.flush().await
        }
        .await;
        if let Some(done) = goodbye {
            let shut = match sent {
                Ok(()) => writer.shutdown().await,
                Err(e) => Err(e),
            };
            let _ = done.send(shut);
            return;
        }
        if let Err(e) = sent {
            shared.close(Closed::lost(format!("sending a request failed: {e}")));
            return;
        }
    }
}

/// Requests on their way out, as one `Buf` whose `chunks_vectored` hands every header and
/// payload piece to one gathering write.
#[derive(Default)]
struct Pieces(VecDeque<Bytes>);

impl Pieces {
    fn push(&mut self, header: Bytes, payload: Vec<Bytes>) {
        self.0.extend(std::iter::once(header).chain(payload).filter(|p| !p.is_empty()));
    }
}

impl Buf for Pieces {
    fn remaining(&self) -> usize {
        self.0.iter().map(Bytes::len).sum()
    }

    fn chunk(&self) -> &[u8] {
        self.0.front().map_or(&[], |p| p)
    }

    fn advance(&mut self, mut cnt: usize) {
        while cnt > 0 {
            let front = self.0.front_mut().expect("advance within remaining");
            if cnt < front.len() {
                front.advance(cnt);
                return;
            }
            cnt -= front.len();
            self.0.pop_front();
        }
    }

    fn chunks_vectored<'a>(&'a self, dst: &mut [io::IoSlice<'a>]) -> usize {
        let n = dst.len().min(self.0.len());
        for (slot, piece) in dst.iter_mut().zip(&self.0) {
            *slot = io::IoSlice::new(piece);
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_read_as_one_stream_in_order() {
        let mut p = Pieces::default();
        p.push(Bytes::from_static(b"head"), vec![Bytes::from_static(b"ab"), Bytes::new(), Bytes::from_static(b"cde")]);
        p.push(Bytes::from_static(b"H2"), Vec::new());
        assert_eq!(p.remaining(), 11);
        let mut slices = [io::IoSlice::new(&[]); 8];
        assert_eq!(p.chunks_vectored(&mut slices), 4, "the empty piece is dropped");
        p.advance(5);
        assert_eq!(p.chunk(), b"b");
        let mut rest = Vec::new();
        while p.has_remaining() {
            rest.extend_from_slice(p.chunk());
            let n = p.chunk().len();
            p.advance(n);
        }
        assert_eq!(rest, b"bcdeH2");
    }
}
