//! `pagewise bench redis`: LDT's experiment (d).
use anyhow::Result;

#[derive(clap::Args)]
pub struct Args {}

pub fn run(_a: Args) -> Result<i32> {
    anyhow::bail!("not yet")
}
