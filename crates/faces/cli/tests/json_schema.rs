//! Every JSON object the tool prints carries `"schema"`, the version of
//! its output, first.

mod support;
use support::*;

/// The JSON lines `pagewise ARGS` prints, each checked for the schema.
fn lines(args: &[&str]) -> Vec<serde_json::Value> {
    let out = Command::new(BIN).args(args).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let vs: Vec<serde_json::Value> = text
        .lines()
        .map(|l| {
            assert!(l.starts_with("{\"schema\":1,"), "{args:?}: {l}");
            serde_json::from_str(l).unwrap()
        })
        .collect();
    assert!(!vs.is_empty(), "{args:?} printed nothing");
    vs
}

#[test]
fn json_output_carries_its_schema() {
    // One object: what the kernel offers.
    let probe = lines(&["probe", "--json"]);
    assert_eq!(probe.len(), 1);
    assert!(probe[0]["kernel"].is_string(), "{}", probe[0]);
    // One object per backend, each against its shadow copy.
    let demo = lines(&["demo", "--json", "--mib", "2"]);
    assert!(demo.iter().all(|v| v["backend"].is_string()));
    // The far-memory instances: an object holding the list.
    let dir = std::env::temp_dir().join(format!("pagewise-json-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = Command::new(BIN)
        .args(["farmem", "ls", "--json"])
        .env("PAGEWISE_FARMEM_DIR", &dir)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let text = String::from_utf8_lossy(&out.stdout);
    let v: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
    assert_eq!(v["schema"], 1, "{text}");
    assert_eq!(v["instances"], serde_json::json!([]), "{text}");
}
