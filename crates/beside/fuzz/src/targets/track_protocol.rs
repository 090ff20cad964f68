//! The track protocol: a preload shim's hello and collection replies, as
//! read by the tracker.

use super::{le, Target};
use crate::mutate::Rng;

/// The tracker's readers.
pub(super) struct TrackProtocol;

impl Target for TrackProtocol {
    fn feed(&self, input: &[u8]) -> bool {
        let hello = pagewise_track::protocol::read_hello(&mut &input[..]).is_ok();
        let collection = pagewise_track::protocol::read_collection(&mut &input[..]).is_ok();
        hello || collection
    }

    fn seeds(&self, rng: &mut Rng) -> Vec<Vec<u8>> {
        (0..8).flat_map(|_| seeds(rng)).collect()
    }
}

/// A valid track-protocol hello and collection reply.
fn seeds(rng: &mut Rng) -> Vec<Vec<u8>> {
    use pagewise_track::protocol as p;
    let mut hello = Vec::new();
    for v in [p::MAGIC, p::VERSION, 1, 0] {
        hello.extend_from_slice(&v.to_le_bytes());
    }
    let n = rng.below(8) as u64;
    let mut c = le(&[n, 100, 5000, 0]);
    for i in 0..n {
        c.extend_from_slice(&le(&[0x10000 + i * 0x3000, 1 + i % 2]));
    }
    vec![hello, c]
}
