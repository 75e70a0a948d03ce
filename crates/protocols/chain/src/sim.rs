//! The simulator setup for the chain store (feature `sim`: `chorus sim --protocol chain` and
//! this crate's swarm tests; the store itself does not depend on the simulator).

use std::sync::Arc;

use crate::{Chain, ChainConfig, ChainLayout, ChainTweak};
use chorus_core::{NodeId, NodeSet, Time};
use chorus_region::{Region, RegionMemory, TenantId};

use chorus_sim::managed::{managed_sim_config, simulate_managed};
use chorus_sim::rng::Rng;
use chorus_sim::runner::ProtocolSetup;
use chorus_sim::simulator::SimConfig;

/// The simulator setup for the chain store, in the main swarm's shape: the real membership
/// service (removals of live nodes, rejoins), restarts and drifting clocks. Each seed draws the
/// retransmission timeout, the pipelining window and a layout (a small log and index, so
/// wrap-around and probing are exercised). A restarted node keeps its region file on half of
/// its restarts (a restart on its data directory) and starts with an empty one on the others
/// (a replacement machine); either way it joins and the coordinator copies the head's region
/// to it before linking it as the tail (HyperLoop §5.1). A kept region holds what the member
/// had flushed (`Region::simulated`): writes it had not flushed are lost.
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
        let mut build = |me: NodeId, replicas: NodeSet, seed: u64, crashed: Option<&Chain>| {
            let mut chain_config = ChainConfig::new(me, replicas);
            chain_config.retransmit_timeout = retransmit_timeout;
            chain_config.window_max = window_max;
            chain_config.layout = layout;
            // Small chunks: a copy takes a dozen or more gWRITEs, so crashes and views land
            // mid-copy.
            chain_config.copy_chunk_bytes = 512;
            chain_config.joining = crashed.is_some();
            if let Some(tweak) = &tweak {
                tweak(&mut chain_config);
            }
            // A simulated region: what a crash keeps is what the member flushed (gFLUSH).
            let bytes = chain_config.layout.region_bytes();
            let mut region =
                Region::simulated(TenantId(0), "chain", bytes).expect("a region of the layout's size");
            if let (Some(kept), true) = (crashed.and_then(Chain::region), seed % 2 == 1) {
                region.write(0, &kept.crash_image()[..bytes as usize]).expect("same layout, same size");
                region.flush().expect("a simulated region flushes");
            }
            Chain::with_region(chain_config, region)
        };
        (simulate_managed(&managed_sim_config(config), None, &mut build), description)
    };
    ProtocolSetup::Custom { name: "chain", simulate: Arc::new(simulate_seed) }
}

/// The chain store's broken variants, for `chorus sim --list-broken` and its tests.
#[cfg(feature = "broken-variants")]
pub fn broken_variants() -> Vec<chorus_sim::broken::BrokenVariant> {
    crate::Bug::ALL
        .into_iter()
        .map(|bug| chorus_sim::broken::BrokenVariant {
            protocol: "chain",
            name: chorus_sim::broken::kebab_case(&format!("{bug:?}")),
            seeds_max: 2_000,
            setup: setup(Some(Arc::new(move |config: &mut ChainConfig| config.bug = Some(bug)))),
        })
        .collect()
}
