//! Properties of the request generators and of the YCSB operation mixes (no servers, no
//! timing). Statistical checks draw enough samples that the tolerances are many standard
//! errors wide; every stream is seeded, so the tests are deterministic.

use std::collections::HashMap;

use chorus_bench::generator::{
    fnv_hash64, zeta, AckCounter, Distribution, KeyChooser, Rng, ScrambledZipfian, SkewedLatest, Zipfian,
    SCRAMBLED_ZETAN, ZIPFIAN_CONSTANT,
};
use chorus_bench::workload::{KvSpec, Op, OpGen, OpKind, YcsbSpec};

const DRAWS: usize = 200_000;

fn counts(draws: impl Iterator<Item = u64>) -> HashMap<u64, usize> {
    let mut counts = HashMap::new();
    for item in draws {
        *counts.entry(item).or_default() += 1;
    }
    counts
}

fn share(counts: &HashMap<u64, usize>, item: u64) -> f64 {
    counts.get(&item).copied().unwrap_or(0) as f64 / DRAWS as f64
}

#[test]
fn zipfian_stays_in_range_and_item_zero_gets_one_over_zeta() {
    let items = 1000;
    let mut zipfian = Zipfian::new(0, items, ZIPFIAN_CONSTANT);
    let mut rng = Rng::new(7);
    let counts = counts((0..DRAWS).map(|_| zipfian.next(&mut rng)));
    assert!(counts.keys().all(|item| *item < items));
    let zetan = zeta(items, ZIPFIAN_CONSTANT);
    let expected_first = 1.0 / zetan;
    let expected_second = 1.0 / (2f64.powf(ZIPFIAN_CONSTANT) * zetan);
    assert!((share(&counts, 0) - expected_first).abs() < 0.01, "{} vs {expected_first}", share(&counts, 0));
    assert!((share(&counts, 1) - expected_second).abs() < 0.01, "{} vs {expected_second}", share(&counts, 1));
    // Skew: the head is far more popular than the tail.
    assert!(share(&counts, 0) > 5.0 * share(&counts, 9));
    let tail: usize = (500..1000).map(|i| counts.get(&i).copied().unwrap_or(0)).sum();
    assert!((tail as f64 / DRAWS as f64) < 0.12, "tail share {}", tail as f64 / DRAWS as f64);
}

#[test]
fn scrambled_zipfian_spreads_the_hot_items_with_fnv() {
    let items = 1000;
    let min = 5000;
    let mut scrambled = ScrambledZipfian::new(min, items);
    let mut rng = Rng::new(11);
    let counts = counts((0..DRAWS).map(|_| scrambled.next(&mut rng)));
    assert!(counts.keys().all(|item| (min..min + items).contains(item)));
    // The most popular item is where the underlying zipfian's item 0 hashes to, and it gets
    // at least that item's share, 1 / zeta(10^10, 0.99) (other items may hash there too).
    let hottest = scrambled.hottest();
    assert_eq!(hottest, min + fnv_hash64(0) % items);
    let (&top, _) = counts.iter().max_by_key(|(_, c)| **c).unwrap();
    assert_eq!(top, hottest);
    let base_share = 1.0 / SCRAMBLED_ZETAN;
    let got = share(&counts, hottest);
    assert!(got > base_share - 0.005 && got < base_share + 0.03, "hottest share {got}, base {base_share}");
    // Scrambled: the popular items are not the lowest key numbers.
    let lowest_ten: f64 = (min..min + 10).map(|i| share(&counts, i)).sum();
    assert!(lowest_ten < 0.1, "lowest ten items have {lowest_ten}");
    // And most items get drawn at all.
    assert!(counts.len() > 900, "only {} distinct items", counts.len());
}

