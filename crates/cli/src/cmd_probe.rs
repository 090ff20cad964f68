//! `pagewise probe`.

use anyhow::Result;

#[derive(clap::Args)]
pub struct Args {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> Result<i32> {
    let p = pagewise::probe::get();
    // What a far-memory fault costs here at latency 0 (the floor of `farmem`).
    use pagewise::farmem::FaultPath;
    let floor_on = |path| match p.uffd_access {
        Some(_) => pagewise::farmem::calibrate(2000, path).map_err(|e| e.to_string()),
        None => Err("userfaultfd is not available".to_string()),
    };
    let floor = floor_on(FaultPath::Thread);
    let inline_floor = if p.uffd_has(pagewise_sys::uffd::feature::SIGBUS) {
        floor_on(FaultPath::Inline)
    } else {
        Err("the kernel lacks UFFD_FEATURE_SIGBUS".to_string())
    };
    // Where the preload shim is (for `-- CMD` commands).
    let shim = pagewise::shim::shim_path().map_err(|e| e.to_string());
    if a.json {
        let mut v = serde_json::to_value(p)?;
        v["preload_shim"] = match &shim {
            Ok(path) => serde_json::json!(path.display().to_string()),
            Err(why) => serde_json::json!({ "unavailable": why }),
        };
        for (key, f) in [
            ("farmem_floor", &floor),
            ("farmem_floor_inline", &inline_floor),
        ] {
            v[key] = match f {
                Ok(c) => serde_json::to_value(c)?,
                Err(why) => serde_json::json!({ "unavailable": why }),
            };
        }
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
