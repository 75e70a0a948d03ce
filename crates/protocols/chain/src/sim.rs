//! The simulator setup for the chain store (feature `sim`: `chorus sim --protocol chain` and
//! this crate's swarm tests; the store itself does not depend on the simulator).

use std::sync::Arc;

use crate::durable::ChainState;
use crate::{Chain, ChainConfig, ChainLayout, ChainTweak};
use chorus_core::{Key, NodeId, NodeSet, Replica, Time};
use chorus_group::ChainMember;
use chorus_membership::{Membership, MembershipLog, WithMembership};
use chorus_persistence::{Durable, Persistence, PersistenceOptions};
use chorus_region::{Region, RegionMemory, TenantId, TurnFlush};
use chorus_storage::{SimDisk, StorageRegion};

use chorus_sim::managed::{
    appendonly_options, managed_sim_config, simulate_managed, swarm_membership_config, AppendOnly,
    AppendOnlyFile, AppendOnlyNode, OnDisk, TurnRecord, ACK_BEFORE_SYNC_PERIOD,
};
use chorus_sim::rng::Rng;
use chorus_sim::runner::ProtocolSetup;
use chorus_sim::simulator::{
    simulate_with_restarts, RestartContext, Restarted, SeedRun, SimConfig, StorageFaults,
};

/// The options a seed draws: every node of the seed uses the same.
#[derive(Clone, Copy)]
struct Options {
    retransmit_timeout: Time,
    window_max: usize,
    layout: ChainLayout,
}

impl Options {
    fn draw(seed: u64) -> Options {
        let mut options = Rng::new(seed ^ 0x4348_4149_4E00);
        let retransmit_timeout = Time::from_millis(options.range(3, 30));
        let window_max = [4, 16, 64][options.below(3) as usize];
        let log_bytes = [1024, 4096][options.below(2) as usize];
        let index_slots = [16, 64][options.below(2) as usize];
        let layout = ChainLayout::new(log_bytes, index_slots, 4096).expect("valid layout");
        Options { retransmit_timeout, window_max, layout }
    }

    fn describe(&self) -> String {
        format!(
            "retransmit {:?}, window {}, log {}, slots {}",
            self.retransmit_timeout, self.window_max, self.layout.txn.log_bytes, self.layout.index_slots
        )
    }

    fn config(&self, me: NodeId, replicas: NodeSet, tweak: Option<&ChainTweak>) -> ChainConfig {
        let mut config = ChainConfig::new(me, replicas);
        config.retransmit_timeout = self.retransmit_timeout;
        config.window_max = self.window_max;
        config.layout = self.layout;
        // Small chunks: a copy takes a dozen or more gWRITEs, so crashes and views land
        // mid-copy.
        config.copy_chunk_bytes = 512;
        if let Some(tweak) = tweak {
            tweak(&mut config);
        }
        config
    }
}

/// The simulator setup for the chain store, in the main swarm's shape: the real membership
/// service (removals of live nodes, rejoins), restarts and drifting clocks. Each seed draws the
/// retransmission timeout, the pipelining window and a layout (a small log and index, so
/// wrap-around and probing are exercised). A restarted node keeps its region on half of its
/// restarts (a restart on its data directory: it offers the region, and the coordinator sends
/// only the records it lacks when it can prove the region is a prefix of its own) and starts
/// with an empty one on the others (a replacement machine: a copy of the whole region). A kept
/// region holds what the member had flushed (`Region::simulated`).
///
/// With `--appendonly` (`SimConfig::appendonly`) the nodes keep their region and their chain
/// state on their simulated disks instead, as `chorus node` does with `appendonly yes`
/// ([`simulate_on_disk`]).
pub fn setup(tweak: Option<ChainTweak>) -> ProtocolSetup {
    let simulate_seed = move |config: &SimConfig| {
        let options = Options::draw(config.seed);
        if config.appendonly != AppendOnly::Off {
            let run = simulate_on_disk(config, options, tweak.as_ref());
            return (run, format!("{}, appendonly", options.describe()));
        }
        let mut build = |me: NodeId, replicas: NodeSet, seed: u64, crashed: Option<&Chain>| {
            let mut chain_config = options.config(me, replicas, tweak.as_ref());
            chain_config.joining = crashed.is_some();
            chain_config.incarnation = seed | 1;
            // A simulated region: what a crash keeps is what the member flushed (gFLUSH).
            let bytes = chain_config.layout.region_bytes();
            let mut region =
                Region::simulated(TenantId(0), "chain", bytes).expect("a region of the layout's size");
            if let Some(crashed) = crashed {
                chain_config.seq_floor = crashed.next_update_seq();
                if let (Some(kept), true) = (crashed.region(), seed % 2 == 1) {
                    region.write(0, &kept.crash_image()[..bytes as usize]).expect("same layout, same size");
                    region.flush().expect("a simulated region flushes");
                    // What it would have recorded: it rejoins, offering the region if whole.
                    let state = crashed.durable_state();
                    chain_config.restored = Some(ChainState { linked: false, ..state });
                }
            }
            Chain::with_region(chain_config, region)
        };
        (simulate_managed(&managed_sim_config(config), None, &mut build), options.describe())
    };
    ProtocolSetup::Custom { name: "chain", simulate: Arc::new(simulate_seed) }
}

