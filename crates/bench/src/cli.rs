//! The `chorus bench ycsb` and `chorus bench kv` commands.

use std::net::{SocketAddr, ToSocketAddrs as _};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

use crate::client::{Api, ClientConfig, Keyspace, Wait};
use crate::driver::{self, RunOptions};
use crate::generator::Distribution;
use crate::report::Report;
use crate::workload::{KvSpec, OpGen, YcsbSpec};

/// Options shared by the load generators.
#[derive(clap::Args, Clone, Debug)]
pub struct CommonArgs {
    /// Servers, comma separated; clients are spread round-robin over them.
    #[arg(long, value_delimiter = ',', default_value = "127.0.0.1:7379,127.0.0.1:7380,127.0.0.1:7381")]
    pub targets: Vec<String>,
    /// Concurrent clients, one connection each.
    #[arg(long, default_value_t = 16)]
    pub clients: usize,
    /// Open loop: this many operations per second in total, latency measured from each
    /// request's intended start time. Without it: closed loop.
    #[arg(long)]
    pub rate: Option<f64>,
    /// Stop after this many seconds even if operations remain.
    #[arg(long)]
    pub duration_s: Option<f64>,
    /// What the targets speak: resp (Chorus, Redis) or etcd (its HTTP/JSON gateway).
    #[arg(long, value_enum, default_value = "resp")]
    pub api: Api,
    /// Follow every write with `WAIT N <wait-timeout-ms>` (Redis synchronous replication).
    #[arg(long)]
    pub wait_replicas: Option<u32>,
    #[arg(long, default_value_t = 1000)]
    pub wait_timeout_ms: u64,
    /// With `--wait-replicas N`: follow every write with `WAITAOF <this> N <wait-timeout-ms>`
    /// instead (Redis 7.2: the write is in this many local and N replica append-only files).
    #[arg(long)]
    pub waitaof_local: Option<u32>,
    /// Write everything (configuration and results) to this JSON file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Seed of the request streams.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Load generator threads (default: the number of CPUs).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Do not insert the records / keys before the run (they are already there).
    #[arg(long)]
    pub skip_load: bool,
    /// Concurrent clients for the load phase.
    #[arg(long, default_value_t = 16)]
    pub load_clients: usize,
}

#[derive(clap::Args, Clone, Debug)]
pub struct YcsbArgs {
    /// YCSB core workload: a (50/50 read/update), b (95/5), c (read only), d (read latest,
    /// 5% inserts), e (short scans, 5% inserts), f (read-modify-write).
    #[arg(long, default_value = "a")]
    pub workload: char,
    /// Records loaded before the run.
    #[arg(long, default_value_t = 10_000)]
    pub records: u64,
    /// Operations in the run.
    #[arg(long, default_value_t = 100_000)]
    pub ops: u64,
    /// Request distribution (default: the workload's own: latest for d, zipfian otherwise).
    #[arg(long, value_enum)]
    pub distribution: Option<Distribution>,
    /// Bytes per field.
    #[arg(long, default_value_t = 100)]
    pub value_bytes: usize,
    /// Fields per record.
    #[arg(long, default_value_t = 10)]
    pub fields: u32,
    /// Reads fetch one random field (HMGET) instead of the whole record (HGETALL).
    #[arg(long)]
    pub read_one_field: bool,
    #[command(flatten)]
    pub common: CommonArgs,
}

#[derive(clap::Args, Clone, Debug)]
pub struct KvArgs {
    /// Fraction of operations that are SETs (the rest are GETs).
    #[arg(long, default_value_t = 0.05)]
    pub write_ratio: f64,
    /// Distinct keys.
    #[arg(long, default_value_t = 100_000)]
    pub keys: u64,
    /// Operations in the run.
    #[arg(long, default_value_t = 200_000)]
    pub ops: u64,
    #[arg(long, value_enum, default_value = "zipfian")]
    pub distribution: Distribution,
    /// Commands each client sends per round trip.
    #[arg(long, default_value_t = 1)]
    pub pipeline: usize,
    /// Bytes per value.
    #[arg(long, default_value_t = 32)]
    pub value_bytes: usize,
    #[command(flatten)]
    pub common: CommonArgs,
}

pub fn resolve_targets(targets: &[String]) -> anyhow::Result<Vec<SocketAddr>> {
    let mut addrs = Vec::new();
    for target in targets {
        let addr = target
            .to_socket_addrs()
            .with_context(|| format!("bad target {target:?} (expected HOST:PORT)"))?
            .next()
            .with_context(|| format!("target {target:?} resolves to no address"))?;
        addrs.push(addr);
    }
    anyhow::ensure!(!addrs.is_empty(), "no --targets");
    Ok(addrs)
}

pub fn runtime(threads: Option<usize>) -> anyhow::Result<tokio::runtime::Runtime> {
    let threads =
        threads.unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2));
    Ok(tokio::runtime::Builder::new_multi_thread().worker_threads(threads.max(1)).enable_all().build()?)
}

