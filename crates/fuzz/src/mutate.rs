//! Byte-level mutations and the deterministic PRNG that picks them.

/// xorshift64*: deterministic, seedable, good enough to pick mutations.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform-ish in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }
}

/// Values that sit on boundaries length and count checks get wrong.
const INTERESTING: &[u64] =
    &[0, 1, 0x7f, 0x80, 0xff, 0x100, 0x7fff, 0xffff, 0x7fff_ffff, 0xffff_ffff, u64::MAX];

/// One to four mutations of `input` (`other` is a splice partner), at most `bytes_max` long.
pub fn mutate(rng: &mut Rng, input: &[u8], other: &[u8], bytes_max: usize) -> Vec<u8> {
    let mut out = input.to_vec();
    for _ in 0..1 + rng.below(4) {
        match rng.below(9) {
            0 if !out.is_empty() => {
                let at = rng.below(out.len());
                out[at] ^= 1 << rng.below(8);
            }
            1 if !out.is_empty() => {
                let at = rng.below(out.len());
                out[at] = rng.next_u64() as u8;
            }
            2 => {
                let at = rng.below(out.len() + 1);
                let count = 1 + rng.below(16);
                let bytes: Vec<u8> = (0..count).map(|_| rng.next_u64() as u8).collect();
                out.splice(at..at, bytes);
            }
            3 if !out.is_empty() => {
                let start = rng.below(out.len());
                let end = (start + 1 + rng.below(32)).min(out.len());
                out.drain(start..end);
            }
            4 if !out.is_empty() => {
                // Duplicate a range (repeated fields, nested prefixes).
                let start = rng.below(out.len());
                let end = (start + 1 + rng.below(64)).min(out.len());
                let copy = out[start..end].to_vec();
                let at = rng.below(out.len() + 1);
                out.splice(at..at, copy);
            }
            5 if out.len() >= 8 => {
                // An interesting integer, little endian, of 1, 2, 4 or 8 bytes.
                let width = [1, 2, 4, 8][rng.below(4)];
                let at = rng.below(out.len() - width + 1);
                let value = INTERESTING[rng.below(INTERESTING.len())];
                out[at..at + width].copy_from_slice(&value.to_le_bytes()[..width]);
            }
            6 if !other.is_empty() => {
                // Splice: a prefix of this input, a suffix of the other.
                let cut = rng.below(out.len() + 1);
                let from = rng.below(other.len());
                out.truncate(cut);
                out.extend_from_slice(&other[from..]);
            }
            7 if !out.is_empty() => {
                out.truncate(rng.below(out.len()));
            }
            8 => {
                // ASCII digits: RESP lengths and integers are text.
                let at = rng.below(out.len() + 1);
                let digits = INTERESTING[rng.below(INTERESTING.len())].to_string();
                out.splice(at..at, digits.into_bytes());
            }
            _ => {}
        }
    }
    out.truncate(bytes_max);
    out
}
