//! The layouts shared with the XDP program: every struct and constant of `bpf/group.h`,
//! mirrored field for field (`#[repr(C)]`, sizes checked by a test).

/// "CKG1", little-endian.
pub const MAGIC: u32 = 0x3147_4b43;
pub const KIND_OP: u8 = 1;
pub const KIND_ACK: u8 = 2;
/// A one-sided read request (padded with the bytes it asks for) and its answer.
pub const KIND_READ: u8 = 3;
pub const KIND_DATA: u8 = 4;

pub const PRIMITIVE_WRITE: u8 = 0;
pub const PRIMITIVE_CAS: u8 = 1;
pub const PRIMITIVE_MEMCPY: u8 = 2;
pub const PRIMITIVE_FLUSH: u8 = 3;

pub const FLAG_FLUSH: u8 = 1;
/// A write-lock gCAS that yields to local readers (`Operation::yields_to_readers`).
pub const FLAG_YIELDS_TO_READERS: u8 = 2;

pub const VERDICT_OUT_OF_BOUNDS: u8 = 1;
pub const VERDICT_MISALIGNED: u8 = 2;
pub const VERDICT_EXECUTE_MAP: u8 = 3;
pub const VERDICT_MALFORMED: u8 = 4;
/// The caller found its own operation malformed: it travels as a no-op and is reported.
pub const VERDICT_BY_CALLER: u8 = 255;

/// The longest chain the kernel path serves.
pub const CHAIN_MAX: usize = 8;
/// The largest gWRITE payload or gMEMCPY length in one datagram.
pub const CHUNK_BYTES_MAX: u64 = 1024;
/// The largest region the kernel path serves (one slot of the regions map).
pub const REGION_BYTES_MAX: u64 = 1024 * 1024;
/// A slot: the region, slack for the verifier, rounded to a page.
pub const SLOT_BYTES: u64 = REGION_BYTES_MAX + 4096;
pub const SLOTS_DEFAULT: u32 = 64;
pub const GROUPS_MAX: u32 = 1024;
/// gCAS results each member remembers for retransmissions: the caller's window must not exceed it.
pub const RING: usize = 256;

/// The datagram header (`struct ck_hdr`); a gWRITE's bytes follow it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Header {
    pub magic: u32,
    pub kind: u8,
    pub primitive: u8,
    pub flags: u8,
    pub verdict: u8,
    pub tenant: u32,
    pub reserved: u32,
    pub group: u64,
    pub epoch: u64,
    pub token: [u8; 16],
    pub seq: u64,
    pub a: u64,
    pub b: u64,
    pub c: u64,
    pub d: u64,
    pub present: u64,
    pub results: [u64; CHAIN_MAX],
}

pub const HEADER_BYTES: usize = std::mem::size_of::<Header>();

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct GroupKey {
    pub tenant: u32,
    pub reserved: u32,
    pub group: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Remembered {
    pub seq: u64,
    pub value: u64,
    pub present: u64,
}

/// One member's state (`struct ck_group`), written by user space at `Initialize`, then owned
/// by the program.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct GroupState {
    pub next_seq: u64,
    pub epoch: u64,
    pub token: [u8; 16],
    pub slot: u32,
    pub region_bytes: u32,
    pub position: u32,
    pub chain_len: u32,
    /// Network byte order, as they go on the wire.
    pub next_ip: u32,
    pub src_ip: u32,
    pub next_port: u16,
    pub src_port: u16,
    pub reserved: u32,
    pub ring: [Remembered; RING],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Config {
    /// Network byte order.
    pub port: u16,
    pub reserved: u16,
    pub loss_per_million: u32,
}

// SAFETY: plain `#[repr(C)]` data without padding holes that matter to the kernel (every
// field is an integer or an array of them; the structs were laid out with explicit
// `reserved` fields so Rust and clang agree).
unsafe impl aya::Pod for GroupKey {}
// SAFETY: as above.
unsafe impl aya::Pod for GroupState {}
// SAFETY: as above.
unsafe impl aya::Pod for Config {}

/// The program's counters (`enum ck_stat`), in order.
pub const STAT_NAMES: [&str; 18] = [
    "applied",
    "rejected",
    "forwarded",
    "acks",
    "duplicates",
    "forgotten",
    "gaps",
    "busy",
    "unknown_group",
    "unauthorized",
    "malformed",
    "verdict_mismatch",
    "no_route",
    "no_neighbour",
    "injected_loss",
    "forwarding_off",
    "reads",
    "yielded_to_readers",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_match_the_c_structs() {
        // Sizes as clang lays out group.h (checked by hand against `pahole`-style arithmetic:
        // the header is 8 + 8 + 16 + 16 + 8 + 32 + 8 + 64 bytes).
        assert_eq!(HEADER_BYTES, 160);
        assert_eq!(std::mem::size_of::<GroupKey>(), 16);
        assert_eq!(std::mem::size_of::<Remembered>(), 24);
        assert_eq!(std::mem::size_of::<GroupState>(), 64 + RING * 24);
        assert_eq!(std::mem::size_of::<Config>(), 8);
        assert!(RING.is_power_of_two() && CHAIN_MAX.is_power_of_two());
        assert_eq!(SLOT_BYTES % 4096, 0);
    }
}
