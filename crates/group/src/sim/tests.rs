use super::*;

/// Seeds in the plain `cargo test` sweep. `chorus sim`-style longer sweeps can call
/// [`run_seed`] with any range.
const SWEEP_SEEDS: u64 = 1_000;

fn describe(report: &SeedReport) -> String {
    format!(
        "seed {} ({} members, {} B regions, crash {:?}, faults {:?}): {}",
        report.seed,
        report.params.members,
        report.params.region_bytes,
        report.params.crash,
        report.params.faults,
        report.violations.join("; ")
    )
}

#[test]
fn a_thousand_seeds_with_faults_match_the_reference_model() {
    let (mut ok, mut rejected, mut failed, mut lost, mut duplicated, mut crashes) = (0, 0, 0, 0, 0, 0);
    let mut failures = Vec::new();
    for seed in 0..SWEEP_SEEDS {
        let report = run_seed(seed, false);
        ok += report.ops_ok;
        rejected += report.ops_rejected;
        failed += report.ops_failed;
        lost += report.messages_lost;
        duplicated += report.messages_duplicated;
        crashes += report.params.crash.is_some() as u32;
        if !report.violations.is_empty() {
            failures.push(describe(&report));
        }
    }
    assert!(
        failures.is_empty(),
        "{} seeds failed; replay with run_seed(seed, true):\n{}",
        failures.len(),
        failures.join("\n")
    );
    // The sweep must actually exercise what it claims to.
    assert!(ok > 10_000 && rejected > 500, "ok {ok}, rejected {rejected}");
    assert!(lost > 1_000 && duplicated > 1_000, "lost {lost}, duplicated {duplicated}");
    assert!(crashes > 50 && failed > 0, "crashes {crashes}, failed ops {failed}");
}

#[test]
fn a_seed_replays_exactly() {
    let a = run_seed(42, true);
    let b = run_seed(42, true);
    assert_eq!(a.trace, b.trace);
    assert!(a.trace.len() > 10);
}

fn caught(bug: Bug, seeds: u64) -> Option<SeedReport> {
    (0..seeds).find_map(|seed| {
        let mut params = SimParams::draw(seed);
        params.bug = Some(bug);
        let report = run_params(params, false);
        (!report.violations.is_empty()).then_some(report)
    })
}

#[test]
fn forwarding_before_the_flush_is_caught() {
    let report = caught(Bug::ForwardBeforeFlush, 300).expect("ForwardBeforeFlush went unnoticed");
    assert!(report.violations.iter().any(|v| v.contains("durable")), "{}", describe(&report));
}

#[test]
fn applying_ahead_of_a_gap_is_caught() {
    let report = caught(Bug::SkipGaps, 300).expect("SkipGaps went unnoticed");
    eprintln!("{}", describe(&report));
}

#[test]
fn clipping_out_of_bounds_writes_is_caught() {
    let report = caught(Bug::ClipOutOfBounds, 300).expect("ClipOutOfBounds went unnoticed");
    eprintln!("{}", describe(&report));
}
