//! `pagewise generate`: the man pages (one per command, from the same
//! definitions as `--help`), the shell completions and the JSON Schema of
//! every `--json` output (from the types the tool prints), written into a
//! directory for packaging (`make install` runs it) or the book.

use anyhow::{Context, Result};
use clap::CommandFactory;
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    what: What,
}

#[derive(clap::Subcommand)]
enum What {
    /// A man page per command: pagewise.1, pagewise-track.1, pagewise-snapshot-restore.1, ...
    Man {
        /// The directory to write them into (made if missing).
        out: PathBuf,
    },
    /// The JSON Schema of each command's `--json` output, derived from the
    /// types it prints: probe.json, track.json, snapshot-serve.json, ...
    Schemas {
        /// The directory to write them into (made if missing).
        out: PathBuf,
    },
    /// The completion script of a shell.
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
        /// The directory to write it into (made if missing).
        out: PathBuf,
    },
}

pub fn run<C: CommandFactory>(a: Args) -> Result<i32> {
    let mut cmd = C::command();
    cmd.build();
    match a.what {
        What::Man { out } => {
            std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
            let n = man_pages(&cmd, "pagewise", &out)?;
            eprintln!("wrote {n} man pages into {}", out.display());
        }
        What::Schemas { out } => {
            std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
            let all = crate::json::schemas();
            for (name, schema) in &all {
                let path = out.join(format!("{name}.json"));
                let text = serde_json::to_string_pretty(schema)? + "\n";
                std::fs::write(&path, text)
                    .with_context(|| format!("writing {}", path.display()))?;
            }
            eprintln!("wrote {} schemas into {}", all.len(), out.display());
        }
        What::Completions { shell, out } => {
            std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
            let path = clap_complete::generate_to(shell, &mut cmd, "pagewise", &out)
                .with_context(|| format!("writing the {shell} completions"))?;
            eprintln!("wrote the {shell} completions to {}", path.display());
        }
    }
    Ok(0)
}

/// Writes `NAME.1` for `cmd` and its visible subcommands, named
/// `NAME-SUB`; the pages written.
fn man_pages(cmd: &clap::Command, name: &str, out: &Path) -> Result<usize> {
    // clap takes a command's name as a static string; this command runs
    // once and exits.
    let static_name: &'static str = Box::leak(name.to_string().into_boxed_str());
    let page = cmd.clone().name(static_name);
    let mut buf = Vec::new();
    clap_mangen::Man::new(page)
        .render(&mut buf)
        .context("rendering a man page")?;
    let path = out.join(format!("{name}.1"));
    std::fs::write(&path, buf).with_context(|| format!("writing {}", path.display()))?;
    let mut n = 1;
    for sub in cmd.get_subcommands() {
        if sub.is_hide_set() || sub.get_name() == "help" {
            continue;
        }
        n += man_pages(sub, &format!("{name}-{}", sub.get_name()), out)?;
    }
    Ok(n)
}
