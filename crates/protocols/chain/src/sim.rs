//! The simulator setup for the chain store (feature `sim`: `chorus sim --protocol chain` and
//! this crate's swarm tests; the store itself does not depend on the simulator).

use std::sync::Arc;

use crate::{Chain, ChainConfig, ChainLayout, ChainTweak};
use chorus_core::{NodeId, NodeSet, Time};

use chorus_sim::rng::Rng;
use chorus_sim::runner::ProtocolSetup;
use chorus_sim::simulator::{simulate, SimConfig};

/// The simulator setup for the chain store: each seed draws the retransmission timeout, the
/// pipelining window and a layout (a small log and index, so wrap-around and probing are
/// exercised).
pub fn setup(tweak: Option<ChainTweak>) -> ProtocolSetup {
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
