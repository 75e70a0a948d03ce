//! Moving a slot's keys (docs/decisions.md, decision 16; docs/resp.md, "Cluster"): the drain
//! reporter and the movers of a node.
//!
//! * [`report_drains`]: for every slot moving away from this node's group, once this node has
//!   applied the move and no command on the slot is running here ([`super::gate`]), it says
//!   so to the metadata service (`Drained`). The copy starts only when every node of the
//!   group has.
//!   Likewise a node of the new group reports `Sealed` once it takes no more copies of the
//!   move and runs none.
//! * [`run_movers`]: for every slot being copied from this group, list its keys here and move
//!   each with `chorus_membership::routing::KeyMove`: mark it here (a compare-and-swap through
//!   this group's protocol), copy it to the new group (`CLUSTER COPYIN`, which writes it there
//!   as `RESTORE ... REPLACE ABSTTL` does), leave a tombstone; once every key is a tombstone,
//!   `Copied`. Once the new group has sealed, delete what is left here and say `Cleaned`.
//!   The group's first node moves at once, the others only if a slot is still moving seconds
//!   later (its first node may be down): movers may race, which the marker and the seal make
//!   safe.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use chorus_core::slots::{key_slot, Slot};
use chorus_core::{Command, Key, Outcome};
use chorus_membership::routing::{clean_step, KeyMove, MoveStep};
use chorus_membership::{MovePhase, SlotChange, SlotMove};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tracing::{debug, info, warn};

use super::service::Cluster;
use crate::engine::EngineHandle;

const DRAIN_POLL: Duration = Duration::from_millis(10);
/// A report not seen applied by then is made again.
const REPORT_AGAIN: Duration = Duration::from_millis(500);
const MOVER_POLL: Duration = Duration::from_millis(50);
/// How long node `i` of a group waits before moving a slot its first node should have moved.
const STAND_IN_DELAY: Duration = Duration::from_secs(3);
/// One request to the new group's node: connect, ASKING, RESTORE.
const TARGET_TIMEOUT: Duration = Duration::from_secs(2);
/// Steps of one key's move tried before the pass gives up on it (the next pass resumes: the
/// marker, if set, holds the value).
const STEPS_MAX: usize = 32;

/// Report, forever: slots moving away from this node's group once nothing this node started
/// on them is running (`Drained`), and slots moving into it once no copy is running here
/// (`Sealed`).
pub async fn report_drains(cluster: Cluster) {
    let mut reported: BTreeMap<(Slot, u64, MovePhase), Instant> = BTreeMap::new();
    let mut poll = tokio::time::interval(DRAIN_POLL);
    loop {
        poll.tick().await;
        // The map first, then the gates: see gate.rs for why this order makes it safe.
        let map = cluster.map();
        let me = map.me().clone();
        let now = Instant::now();
        for (slot, moving) in map.table().moves() {
            let change = match moving.phase {
                MovePhase::Closing
                    if map.owner(slot) == me.group
                        && !moving.drained.contains(me.node)
                        && cluster.gates().running(slot) == 0 =>
                {
                    SlotChange::Drained { slot, node: me.node, began: moving.began }
                }
                MovePhase::Sealing
                    if moving.to == me.group
                        && !moving.sealed.contains(me.node)
                        && cluster.copies().running(slot) == 0 =>
                {
                    SlotChange::Sealed { slot, node: me.node, began: moving.began }
                }
                _ => continue,
            };
            let key = (slot, moving.began, moving.phase);
            if reported.get(&key).is_some_and(|at| now < *at + REPORT_AGAIN) {
                continue;
            }
            reported.insert(key, now);
            debug!(slot, phase = ?moving.phase, "reporting the slot's move done here");
            let cluster = cluster.clone();
            tokio::spawn(async move {
                let _ = cluster.propose(change).await;
            });
        }
        reported.retain(|_, at| now < *at + REPORT_AGAIN * 4);
    }
}

