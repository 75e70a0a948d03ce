//! Runs clients: closed loop (each client waits for its reply before the next request) or
//! open loop at a fixed rate, where each request has an *intended* start time on a fixed
//! schedule and its latency is measured from that time, so a stalled server is charged for
//! the requests it delayed (no coordinated omission).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use hdrhistogram::Histogram;
use indicatif::ProgressBar;

use crate::client::{Client, ClientConfig, Executor};
use crate::workload::{Op, OpGen, OpKind};

/// Latencies are recorded in nanoseconds, 3 significant digits, up to this.
pub const LATENCY_NS_MAX: u64 = 60_000_000_000;

/// A source of time, in nanoseconds since an arbitrary origin.
pub trait Clock: Send + Sync {
    fn now_ns(&self) -> u64;
    fn sleep_until(&self, ns: u64) -> impl Future<Output = ()> + Send;
}

/// The real clock.
pub struct RealClock {
    origin: Instant,
}

impl Default for RealClock {
    fn default() -> Self {
        RealClock { origin: Instant::now() }
    }
}

impl Clock for RealClock {
    fn now_ns(&self) -> u64 {
        self.origin.elapsed().as_nanos() as u64
    }

    async fn sleep_until(&self, ns: u64) {
        let now = self.now_ns();
        if ns > now {
            tokio::time::sleep(Duration::from_nanos(ns - now)).await;
        }
    }
}

/// The open-loop schedule of one client: request `k` is intended to start at
/// `start_ns + k * interval_ns`, whenever the previous one completes.
#[derive(Clone, Debug)]
pub struct Pacer {
    start_ns: u64,
    interval_ns: f64,
    issued: u64,
}

impl Pacer {
    pub fn new(start_ns: u64, interval_ns: f64) -> Pacer {
        Pacer { start_ns, interval_ns, issued: 0 }
    }

    /// The intended start of the next request.
    pub fn next_intended_ns(&self) -> u64 {
        self.start_ns + (self.issued as f64 * self.interval_ns) as u64
    }

    /// `count` requests were issued.
    pub fn advance(&mut self, count: u64) {
        self.issued += count;
    }
}

/// Per-operation latency histograms and error counts of one client (merged at the end).
#[derive(Clone, Debug)]
pub struct Recorder {
    pub histograms: Vec<Option<Histogram<u64>>>,
    pub errors: Vec<u64>,
    pub first_error: Option<String>,
}

impl Default for Recorder {
    fn default() -> Self {
        Recorder {
            histograms: vec![None; OpKind::ALL.len()],
            errors: vec![0; OpKind::ALL.len()],
            first_error: None,
        }
    }
}

pub fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(100, LATENCY_NS_MAX, 3).expect("valid histogram bounds")
}

impl Recorder {
    pub fn record(&mut self, kind: OpKind, latency_ns: u64, error: Option<String>) {
        match error {
            None => {
                let histogram = self.histograms[kind.index()].get_or_insert_with(new_histogram);
                histogram.saturating_record(latency_ns.clamp(100, LATENCY_NS_MAX));
            }
            Some(error) => {
                self.errors[kind.index()] += 1;
                self.first_error.get_or_insert(error);
            }
        }
    }

    pub fn merge(&mut self, other: &Recorder) {
        for (mine, theirs) in self.histograms.iter_mut().zip(&other.histograms) {
            if let Some(theirs) = theirs {
                mine.get_or_insert_with(new_histogram).add(theirs).expect("same bounds");
            }
        }
        for (mine, theirs) in self.errors.iter_mut().zip(&other.errors) {
            *mine += theirs;
        }
        if self.first_error.is_none() {
            self.first_error.clone_from(&other.first_error);
        }
    }

    pub fn completed(&self) -> u64 {
        self.histograms.iter().flatten().map(|h| h.len()).sum::<u64>() + self.errors.iter().sum::<u64>()
    }
}

/// Operations left to hand out, and when to stop anyway.
pub struct Budget {
    remaining: AtomicI64,
    /// Operations completed so far (for the progress bar).
    pub completed: AtomicU64,
    deadline_ns: Option<u64>,
    stop: Arc<AtomicBool>,
}

