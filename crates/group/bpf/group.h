// SPDX-License-Identifier: (GPL-2.0-only OR Apache-2.0)
//
// The layouts shared by the XDP program (group.bpf.c) and user space
// (crates/group/src/kernel/layout.rs mirrors every struct and constant here; a unit test there
// checks the sizes). All multi-byte fields of `ck_hdr` are little-endian except where noted:
// both ends are the same machine's kernel and its user space.

#ifndef CHORUS_GROUP_BPF_H
#define CHORUS_GROUP_BPF_H

// "CKG1"
#define CK_MAGIC 0x31474b43u
#define CK_KIND_OP 1
#define CK_KIND_ACK 2
// A one-sided read (HyperLoop's lock-free read at one member): the request carries `c` bytes
// of padding that the member overwrites with its region's bytes at `a`, and it comes back as
// CK_KIND_DATA to whoever sent it.
#define CK_KIND_READ 3
#define CK_KIND_DATA 4

#define CK_WRITE 0
#define CK_CAS 1
#define CK_MEMCPY 2
#define CK_FLUSH 3

#define CK_FLAG_FLUSH 1
// A write-lock gCAS that yields to local readers: where its compare fails because the word
// holds only a reader count (non-zero, CK_WRITER_BIT clear), the datagram is dropped without
// consuming its sequence number (crates/group/src/op.rs, `Operation::yields_to_readers`).
#define CK_FLAG_YIELDS_TO_READERS 2
// The transaction API's writer bit in a lock word (crates/group/src/txn.rs, WRITER_BIT).
#define CK_WRITER_BIT (1ULL << 63)

// Verdicts (0 = applied). The caller learns the precise error by validating its own operation.
#define CK_VERDICT_OUT_OF_BOUNDS 1
#define CK_VERDICT_MISALIGNED 2
#define CK_VERDICT_EXECUTE_MAP 3
#define CK_VERDICT_MALFORMED 4
#define CK_VERDICT_BY_CALLER 255

// The longest chain the kernel path serves (results travel in the datagram).
#define CK_CHAIN_MAX 8
// The largest gWRITE payload or gMEMCPY length in one datagram. Larger operations are split
// by the caller into consecutive sequence numbers.
#define CK_CHUNK_MAX 1024
// A region slot: CK_REGION_MAX usable bytes plus CK_CHUNK_MAX of slack, rounded to pages so
// that every slot starts on a page (user space maps slot i at i * CK_SLOT_BYTES).
#define CK_REGION_MAX (1024 * 1024)
#define CK_SLOT_BYTES (CK_REGION_MAX + 4096)
#define CK_SLOTS_DEFAULT 64
#define CK_GROUPS_MAX 1024
// Remembered gCAS results per member: at least the caller's window.
#define CK_RING 256
#define CK_BUSY (1ULL << 63)

struct ck_hdr {
	__u32 magic;
	__u8 kind;
	__u8 primitive;
	__u8 flags;
	__u8 verdict;
	__u32 tenant;
	__u32 reserved;
	__u64 group;
	__u64 epoch;
	__u8 token[16];
	__u64 seq;
	// gWRITE: offset, -, length. gCAS: offset, old, new, execute map.
	// gMEMCPY: src, dst, length.
	__u64 a;
	__u64 b;
	__u64 c;
	__u64 d;
	// gCAS result map: bit i set when results[i] holds member i's original value.
	__u64 present;
	__u64 results[CK_CHAIN_MAX];
};

struct ck_group_key {
	__u32 tenant;
	__u32 reserved;
	__u64 group;
};

struct ck_remembered {
	__u64 seq;
	__u64 value;
	__u64 present;
};

struct ck_group {
	__u64 next_seq; // CK_BUSY while an operation is being applied
	__u64 epoch;
	__u8 token[16];
	__u32 slot;
	__u32 region_bytes;
	__u32 position;
	__u32 chain_len;
	// Where this member sends: the next member, or (tail) the caller. Network byte order.
	__u32 next_ip;
	__u32 src_ip;
	__u16 next_port;
	__u16 src_port;
	__u32 reserved;
	struct ck_remembered ring[CK_RING];
};

struct ck_config {
	__u16 port; // network byte order; 0: serve nothing
	__u16 reserved;
	__u32 loss_per_million; // injected loss at ingress, for tests
};

enum ck_stat {
	CK_STAT_APPLIED,
	CK_STAT_REJECTED,
	CK_STAT_FORWARDED,
	CK_STAT_ACKS,
	CK_STAT_DUPLICATES,
	CK_STAT_FORGOTTEN,
	CK_STAT_GAPS,
	CK_STAT_BUSY,
	CK_STAT_UNKNOWN_GROUP,
	CK_STAT_UNAUTHORIZED,
	CK_STAT_MALFORMED,
	CK_STAT_VERDICT_MISMATCH,
	CK_STAT_NO_ROUTE,
	CK_STAT_NO_NEIGHBOUR,
	CK_STAT_INJECTED_LOSS,
	CK_STAT_FORWARDING_OFF,
	CK_STAT_READS,
	CK_STAT_YIELDED_TO_READERS,
	CK_STAT_COUNT,
};

#endif
