//! The far-memory server's wire (`pagewise_mech::inject::uffd_lending`): a
//! request a program in a container sends to the host's server, and the
//! answer the program reads back. The first byte picks which one the rest
//! is read as.

use super::Target;
use crate::mutate::Rng;
use pagewise_mech::inject::uffd_lending;

/// Both readers of the wire.
pub(super) struct UffdMaker;

impl Target for UffdMaker {
    fn feed(&self, input: &[u8]) -> bool {
        let Some((&kind, rest)) = input.split_first() else {
            return false;
        };
        if kind & 1 == 0 {
            let Ok((op, flags)) = uffd_lending::read_request(&mut &rest[..]) else {
                return false;
            };
            let _ = (op, flags);
            true
        } else {
            let Ok((value, why)) = uffd_lending::read_answer(&mut &rest[..]) else {
                return false;
            };
            assert!(
                why.len() <= 4 * uffd_lending::MAX_WHY as usize,
                "a reason of {}",
                why.len()
            );
            // What is read is what would be written.
            let mut again = Vec::new();
            uffd_lending::write_answer(&mut again, value, &why).expect("writing to a vector");
            let back =
                uffd_lending::read_answer(&mut &again[..]).expect("an answer written reads back");
            assert_eq!(back.0, value);
            true
        }
    }

    fn seeds(&self, rng: &mut Rng) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        for op in [uffd_lending::WHO, uffd_lending::USERFAULTFD] {
            let mut b = vec![0u8];
            b.extend_from_slice(&pagewise_mech::shim::hello_header(uffd_lending::MAGIC));
            b.extend_from_slice(&op.to_le_bytes());
            b.extend_from_slice(&((rng.below(2) as u32) << 19 | 0x800).to_le_bytes());
            out.push(b);
        }
        for (value, why) in [
            (7i64, ""),
            (-1, "process 4242 is not a member of instance web"),
        ] {
            let mut b = vec![1u8];
            uffd_lending::write_answer(&mut b, value, why).expect("writing to a vector");
            out.push(b);
        }
        out
    }
}
