//! The slot check every command passes when the node is one group of a sharded cluster
//! (docs/resp.md, "Cluster"): its keys' slot is routed by the metadata service's map, and a
//! command that runs holds the slot's gate until its reply is made (cluster/gate.rs), which
//! is what a slot move's drain counts.

use std::net::SocketAddr;

use bytes::Bytes;
use chorus_core::slots::{key_slot, Slot};
use chorus_core::{Command, Outcome};
use chorus_membership::routing::accepts_copy;
use chorus_membership::{MovePhase, SlotChange};
use tokio::io::{AsyncRead, AsyncWrite};

use super::Connection;
use crate::cluster::command::MoveUntil;
use crate::cluster::gate::GateGuard;
use crate::cluster::map::{try_again, Routed, SlotMap};
use crate::cluster::migrate::{move_key, TargetLinks};
use crate::resp::Reply;

/// What the check decided before the command runs.
pub(super) enum Admit {
    /// Run it (holding this gate, if it has keys and the node is sharded).
    Run(Option<GateGuard>),
    /// Answer this instead.
    Refuse(Reply),
    /// The slot is being copied away: answer `ask` if this group holds none of the keys.
    CheckPresence { slot: Slot, ask: Reply },
}

impl<S> Connection<S> {
    /// Route `args` (whose parse succeeded) by the slot map, entering its slot's gate. Takes
    /// the connection's ASKING flag: it covers one command, as in Redis.
    pub(super) fn admit(&mut self, args: &[Bytes]) -> Admit {
        let asking = std::mem::take(&mut self.asking);
        let Some(cluster) = self.shared.cluster.as_ref() else { return Admit::Run(None) };
        let slot = match SlotMap::slot_of(args) {
            Err(reply) => return Admit::Refuse(reply),
            Ok(None) => return Admit::Run(None),
            Ok(Some(slot)) => slot,
        };
        // Enter before reading the map: see cluster/gate.rs.
        let gate = cluster.gates().enter(slot);
        match cluster.map().route_slot(slot, asking) {
            Routed::Serve => Admit::Run(Some(gate)),
            Routed::Reply(reply) => Admit::Refuse(reply),
            Routed::CheckPresence { ask } => Admit::CheckPresence { slot, ask },
        }
    }

    /// During a move's copy, at its old group: `-ASK` if this group holds none of the
    /// command's keys (the new group has them, or nobody does), `-TRYAGAIN` while it still
    /// holds one (the movers are on it).
    pub(super) async fn presence(&mut self, args: &[Bytes], slot: Slot, ask: Reply) -> Reply {
        let reads =
            crate::command::command_keys(args).into_iter().map(|key| Command::Read { key: key.clone() });
        let outcomes = self.shared.engine.execute_all(reads.collect()).await;
        let none_held = outcomes.iter().all(|done| matches!(done.outcome, Outcome::Value(None)));
        if none_held {
            ask
        } else {
            try_again(slot)
        }
    }

    /// EXEC: the slots of the queued commands (and watched keys) must still be served here,
    /// and stay gated while the transaction runs.
    pub(super) fn enter_slots(&self, keys: &[&Bytes]) -> Result<Vec<GateGuard>, Reply> {
        let Some(cluster) = self.shared.cluster.as_ref() else { return Ok(Vec::new()) };
        let mut slots: Vec<Slot> = keys.iter().map(|key| key_slot(key)).collect();
        slots.sort_unstable();
        slots.dedup();
        let mut gates = Vec::with_capacity(slots.len());
        for slot in slots {
            gates.push(cluster.gates().enter(slot));
            match cluster.map().route_slot(slot, false) {
                Routed::Serve => {}
                Routed::Reply(reply) => return Err(reply),
                Routed::CheckPresence { .. } => return Err(try_again(slot)),
            }
        }
        Ok(gates)
    }
}

