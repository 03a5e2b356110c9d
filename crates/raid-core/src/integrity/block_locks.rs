//! Writes in flight per range of blocks: a write (or a restamp) holds its blocks until its
//! stamps are in the table, so two never interleave on a block, and a read that meets bytes a
//! write in flight just put there finds their stamps here.

use std::sync::Mutex;

use event_listener::Event;

struct InFlight {
    id: u64,
    first_block: u64,
    /// The stamps being written, once known (none for a restamp).
    stamps: Vec<u32>,
    blocks: u64,
}

#[derive(Default)]
pub(super) struct BlockLocks {
    held: Mutex<(u64, Vec<InFlight>)>,
    released: Event,
}

pub(super) struct BlockGuard<'a> {
    locks: &'a BlockLocks,
    id: u64,
}

impl BlockLocks {
    /// Takes `[first_block, +blocks)`, waiting for writes in flight there.
    pub async fn lock(&self, first_block: u64, blocks: u64) -> BlockGuard<'_> {
        loop {
            let listener = {
                let mut held = self.held.lock().expect("block locks");
                let overlaps = held
                    .1
                    .iter()
                    .any(|f| f.first_block < first_block + blocks && first_block < f.first_block + f.blocks);
                if !overlaps {
                    held.0 += 1;
                    let id = held.0;
                    held.1.push(InFlight { id, first_block, stamps: Vec::new(), blocks });
                    return BlockGuard { locks: self, id };
                }
                self.released.listen()
            };
            listener.await;
        }
    }

    /// Whether a write in flight is putting bytes with `stamp` into `block`.
    pub fn pending(&self, block: u64, stamp: u32) -> bool {
        let held = self.held.lock().expect("block locks");
        held.1.iter().any(|f| {
            block >= f.first_block
                && block < f.first_block + f.blocks
                && f.stamps.get((block - f.first_block) as usize) == Some(&stamp)
        })
    }
}

impl BlockGuard<'_> {
    /// The stamps the held blocks are about to be written with.
    pub fn announce(&self, stamps: Vec<u32>) {
        let mut held = self.locks.held.lock().expect("block locks");
        let entry = held.1.iter_mut().find(|f| f.id == self.id).expect("a held range");
        debug_assert_eq!(stamps.len() as u64, entry.blocks);
        entry.stamps = stamps;
    }

    /// Hands the announced stamps, by block, to `store` while they are still announced (so
    /// a racing read finds each one in the table or here).
    pub fn store_announced(&self, mut store: impl FnMut(u64, u32)) {
        let held = self.locks.held.lock().expect("block locks");
        let entry = held.1.iter().find(|f| f.id == self.id).expect("a held range");
        for (i, &stamp) in entry.stamps.iter().enumerate() {
            store(entry.first_block + i as u64, stamp);
        }
    }
}

impl Drop for BlockGuard<'_> {
    fn drop(&mut self) {
        self.locks.held.lock().expect("block locks").1.retain(|f| f.id != self.id);
        self.locks.released.notify(usize::MAX);
    }
}