impl Budget {
    pub fn new(operations: u64, deadline_ns: Option<u64>, stop: Arc<AtomicBool>) -> Budget {
        Budget {
            remaining: AtomicI64::new(operations as i64),
            completed: AtomicU64::new(0),
            deadline_ns,
            stop,
        }
    }

    /// Claims up to `count` operations; 0 when the run is over.
    pub fn claim(&self, count: usize, now_ns: u64) -> usize {
        if self.stop.load(Ordering::Relaxed) || self.deadline_ns.is_some_and(|deadline| now_ns >= deadline) {
            return 0;
        }
        let before = self.remaining.fetch_sub(count as i64, Ordering::Relaxed);
        before.clamp(0, count as i64) as usize
    }
}

/// One client's loop. `pacer`: open loop; `None`: closed loop.
pub async fn run_client<C: Clock, E: Executor>(
    clock: &C,
    executor: &mut E,
    generator: &mut OpGen,
    budget: &Budget,
    mut pacer: Option<Pacer>,
    pipeline: usize,
    recorder: &mut Recorder,
) -> anyhow::Result<()> {
    let mut ops: Vec<Op> = Vec::with_capacity(pipeline);
    let mut errors: Vec<Option<String>> = Vec::with_capacity(pipeline);
    loop {
        let count = budget.claim(pipeline, clock.now_ns());
        if count == 0 {
            return Ok(());
        }
        ops.clear();
        ops.extend((0..count).map(|_| generator.next_op()));
        let start_ns = match &mut pacer {
            Some(pacer) => {
                let intended = pacer.next_intended_ns();
                clock.sleep_until(intended).await;
                pacer.advance(count as u64);
                intended
            }
            None => clock.now_ns(),
        };
        executor.execute(&ops, &mut errors).await?;
        let latency_ns = clock.now_ns().saturating_sub(start_ns);
        for (op, error) in ops.iter().zip(errors.drain(..)) {
            recorder.record(op.kind(), latency_ns, error);
            generator.done(op);
        }
        budget.completed.fetch_add(count as u64, Ordering::Relaxed);
    }
}

/// How to run the clients of one measurement.
#[derive(Clone, Debug)]
pub struct RunOptions {
    pub targets: Vec<SocketAddr>,
    pub clients: usize,
    pub pipeline: usize,
    /// Open loop at this many operations per second in total.
    pub rate: Option<f64>,
    pub operations: u64,
    /// Stop after this long even if operations remain.
    pub duration_max: Option<Duration>,
    pub client: ClientConfig,
}

/// What one measurement produced.
#[derive(Clone, Debug)]
pub struct RunResult {
    pub elapsed: Duration,
    pub recorder: Recorder,
}

async fn connect_all(options: &RunOptions, count: usize) -> anyhow::Result<Vec<Client>> {
    anyhow::ensure!(!options.targets.is_empty(), "no targets");
    let mut set = tokio::task::JoinSet::new();
    for i in 0..count {
        let addr = options.targets[i % options.targets.len()];
        let config = options.client.clone();
        set.spawn(async move { (i, Client::connect(addr, config, i as u64).await) });
    }
    let mut clients: Vec<Option<Client>> = (0..count).map(|_| None).collect();
    while let Some(joined) = set.join_next().await {
        let (i, client) = joined.context("connect task")?;
        clients[i] = Some(client?);
    }
    Ok(clients.into_iter().map(|c| c.expect("every client connected")).collect())
}

