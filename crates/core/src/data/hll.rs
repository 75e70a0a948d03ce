//! HyperLogLog (PFADD, PFCOUNT, PFMERGE) in Redis' own format: a string value `HYLL`, an
//! encoding byte, a cached cardinality, then 16384 six-bit registers (Redis' dense
//! encoding). Elements hash with Redis' MurmurHash64A and seed, and the count is Redis'
//! estimator (Ertl's, since Redis 5), so a key gives the same count here as in Redis, and
//! `GET`/`SET` move one between them. Chorus writes the dense encoding only (12 KiB a key:
//! Redis starts sparse and turns dense past `hll-sparse-max-bytes`); it reads both.

use bytes::{BufMut, Bytes, BytesMut};

use super::{Args, Data, Fail, Reply, Slot};

/// Registers: 2^14, addressed by the hash's low 14 bits.
const P: u32 = 14;
pub const REGISTERS: usize = 1 << P;
/// Bits of the hash left for the run of zeros.
const Q: u32 = 64 - P;
const REGISTER_BITS: usize = 6;
const REGISTER_MAX: u8 = (1 << REGISTER_BITS) - 1;
const HEADER_BYTES: usize = 16;
/// A dense HyperLogLog's whole size.
pub const DENSE_BYTES: usize = HEADER_BYTES + (REGISTERS * REGISTER_BITS).div_ceil(8);
const MAGIC: &[u8; 4] = b"HYLL";
const DENSE: u8 = 0;
const SPARSE: u8 = 1;

pub const NOT_HLL: &str = "WRONGTYPE Key is not a valid HyperLogLog string value.";
pub const CORRUPT: &str = "INVALIDOBJ Corrupted HLL object detected";

/// Redis' MurmurHash64A (little-endian reads), as hyperloglog.c uses it.
pub fn murmur64a(key: &[u8], seed: u64) -> u64 {
    const M: u64 = 0xc6a4_a793_5bd1_e995;
    const R: u32 = 47;
    let mut h = seed ^ (key.len() as u64).wrapping_mul(M);
    let mut chunks = key.chunks_exact(8);
    for chunk in &mut chunks {
        let mut k = u64::from_le_bytes(chunk.try_into().expect("8 bytes"));
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h ^= k;
        h = h.wrapping_mul(M);
    }
    let tail = chunks.remainder();
    if !tail.is_empty() {
        for (i, byte) in tail.iter().enumerate() {
            h ^= (*byte as u64) << (8 * i);
        }
        h = h.wrapping_mul(M);
    }
    h ^= h >> R;
    h = h.wrapping_mul(M);
    h ^= h >> R;
    h
}

/// One register per index, unpacked.
#[derive(Clone, PartialEq, Eq)]
pub struct Registers(Box<[u8; REGISTERS]>);

impl std::fmt::Debug for Registers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let set = self.0.iter().filter(|register| **register > 0).count();
        write!(f, "Registers({set} of {REGISTERS} set)")
    }
}

impl Default for Registers {
    fn default() -> Self {
        Registers(Box::new([0; REGISTERS]))
    }
}

impl Registers {
    /// Add `element`: whether a register grew (Redis' hllPatLen then the max).
    pub fn add(&mut self, element: &[u8]) -> bool {
        let hash = murmur64a(element, 0xadc8_3b19);
        let index = (hash & (REGISTERS as u64 - 1)) as usize;
        // The run of zeros after the index bits, plus one; a stop bit keeps it within Q + 1.
        let rest = (hash >> P) | (1 << Q);
        let count = rest.trailing_zeros() as u8 + 1;
        if count > self.0[index] {
            self.0[index] = count;
            return true;
        }
        false
    }

    /// The union: each register the larger of the two.
    pub fn merge(&mut self, other: &Registers) {
        for (mine, theirs) in self.0.iter_mut().zip(other.0.iter()) {
            *mine = (*mine).max(*theirs);
        }
    }

    /// Redis' cardinality estimate (hllCount: Ertl's improved estimator).
    pub fn count(&self) -> u64 {
        let m = REGISTERS as f64;
        let mut histogram = [0u32; Q as usize + 2];
        for register in self.0.iter() {
            histogram[*register as usize] += 1;
        }
        let mut z = m * tau((m - histogram[Q as usize + 1] as f64) / m);
        for j in (1..=Q as usize).rev() {
            z += histogram[j] as f64;
            z *= 0.5;
        }
        z += m * sigma(histogram[0] as f64 / m);
        const ALPHA_INF: f64 = 0.721_347_520_444_481_7;
        (ALPHA_INF * m * m / z).round() as u64
    }

    /// Redis' dense encoding, its cached cardinality marked stale (Redis recomputes it).
    pub fn encode(&self) -> Bytes {
        let mut out = BytesMut::with_capacity(DENSE_BYTES);
        out.put_slice(MAGIC);
        out.put_slice(&[DENSE, 0, 0, 0]);
        out.put_slice(&[0, 0, 0, 0, 0, 0, 0, 0x80]);
        let mut packed = vec![0u8; DENSE_BYTES - HEADER_BYTES + 1];
        for (index, register) in self.0.iter().enumerate() {
            let bit = index * REGISTER_BITS;
            let (byte, shift) = (bit / 8, bit % 8);
            let value = (*register as u16) << shift;
            packed[byte] |= value as u8;
            packed[byte + 1] |= (value >> 8) as u8;
        }
        packed.pop();
        out.put_slice(&packed);
        out.freeze()
    }

