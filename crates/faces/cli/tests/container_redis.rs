//! A real Redis in a podman container with the runtime's defaults (its
//! seccomp profile, a read-only root, no network but a Unix socket in a
//! directory it shares, run as a user without privileges), every command
//! run on it from the host, and Redis's data checked after every step
//! (its key count, and sample values): track (uffd-wp), snapshot, restore
//! in full after writes (the data back to the snapshot's), thp run with
//! coverage, dedup run. Afterwards its filters are as they were and it
//! holds no userfaultfd.

#[macro_use]
mod support;
use pagewise_testkit::container::{host_pid, podman_missing, podman_run_with, Removed};
use support::*;

const KEYS: usize = 2000;

fn tmp() -> &'static Path {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
}

/// `redis-cli -s SOCK ARGS...`: its answer, trimmed.
fn cli(sock: &Path, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .arg("-s")
        .arg(sock)
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "redis-cli {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Redis holds exactly `keys` keys, and the sample values it must.
fn data_is(sock: &Path, keys: usize, changed: bool, after: &str) {
    assert_eq!(cli(sock, &["DBSIZE"]), keys.to_string(), "after {after}");
    for i in [0, 1, 777, KEYS - 1] {
        let want = if changed && i == 1 {
            "changed".to_string()
        } else {
            format!("value:{i}")
        };
        assert_eq!(
            cli(sock, &["GET", &format!("key:{i}")]),
            want,
            "after {after}"
        );
    }
    println!("ok   {after}: {keys} keys, sample values as written");
}

fn filters_and_ufds(pid: i32) -> (u64, usize) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let n = pagewise_mech::procfs::status_field(&status, "Seccomp_filters").unwrap();
    (n, pagewise_testkit::userfaultfds(pid))
}

fn pagewise(args: &[&str]) -> std::process::Output {
    let out = Command::new(BIN).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "pagewise {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

#[test]
fn redis_in_a_default_container_keeps_its_data_through_every_command() {
    need_support!();
    if let Some(why) = podman_missing() {
        pagewise_testkit::skip!("{why}");
        return;
    }
    if Command::new("redis-cli").arg("--version").output().is_err() {
        pagewise_testkit::skip!("redis-cli is not installed (scripts/setup.sh installs it)");
        return;
    }
    let dir = temp_dir("container-redis");
    std::fs::create_dir_all(&dir).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let sock = dir.join("redis.sock");
    let name = format!("pagewise-test-{}-redis", std::process::id());
    let _gone = Removed(name.clone());
    let more: Vec<String> = [
        "-v",
        &format!("{}:/s", dir.display()),
        "--user",
        "1000:1000",
    ]
    .map(String::from)
    .into();
    let mut server = podman_run_with(
        tmp(),
        &name,
        tmp(),
        &more,
        "/usr/bin/redis-server",
        &[
            "--port",
            "0",
            "--unixsocket",
            "/s/redis.sock",
            "--unixsocketperm",
            "777",
            "--save",
            "",
            "--appendonly",
            "no",
            "--jemalloc-bg-thread",
            "no",
            // DEBUG POPULATE loads the keys, over the Unix socket.
            "--enable-debug-command",
            "local",
        ],
    )
    .stdin(std::process::Stdio::null())
    .stdout(std::process::Stdio::null())
    .spawn()
    .unwrap();
    let t0 = std::time::Instant::now();
    while !(sock.exists() && cli(&sock, &["PING"]) == "PONG") {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "Redis in the container never answered"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let pid = host_pid(&name);
    let spid = pid.to_string();
    let (filters, _) = filters_and_ufds(pid);
    assert!(filters >= 1, "Redis runs under the container's profile");
    assert_eq!(cli(&sock, &["DEBUG", "POPULATE", &KEYS.to_string()]), "OK");
    data_is(&sock, KEYS, false, "loading");

    let out = pagewise(&[
        "track",
        "--pid",
        &spid,
        "--json",
        "--interval-ms",
        "200",
        "--count",
        "2",
    ]);
    for l in json_lines(&out.stdout) {
        assert_eq!(l["backend"], "uffd-wp", "track fell back: {l}");
    }
    data_is(&sock, KEYS, false, "track --pid (uffd-wp)");

    let store = temp_dir("container-redis-store");
    let store_s = store.display().to_string();
    pagewise(&["snapshot", "--pid", &spid, "--out", &store_s]);
    data_is(&sock, KEYS, false, "snapshot --pid");
    cli(&sock, &["SET", "key:1", "changed"]);
    cli(&sock, &["DEBUG", "POPULATE", "500", "extra"]);
    data_is(&sock, KEYS + 500, true, "writes after the snapshot");
    let out = pagewise(&["snapshot", "restore", "--pid", &spid, "--json", &store_s]);
    let r = &json_lines(&out.stdout)[0]["restored"]["report"];
    assert_eq!(
        r["thread_areas"],
        serde_json::json!([]),
        "a full restore: {r}"
    );
    data_is(&sock, KEYS, false, "snapshot restore (the snapshot's data)");

    // Each agent measured what it needs (coverage, write frequency).
    for (agent, interval) in [("thp", "300"), ("dedup", "400")] {
        let out = pagewise(&[
            agent,
            "run",
            "--pid",
            &spid,
            "--steps",
            "2",
            "--json",
            "--interval-ms",
            interval,
            "--window-ms",
            "100",
        ]);
        for l in json_lines(&out.stdout) {
            for a in l["actions"].as_array().into_iter().flatten() {
                assert_ne!(
                    a["action"], "no-coverage",
                    "{agent} run measured nothing: {a}"
                );
            }
        }
        data_is(&sock, KEYS, false, &format!("{agent} run --pid"));
    }

    assert_eq!(
        filters_and_ufds(pid),
        (filters, 0),
        "filters as they were, no userfaultfd left"
    );
    let _ = std::fs::remove_dir_all(&store);
    drop(_gone);
    let _ = server.wait();
}