fn spawn_ticker(bar: &ProgressBar, budget: Arc<Budget>) -> tokio::task::JoinHandle<()> {
    let bar = bar.clone();
    tokio::spawn(async move {
        loop {
            bar.set_position(budget.completed.load(Ordering::Relaxed));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
}

/// Runs `generators.len()` clients spread round-robin over the targets.
pub async fn run(
    options: &RunOptions,
    generators: Vec<OpGen>,
    bar: &ProgressBar,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<RunResult> {
    let clients = connect_all(options, generators.len()).await?;
    let clock = Arc::new(RealClock::default());
    let start_ns = clock.now_ns();
    let deadline_ns = options.duration_max.map(|d| start_ns + d.as_nanos() as u64);
    let budget = Arc::new(Budget::new(options.operations, deadline_ns, stop));
    let ticker = spawn_ticker(bar, budget.clone());
    let count = generators.len();
    let mut set = tokio::task::JoinSet::new();
    for (i, (mut client, mut generator)) in clients.into_iter().zip(generators).enumerate() {
        let pacer = options.rate.map(|rate| {
            let interval_ns = 1e9 * count as f64 / rate;
            Pacer::new(start_ns + (interval_ns * i as f64 / count as f64) as u64, interval_ns)
        });
        let (clock, budget, pipeline) = (clock.clone(), budget.clone(), options.pipeline);
        set.spawn(async move {
            let mut recorder = Recorder::default();
            let result = run_client(
                &*clock,
                &mut client,
                &mut generator,
                &budget,
                pacer,
                pipeline.max(1),
                &mut recorder,
            )
            .await;
            (recorder, result, clock.now_ns())
        });
    }
    let mut merged = Recorder::default();
    let mut end_ns = start_ns;
    let mut failure = None;
    while let Some(joined) = set.join_next().await {
        let (recorder, result, finished_ns) = joined.context("client task")?;
        merged.merge(&recorder);
        end_ns = end_ns.max(finished_ns);
        if let Err(error) = result {
            failure.get_or_insert(error);
        }
    }
    ticker.abort();
    bar.set_position(budget.completed.load(Ordering::Relaxed));
    if let Some(error) = failure {
        return Err(error.context("a client failed"));
    }
    Ok(RunResult { elapsed: Duration::from_nanos(end_ns - start_ns), recorder: merged })
}

/// Loads keys [0, count) with `loaders` concurrent clients, `batch` keys per round trip.
pub async fn load(
    options: &RunOptions,
    count: u64,
    loaders: usize,
    bar: &ProgressBar,
) -> anyhow::Result<Duration> {
    let batch = 50u64;
    let clients = connect_all(options, loaders.max(1)).await?;
    let started = Instant::now();
    let next = Arc::new(AtomicU64::new(0));
    let budget = Arc::new(Budget::new(count, None, Arc::new(AtomicBool::new(false))));
    let ticker = spawn_ticker(bar, budget.clone());
    let mut set = tokio::task::JoinSet::new();
    for mut client in clients {
        let (next, budget) = (next.clone(), budget.clone());
        set.spawn(async move {
            loop {
                let from = next.fetch_add(batch, Ordering::Relaxed);
                if from >= count {
                    return Ok::<(), anyhow::Error>(());
                }
                let to = (from + batch).min(count);
                client.load(from..to).await?;
                budget.completed.fetch_add(to - from, Ordering::Relaxed);
            }
        });
    }
    let mut failure = None;
    while let Some(joined) = set.join_next().await {
        if let Err(error) = joined.context("load task")? {
            failure.get_or_insert(error);
        }
    }
    ticker.abort();
    bar.set_position(count);
    match failure {
        Some(error) => Err(error.context("loading failed")),
        None => Ok(started.elapsed()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generator::Distribution;
    use crate::workload::KvSpec;
    use std::sync::Mutex;

    /// A clock that only moves when told to: `sleep_until` jumps to the wake-up time.
    #[derive(Default)]
    struct FakeClock {
        now: Mutex<u64>,
    }

    impl Clock for FakeClock {
        fn now_ns(&self) -> u64 {
            *self.now.lock().unwrap()
        }

        async fn sleep_until(&self, ns: u64) {
            let mut now = self.now.lock().unwrap();
            *now = (*now).max(ns);
        }
    }

    /// A server whose k-th request takes `service_ns[k]`.
    struct FakeServer<'a> {
        clock: &'a FakeClock,
        service_ns: Vec<u64>,
        served: usize,
    }

    impl Executor for FakeServer<'_> {
        async fn execute<'b>(
            &'b mut self,
            ops: &'b [Op],
            errors: &'b mut Vec<Option<String>>,
        ) -> anyhow::Result<()> {
            errors.clear();
            errors.resize(ops.len(), None);
            let service = self.service_ns[self.served];
            self.served += 1;
            *self.clock.now.lock().unwrap() += service;
            Ok(())
        }
    }

    fn latencies(pacer: Option<Pacer>, service_ns: Vec<u64>) -> (Vec<u64>, u64) {
        let clock = FakeClock::default();
        let operations = service_ns.len() as u64;
        let mut server = FakeServer { clock: &clock, service_ns, served: 0 };
        let spec = KvSpec {
            write_ratio: 0.0,
            keys: 10,
            operations,
            value_bytes: 1,
            distribution: Distribution::Uniform,
        };
        let mut generator = OpGen::kv(&spec, 1, 1).remove(0);
        let budget = Budget::new(operations, None, Arc::new(AtomicBool::new(false)));
        let mut recorder = Recorder::default();
        let future = run_client(&clock, &mut server, &mut generator, &budget, pacer, 1, &mut recorder);
        futures_lite_block_on(future).unwrap();
        let histogram = recorder.histograms[OpKind::Get.index()].clone().unwrap();
        let values: Vec<u64> = histogram
            .iter_recorded()
            .flat_map(|v| (0..v.count_at_value()).map(move |_| v.value_iterated_to()))
            .collect();
        (values, clock.now_ns())
    }

    fn futures_lite_block_on<F: Future>(future: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(future)
    }

    fn close(a: u64, b: u64) -> bool {
        a.abs_diff(b) <= b / 100 + 1
    }

    #[test]
    fn open_loop_latency_counts_from_the_intended_start() {
        // One request every 1 ms; the 3rd takes 10 ms. The 4 requests meant to start during
        // that stall wait for it, and their latency includes the wait.
        let ms = 1_000_000;
        let service =
            vec![100_000, 100_000, 10 * ms, 100_000, 100_000, 100_000, 100_000, 100_000, 100_000, 100_000];
        let (mut open, end) = latencies(Some(Pacer::new(0, ms as f64)), service.clone());
        open.sort();
        // Intended starts 0,1,..,9 ms. Request 2 starts at 2 ms and ends at 12 ms.
        // Request 3 (intended 3 ms) starts at 12 ms, ends 12.1: latency 9.1 ms; request 4:
        // 12.1 -> 12.2, latency 8.2 ms; ... request 9 ends at 12.7 ms: latency 3.7 ms.
        let expected_ns = [
            100_000,
            100_000,
            3_700_000,
            4_600_000,
            5_500_000,
            6_400_000,
            7_300_000,
            8_200_000,
            9_100_000,
            10 * ms,
        ];
        let mut expected = expected_ns.to_vec();
        expected.sort();
        for (got, want) in open.iter().zip(&expected) {
            assert!(close(*got, *want), "got {open:?}, want {expected:?}");
        }
        assert_eq!(end, 12_700_000);

        // The same server in a closed loop only sees one slow request: coordinated omission.
        let (closed, _) = latencies(None, service);
        assert_eq!(closed.iter().filter(|l| **l > ms).count(), 1);
    }

    #[test]
    fn open_loop_waits_for_the_schedule_when_ahead() {
        let ms = 1_000_000;
        let (open, end) = latencies(Some(Pacer::new(5 * ms, ms as f64)), vec![10_000; 4]);
        assert!(open.iter().all(|l| close(*l, 10_000)), "{open:?}");
        assert_eq!(end, 8 * ms + 10_000);
    }

    #[test]
    fn budget_hands_out_exactly_the_operations() {
        let budget = Budget::new(10, Some(100), Arc::new(AtomicBool::new(false)));
        assert_eq!(budget.claim(4, 0), 4);
        assert_eq!(budget.claim(4, 0), 4);
        assert_eq!(budget.claim(4, 0), 2);
        assert_eq!(budget.claim(4, 0), 0);
        let budget = Budget::new(10, Some(100), Arc::new(AtomicBool::new(false)));
        assert_eq!(budget.claim(4, 100), 0);
    }
}
