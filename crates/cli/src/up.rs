//! `chorus up` (being written: issue 3).

#[derive(clap::Args)]
pub struct UpArgs {}

pub fn run(_args: UpArgs) -> anyhow::Result<i32> {
    anyhow::bail!("`chorus up` is not available yet")
}
