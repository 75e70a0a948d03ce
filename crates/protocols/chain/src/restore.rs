//! What a chain node restarted on its data directory makes of what it kept (the server's
//! `chorus node` and the simulator run this same code): its last chain state record
//! (`crate::durable`) and its region, redone where a crash cut a record short and checked
//! against its checksums.

use chorus_region::RegionMemory;

use crate::durable::ChainState;
use crate::layout::{redo_interrupted, ChainLayout};

/// What a restarted node may start from.
#[derive(Debug, Default)]
pub struct Assessment {
    /// The state to restart with (`ChainConfig::restored`): `None` when nothing usable was
    /// kept (it joins and is copied the whole region).
    pub state: Option<ChainState>,
    /// The region failed its checks and is not used: it is repaired by a copy from the head.
    pub region_refused: bool,
    /// Why the node does not come back with its data, for the log (empty if it does).
    pub reason: String,
}

/// `records`: the append-only file's records, oldest first; `synced`: every record the node
/// acted on is among them (`appendfsync always`, or a clean stop), so the region was flushed
/// in step with them. Without that, the region is whatever the page cache wrote back, and
/// nothing in it is trusted.
pub fn assess(
    records: &[Vec<u8>],
    synced: bool,
    layout: ChainLayout,
    region: &mut impl RegionMemory,
) -> Assessment {
    if !synced {
        let reason = "the files were not synced in step with the region (appendfsync was not always \
                      and the node did not stop cleanly)";
        return Assessment { reason: reason.into(), ..Assessment::default() };
    }
    let state = match ChainState::last_of(records) {
        Ok(Some(state)) => state,
        Ok(None) => {
            return Assessment { reason: "no chain state was recorded".into(), ..Assessment::default() }
        }
        Err(error) => {
            let reason = format!("the chain state does not parse: {error}");
            return Assessment { reason, ..Assessment::default() };
        }
    };
    if !state.linked && !state.region_complete {
        let reason = "the region was being copied to when the node stopped".to_string();
        return Assessment { reason, ..Assessment::default() };
    }
    let checked = redo_interrupted(region, &layout)
        .map_err(|error| error.to_string())
        .and_then(|_| crate::mirror::verify(region, layout).map_err(|error| error.to_string()));
    if let Err(error) = checked {
        let reason = format!("the chain region is refused ({error}); it is repaired by a copy from the head");
        return Assessment { state: None, region_refused: true, reason };
    }
    let reason = if state.linked { String::new() } else { "it was not linked into the chain".into() };
    Assessment { state: Some(state), region_refused: false, reason }
}
