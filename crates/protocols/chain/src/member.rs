//! This node's member of the chain's HyperLoop group, as the core sees it.
//!
//! The core ([`crate::Chain`]) needs from its member what HyperLoop's NIC gives a replica:
//! group operations applied to the region in order (`on_message`), a new configuration
//! installed (`on_config`: the paper's `Initialize` of a new epoch), and the region itself
//! for reads, recovery and copies (`memory`). [`Member`] says exactly that, so the member can
//! live elsewhere than in the core's event loop (issue 17 point 5, docs/protocols/hyperloop.md
//! "`--protocol chain` on the group host").
//!
//! The local form is the group crate's sans-I/O member core, [`ChainMember`], over any region
//! memory: the simulator, the swarm tests and `chorus node` use it, and it is the reference.

use chorus_core::{NodeId, Time};
use chorus_group::{ChainMember, GroupConfig, GroupMessage, GroupOutbox};
use chorus_region::RegionMemory;

/// One member of the chain's group, over this node's region.
pub trait Member {
    type Memory: RegionMemory;

    /// The configuration installed last.
    fn config(&self) -> &GroupConfig;
    /// This member's place in the installed configuration's chain (0: the head).
    fn position(&self) -> usize;
    /// The region: what reads, recovery and copies see. Written by the member's application of
    /// group operations: inside the core's calls, or at any time if [`Member::applies_concurrently`].
    fn memory(&self) -> &Self::Memory;
    fn memory_mut(&mut self) -> &mut Self::Memory;
    /// Apply a group operation (in order, once) and forward or acknowledge it.
    fn on_message(&mut self, now: Time, from: NodeId, message: GroupMessage, out: &mut GroupOutbox);
    fn on_tick(&mut self, now: Time, out: &mut GroupOutbox);
    /// Install a newer configuration (a stale or repeated one is ignored). `Err`: it names a
    /// chain this member is not in, or a region it cannot serve.
    fn on_config(&mut self, now: Time, config: GroupConfig, out: &mut GroupOutbox) -> Result<(), String>;
    /// The runtime's end of a turn, before the turn's messages leave: make what the turn's
    /// operations asked to flush durable, once for all (`chorus_region::TurnFlush`). Members
    /// that flush each operation themselves (a group host) have nothing to do. `force`: flush
    /// whatever the policy says (a clean stop).
    fn sync_turn(&mut self, _force: bool) -> Result<(), String> {
        Ok(())
    }
    /// Whether [`Member::sync_turn`] has something to do.
    fn sync_pending(&self) -> bool {
        false
    }
    /// The node whose coordinator sent the configuration about to be installed: where the
    /// group's acknowledgements are wanted. A member that acknowledges straight to that node
    /// (the kernel path's tail) needs it; the others route through the core.
    fn coordinated_by(&mut self, _coordinator: NodeId) {}
    /// Operations are applied to [`Member::memory`] outside the core's calls, while the core
    /// may be reading it (a group host's process, the kernel path's XDP program): then every
    /// read, the tail's included, takes the read lock, which the group write lock waits for
    /// (docs/protocols/chain.md, "Tail reads"). The local member core applies only inside the
    /// core's calls, so its tail reads go lock-free (HyperLoop §5).
    fn applies_concurrently(&self) -> bool {
        false
    }
    /// This member's data path carries an operation in one kernel datagram (at most
    /// `chorus_group::kernel::layout::CHUNK_BYTES_MAX` bytes): the coordinator splits larger
    /// ones into consecutive pieces (`chorus_group::kernel::packet::split`).
    fn carries_datagrams(&self) -> bool {
        false
    }
}

/// The local form: the member core runs in the caller's event loop.
impl<M: RegionMemory> Member for ChainMember<M> {
    type Memory = M;

