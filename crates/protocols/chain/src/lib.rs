//! A key-value store replicated through the HyperLoop group primitives (Kim et al., SIGCOMM
//! 2018), shaped like the paper's MongoDB case study (§5.2) with its recovery (§5.1).
//!
//! Every replica's node holds one member of a HyperLoop group (`chorus_group::ChainMember`)
//! over its region; the head's node also runs the coordinator (`chorus_group::GroupCaller`).
//! Each batch of client updates becomes one redo record: `Append` (gWRITE+gFLUSH into every
//! log) and `ExecuteAndAdvance` (gMEMCPY+gFLUSH per entry, then the log head) under the group
//! write lock (gCAS). The database in the region is a hash index plus a heap of entries
//! ([`layout`]), so any replica answers a read from its own region: the tail lock-free, the
//! others under a read lock. See docs/protocols/chain.md.

pub mod config;
pub mod layout;
pub mod message;
pub mod mirror;
pub mod replica;

use std::sync::Arc;

use chorus_core::{NodeId, NodeSet, Time};
use chorus_sim::rng::Rng;
use chorus_sim::runner::ProtocolSetup;
use chorus_sim::simulator::{simulate, SimConfig};

pub use config::{Bug, ChainConfig};
pub use layout::ChainLayout;
pub use message::Message;
pub use replica::{Chain, ChainStats};

/// A change applied to every replica's configuration (e.g. to select a broken variant).
pub type ChainTweak = Arc<dyn Fn(&mut ChainConfig) + Send + Sync>;

/// The simulator setup for the chain store: each seed draws the retransmission timeout, the
/// pipelining window and a layout (a small log and index, so wrap-around and probing are
/// exercised).
pub fn sim_setup(tweak: Option<ChainTweak>) -> ProtocolSetup {
    let simulate_seed = move |config: &SimConfig| {
        let mut options = Rng::new(config.seed ^ 0x4348_4149_4E00);
        let retransmit_timeout = Time::from_millis(options.range(3, 30));
        let window_max = [4, 16, 64][options.below(3) as usize];
        let log_bytes = [1024, 4096][options.below(2) as usize];
        let index_slots = [16, 64][options.below(2) as usize];
        let layout = ChainLayout::new(log_bytes, index_slots, 4096).expect("valid layout");
        let description = format!(
            "retransmit {retransmit_timeout:?}, window {window_max}, log {log_bytes}, slots {index_slots}"
        );
        let mut build = |me: NodeId, replicas: NodeSet, _seed: u64| {
            let mut chain_config = ChainConfig::new(me, replicas);
            chain_config.retransmit_timeout = retransmit_timeout;
            chain_config.window_max = window_max;
            chain_config.layout = layout;
            if let Some(tweak) = &tweak {
                tweak(&mut chain_config);
            }
            Chain::new(chain_config)
        };
        (simulate(config, &mut build), description)
    };
    ProtocolSetup::Custom { name: "chain", simulate: Arc::new(simulate_seed) }
}
