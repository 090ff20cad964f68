//! System-wide settings under a journal (`pagewise_mech::settings`): an owner
//! SIGKILLed at any point leaves a journal the next claim (or `pagewise`
//! command) repairs; a setting a live process holds is refused to another,
//! naming the owner.

use pagewise_mech::settings::SettingGuard;
use std::io::BufReader;
use std::process::{Command, Stdio};
use std::time::Duration;

const SETTING: &str = "/sys/kernel/mm/transparent_hugepage/khugepaged/max_ptes_none";

/// Whether this test may change the setting (root, and it exists).
fn can_set() -> Option<String> {
    if pagewise_sys::process::geteuid() != 0 {
        return Some("needs root to change a system setting".into());
    }
    if std::fs::metadata(SETTING).is_err() {
        return Some(format!("{SETTING} does not exist here"));
    }
    None
}

fn value() -> String {
    std::fs::read_to_string(SETTING).unwrap().trim().to_string()
}

/// Not a test of its own: the process the tests start and kill. It holds
/// the setting at 123, says "held", and waits to be killed.
#[test]
#[ignore = "started by the other tests as the owner they kill"]
fn owner_process() {
    if std::env::var_os("PAGEWISE_TEST_OWNER").is_none() {
        return;
    }
    let g = SettingGuard::set(SETTING, "123").unwrap();
    println!("held");
    std::thread::sleep(Duration::from_secs(120));
    drop(g);
}

/// Starts the owner; waits for "held" when `wait`.
fn start_owner() -> (std::process::Child, BufReader<std::process::ChildStdout>) {
    let mut c = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "owner_process", "--ignored", "--nocapture"])
        .env("PAGEWISE_TEST_OWNER", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let out = BufReader::new(c.stdout.take().unwrap());
    (c, out)
}

/// Waits (bounded) for the owner `c`'s "held".
fn wait_held(c: &std::process::Child, out: &mut BufReader<std::process::ChildStdout>) {
    loop {
        let l = pagewise_testkit::line_within(out, c.id() as i32).expect("the owner ended");
        if l.contains("held") {
            return;
        }
    }
}

/// While a live process holds the setting, another claim is refused with
/// the owner's pid; once the owner is SIGKILLed, the next claim puts the
/// original back first (the owner never did), and a journal remains of
/// nothing.
#[test]
fn a_killed_owner_is_repaired_and_a_live_one_refuses_others() {
    if let Some(why) = can_set() {
        pagewise_testkit::skip!("{why}");
        return;
    }
    let _one = serial();
    let original = value();
    let (mut c, mut out) = start_owner();
    wait_held(&c, &mut out);
    assert_eq!(value(), "123");
    let e = SettingGuard::claim(SETTING).unwrap_err();
    assert!(
        matches!(
            &e,
            pagewise::MechError::SettingHeld {
                holder: pagewise_mech::Holder::Pagewise { pid, .. },
                ..
            } if *pid == c.id() as i32
        ),
        "{e}"
    );
    c.kill().unwrap();
    c.wait().unwrap();
    assert_eq!(value(), "123", "left changed by the killed owner");
    let said = pagewise_mech::settings::recover();
    assert_eq!(said.len(), 1, "{said:?}");
    assert!(said[0].contains("put back"), "{said:?}");
    assert_eq!(value(), original, "put back by the next run");
    let g = SettingGuard::claim(SETTING).unwrap();
    assert_eq!(g.old(), original);
}

/// A test (or a tool) that needs a setting another pagewise holds waits
/// for it, bounded, and then says who holds it: before, a test of the
/// dedup agent panicked at once with `Busy(... held by pagewise process N)`
/// and cargo stopped at that binary.
#[test]
fn a_setting_held_elsewhere_is_waited_for_then_named() {
    if let Some(why) = can_set() {
        pagewise_testkit::skip!("{why}");
        return;
    }
    let _one = serial();
    let (mut c, mut out) = start_owner();
    wait_held(&c, &mut out);
    let t0 = std::time::Instant::now();
    let e =
        pagewise_mech::settings::wait_until_free(SETTING, Duration::from_millis(500)).unwrap_err();
    assert!(t0.elapsed() >= Duration::from_millis(500), "it waited");
    assert!(
        matches!(
            &e,
            pagewise::MechError::SettingHeld {
                holder: pagewise_mech::Holder::Pagewise { pid, .. },
                ..
            } if *pid == c.id() as i32
        ),
        "{e}"
    );
    let id = c.id();
    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        c.kill().unwrap();
        c.wait().unwrap();
    });
    pagewise_mech::settings::wait_until_free(SETTING, Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("free once owner {id} was killed: {e}"));
    killer.join().unwrap();
    let said = pagewise_mech::settings::recover();
    assert!(said.iter().all(|l| l.contains("put back")), "{said:?}");
}

/// SIGKILL at random points of an owner's life (before, during and after
/// its claim): after the next claim the setting always has its original
/// value, and no journal is left once that claim ends.
#[test]
fn sigkill_at_random_points_leaves_nothing_changed() {
    if let Some(why) = can_set() {
        pagewise_testkit::skip!("{why}");
        return;
    }
    let _one = serial();
    let original = value();
    let mut seed = std::process::id() as u64 | 1;
    for round in 0..12 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let (mut c, _out) = start_owner();
        std::thread::sleep(Duration::from_micros(seed % 40_000));
        c.kill().unwrap();
        c.wait().unwrap();
        let g = SettingGuard::claim(SETTING).unwrap();
        assert_eq!(
            g.old(),
            original,
            "round {round}: the original value was lost"
        );
        drop(g);
        assert_eq!(value(), original, "round {round}");
    }
    let left: Vec<_> = std::fs::read_dir(pagewise_mech::settings::journal_dir())
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(
        !left
            .iter()
            .any(|p| p.to_string_lossy().contains("max_ptes_none")),
        "journals left: {left:?}"
    );
}

/// The tests here change one setting: one at a time.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ONE.lock().unwrap_or_else(|e| e.into_inner())
}
