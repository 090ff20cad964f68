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
    if a.json {
        println!("{}", serde_json::to_string_pretty(p)?);
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
    Ok(0)
}
