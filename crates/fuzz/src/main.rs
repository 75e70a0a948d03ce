//! `chorus-fuzz`: long fuzzing runs and corpus upkeep.
//!
//! ```text
//! cargo run --release -p chorus-fuzz -- run [TARGET...] [--seconds 60] [--seed N]
//! cargo run --release -p chorus-fuzz -- seed          # rewrite corpus/<target>/ from the real cores
//! cargo run --release -p chorus-fuzz -- list
//! ```
//!
//! `run` fuzzes each target (all by default) in rounds of 10,000 executions until the time is
//! up, from the committed corpus plus the regressions; a crash is saved under
//! `regressions/<target>/` (commit it: the tests replay it forever) and the run exits 1.

use std::time::{Duration, Instant};

use chorus_fuzz::{corpus_dir, fuzz, read_inputs, regressions_dir, target, TARGETS};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("run") => run(&args[1..]),
        Some("seed") => seed(),
        Some("list") => {
            for target in TARGETS {
                println!("{}", target.name);
            }
            Ok(())
        }
        _ => anyhow::bail!("usage: chorus-fuzz run [TARGET...] [--seconds N] [--seed N] | seed | list"),
    }
}

fn run(args: &[String]) -> anyhow::Result<()> {
    let mut seconds = 60u64;
    let mut seed = 1u64;
    let mut names = Vec::new();
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--seconds" => seconds = args.next().and_then(|value| value.parse().ok()).unwrap_or(seconds),
            "--seed" => seed = args.next().and_then(|value| value.parse().ok()).unwrap_or(seed),
            name => names.push(name.to_string()),
        }
    }
    let targets: Vec<_> = if names.is_empty() {
        TARGETS.iter().collect()
    } else {
        names
            .iter()
            .map(|name| target(name).ok_or_else(|| anyhow::anyhow!("no target {name:?} (try `list`)")))
            .collect::<anyhow::Result<_>>()?
    };
    let budget = Duration::from_secs(seconds) / targets.len() as u32;
    for target in targets {
        let mut inputs: Vec<Vec<u8>> =
            read_inputs(&corpus_dir(target.name)).into_iter().map(|(_, input)| input).collect();
        inputs.extend(read_inputs(&regressions_dir(target.name)).into_iter().map(|(_, input)| input));
        let started = Instant::now();
        let (mut executions, mut round) = (0u64, 0u64);
        while started.elapsed() < budget {
            match fuzz(target, &inputs, 10_000, seed.wrapping_add(round)) {
                Ok(stats) => executions += stats.executions,
                Err(crash) => {
                    let path = crash.save()?;
                    eprintln!("{}: CRASH ({}) saved to {}", target.name, crash.message, path.display());
                    std::process::exit(1);
                }
            }
            round += 1;
        }
        println!(
            "{}: {executions} executions in {:.1} s, no crash",
            target.name,
            started.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

fn seed() -> anyhow::Result<()> {
    for target in TARGETS {
        let dir = corpus_dir(target.name);
        if dir.exists() {
            std::fs::remove_dir_all(&dir)?;
        }
        std::fs::create_dir_all(&dir)?;
        let seeds = (target.seeds)();
        for (index, input) in seeds.iter().enumerate() {
            std::fs::write(dir.join(format!("seed-{index:03}")), input)?;
        }
        println!("{}: {} seeds in {}", target.name, seeds.len(), dir.display());
    }
    Ok(())
}
