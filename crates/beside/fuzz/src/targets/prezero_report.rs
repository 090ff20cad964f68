//! The pre-zeroing report the shim sends at a program's exit.

use pagewise_thp::prezero::PrezeroStats;

use super::Target;
use crate::mutate::Rng;

/// The report's reader.
pub(super) struct PrezeroReport;

impl Target for PrezeroReport {
    fn feed(&self, input: &[u8]) -> bool {
        // A report read writes back its counts as they were.
        let Ok(r) = PrezeroStats::decode(&mut &input[..]) else {
            return false;
        };
        assert_eq!(
            r.encode()[8..24],
            input[8..24],
            "a report does not read back as written"
        );
        true
    }

    fn seeds(&self, rng: &mut Rng) -> Vec<Vec<u8>> {
        (0..8).map(|_| seed(rng)).collect()
    }
}

/// A pre-zeroing report as the shim sends it at a program's exit.
fn seed(rng: &mut Rng) -> Vec<u8> {
    let s = PrezeroStats {
        populated: rng.word() >> rng.below(64),
        scans: rng.word() >> rng.below(64),
        cpu_ms: (rng.word() >> 40) as f64 / 1e3,
    };
    s.encode().to_vec()
}