/// Move the keys of every slot this group is copying away, and clean what is left of the
/// slots it has handed over, forever.
pub async fn run_movers(cluster: Cluster, engine: EngineHandle, password: Option<String>) {
    let mut first_seen: BTreeMap<(Slot, u64), Instant> = BTreeMap::new();
    let mut done_proposed: BTreeMap<(Slot, u64, MovePhase), Instant> = BTreeMap::new();
    let mut target = TargetLinks::new(password);
    let mut poll = tokio::time::interval(MOVER_POLL);
    loop {
        poll.tick().await;
        let map = cluster.map();
        let me = map.me().clone();
        let now = Instant::now();
        let work: BTreeMap<Slot, SlotMove> = map
            .table()
            .moves()
            .filter(|(slot, moving)| {
                map.owner(*slot) == me.group
                    && matches!(moving.phase, MovePhase::Copying | MovePhase::Cleaning)
            })
            .map(|(slot, moving)| (slot, *moving))
            .collect();
        first_seen.retain(|(slot, began), _| work.get(slot).is_some_and(|moving| moving.began == *began));
        let mine: BTreeMap<Slot, SlotMove> = work
            .into_iter()
            .filter(|(slot, moving)| {
                let since = *first_seen.entry((*slot, moving.began)).or_insert(now);
                now >= since + STAND_IN_DELAY * me.index as u32
            })
            .collect();
        if mine.is_empty() {
            continue;
        }
        // A read through the protocol first: a node that is not serving lists nothing it can
        // vouch for, and on ZAB the read makes the node apply everything committed before it.
        let barrier =
            engine.execute(Command::Read { key: Key::from_static(b"chorus:migration-barrier") }).await;
        if !matches!(barrier.outcome, Outcome::Value(_)) {
            continue;
        }
        let mut by_slot: BTreeMap<Slot, Vec<Key>> = mine.keys().map(|slot| (*slot, Vec::new())).collect();
        for key in engine.keys().await {
            if let Some(keys) = by_slot.get_mut(&key_slot(&key)) {
                keys.push(key);
            }
        }
        for (slot, keys) in by_slot {
            let moving = mine[&slot];
            let to = map.first_of(moving.to).addr;
            let all_done = match moving.phase {
                MovePhase::Cleaning => clean_keys(&engine, &keys).await,
                _ => copy_keys(&engine, &mut target, to, (slot, moving.began), &keys).await,
            };
            if !all_done {
                continue;
            }
            let key = (slot, moving.began, moving.phase);
            if done_proposed.get(&key).is_some_and(|at| now < *at + Duration::from_secs(1)) {
                continue;
            }
            done_proposed.insert(key, now);
            let change = match moving.phase {
                MovePhase::Cleaning => SlotChange::Cleaned { slot, began: moving.began },
                _ => SlotChange::Copied { slot, began: moving.began },
            };
            info!(slot, phase = ?moving.phase, "every key of the moving slot is done here");
            let cluster = cluster.clone();
            tokio::spawn(async move {
                let _ = cluster.propose(change).await;
            });
        }
        done_proposed.retain(|_, at| now < *at + Duration::from_secs(60));
    }
}

/// Copy every key (the slot's, listed here); whether each is gone or a tombstone now.
async fn copy_keys(
    engine: &EngineHandle,
    target: &mut TargetLinks,
    to: SocketAddr,
    copy: (Slot, u64),
    keys: &[Key],
) -> bool {
    for key in keys {
        if let Err(error) = move_key(engine, target, to, copy, key).await {
            warn!(slot = copy.0, %to, %error, "a key of a moving slot did not move yet; trying again");
            return false;
        }
    }
    true
}

/// Delete what is left of a handed-over slot here; whether nothing is left.
async fn clean_keys(engine: &EngineHandle, keys: &[Key]) -> bool {
    let mut clean = true;
    for key in keys {
        let read = engine.execute(Command::Read { key: key.clone() }).await.outcome;
        let stored = match read {
            Outcome::Value(stored) => stored,
            _ => return false,
        };
        if let Some(delete) = clean_step(key, stored.as_ref()) {
            engine.execute(delete).await;
            clean = false; // Read again on the next pass: something may have landed since.
        }
    }
    clean
}

