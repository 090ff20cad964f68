//! The advice shim's hello: the memory the shim says is its own, which
//! pagewise then never advises.

use std::io::Write;
use std::time::Duration;

use super::{le, Target};
use crate::mutate::Rng;

/// The advice socket's reader.
pub(super) struct ShimHello;

impl Target for ShimHello {
    fn feed(&self, input: &[u8]) -> bool {
        let (mut a, b) = std::os::unix::net::UnixStream::pair().expect("socketpair");
        let _ = a.write_all(input);
        drop(a);
        let Ok(s) = pagewise_mech::inject::shim::ShimAdvice::hello(b, Duration::from_secs(1))
        else {
            return false;
        };
        {
            let own = s.own_memory().to_vec();
            let inside = pagewise_mech::inject::Inside::Shim(s);
            for (start, len) in own {
                let _ = inside.is_own_memory(start, len);
                let _ = inside.is_own_memory(u64::MAX - 4095, 4096);
            }
        }
        true
    }

    fn seeds(&self, rng: &mut Rng) -> Vec<Vec<u8>> {
        (0..8).map(|_| seed(rng)).collect()
    }
}

/// A valid shim advice hello.
fn seed(rng: &mut Rng) -> Vec<u8> {
    use pagewise_mech::inject::shim;
    let m = rng.below(4) as u32;
    let mut b = Vec::new();
    for v in [shim::MAGIC, shim::VERSION, 4242, m] {
        b.extend_from_slice(&v.to_le_bytes());
    }
    for i in 0..m as u64 {
        b.extend_from_slice(&le(&[0x7000_0000 + i * 0x10000, 0x4000]));
    }
    b
}