    fn config(&self) -> &GroupConfig {
        ChainMember::config(self)
    }
    fn position(&self) -> usize {
        ChainMember::position(self)
    }
    fn memory(&self) -> &M {
        ChainMember::memory(self)
    }
    fn memory_mut(&mut self) -> &mut M {
        ChainMember::memory_mut(self)
    }
    fn on_message(&mut self, now: Time, from: NodeId, message: GroupMessage, out: &mut GroupOutbox) {
        ChainMember::on_message(self, now, from, message, out)
    }
    fn on_tick(&mut self, now: Time, out: &mut GroupOutbox) {
        ChainMember::on_tick(self, now, out)
    }
    fn on_config(&mut self, now: Time, config: GroupConfig, out: &mut GroupOutbox) -> Result<(), String> {
        ChainMember::on_config(self, now, config, out).map_err(|error| error.to_string())
    }
    fn sync_turn(&mut self, force: bool) -> Result<(), String> {
        self.memory_mut().sync_turn(force).map_err(|error| format!("cannot flush the chain region: {error}"))
    }
    fn sync_pending(&self) -> bool {
        self.memory().flush_pending()
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use chorus_core::{ClientRequestId, Command, NodeSet, Outbox, Outcome, Replica};
    use std::cell::{Cell, RefCell};
    use std::rc::Rc;

    use chorus_group::txn::WRITER_BIT;
    use chorus_region::{Region, RegionError, TenantId};

    use super::*;
    use crate::{Chain, ChainConfig, ChainLayout, Message};

    fn one_replica() -> ChainConfig {
        let mut config = ChainConfig::new(NodeId(0), NodeSet::single(NodeId(0)));
        config.layout = ChainLayout::new(4096, 16, 4096).unwrap();
        config
    }

    /// Run the core until it has answered `request` (a one-replica chain needs no peer).
    fn answer(chain: &mut Chain, request: u64, command: Command) -> Outcome {
        let mut out = Outbox::<Message>::default();
        chain.on_client(Time::from_millis(1), ClientRequestId(request), command, &mut out);
        for tick in 2..100 {
            if let Some((_, outcome)) = out.replies.iter().find(|(id, _)| *id == ClientRequestId(request)) {
                return outcome.clone();
            }
            assert!(out.messages.is_empty(), "a one-replica chain sends nothing: {:?}", out.messages);
            chain.on_tick(Time::from_millis(tick), &mut out);
        }
        panic!("request {request} was not answered");
    }

    #[test]
    fn a_chain_over_a_member_given_by_with_member_serves_from_that_members_memory() {
        let config = one_replica();
        let bytes = config.layout.region_bytes();
        let mut chain = Chain::with_member(config, |initial| {
            assert_eq!(initial.chain, vec![NodeId(0)], "the first configuration is the view's chain");
            let region = Region::volatile(TenantId(0), "chain", bytes).unwrap();
            ChainMember::new(initial, NodeId(0), TenantId(0), region).map_err(|e| e.to_string())
        });
        assert!(chain.is_operational());
        let (key, value) = (Bytes::from("k"), Bytes::from("v"));
        let write = Command::Write { key: key.clone(), value: Some(value.clone()) };
        assert_eq!(answer(&mut chain, 1, write), Outcome::Written);
        assert_eq!(
            answer(&mut chain, 2, Command::Read { key: key.clone() }),
            Outcome::Value(Some(value.clone()))
        );
        let region = chain.region().expect("the member's memory");
        assert_eq!(crate::layout::lookup(region, &chain.layout(), &key), Ok(Some(value)));
    }

    #[test]
    fn a_member_that_cannot_be_made_or_holds_another_layout_serves_nothing_and_says_why() {
        let refused = Chain::with_member(one_replica(), |_| Err::<ChainMember<Region>, _>("no host".into()));
        assert_eq!(refused.region_error(), Some("no host"));
        assert!(!refused.is_operational());

        let other = ChainLayout::new(8192, 16, 4096).unwrap();
        let mut region = Region::volatile(TenantId(0), "chain", other.region_bytes()).unwrap();
        region.write(crate::layout::MAGIC_OFFSET, &other.magic_words()).unwrap();
        let foreign = Chain::with_member(one_replica(), |initial| {
            ChainMember::new(initial, NodeId(0), TenantId(0), region).map_err(|e| e.to_string())
        });
        assert!(
            foreign.region_error().unwrap().contains("another chain layout"),
            "{:?}",
            foreign.region_error()
        );
        assert!(!foreign.is_operational());
    }

    /// A region that notes the lock word each time a database byte is read (a lookup in
    /// progress), and can show the lock word as held by a writer, as a group host does while
    /// it executes a batch.
    struct Watched {
        region: Region,
        db_offset: u64,
        words_during_lookups: Rc<RefCell<Vec<u64>>>,
        writer_holds: Rc<Cell<bool>>,
    }

    impl RegionMemory for Watched {
        fn size(&self) -> u64 {
            self.region.size()
        }
        fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), RegionError> {
            if offset == crate::layout::LOCK_OFFSET && self.writer_holds.get() {
                buf.copy_from_slice(&(WRITER_BIT | 1).to_le_bytes());
                return Ok(());
            }
            if offset >= self.db_offset {
                let word = self.region.load_u64(crate::layout::LOCK_OFFSET)?;
                self.words_during_lookups.borrow_mut().push(word);
            }
            self.region.read(offset, buf)
        }
        fn write(&mut self, offset: u64, data: &[u8]) -> Result<(), RegionError> {
            self.region.write(offset, data)
        }
        fn memcpy(&mut self, src: u64, dst: u64, len: u64) -> Result<(), RegionError> {
            self.region.memcpy(src, dst, len)
        }
        fn cas(&mut self, offset: u64, old: u64, new: u64) -> Result<u64, RegionError> {
            if offset == crate::layout::LOCK_OFFSET && self.writer_holds.get() {
                return Ok(WRITER_BIT | 1);
            }
            self.region.cas(offset, old, new)
        }
        fn flush(&mut self) -> Result<(), RegionError> {
            self.region.flush()
        }
    }

