//! `pagewise probe`.

use anyhow::Result;

use crate::json::OrUnavailable;

#[derive(clap::Args)]
pub struct Args {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

/// `probe --json`: what the kernel offers, where the shim is, what a
/// far-memory fault costs here.
#[derive(serde::Serialize, schemars::JsonSchema)]
pub struct Output<'a> {
    /// The kernel's features, as probed.
    #[serde(flatten)]
    pub probe: &'a pagewise::probe::Probe,
    /// The preload shim's path.
    pub preload_shim: OrUnavailable<String>,
    /// What a far-memory fault costs at latency 0, served by a thread.
    pub farmem_floor: OrUnavailable<pagewise::farmem::Calibration>,
    /// The same, served inline in the faulting thread (SIGBUS).
    pub farmem_floor_inline: OrUnavailable<pagewise::farmem::Calibration>,
}
impl crate::json::Printed for Output<'_> {}

pub fn run(a: Args) -> Result<i32> {
    let p = pagewise::probe::get();
    // What a far-memory fault costs here at latency 0 (the floor of `farmem`).
    use pagewise::farmem::FaultPath;
    let floor_on = |path| match p.uffd_access {
        Some(_) => pagewise::farmem::calibrate(2000, path).map_err(|e| e.to_string()),
        None => Err("userfaultfd is not available".to_string()),
    };
    let floor = floor_on(FaultPath::Thread);
    let inline_floor = if p.uffd_sigbus() {
        floor_on(FaultPath::Inline)
    } else {
        Err("the kernel lacks UFFD_FEATURE_SIGBUS".to_string())
    };
    // Where the preload shim is (for `-- CMD` commands).
    let shim = pagewise::shim::shim_path().map_err(|e| e.to_string());
    if a.json {
        let v = Output {
            probe: p,
            preload_shim: shim
                .as_ref()
                .map(|p| p.display().to_string())
                .map_err(Clone::clone)
                .into(),
            farmem_floor: floor.clone().into(),
            farmem_floor_inline: inline_floor.clone().into(),
        };
        println!("{}", crate::json::line(&v)?);
        return Ok(0);
    }
    println!("Linux {}", p.kernel);
    let w = p.features.iter().map(|f| f.name.len()).max().unwrap_or(10);
    for f in &p.features {
        println!(
            "{:<w$}  {:<3}  {}",
            f.name,
            if f.available { "yes" } else { "no" },
            f.detail,
            w = w
        );
    }
    println!();
    for k in pagewise::track::BackendKind::ALL {
        let here = match k.available_in_process() {
            Ok(()) => "available".to_string(),
            Err(why) => format!("unavailable: {why}"),
        };
        println!("track backend {:<10} {here}", k.name());
    }
    match floor {
        Ok(c) => println!(
            "farmem floor           {} ns per fault at latency 0 (handler thread; {} ns of it unseen by the handler; {} faults)",
            c.floor_ns, c.unseen_ns, c.faults
        ),
        Err(why) => println!("farmem                 unavailable: {why}"),
    }
    match inline_floor {
        Ok(c) => println!(
            "farmem floor inline    {} ns per fault at latency 0 (in the faulting thread; {} ns of it unseen by the engine; {} faults)",
            c.floor_ns, c.unseen_ns, c.faults
        ),
        Err(why) => println!("farmem inline          unavailable: {why}"),
    }
    match shim {
        Ok(path) => println!("preload shim           {}", path.display()),
        Err(why) => println!("preload shim           not found: {why}"),
    }
    Ok(0)
}
