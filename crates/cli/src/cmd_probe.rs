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
    let floor = match p.uffd_access {
        Some(_) => pagewise::farmem::calibrate(2000).map_err(|e| e.to_string()),
        None => Err("userfaultfd is not available".to_string()),
    };
    if a.json {
        let mut v = serde_json::to_value(p)?;
        v["farmem_floor"] = match &floor {
            Ok(c) => serde_json::to_value(c)?,
            Err(why) => serde_json::json!({ "unavailable": why }),
        };
        println!("{}", serde_json::to_string(&v)?);
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
    Ok(0)
}