/// Move one key from this group to the node at `to` (see `KeyMove`).
pub async fn move_key(
    engine: &EngineHandle,
    target: &mut TargetLinks,
    to: SocketAddr,
    copy: (Slot, u64),
    key: &Key,
) -> Result<(), String> {
    let mut state = KeyMove::start();
    for _ in 0..STEPS_MAX {
        let outcome = match state.step(key) {
            MoveStep::Done => return Ok(()),
            MoveStep::Source(command) => engine.execute(command).await.outcome,
            MoveStep::Target { key, value } => match target.copy(to, copy, &key, &value).await {
                Ok(()) => Outcome::Written,
                Err(error) => {
                    target.links.remove(&to);
                    return Err(error);
                }
            },
        };
        state = state.next(&outcome);
    }
    Err(format!("key {} changed under every attempt", String::from_utf8_lossy(key)))
}

/// Connections to the new groups' nodes, as a client of theirs.
pub struct TargetLinks {
    password: Option<String>,
    links: BTreeMap<SocketAddr, BufReader<TcpStream>>,
}

impl TargetLinks {
    pub fn new(password: Option<String>) -> TargetLinks {
        TargetLinks { password, links: BTreeMap::new() }
    }

    /// `CLUSTER COPYIN <slot> <began> <key> <deadline> <payload>` at `to`: the stored value
    /// `raw`, its deadline included, written there through the new group's protocol (as
    /// `RESTORE ... REPLACE ABSTTL`) while that group takes copies of the move `copy`.
    pub async fn copy(
        &mut self,
        to: SocketAddr,
        copy: (Slot, u64),
        key: &Key,
        raw: &Bytes,
    ) -> Result<(), String> {
        let entry = chorus_core::data::value::decode(raw)
            .map_err(|_| "a stored value does not decode".to_string())?;
        let payload = chorus_core::data::dump::payload(&entry.value);
        let deadline = entry.deadline_ms.unwrap_or(0).to_string();
        let (slot, began) = (copy.0.to_string(), copy.1.to_string());
        let request: [&[u8]; 7] =
            [b"CLUSTER", b"COPYIN", slot.as_bytes(), began.as_bytes(), key, deadline.as_bytes(), &payload];
        let request = async {
            let link = self.link(to).await?;
            send(link, &request).await?;
            expect_ok(link).await
        };
        tokio::time::timeout(TARGET_TIMEOUT, request)
            .await
            .map_err(|_| format!("{to} did not answer in time"))?
    }

    async fn link(&mut self, to: SocketAddr) -> Result<&mut BufReader<TcpStream>, String> {
        if !self.links.contains_key(&to) {
            let stream =
                TcpStream::connect(to).await.map_err(|error| format!("cannot reach {to}: {error}"))?;
            stream.set_nodelay(true).ok();
            let mut link = BufReader::new(stream);
            if let Some(password) = &self.password {
                send(&mut link, &[b"AUTH", password.as_bytes()]).await?;
                expect_ok(&mut link).await?;
            }
            self.links.insert(to, link);
        }
        Ok(self.links.get_mut(&to).expect("just connected"))
    }
}

async fn send(link: &mut BufReader<TcpStream>, args: &[&[u8]]) -> Result<(), String> {
    let mut frame = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        frame.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        frame.extend_from_slice(arg);
        frame.extend_from_slice(b"\r\n");
    }
    link.get_mut().write_all(&frame).await.map_err(|error| error.to_string())
}

/// Read one reply: `+OK` passes; an error line is returned as the error.
async fn expect_ok(link: &mut BufReader<TcpStream>) -> Result<(), String> {
    let mut line = String::new();
    if link.read_line(&mut line).await.map_err(|error| error.to_string())? == 0 {
        return Err("connection closed".into());
    }
    let line = line.trim_end();
    match line.as_bytes().first() {
        Some(b'+') => Ok(()),
        Some(b'-') => Err(line[1..].to_string()),
        Some(b'$') => {
            // A bulk reply (not expected): skip it to keep the link in step.
            let length: i64 = line[1..].parse().map_err(|_| format!("bad reply {line}"))?;
            if length >= 0 {
                let mut skip = vec![0; length as usize + 2];
                link.read_exact(&mut skip).await.map_err(|error| error.to_string())?;
            }
            Err(format!("unexpected bulk reply of {length} bytes"))
        }
        _ => Err(format!("unexpected reply {line}")),
    }
}
