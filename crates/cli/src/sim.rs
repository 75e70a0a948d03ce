//! `chorus sim` (being written).

#[derive(clap::Args)]
pub struct SimArgs {}

pub fn run(_args: SimArgs) -> anyhow::Result<i32> {
    anyhow::bail!("`chorus sim` is not available yet")
}