/// The region's file on a node's simulated disk.
const REGION_FILE: &str = "chain.region";

/// A region on the node's simulated disk whose flushes wait for the end of the turn, as in
/// the server (`chorus_region::TurnFlush`).
type DiskRegion = TurnFlush<StorageRegion<SimDisk>>;
type DiskChain = Chain<ChainMember<DiskRegion>>;

/// The chain store with `appendonly yes` on every node's simulated disk: the region file
/// (flushed once per turn, before the turn's messages leave) and the chain's state records in
/// the append-only file (`chorus_persistence`), beside `membership.log`. A crash loses, keeps
/// or tears each file's unsynced writes, a quarter of the seeds cut power to every node at
/// once, and on a quarter of the seeds one restart finds a corrupted sector. A restarted node
/// does what `chorus node` does (crates/server/src/lib.rs, `open_chain`): it redoes the
/// records a crash may have cut short, checks the region against its checksums, and comes
/// back as the member it was if its files say it was linked; a refused region is repaired by
/// a copy from the head.
fn simulate_on_disk(config: &SimConfig, options: Options, tweak: Option<&ChainTweak>) -> SeedRun {
    let mut draw = Rng::new(config.seed ^ 0x414F_4621);
    let persistence = appendonly_options(*draw.pick(&[1 << 10, 16 << 10, 64 << 20]));
    let mut corrupt_one_restart = draw.chance(0.25);
    let mut first = |me: NodeId, replicas: NodeSet, seed: u64| {
        let disk = SimDisk::new();
        let mut chain_config = options.config(me, replicas, tweak);
        chain_config.incarnation = seed | 1;
        let region = open_region(&disk, chain_config.layout).expect("an empty disk opens");
        let chain = disk_chain(chain_config, region);
        let membership = Membership::new(swarm_membership_config(me, replicas), Time::ZERO);
        let node =
            OnDisk::new(WithMembership::new(chain, membership), disk.clone()).expect("an empty disk opens");
        let (aof, _) =
            Persistence::open_on(Box::new(disk), std::path::Path::new("appendonly"), persistence.clone())
                .expect("an empty disk opens");
        ChainOnDisk::new(node, aof, config.appendonly, false, StateRecord)
    };
    let mut restart = |context: RestartContext, crashed: &ChainOnDisk| {
        let disk = crashed.on_disk().disk().clone();
        let corrupt = std::mem::take(&mut corrupt_one_restart);
        let mut storage = StorageFaults::crash(&disk, context.seed, corrupt);
        let seq_floor = crashed.on_disk().node().protocol().next_update_seq();
        let replica = restart_on_disk(&context, &disk, options, tweak, &persistence, seq_floor, &mut storage)
            .map(|node| node.with_mode(config.appendonly));
        Restarted { replica, storage }
    };
    let managed = managed_sim_config(config);
    simulate_with_restarts(&SimConfig { power_loss: true, ..managed }, &mut first, &mut restart)
}

fn open_region(disk: &SimDisk, layout: ChainLayout) -> Result<StorageRegion<SimDisk>, String> {
    StorageRegion::open(disk.clone(), REGION_FILE, layout.region_bytes()).map_err(|error| error.to_string())
}

fn disk_chain(config: ChainConfig, region: StorageRegion<SimDisk>) -> DiskChain {
    let me = config.me;
    Chain::with_member(config, |initial| {
        ChainMember::new(initial, me, crate::replica::TENANT, TurnFlush::new(region))
            .map_err(|error| error.to_string())
    })
}