    /// The member core over a watched region, applying inside the core's calls or (as far as
    /// the core is told) outside them, as a group host does.
    struct Watchable {
        core: ChainMember<Watched>,
        concurrent: bool,
    }

    impl Member for Watchable {
        type Memory = Watched;
        fn config(&self) -> &GroupConfig {
            self.core.config()
        }
        fn position(&self) -> usize {
            self.core.position()
        }
        fn memory(&self) -> &Watched {
            self.core.memory()
        }
        fn memory_mut(&mut self) -> &mut Watched {
            self.core.memory_mut()
        }
        fn on_message(&mut self, now: Time, from: NodeId, message: GroupMessage, out: &mut GroupOutbox) {
            self.core.on_message(now, from, message, out)
        }
        fn on_tick(&mut self, now: Time, out: &mut GroupOutbox) {
            self.core.on_tick(now, out)
        }
        fn on_config(&mut self, now: Time, config: GroupConfig, out: &mut GroupOutbox) -> Result<(), String> {
            self.core.on_config(now, config, out).map_err(|error| error.to_string())
        }
        fn applies_concurrently(&self) -> bool {
            self.concurrent
        }
    }

    /// The lock words seen during lookups, and the switch that shows the word held by a writer.
    type Watch = (Rc<RefCell<Vec<u64>>>, Rc<Cell<bool>>);

    /// A one-replica chain (its node is the tail) over a watched region.
    fn watched_tail(concurrent: bool) -> (Chain<Watchable>, Watch) {
        let config = one_replica();
        let layout = config.layout;
        let words = Rc::new(RefCell::new(Vec::new()));
        let writer_holds = Rc::new(Cell::new(false));
        let (w, h) = (words.clone(), writer_holds.clone());
        let chain = Chain::with_member(config, move |initial| {
            let region = Region::volatile(TenantId(0), "chain", layout.region_bytes()).unwrap();
            let memory =
                Watched { region, db_offset: layout.txn.db_offset, words_during_lookups: w, writer_holds: h };
            let core =
                ChainMember::new(initial, NodeId(0), TenantId(0), memory).map_err(|e| e.to_string())?;
            Ok(Watchable { core, concurrent })
        });
        (chain, (words, writer_holds))
    }

    #[test]
    fn a_tail_whose_member_applies_outside_the_event_loop_reads_under_the_reader_count() {
        for concurrent in [false, true] {
            let (mut chain, (words, writer_holds)) = watched_tail(concurrent);
            let (key, value) = (Bytes::from("k"), Bytes::from("v"));
            let mut out = Outbox::<Message>::default();
            chain.on_client(
                Time::from_millis(1),
                ClientRequestId(1),
                Command::Write { key: key.clone(), value: Some(value.clone()) },
                &mut out,
            );
            for tick in 2..50 {
                chain.on_tick(Time::from_millis(tick), &mut out);
            }
            assert_eq!(out.replies.last().map(|(_, outcome)| outcome), Some(&Outcome::Written));

            // A lookup at the tail: lock-free in the event loop (HyperLoop §5), under a reader
            // count in the lock word where the member applies outside it.
            words.borrow_mut().clear();
            let mut out = Outbox::<Message>::default();
            chain.on_client(
                Time::from_millis(60),
                ClientRequestId(2),
                Command::Read { key: key.clone() },
                &mut out,
            );
            assert_eq!(out.replies, vec![(ClientRequestId(2), Outcome::Value(Some(value.clone())))]);
            let seen = words.borrow().clone();
            assert!(!seen.is_empty(), "the lookup read the database");
            let expected = u64::from(concurrent);
            assert!(
                seen.iter().all(|word| *word == expected),
                "concurrent {concurrent}: lock word {seen:?} during the lookup"
            );
            assert_eq!(
                chain.region().unwrap().region.load_u64(crate::layout::LOCK_OFFSET).unwrap(),
                0,
                "the count is given back"
            );

            // The group write lock held (a host executing a batch): the hosted tail's read
            // waits for the unlock; the event loop's never meets it mid-execution.
            writer_holds.set(true);
            let mut out = Outbox::<Message>::default();
            chain.on_client(
                Time::from_millis(61),
                ClientRequestId(3),
                Command::Read { key: key.clone() },
                &mut out,
            );
            if concurrent {
                assert!(
                    out.replies.is_empty(),
                    "a hosted tail read under a held write lock: {:?}",
                    out.replies
                );
                writer_holds.set(false);
                chain.on_tick(Time::from_millis(62), &mut out);
            }
            assert_eq!(out.replies, vec![(ClientRequestId(3), Outcome::Value(Some(value.clone())))]);
            let stats = chain.stats();
            assert_eq!(
                (stats.reads_tail, stats.reads_locked, stats.reads_parked),
                (2, 0, u64::from(concurrent))
            );
        }
    }
}
