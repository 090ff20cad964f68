//! `pagewise criu`: CRIU's images out of the dumps `pagewise page-server`
//! keeps.

use anyhow::Result;
use pagewise::snap::criu::{export, Exported};
use pagewise::snap::DiskStore;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    sub: Sub,
}

#[derive(clap::Subcommand)]
enum Sub {
    /// Write a kept dump's pages as CRIU's own images.
    ///
    /// `pagewise criu export STORE DUMP DIR` writes `pagemap-ID.img` and
    /// `pages-N.img` of dump DUMP (its number, as `page-server` said it)
    /// into DIR, byte for byte what `criu page-server -D DIR` would have
    /// written: put them beside the dump's other images (`criu dump -D`)
    /// and `criu restore` reads them.
    Export(ExportArgs),
}

#[derive(clap::Args)]
struct ExportArgs {
    /// The store `page-server --store` kept the dump in.
    store: PathBuf,
    /// The dump's number (`criu/dump-N.json` in the store).
    dump: u64,
    /// Where the images are written (created if missing).
    dir: PathBuf,
    /// One JSON object on stdout.
    #[arg(long)]
    json: bool,
}

/// `criu export --json`.
#[derive(serde::Serialize, schemars::JsonSchema)]
#[serde(transparent)]
pub struct ExportOutput(pub Exported);
impl crate::json::Printed for ExportOutput {}

pub fn run(a: Args) -> Result<i32> {
    match a.sub {
        Sub::Export(e) => {
            let store = DiskStore::open(&e.store)?;
            let done = export(&store, e.dump, &e.dir)?;
            if e.json {
                println!("{}", crate::json::line(&ExportOutput(done))?);
            } else {
                println!(
                    "dump {} written to {}: {} ({} pages, {:.1} MiB)",
                    done.dump,
                    e.dir.display(),
                    done.files.join(", "),
                    done.pages,
                    done.bytes as f64 / 1048576.0
                );
            }
            Ok(0)
        }
    }
}