    /// A HyperLogLog string in Redis' dense or sparse encoding. `Err`: not one
    /// ([`NOT_HLL`]), or a sparse one whose runs do not add up ([`CORRUPT`]).
    pub fn decode(value: &[u8]) -> Result<Registers, Fail> {
        if value.len() < HEADER_BYTES || &value[..4] != MAGIC {
            return Err(NOT_HLL.into());
        }
        let body = &value[HEADER_BYTES..];
        let mut registers = Registers::default();
        match value[4] {
            DENSE if value.len() == DENSE_BYTES => {
                for (index, register) in registers.0.iter_mut().enumerate() {
                    let bit = index * REGISTER_BITS;
                    let (byte, shift) = (bit / 8, bit % 8);
                    let low = body[byte] as u16;
                    let high = body.get(byte + 1).copied().unwrap_or(0) as u16;
                    *register = (((high << 8) | low) >> shift) as u8 & REGISTER_MAX;
                }
            }
            SPARSE => decode_sparse(body, &mut registers)?,
            _ => return Err(NOT_HLL.into()),
        }
        Ok(registers)
    }
}

/// Redis' sparse opcodes: ZERO `00xxxxxx`, XZERO `01xxxxxx yyyyyyyy`, VAL `1vvvvvxx`.
fn decode_sparse(body: &[u8], registers: &mut Registers) -> Result<(), Fail> {
    let (mut at, mut index) = (0, 0usize);
    while at < body.len() {
        let op = body[at];
        let (run, value, width) = match op & 0xc0 {
            0x00 => ((op & 0x3f) as usize + 1, 0, 1),
            0x40 => {
                let low = *body.get(at + 1).ok_or_else(|| Fail::from(CORRUPT))?;
                ((((op & 0x3f) as usize) << 8 | low as usize) + 1, 0, 2)
            }
            _ => ((op & 0x3) as usize + 1, ((op >> 2) & 0x1f) + 1, 1),
        };
        if index + run > REGISTERS {
            return Err(CORRUPT.into());
        }
        registers.0[index..index + run].fill(value);
        index += run;
        at += width;
    }
    if index != REGISTERS {
        return Err(CORRUPT.into());
    }
    Ok(())
}

fn sigma(mut x: f64) -> f64 {
    if x == 1.0 {
        return f64::INFINITY;
    }
    let (mut y, mut z) = (1.0, x);
    loop {
        x *= x;
        let previous = z;
        z += x * y;
        y += y;
        if previous == z {
            return z;
        }
    }
}

fn tau(mut x: f64) -> f64 {
    if x == 0.0 || x == 1.0 {
        return 0.0;
    }
    let (mut y, mut z) = (1.0, 1.0 - x);
    loop {
        x = x.sqrt();
        let previous = z;
        y *= 0.5;
        z -= (1.0 - x).powi(2) * y;
        if previous == z {
            return z / 3.0;
        }
    }
}

pub(super) fn run(name: &str, args: &Args, slot: &mut Slot) -> Option<Reply> {
    Some(match name {
        "pfadd" => pfadd(args, slot),
        "pfcount" => pfcount(slot),
        _ => return None,
    })
}

/// PFADD key [element ...]: 1 if the key was created or a register changed.
fn pfadd(args: &Args, slot: &mut Slot) -> Reply {
    let existing = slot.string()?.cloned();
    let (mut registers, mut changed) = match &existing {
        Some(value) => (Registers::decode(value)?, false),
        None => (Registers::default(), true),
    };
    for element in args.from(2) {
        changed |= registers.add(element);
    }
    if changed {
        *slot.string_mut()? = registers.encode();
    }
    Ok(Data::Integer(changed as i64))
}

/// PFCOUNT of one key (several keys: the server merges their registers).
fn pfcount(slot: &mut Slot) -> Reply {
    match slot.string()? {
        None => Ok(Data::Integer(0)),
        Some(value) => Ok(Data::Integer(Registers::decode(value)?.count() as i64)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dense_and_sparse_encodings_decode_to_the_same_registers() {
        let mut registers = Registers::default();
        for element in ["a", "b", "c", "hello world", ""] {
            registers.add(element.as_bytes());
        }
        let dense = registers.encode();
        assert_eq!(dense.len(), DENSE_BYTES);
        assert!(Registers::decode(&dense).unwrap() == registers);
        // What Redis 7.0.15 stores after `PFADD k a` (sparse: XZERO, VAL, XZERO), so the
        // hash, the register index and the run length are Redis'.
        let sparse = b"HYLL\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x80q\xa6\x84NW";
        let decoded = Registers::decode(sparse).unwrap();
        let mut just_a = Registers::default();
        just_a.add(b"a");
        assert!(decoded == just_a, "Redis' own bytes for PFADD k a");
        assert_eq!(decoded.count(), 1);
        assert_eq!(
            Registers::decode(b"HYLL\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x40"),
            Err(CORRUPT.into())
        );
        assert_eq!(Registers::decode(b"not a hyperloglog"), Err(NOT_HLL.into()));
    }

    #[test]
    fn counts_are_the_ones_redis_gives() {
        // PFCOUNT after PFADD of element:0 .. element:n-1, as Redis 7.0.15 answers.
        let mut registers = Registers::default();
        assert_eq!(registers.count(), 0);
        let mut added = 0;
        for (n, redis) in [(3, 3), (1000, 997), (100_000, 100_039)] {
            while added < n {
                registers.add(format!("element:{added}").as_bytes());
                added += 1;
            }
            assert_eq!(registers.count(), redis, "{n} elements");
        }
    }
}