#[test]
fn generators_are_deterministic_by_seed() {
    let draw = |seed| {
        let mut rng = Rng::new(seed);
        let mut scrambled = ScrambledZipfian::new(0, 10_000);
        (0..1000).map(|_| scrambled.next(&mut rng)).collect::<Vec<_>>()
    };
    assert_eq!(draw(3), draw(3));
    assert_ne!(draw(3), draw(4));
    let stream = |seed, index| {
        let mut rng = Rng::stream(seed, index);
        (0..100).map(|_| rng.next_u64()).collect::<Vec<_>>()
    };
    assert_eq!(stream(1, 2), stream(1, 2));
    assert_ne!(stream(1, 2), stream(1, 3));
    let ops = |seed| {
        let spec = YcsbSpec::core('a', 1000, 1000).unwrap();
        let mut generator = OpGen::ycsb(&spec, seed, 2).remove(1);
        (0..1000).map(|_| generator.next_op()).collect::<Vec<Op>>()
    };
    assert_eq!(ops(9), ops(9));
    assert_ne!(ops(9), ops(10));
}

#[test]
fn latest_prefers_the_newest_items() {
    let mut latest = SkewedLatest::new(1000);
    let mut rng = Rng::new(5);
    let counts = counts((0..DRAWS).map(|_| latest.next(&mut rng, 999)));
    assert!(counts.keys().all(|item| *item <= 999));
    let (&top, _) = counts.iter().max_by_key(|(_, c)| **c).unwrap();
    assert_eq!(top, 999);
    let expected = 1.0 / zeta(999, ZIPFIAN_CONSTANT);
    assert!((share(&counts, 999) - expected).abs() < 0.01, "{} vs {expected}", share(&counts, 999));
    assert!(share(&counts, 998) > share(&counts, 900));
    // After more inserts the newest item is the most popular one.
    let counts = counts_after_growth(&mut latest, &mut rng);
    let (&top, _) = counts.iter().max_by_key(|(_, c)| **c).unwrap();
    assert_eq!(top, 1999);
}

fn counts_after_growth(latest: &mut SkewedLatest, rng: &mut Rng) -> HashMap<u64, usize> {
    counts((0..DRAWS).map(|_| latest.next(rng, 1999)))
}

#[test]
fn uniform_and_zipfian_choosers_stay_below_the_inserted_count() {
    let mut rng = Rng::new(1);
    for distribution in [Distribution::Zipfian, Distribution::Uniform, Distribution::Latest] {
        let mut chooser = KeyChooser::new(distribution, 100, 100);
        for _ in 0..20_000 {
            assert!(chooser.next(&mut rng, 100) < 100, "{distribution:?}");
        }
    }
    let mut uniform = KeyChooser::new(Distribution::Uniform, 100, 0);
    let counts = counts((0..DRAWS).map(|_| uniform.next(&mut rng, 100)));
    assert_eq!(counts.len(), 100);
    assert!(counts.values().all(|c| (*c as f64 / DRAWS as f64 - 0.01).abs() < 0.003));
}

#[test]
fn acknowledged_counter_only_exposes_contiguous_inserts() {
    let counter = AckCounter::new(10);
    let (a, b, c) = (counter.next_insert(), counter.next_insert(), counter.next_insert());
    assert_eq!((a, b, c), (10, 11, 12));
    assert_eq!(counter.count(), 10);
    counter.acknowledge(12);
    counter.acknowledge(11);
    assert_eq!(counter.count(), 10, "10 is not acknowledged yet");
    counter.acknowledge(10);
    assert_eq!(counter.count(), 13);
}

fn proportions(generator: &mut OpGen, draws: usize) -> HashMap<OpKind, f64> {
    let mut counts: HashMap<OpKind, usize> = HashMap::new();
    for _ in 0..draws {
        let op = generator.next_op();
        *counts.entry(op.kind()).or_default() += 1;
        generator.done(&op);
    }
    counts.into_iter().map(|(kind, count)| (kind, count as f64 / draws as f64)).collect()
}