impl<S> Connection<S> {
    /// CLUSTER SETSLOT NODE/MIGRATING: start moving `slot` to `group` unless that move is
    /// under way, then wait until it reached `until`.
    pub(super) async fn move_slot(&mut self, slot: Slot, group: u16, until: MoveUntil) -> Reply {
        let cluster = self.shared.cluster.clone().expect("planned only when sharded");
        let reached = move |map: &SlotMap| {
            let moving = map.table().moving(slot);
            match until {
                MoveUntil::Owned => map.owner(slot) == group && moving.is_none(),
                MoveUntil::Copying => {
                    (map.owner(slot) == group && moving.is_none())
                        || moving
                            .is_some_and(|moving| moving.to == group && moving.phase != MovePhase::Closing)
                }
            }
        };
        let map = cluster.map();
        if reached(&map) {
            return Reply::ok();
        }
        match map.table().moving(slot) {
            Some(moving) if moving.to != group => {
                return Reply::err(format!(
                    "slot {slot} is moving to another group; wait for it, or CLUSTER SETSLOT {slot} STABLE while it is still closing"
                ))
            }
            Some(_) => {}
            None => {
                if let Err(error) = cluster.propose(SlotChange::BeginMove { slot, to: group }).await {
                    return Reply::err(error);
                }
            }
        }
        let patience = match until {
            MoveUntil::Copying => MIGRATING_PATIENCE,
            MoveUntil::Owned => NODE_PATIENCE,
        };
        if cluster.wait_for(patience, reached).await {
            Reply::ok()
        } else {
            Reply::err(format!(
                "slot {slot} has not moved within {} s (a node of its group has not drained: every node of the old group must be up; CLUSTER SETSLOT {slot} STABLE calls a closing move off); check CLUSTER NODES",
                patience.as_secs()
            ))
        }
    }

    /// CLUSTER SETSLOT STABLE.
    pub(super) async fn cancel_move(&mut self, slot: Slot) -> Reply {
        let cluster = self.shared.cluster.clone().expect("planned only when sharded");
        let Some(began) = cluster.map().table().moving(slot).map(|moving| moving.began) else {
            return Reply::ok();
        };
        match cluster.propose(SlotChange::CancelMove { slot, began }).await {
            Ok(_) => Reply::ok(),
            Err(error) => Reply::err(error),
        }
    }

    /// MIGRATE: move `keys` (of slots this group is copying away) to the node at `to` now.
    pub(super) async fn migrate(
        &mut self,
        to: SocketAddr,
        keys: Vec<Bytes>,
        password: Option<String>,
    ) -> Reply {
        let cluster = self.shared.cluster.clone().expect("planned only when sharded");
        let map = cluster.map();
        let mut moves = Vec::with_capacity(keys.len());
        for key in &keys {
            let slot = key_slot(key);
            let copying = map.table().moving(slot).filter(|moving| moving.phase == MovePhase::Copying);
            let Some(moving) = copying.filter(|_| map.owner(slot) == map.me().group) else {
                return Reply::err(format!(
                    "IOERR slot {slot} is not being copied from this group: CLUSTER SETSLOT {slot} MIGRATING <node-id> first"
                ));
            };
            moves.push((slot, moving.began));
        }
        let present = self
            .shared
            .engine
            .execute_all(keys.iter().map(|key| Command::Read { key: key.clone() }).collect())
            .await;
        if present.iter().all(|done| matches!(done.outcome, Outcome::Value(None))) {
            return Reply::Status("NOKEY");
        }
        let mut links = TargetLinks::new(password);
        for (key, copy) in keys.iter().zip(moves) {
            if let Err(error) = move_key(&self.shared.engine, &mut links, to, copy, key).await {
                return Reply::err(format!("IOERR {error}"));
            }
        }
        Reply::ok()
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin + Send> Connection<S> {
    /// CLUSTER COPYIN: a mover of the old group writes one key here (as `RESTORE ... REPLACE
    /// ABSTTL`), while this group takes copies of that move; it holds the slot's copy gate,
    /// which the seal waits for (cluster/migrate.rs).
    pub(super) async fn copy_in(&mut self, slot: Slot, began: u64, args: Vec<Bytes>) -> Reply {
        let cluster = self.shared.cluster.clone().expect("planned only when sharded");
        if key_slot(&args[1]) != slot {
            return Reply::err("the key is not in that slot");
        }
        let _copy = cluster.copies().enter(slot);
        let map = cluster.map();
        if !accepts_copy(map.table(), map.me().group, slot, began) {
            return Reply::error(format!("TRYAGAIN this group takes no copies of slot {slot}'s move now"));
        }
        self.run_data(args).await
    }
}

/// How long SETSLOT MIGRATING waits for the old group to drain.
const MIGRATING_PATIENCE: std::time::Duration = std::time::Duration::from_secs(10);
/// How long SETSLOT NODE waits for the whole move.
const NODE_PATIENCE: std::time::Duration = std::time::Duration::from_secs(60);
