//! The away record on disk: an image of the chunks written while a member is away, with
//! the array UUID and the superblocks' event count it was saved at, checksummed (CRC-32C);
//! an image whose count is not the assembled one (md or raidnbd changed the array since) is
//! not trusted.

const MAGIC: &[u8; 8] = b"RNBDAWAY";
const VERSION: u32 = 1;
const HEADER_BYTES: usize = 8 + 4 + 4 + 16 + 8 * 4;
/// At most this many chunks (an 8 KiB bitset on disk, a bounded map in memory).
pub const MAX_AWAY_CHUNKS: u64 = 65536;
/// Smallest chunk: 64 KiB.
const MIN_CHUNK_SECTORS: u64 = 128;

/// Chunk size (resync sectors, a power of two) for `resync_sectors`: at least 64 KiB, and
/// large enough for at most [`MAX_AWAY_CHUNKS`] chunks.
pub fn chunk_sectors_for(resync_sectors: u64) -> u64 {
    resync_sectors.div_ceil(MAX_AWAY_CHUNKS).next_power_of_two().max(MIN_CHUNK_SECTORS)
}

/// What a stored image holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AwayImage {
    pub uuid: [u8; 16],
    pub since_events: u64,
    /// The superblocks' event count when it was saved.
    pub valid_events: u64,
    pub chunk_sectors: u64,
    pub chunks: u64,
    /// One bit per chunk, little-endian bit order.
    pub bits: Vec<u8>,
}

impl AwayImage {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_BYTES + self.bits.len() + 4);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&self.uuid);
        for v in [self.since_events, self.valid_events, self.chunk_sectors, self.chunks] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&self.bits);
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    /// Decodes and checks an image (magic, version, checksum, sizes).
    pub fn decode(image: &[u8]) -> Result<Self, String> {
        if image.len() < HEADER_BYTES + 4 || &image[..8] != MAGIC {
            return Err("not an away record".into());
        }
        let (body, crc) = image.split_at(image.len() - 4);
        if crc32c::crc32c(body) != u32::from_le_bytes(crc.try_into().expect("4 bytes")) {
            return Err("checksum mismatch".into());
        }
        let u32_at = |at: usize| u32::from_le_bytes(body[at..at + 4].try_into().expect("4 bytes"));
        let u64_at = |at: usize| u64::from_le_bytes(body[at..at + 8].try_into().expect("8 bytes"));
        if u32_at(8) != VERSION {
            return Err(format!("version {} (this raidnbd reads {VERSION})", u32_at(8)));
        }
        let uuid: [u8; 16] = body[16..32].try_into().expect("16 bytes");
        let (since_events, valid_events, chunk_sectors, chunks) = (u64_at(32), u64_at(40), u64_at(48), u64_at(56));
        let bits = body[HEADER_BYTES..].to_vec();
        if chunks > MAX_AWAY_CHUNKS || bits.len() as u64 != chunks.div_ceil(8) || chunk_sectors == 0 {
            return Err(format!("{chunks} chunks in {} bytes", bits.len()));
        }
        Ok(Self { uuid, since_events, valid_events, chunk_sectors, chunks, bits })
    }

    pub(crate) fn is_set(&self, chunk: u64) -> bool {
        self.bits[(chunk / 8) as usize] & (1 << (chunk % 8)) != 0
    }
}

/// Whether a stored image can be trusted for this array as assembled.
pub fn check_image(
    image: &AwayImage,
    uuid: [u8; 16],
    events: u64,
    chunk_sectors: u64,
    chunks: u64,
) -> Result<(), String> {
    if image.uuid != uuid {
        return Err("it belongs to another array".into());
    }
    if image.valid_events != events {
        return Err(format!(
            "it was saved at event count {}, the superblocks say {events} (the array changed since)",
            image.valid_events
        ));
    }
    if (image.chunk_sectors, image.chunks) != (chunk_sectors, chunks) {
        return Err(format!("its chunks ({} x {} sectors) do not fit the array", image.chunks, image.chunk_sectors));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_sizes_stay_bounded() {
        assert_eq!(chunk_sectors_for(0), 128);
        assert_eq!(chunk_sectors_for(128 * 65536), 128);
        assert_eq!(chunk_sectors_for(128 * 65536 + 1), 256);
        let huge = 1u64 << 40;
        assert!(huge.div_ceil(chunk_sectors_for(huge)) <= MAX_AWAY_CHUNKS);
    }

    #[test]
    fn images_round_trip_and_corruption_is_refused() {
        let image = AwayImage {
            uuid: [7; 16],
            since_events: 10,
            valid_events: 12,
            chunk_sectors: 128,
            chunks: 20,
            bits: vec![0b101, 0, 0x8],
        };
        let bytes = image.encode();
        assert_eq!(AwayImage::decode(&bytes).unwrap(), image);
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x10;
            assert!(AwayImage::decode(&bad).is_err(), "byte {i} flipped was accepted");
        }
        assert!(AwayImage::decode(&bytes[..bytes.len() - 1]).is_err());
        assert!(check_image(&image, [7; 16], 12, 128, 20).is_ok());
        assert!(check_image(&image, [8; 16], 12, 128, 20).is_err());
        assert!(check_image(&image, [7; 16], 13, 128, 20).is_err());
        assert!(check_image(&image, [7; 16], 12, 256, 10).is_err());
    }
}