#[test]
fn ycsb_mixes_match_the_core_workloads() {
    use OpKind::*;
    type Mix = &'static [(OpKind, f64)];
    let expected: [(char, Mix, Distribution); 6] = [
        ('a', &[(Read, 0.5), (Update, 0.5)], Distribution::Zipfian),
        ('b', &[(Read, 0.95), (Update, 0.05)], Distribution::Zipfian),
        ('c', &[(Read, 1.0)], Distribution::Zipfian),
        ('d', &[(Read, 0.95), (Insert, 0.05)], Distribution::Latest),
        ('e', &[(Scan, 0.95), (Insert, 0.05)], Distribution::Zipfian),
        ('f', &[(Read, 0.5), (ReadModifyWrite, 0.5)], Distribution::Zipfian),
    ];
    for (letter, mix, distribution) in expected {
        let spec = YcsbSpec::core(letter, 10_000, 100_000).unwrap();
        assert_eq!(spec.distribution, distribution, "workload {letter}");
        assert_eq!((spec.field_count, spec.field_bytes), (10, 100));
        let mut generator = OpGen::ycsb(&spec, 42, 1).remove(0);
        let got = proportions(&mut generator, 100_000);
        assert_eq!(got.len(), mix.len(), "workload {letter}: {got:?}");
        for (kind, want) in mix {
            let share = got.get(kind).copied().unwrap_or(0.0);
            assert!((share - want).abs() < 0.01, "workload {letter}: {kind:?} {share} vs {want}");
        }
    }
    assert!(YcsbSpec::core('g', 1, 1).is_err());
}

#[test]
fn ycsb_ops_are_well_formed() {
    let records = 1000;
    let spec = YcsbSpec::core('e', records, 10_000).unwrap();
    let mut generator = OpGen::ycsb(&spec, 1, 1).remove(0);
    let mut next_insert = records;
    for _ in 0..10_000 {
        let op = generator.next_op();
        match op {
            Op::Scan { start, len } => {
                assert!((1..=100).contains(&len));
                assert!(start < next_insert);
            }
            Op::Insert { keynum } => {
                assert_eq!(keynum, next_insert, "inserts take consecutive key numbers");
                next_insert += 1;
            }
            other => panic!("workload e made {other:?}"),
        }
        generator.done(&op);
    }
    // Workload d reads recent inserts, and only acknowledged ones.
    let spec = YcsbSpec::core('d', records, 10_000).unwrap();
    let mut generator = OpGen::ycsb(&spec, 1, 1).remove(0);
    let mut inserted = records;
    let mut recent = 0;
    for _ in 0..10_000 {
        let op = generator.next_op();
        match op {
            Op::Read { keynum, field: None } => {
                assert!(keynum < inserted);
                recent += usize::from(keynum + 100 >= inserted);
            }
            Op::Insert { .. } => inserted += 1,
            other => panic!("workload d made {other:?}"),
        }
        generator.done(&op);
    }
    assert!(recent > 5000, "only {recent} reads of the 100 newest records");
    // Update and read-modify-write touch one of the 10 fields.
    let spec = YcsbSpec::core('f', records, 10_000).unwrap();
    let mut generator = OpGen::ycsb(&spec, 1, 1).remove(0);
    for _ in 0..1000 {
        if let Op::ReadModifyWrite { keynum, field } = generator.next_op() {
            assert!(keynum < records && field < 10);
        }
    }
}

#[test]
fn kv_write_ratio_is_respected() {
    for write_ratio in [0.0, 0.05, 0.5, 1.0] {
        let spec = KvSpec {
            write_ratio,
            keys: 1000,
            operations: 0,
            value_bytes: 8,
            distribution: Distribution::Zipfian,
        };
        let mut generator = OpGen::kv(&spec, 3, 1).remove(0);
        let got = proportions(&mut generator, 50_000);
        let sets = got.get(&OpKind::Set).copied().unwrap_or(0.0);
        assert!((sets - write_ratio).abs() < 0.01, "write ratio {write_ratio}: {sets}");
    }
}