/// What a restarted node finds on its disk and makes of it.
fn restart_on_disk(
    context: &RestartContext,
    disk: &SimDisk,
    options: Options,
    tweak: Option<&ChainTweak>,
    persistence: &PersistenceOptions,
    seq_floor: u64,
    storage: &mut StorageFaults,
) -> Result<ChainOnDisk, String> {
    let opened = MembershipLog::open(disk.clone());
    // Refused: a checksum caught the damage to `membership.log` (the node stays down).
    storage.corruption_detected += opened.is_err() as u64;
    let (log, records) = opened.map_err(|error| error.to_string())?;
    let (mut aof, restored) =
        Persistence::open_on(Box::new(disk.clone()), std::path::Path::new("appendonly"), persistence.clone())
            .map_err(|error| format!("{error:#}"))?;
    aof.stop_clock();
    storage.corruption_detected += restored.refused as u64;
    let mut chain_config = options.config(context.node, context.replicas, tweak);
    let mut region = open_region(disk, chain_config.layout)?;
    let assessment =
        crate::restore::assess(&restored.records, restored.synced, chain_config.layout, &mut region);
    let state = assessment.state;
    storage.corruption_detected += assessment.region_refused as u64;
    let data_restored = state.as_ref().is_some_and(|state| state.linked) && restored.trusted;
    let mut membership_config = swarm_membership_config(context.node, context.replicas);
    let restarted = !records.is_empty() || !restored.fresh;
    if restarted && !data_restored {
        membership_config.join = Some(context.seed | 1);
    }
    let membership = Membership::restore(membership_config, context.now, &records);
    chain_config.joining = membership.is_joining();
    chain_config.restored = state;
    chain_config.incarnation = context.seed | 1;
    chain_config.seq_floor = seq_floor;
    let chain = disk_chain(chain_config, region);
    let from_disk = data_restored && !membership.is_joining();
    let node = OnDisk::from_parts(WithMembership::new(chain, membership), log, disk.clone());
    Ok(ChainOnDisk::new(node, aof, AppendOnly::Always, from_disk, StateRecord))
}

/// A managed chain node whose region and chain state are on its simulated disk: each turn
/// appends the chain's state if it changed, and the turn's region flushes and state records
/// are synced before its messages leave, as the server's event loop does
/// (crates/server/src/engine.rs, `perform_outbox`).
pub type ChainOnDisk = AppendOnlyNode<DiskChain, StateRecord>;

/// What the chain keeps in the append-only file: its state, when it changed.
pub struct StateRecord;

/// The chain as the append-only file sees it: no keys, only its state, which a snapshot
/// starts with.
struct StateOnly<'a>(&'a DiskChain);

impl Durable for StateOnly<'_> {
    fn durable_record(&self, _keys: &[Key]) -> Option<Vec<u8>> {
        None
    }
    fn durable_keys(&self) -> Vec<Key> {
        Vec::new()
    }
    fn holds_all_data(&self) -> bool {
        self.0.is_caught_up()
    }
    fn snapshot_header(&self) -> Vec<Vec<u8>> {
        vec![self.0.durable_state().encode()]
    }
}

impl TurnRecord<DiskChain> for StateRecord {
    /// The chain's state if it changed; the region's writes are on the disk already
    /// (unsynced until the turn's flush).
    fn write_durable(&mut self, file: &mut AppendOnlyFile<DiskChain>) -> bool {
        let chain = file.inner.node_mut().protocol_mut();
        let state: Vec<Vec<u8>> = chain.take_state_record().into_iter().collect();
        let wrote_state = !state.is_empty();
        file.aof.log_records(state);
        file.aof
            .end_turn(&StateOnly(file.inner.node().protocol()), &mut Vec::new(), true)
            .expect("the simulated disk never fails a write");
        wrote_state || file.inner.node().protocol().sync_pending()
    }
    /// The state records and the region's flushes; with [`AppendOnly::AckBeforeSync`] only
    /// once a period, after the messages that depended on them left (the broken variant).
    fn sync_durable(&mut self, file: &mut AppendOnlyFile<DiskChain>) {
        if file.mode == AppendOnly::AckBeforeSync && file.now < file.synced_at + ACK_BEFORE_SYNC_PERIOD {
            return;
        }
        file.synced_at = file.now;
        file.aof.sync_now().expect("the simulated disk never fails a sync");
        file.inner.node_mut().protocol_mut().sync_turn(false).expect("the simulated disk never fails a sync");
    }
}

/// The chain store's broken variants, for `chorus sim --list-broken` and its tests; with
/// `ack-before-sync` a member's forwards and acknowledgements leave before its region and state
/// are synced (they are, once a period), so a crash or a power loss can lose what it passed on.
#[cfg(feature = "broken-variants")]
pub fn broken_variants() -> Vec<chorus_sim::broken::BrokenVariant> {
    let mut variants: Vec<chorus_sim::broken::BrokenVariant> = crate::Bug::ALL
        .into_iter()
        .map(|bug| chorus_sim::broken::BrokenVariant {
            protocol: "chain",
            name: chorus_sim::broken::kebab_case(&format!("{bug:?}")),
            seeds_max: 2_000,
            setup: setup(Some(Arc::new(move |config: &mut ChainConfig| config.bug = Some(bug)))),
        })
        .collect();
    variants.push(chorus_sim::broken::BrokenVariant {
        protocol: "chain",
        name: "ack-before-sync".to_string(),
        seeds_max: 2_000,
        setup: chorus_sim::runner::appendonly(setup(None), AppendOnly::AckBeforeSync),
    });
    variants
}