pub fn bar(length: u64, message: &str) -> ProgressBar {
    let bar = ProgressBar::new(length);
    bar.set_style(
        ProgressStyle::with_template(
            "{msg:>12} [{elapsed_precise}] {wide_bar} {pos}/{len} ({per_sec}, eta {eta})",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.set_message(message.to_string());
    bar
}

#[derive(Serialize)]
pub struct LoadReport {
    pub items: u64,
    pub elapsed_s: f64,
    pub ops_per_s: f64,
}

#[derive(Serialize)]
struct Output<'a, S: Serialize> {
    command: &'static str,
    spec: &'a S,
    targets: &'a [String],
    clients: usize,
    pipeline: usize,
    rate: Option<f64>,
    api: Api,
    wait: Option<Wait>,
    seed: u64,
    load: Option<LoadReport>,
    run: Report,
}

fn options(
    common: &CommonArgs,
    pipeline: usize,
    operations: u64,
    client: ClientConfig,
) -> anyhow::Result<RunOptions> {
    anyhow::ensure!(common.clients > 0, "--clients must be at least 1");
    if let Some(rate) = common.rate {
        anyhow::ensure!(rate > 0.0, "--rate must be positive");
    }
    Ok(RunOptions {
        targets: resolve_targets(&common.targets)?,
        clients: common.clients,
        pipeline: pipeline.max(1),
        rate: common.rate,
        operations,
        duration_max: common.duration_s.map(Duration::from_secs_f64),
        client,
    })
}

/// Stops the clients (they finish their request in flight) on Ctrl-C.
fn stop_on_ctrl_c(runtime: &tokio::runtime::Runtime) -> Arc<AtomicBool> {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    runtime.spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            flag.store(true, Ordering::Relaxed);
        }
    });
    stop
}

fn finish<S: Serialize>(output: Output<'_, S>, json: Option<&PathBuf>) -> anyhow::Result<i32> {
    if let Some(load) = &output.load {
        println!("[LOAD] {} items in {:.3} s ({:.0} items/s)", load.items, load.elapsed_s, load.ops_per_s);
    }
    print!("{}", output.run.to_text());
    if let Some(path) = json {
        std::fs::write(path, serde_json::to_string_pretty(&output)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
        println!("results written to {}", path.display());
    }
    Ok(if output.run.errors > 0 { 1 } else { 0 })
}

pub fn run_ycsb(args: YcsbArgs) -> anyhow::Result<i32> {
    let mut spec = YcsbSpec::core(args.workload, args.records, args.ops)?;
    if let Some(distribution) = args.distribution {
        spec.distribution = distribution;
    }
    spec.field_bytes = args.value_bytes;
    spec.field_count = args.fields.max(1);
    spec.read_all_fields = !args.read_one_field;
    let common = &args.common;
    let wait = common.wait_replicas.map(|replicas| Wait {
        replicas,
        timeout_ms: common.wait_timeout_ms,
        aof_local: common.waitaof_local,
    });
    let client = ClientConfig {
        api: common.api,
        keyspace: Keyspace::Ycsb { fields: spec.field_count },
        value_bytes: spec.field_bytes,
        wait,
        seed: common.seed,
    };
    let options = options(common, 1, spec.operations, client)?;
    let runtime = runtime(common.threads)?;
    let stop = stop_on_ctrl_c(&runtime);
    let (load, result) = runtime.block_on(async {
        let load = if common.skip_load {
            None
        } else {
            let bar = bar(spec.records, "load");
            let elapsed = driver::load(&options, spec.records, common.load_clients, &bar).await?;
            bar.finish_and_clear();
            Some(LoadReport {
                items: spec.records,
                elapsed_s: elapsed.as_secs_f64(),
                ops_per_s: spec.records as f64 / elapsed.as_secs_f64().max(1e-9),
            })
        };
        let bar = bar(spec.operations, &format!("ycsb-{}", spec.workload));
        let generators = OpGen::ycsb(&spec, common.seed, common.clients);
        let result = driver::run(&options, generators, &bar, stop).await;
        bar.finish_and_clear();
        anyhow::Ok((load, result?))
    })?;
    let output = Output {
        command: "ycsb",
        spec: &spec,
        targets: &common.targets,
        clients: common.clients,
        pipeline: 1,
        rate: common.rate,
        api: common.api,
        wait,
        seed: common.seed,
        load,
        run: Report::of(&result),
    };
    finish(output, common.json.as_ref())
}

pub fn run_kv(args: KvArgs) -> anyhow::Result<i32> {
    anyhow::ensure!((0.0..=1.0).contains(&args.write_ratio), "--write-ratio must be between 0 and 1");
    anyhow::ensure!(args.keys > 0, "--keys must be at least 1");
    let spec = KvSpec {
        write_ratio: args.write_ratio,
        keys: args.keys,
        operations: args.ops,
        value_bytes: args.value_bytes,
        distribution: args.distribution,
    };
    let common = &args.common;
    let wait = common.wait_replicas.map(|replicas| Wait {
        replicas,
        timeout_ms: common.wait_timeout_ms,
        aof_local: common.waitaof_local,
    });
    let client = ClientConfig {
        api: common.api,
        keyspace: Keyspace::Kv,
        value_bytes: spec.value_bytes,
        wait,
        seed: common.seed,
    };
    let options = options(common, args.pipeline, spec.operations, client)?;
    let runtime = runtime(common.threads)?;
    let stop = stop_on_ctrl_c(&runtime);
    let (load, result) = runtime.block_on(async {
        let load = if common.skip_load {
            None
        } else {
            let bar = bar(spec.keys, "load");
            let elapsed = driver::load(&options, spec.keys, common.load_clients, &bar).await?;
            bar.finish_and_clear();
            Some(LoadReport {
                items: spec.keys,
                elapsed_s: elapsed.as_secs_f64(),
                ops_per_s: spec.keys as f64 / elapsed.as_secs_f64().max(1e-9),
            })
        };
        let bar = bar(spec.operations, "kv");
        let generators = OpGen::kv(&spec, common.seed, common.clients);
        let result = driver::run(&options, generators, &bar, stop).await;
        bar.finish_and_clear();
        anyhow::Ok((load, result?))
    })?;
    let output = Output {
        command: "kv",
        spec: &spec,
        targets: &common.targets,
        clients: common.clients,
        pipeline: args.pipeline,
        rate: common.rate,
        api: common.api,
        wait,
        seed: common.seed,
        load,
        run: Report::of(&result),
    };
    finish(output, common.json.as_ref())
}
