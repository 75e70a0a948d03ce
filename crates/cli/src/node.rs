//! `chorus node` (being written: issue 3).

#[derive(clap::Args)]
pub struct NodeArgs {}

pub fn run(_args: NodeArgs) -> anyhow::Result<i32> {
    anyhow::bail!("`chorus node` is not available yet")
}
