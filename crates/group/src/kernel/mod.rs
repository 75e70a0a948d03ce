//! HyperLoop's group primitives on the kernel's packet path (issue 17).
//!
//! The XDP program in `bpf/group.bpf.c` applies gWRITE, gCAS, gMEMCPY and gFLUSH to a
//! member's region (a slot of an mmapable BPF array the host maps) and forwards each
//! operation to the next member, or acknowledges it from the tail, all in the softirq of the
//! datagram's sender: no replica process is woken. User space keeps what the kernel cannot
//! do: `Initialize` (installing a member), reads over the control connection, recovery.
//!
//! * [`layout`]: the structs and constants shared with the C program.
//! * [`packet`]: the caller's datagrams, and splitting operations larger than one.
//! * [`datapath`]: loading, attaching, installing members, the regions' mapping.
//! * [`netlab`]: network namespaces joined by veth pairs, where the path runs in tests and
//!   benchmarks.

pub mod datapath;
pub mod layout;
pub mod netlab;
pub mod packet;

pub use datapath::{unavailable_reason, KernelDatapath, MemberInstall};
