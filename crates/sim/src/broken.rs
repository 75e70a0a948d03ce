//! The deliberately broken variants of every protocol this crate simulates, by name: what
//! `chorus sim --list-broken` lists and `--broken VARIANT` runs, and what the tests require the
//! checker to catch. A variant counts as caught only when a seed's history has a
//! linearizability violation (or breaks the variant's named invariant), never for a panic, a
//! debug assertion or a stall: those would say the protocol noticed its own bug, not that the
//! simulator can see what a client would.
//!
//! (The chain store's variants live in `chorus_chain::sim::broken_variants`, which depends on this
//! crate.)

use std::sync::Arc;

use crate::managed::{AppendOnly, MembershipTweak};
use crate::runner::{ProtocolSetup, ReadMode};
use crate::simulator::SimConfig;

/// One broken variant and how to run it.
#[derive(Clone)]
pub struct BrokenVariant {
    pub protocol: &'static str,
    /// Kebab-case, as `--broken` takes it.
    pub name: String,
    /// The test suite requires a violation among seeds `0..seeds_max` at 3 replicas.
    pub seeds_max: u64,
    pub setup: ProtocolSetup,
}

/// `KeepAcksOnViewChange` -> `keep-acks-on-view-change`.
pub fn kebab_case(camel: &str) -> String {
    let mut kebab = String::with_capacity(camel.len() + 8);
    for (index, character) in camel.chars().enumerate() {
        if character.is_ascii_uppercase() && index > 0 {
            kebab.push('-');
        }
        kebab.push(character.to_ascii_lowercase());
    }
    kebab
}

fn variant(
    protocol: &'static str,
    bug: &impl std::fmt::Debug,
    seeds_max: u64,
    setup: ProtocolSetup,
) -> BrokenVariant {
    BrokenVariant { protocol, name: kebab_case(&format!("{bug:?}")), seeds_max, setup }
}

/// How many seeds each variant may take before the tests call it missed. Measured first
/// failing seeds are in docs/testing.md; each bound leaves room for the swarm to change.
fn hermes_seeds_max(bug: chorus_hermes::Bug) -> u64 {
    use chorus_hermes::Bug;
    match bug {
        Bug::KeepAcksOnViewChange => 20_000,
        Bug::ValidateSuperseded => 30_000,
        Bug::ChunkOverwritesNewer => 5_000,
        _ => 1_000,
    }
}

/// Every variant of Hermes, CRAQ, ZAB and raftlog, and the membership service's own.
pub fn variants() -> Vec<BrokenVariant> {
    let mut all = Vec::new();
    for bug in chorus_hermes::Bug::ALL {
        let tweak = Arc::new(move |config: &mut chorus_hermes::HermesConfig| config.bug = Some(bug));
        let setup = ProtocolSetup::Hermes { tweak: Some(tweak), membership: None };
        all.push(variant("hermes", &bug, hermes_seeds_max(bug), setup));
    }
    // The membership service's: promises without the drift margin, so a lease can outlive a
    // promise when clocks drift (run under Hermes, whose reads lean on the lease). First
    // caught at seed 8,665 since a core hears the membership's lease before its first
    // request (it was caught earlier while a restarted node briefly kept an unlimited lease,
    // a real bug that made this variant look easier to catch than it is).
    let no_margin: MembershipTweak = Arc::new(|config| config.drift_margin = chorus_core::Time::ZERO);
    all.push(BrokenVariant {
        protocol: "hermes",
        name: "lease-without-drift-margin".to_string(),
        seeds_max: 20_000,
        setup: ProtocolSetup::Hermes { tweak: None, membership: Some(no_margin) },
    });
    // The server's persistence, not a protocol's: a replica whose ACKs (and every other
    // message and reply) leave before the turn's append-only records are synced, run on the
    // swarm that restarts nodes from their files; a crash then loses what it acknowledged.
    all.push(BrokenVariant {
        protocol: "hermes",
        name: "ack-before-sync".to_string(),
        seeds_max: 2_000,
        setup: crate::runner::appendonly(ProtocolSetup::hermes(), AppendOnly::AckBeforeSync),
    });
    // The server's, not a protocol's: a replica that expires keys by its own clock (a typed
    // read answers "absent" once its clock passes the deadline, without the replicated
    // delete), under every protocol the server runs on.
    for (protocol, setup) in [
        ("hermes", ProtocolSetup::hermes()),
        ("craq", ProtocolSetup::craq()),
        ("zab", ProtocolSetup::zab(ReadMode::Sync)),
        ("raftlog", ProtocolSetup::raftlog()),
    ] {
        all.push(BrokenVariant {
            protocol,
            name: "expiry-by-local-clock".to_string(),
            seeds_max: 2_000,
            setup: expiring_by_local_clock(protocol, setup),
        });
    }
    for bug in chorus_craq::Bug::ALL {
        let tweak = Arc::new(move |config: &mut chorus_craq::CraqConfig| config.bug = Some(bug));
        all.push(variant("craq", &bug, 2_000, ProtocolSetup::Craq { tweak: Some(tweak), membership: None }));
    }
    for bug in chorus_zab::Bug::ALL {
        let tweak = Arc::new(move |config: &mut chorus_zab::ZabConfig| config.bug = Some(bug));
        let setup = ProtocolSetup::Zab { read_mode: ReadMode::Sync, tweak: Some(tweak), membership: None };
        all.push(variant("zab", &bug, 3_000, setup));
    }
    for bug in chorus_raftlog::Bug::ALL {
        let tweak = Arc::new(move |config: &mut chorus_raftlog::RaftLogConfig| config.bug = Some(bug));
        all.push(variant("raftlog", &bug, 1_000, ProtocolSetup::Raftlog { tweak: Some(tweak) }));
    }
    all
}

/// `setup` run by a server that expires keys by its replica's unsynchronised clock.
fn expiring_by_local_clock(protocol: &'static str, setup: ProtocolSetup) -> ProtocolSetup {
    let simulate = move |config: &SimConfig| {
        let broken = SimConfig { expiry_by_local_clock: true, ..config.clone() };
        setup.simulate(&broken)
    };
    ProtocolSetup::Custom { name: protocol, simulate: Arc::new(simulate) }
}

/// The variant `protocol`/`name` among `variants`.
pub fn find<'a>(variants: &'a [BrokenVariant], protocol: &str, name: &str) -> Option<&'a BrokenVariant> {
    variants.iter().find(|variant| variant.protocol == protocol && variant.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_kebab_case_and_unique() {
        assert_eq!(kebab_case("KeepAcksOnViewChange"), "keep-acks-on-view-change");
        assert_eq!(kebab_case("IgnoreLease"), "ignore-lease");
        let all = variants();
        let mut names: Vec<(&str, &str)> = all.iter().map(|v| (v.protocol, v.name.as_str())).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), all.len());
        assert!(find(&all, "hermes", "keep-acks-on-view-change").is_some());
    }
}
