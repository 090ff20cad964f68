//! The seeded random numbers and the generic mutations of the stable
//! driver (`pagewise-fuzz`); libFuzzer has its own.

/// xorshift64*.
pub struct Rng(pub u64);

impl Rng {
    /// The next number.
    pub fn word(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// A number below `n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.word() % n as u64) as usize
        }
    }
}

/// Values that break length and address arithmetic.
const EDGES: [u64; 12] = [
    0,
    1,
    2,
    4095,
    4096,
    1 << 20,
    1 << 26,
    0x7fff_ffff,
    0xffff_ffff,
    u64::MAX - 8191,
    u64::MAX - 4095,
    u64::MAX,
];

/// One to four mutations of `input`.
pub fn mutate(rng: &mut Rng, input: &[u8]) -> Vec<u8> {
    let mut b = input.to_vec();
    for _ in 0..1 + rng.below(4) {
        match rng.below(7) {
            0 if !b.is_empty() => {
                let i = rng.below(b.len());
                b[i] ^= 1 << rng.below(8);
            }
            1 if !b.is_empty() => {
                let i = rng.below(b.len());
                b[i] = [0u8, 1, 0x7f, 0x80, 0xff][rng.below(5)];
            }
            2 if b.len() >= 4 => {
                let i = rng.below(b.len() - 3) & !3;
                let v = EDGES[rng.below(EDGES.len())] as u32;
                b[i..i + 4].copy_from_slice(&v.to_le_bytes());
            }
            3 if b.len() >= 8 => {
                let i = rng.below(b.len() - 7) & !3;
                let v = EDGES[rng.below(EDGES.len())];
                b[i..i + 8].copy_from_slice(&v.to_le_bytes());
            }
            4 => {
                let n = rng.below(b.len() + 1);
                b.truncate(n);
            }
            5 if !b.is_empty() => {
                let (a, n) = (rng.below(b.len()), 1 + rng.below(64));
                let part: Vec<u8> = b[a..(a + n).min(b.len())].to_vec();
                let at = rng.below(b.len() + 1);
                b.splice(at..at, part);
            }
            _ => {
                let at = rng.below(b.len() + 1);
                let extra: Vec<u8> = (0..1 + rng.below(16)).map(|_| rng.word() as u8).collect();
                b.splice(at..at, extra);
            }
        }
    }
    b
}
