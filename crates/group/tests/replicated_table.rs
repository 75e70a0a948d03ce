//! The `replicated_table` example (HyperLoop §5's transaction API building a table) end to end
//! through real processes: group hosts as child processes, the chain and the Naïve baseline.

#[allow(dead_code)]
#[path = "../examples/replicated_table.rs"]
mod example;

use chorus_group::runtime::HostMode;
use example::{Options, Summary};

fn options(mode: HostMode, members: usize, tag: &str) -> Options {
    let dir = chorus_region::default_region_dir().join(format!("table-test-{tag}-{}", std::process::id()));
    Options {
        host_command: vec![env!("CARGO_BIN_EXE_chorus-group-child").to_string()],
        members,
        mode,
        rows: 8,
        transfers: 60,
        region_dir: dir,
    }
}

/// Runs the example and removes its region directory, which the example leaves to its caller.
fn run(options: &Options) -> anyhow::Result<Summary> {
    let result = example::run(options);
    let _ = std::fs::remove_dir_all(&options.region_dir);
    result
}

fn check(summary: &Summary, options: &Options) {
    assert_eq!(summary.committed + summary.refused, options.transfers);
    assert!(summary.committed > 0, "some transfers had the money");
    assert_eq!(summary.tables.len(), options.members);
    for (position, table) in summary.tables.iter().enumerate() {
        assert_eq!(table.len() as u64, options.rows);
        let total: u64 = table.iter().map(|a| a.balance).sum();
        assert_eq!(total, 1000 * options.rows, "member {position}: transfers keep the total");
        assert_eq!(table[3].name, "account-003");
        assert_eq!(table, &summary.tables[0], "member {position}'s table equals the head's");
    }
    assert!(summary.tables[0].iter().any(|a| a.balance != 1000), "the transfers changed some balance");
    assert_eq!(summary.region_files.len(), options.members);
    for file in &summary.region_files {
        assert_eq!(file, &summary.region_files[0], "region files are byte-identical");
    }
    assert!(!options.region_dir.join(format!("replicated-table-{}", std::process::id())).exists());
}

#[test]
fn the_example_table_replicates_through_host_processes() {
    let options = options(HostMode::Chorus, 3, "chain");
    let summary = run(&options).unwrap();
    check(&summary, &options);
    assert_eq!(summary.data_addrs, summary.host_addrs, "the hosts serve the chain themselves");
}

#[test]
fn the_example_table_replicates_through_naive_replica_processes() {
    let options = options(HostMode::Naive, 3, "naive");
    let summary = run(&options).unwrap();
    check(&summary, &options);
    assert_ne!(summary.data_addrs, summary.host_addrs, "every member was redirected to a replica");
}

#[test]
fn a_row_outside_the_table_is_refused() {
    let mut options = options(HostMode::Chorus, 1, "one");
    options.rows = 1;
    assert!(run(&options).is_err(), "a table of accounts needs two rows");
}
