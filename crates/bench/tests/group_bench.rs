//! The §6.1 microbenchmark driver in quick form, in process (the CLI test in
//! crates/cli/tests/group_cli.rs runs it with hosts as processes through the real binary).
//! No timing assertions.

use std::path::PathBuf;

use chorus_bench::group::run::run;
use chorus_bench::group::BenchConfig;
use chorus_group::runtime::HostMode;

/// A fresh directory, removed on drop.
struct TestDir(PathBuf);

impl TestDir {
    fn new(tag: &str) -> TestDir {
        let dir =
            chorus_region::default_region_dir().join(format!("group-bench-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        TestDir(dir)
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn the_microbenchmark_runs_chain_and_naive_in_process() {
    let dir = TestDir::new("bench");
    let mut config = BenchConfig::quick();
    config.region_dir = Some(dir.0.clone());
    config.output = Some(dir.0.join("report.json"));
    let report = run(config).unwrap();
    for mode in [HostMode::Chorus, HostMode::Naive] {
        for primitive in ["gWRITE", "gWRITE+gFLUSH", "gFLUSH", "gMEMCPY", "gCAS"] {
            assert!(
                report.results.iter().any(|r| r.mode == mode && r.primitive == primitive && r.ops > 0),
                "{mode:?} {primitive}"
            );
        }
        assert!(report.results.iter().any(|r| r.mode == mode && r.kind == "throughput" && r.mib_per_s > 0.0));
        assert!(report.results.iter().any(|r| r.mode == mode && r.tenants == 2));
    }
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.0.join("report.json")).unwrap()).unwrap();
    assert!(json["results"].as_array().is_some_and(|r| !r.is_empty()));
    assert!(!report.table().is_empty());
}

#[test]
fn the_microbenchmark_repeats_every_point_under_the_background_load_and_stops_it() {
    let dir = TestDir::new("bench-load");
    let mut config = BenchConfig::quick();
    config.region_dir = Some(dir.0.clone());
    config.modes = vec![HostMode::Chorus];
    config.message_sizes = vec![256];
    config.multi_tenant = vec![];
    // A stand-in for stress-ng: a process group that must be gone when the run ends.
    let marker = dir.0.join("load-ran");
    let script = format!("echo $$ > {}; exec sleep 600", marker.display());
    config.background_load_command = Some(vec!["sh".into(), "-c".into(), script]);
    let report = run(config).unwrap();
    assert!(marker.exists(), "the load command ran");
    let quiet = report.results.iter().filter(|r| !r.background_load).count();
    let loaded = report.results.iter().filter(|r| r.background_load).count();
    assert!(quiet > 0 && quiet == loaded, "every point twice: {quiet} quiet, {loaded} loaded");
    let pid = std::fs::read_to_string(&marker).unwrap();
    let proc_dir = PathBuf::from(format!("/proc/{}", pid.trim()));
    assert!(!proc_dir.exists(), "the background load (pid {}) was stopped and reaped", pid.trim());
}
