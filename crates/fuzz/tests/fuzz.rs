//! Every fuzz target: the committed corpus and every regression input replay without a
//! panic, then a short deterministic fuzzing pass. Long runs: `chorus-fuzz run` (README of
//! docs/testing.md, "Fuzzing").

use chorus_fuzz::{corpus_dir, fuzz, read_inputs, regressions_dir, run_one, Target, TARGETS};

/// Executions per target in the test run: about a second each in a debug build.
const EXECUTIONS: u64 = 100_000;

fn inputs(target: &Target) -> Vec<Vec<u8>> {
    let corpus = read_inputs(&corpus_dir(target.name));
    assert!(!corpus.is_empty(), "no committed corpus for {} (run `chorus-fuzz seed`)", target.name);
    corpus.into_iter().chain(read_inputs(&regressions_dir(target.name))).map(|(_, input)| input).collect()
}

fn check(name: &str) {
    let target = TARGETS.iter().find(|target| target.name == name).expect("a target");
    for (file, input) in read_inputs(&regressions_dir(name)) {
        if let Err(crash) = run_one(target, &input) {
            panic!("{name}: regression {file} crashes again: {}", crash.message);
        }
    }
    let seeds = inputs(target);
    match fuzz(target, &seeds, EXECUTIONS, 22) {
        Ok(stats) => eprintln!("{name}: {stats:?}"),
        Err(crash) => {
            let path = crash.save().map(|path| path.display().to_string()).unwrap_or_default();
            panic!("{name}: crash ({}) on {:?}; saved to {path}: commit it", crash.message, crash.input);
        }
    }
}

#[test]
fn resp_framing_and_command_parsing() {
    check("resp");
}

#[test]
fn peer_codec_protocol_messages_and_handshake() {
    check("peer");
}

#[test]
fn membership_messages_and_log() {
    check("membership");
}

#[test]
fn group_host_wire() {
    check("group");
}

/// The committed corpus still matches what the cores send: a format change that left it
/// behind would fuzz from stale seeds.
#[test]
fn the_committed_corpus_is_current() {
    for target in TARGETS {
        let committed: Vec<Vec<u8>> =
            read_inputs(&corpus_dir(target.name)).into_iter().map(|(_, input)| input).collect();
        assert_eq!(committed, (target.seeds)(), "{}: run `cargo run -p chorus-fuzz -- seed`", target.name);
    }
}
