//! Mappings userfaultfd cannot register (`special_maps.c`: a droppable
//! mapping, `MAP_DROPPABLE`, and a native AIO ring, `/[aio]`) beside
//! ordinary memory: a snapshot and a restore put back the ordinary memory
//! and the droppable mapping (compared page by page, since they cannot be
//! watched), the AIO context still answers, and `track --pid` tracks the
//! rest and says once what it leaves alone.

#[macro_use]
mod support;
use support::*;

fn checksums(answer: &str) -> (String, String, String) {
    let word = |k: &str| {
        answer
            .split_whitespace()
            .find_map(|w| w.strip_prefix(k))
            .unwrap_or_else(|| panic!("no {k} in {answer:?}"))
            .to_string()
    };
    (word("sum="), word("drop="), word("aio="))
}

#[test]
fn droppable_and_aio_mappings_do_not_stop_a_restore_or_tracking() {
    need_support!();
    let prog = c_program("special_maps");
    let mut t = pagewise_testkit::Piped::start(&mut Command::new(prog));
    let ready = t.line();
    let w: Vec<&str> = ready.split_whitespace().collect();
    assert_eq!(w[0], "ready", "{ready}");
    if w[1] == "(nil)" || w[1] == "0" {
        pagewise_testkit::skip!(
            "this kernel refuses MAP_DROPPABLE (Linux 6.11 and later make one)"
        );
        return;
    }
    assert_eq!(w[2], "1", "io_setup failed: {ready}");
    let pid = t.pid().to_string();
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    assert!(maps.contains("/[aio]"), "no AIO ring: {maps}");
    let dp = pagewise_mech::procfs::with_vm_flag(Some(t.pid()), &["dp"]).unwrap();
    assert_eq!(dp.len(), 1, "one droppable mapping: {dp:?}");
    t.ask("w 1");
    let then = checksums(&t.ask("c"));
    assert_eq!(then.2, "ok");
    let dir = temp_dir("special-maps");
    ok(Command::new(BIN)
        .args(["snapshot", "--pid", &pid, "--out"])
        .arg(&dir));
    t.ask("w 2");
    assert_ne!(checksums(&t.ask("c")).0, then.0);
    let out = ok(Command::new(BIN)
        .args(["snapshot", "restore", "--pid", &pid])
        .arg(&dir));
    println!("{}", String::from_utf8_lossy(&out.stdout));
    let now = checksums(&t.ask("c"));
    assert_eq!(
        now, then,
        "memory, droppable mapping and AIO after the restore"
    );
    // Tracking from outside: the rest is tracked, the droppable mapping
    // said once over three collections.
    let out = ok(Command::new(BIN).args([
        "track",
        "--pid",
        &pid,
        "--count",
        "3",
        "--interval-ms",
        "50",
    ]));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        err.matches("is not tracked: a droppable mapping").count(),
        1,
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
