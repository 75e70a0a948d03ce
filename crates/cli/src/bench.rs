//! `chorus bench` (being written: issue 4).

#[derive(clap::Args)]
pub struct BenchArgs {}

pub fn run(_args: BenchArgs) -> anyhow::Result<i32> {
    anyhow::bail!("`chorus bench` is not available yet")
}
