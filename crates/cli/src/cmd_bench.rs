//! `pagewise bench` and `pagewise demo`.
use anyhow::Result;

#[derive(clap::Args)]
pub struct Args {}
#[derive(clap::Args)]
pub struct DemoArgs {}
pub fn run(_a: Args) -> Result<i32> {
    Ok(0)
}
pub fn demo(_a: DemoArgs) -> Result<i32> {
    Ok(0)
}
