//! CRAQ (Terrace & Freedman, "Object Storage on CRAQ", USENIX ATC 2009; the Hermes paper's
//! §2.5 baseline) as a sans-I/O replica core.
//!
//! The chain is the view's live replicas in id order: the head is the lowest id, the tail the
//! highest. Writes and RMWs entering at any replica are forwarded to the head, which orders
//! them per key (a version number), executes RMWs on its latest version, and propagates the
//! new version down the chain. Every replica keeps the key's clean (committed) version and
//! the dirty versions above it. The tail commits and acknowledgements flow back up; each
//! replica cleans the versions an ACK covers and answers its own clients. Reads complete at
//! any replica: locally when the key is clean, otherwise after asking the tail which version
//! is committed. See docs/protocols/craq.md for the section-by-section map.

pub mod config;
pub mod key;
pub mod message;
pub mod replica;

pub use config::{Bug, CraqConfig};
pub use message::Message;
pub use replica::{Craq, CraqStats};
