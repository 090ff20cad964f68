//! `pagewise-bench`: the experiments of the papers, each against its
//! baselines in the same run, reported as ratios with their spread. A
//! program of its own, so that the `pagewise` tool does not carry the
//! experiments; `pagewise bench ...` runs it when it is installed beside
//! `pagewise`.

use clap::Parser;

#[derive(Parser)]
/// The benchmarks of pagewise: the papers' experiments against their
/// baselines (LDT, SimGrid, DiME, HawkEye, SmartMD), on this machine.
#[command(name = "pagewise-bench", version, long_about = None)]
struct Cli {
    /// No progress bars or spinners (they appear only on a terminal anyway).
    #[arg(long, short, global = true)]
    quiet: bool,
    #[command(flatten)]
    args: pagewise_bench::cli::Args,
}

fn main() {
    // Output piped into `head` ends quietly when the reader goes away.
    let _ = pagewise_sys::signal::default_sigpipe();
    // The rollback experiments' target is this program too.
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("__rollback-target") {
        std::process::exit(pagewise_bench::rollback::target::main(&args[2..]));
    }
    // SIGINT or SIGTERM while no benchmark polls for it (those that run
    // servers end their run themselves): the settings changed are put back
    // before the process ends.
    if let Err(e) = pagewise_sys::signal::on_stop_otherwise(stopped) {
        eprintln!("pagewise-bench: taking SIGINT and SIGTERM: {e}");
    }
    let cli = Cli::parse();
    // Settings a killed pagewise left changed are put back first (and said).
    pagewise_agent::settings::recover();
    match pagewise_bench::cli::run(cli.args, cli.quiet) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("pagewise-bench: {e:#}");
            std::process::exit(1);
        }
    }
}

/// Ends the process on SIGINT or SIGTERM after putting back every system
/// setting it holds (its guards' drops will not run): 128 + the signal.
fn stopped(sig: libc::c_int) {
    for line in pagewise_agent::settings::put_back_own() {
        eprintln!("pagewise-bench: {line}");
    }
    eprintln!("pagewise-bench: ended by signal {sig}");
    std::process::exit(128 + sig);
}
