//! Far memory for programs in podman containers with the runtime's
//! defaults (the seccomp profile refuses `userfaultfd`; no
//! CAP_SYS_PTRACE): `pagewise farmem serve` on the host, the container run
//! with the arguments it prints. The programs' own checks and outputs
//! match a run without pagewise; faults were served inline (so the
//! emulation ran, and the engine's userfaultfds were made inside the
//! program); members are listed by host pid, forked children too; the
//! program's filters are the container's plus the shim's own trap, and the
//! only descriptors it gained are its engine's two userfaultfds. Without a
//! server, the shim names the filter as the cause and the program runs
//! unemulated.

#[macro_use]
mod support;
use pagewise_testkit::container::{podman_missing, podman_run_with, Removed};
use support::*;

fn tmp() -> &'static Path {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
}

/// `farmem serve` started over `dir`, its first JSON line read.
struct Serve {
    child: std::process::Child,
    out: std::io::BufReader<std::process::ChildStdout>,
    args: Vec<String>,
    instance: String,
}

impl Serve {
    fn start(dir: &Path, extra: &[&str]) -> Serve {
        let mut child = Command::new(BIN)
            .args(["farmem", "serve", "--json", "--local-pages", "64"])
            .args(extra)
            .env("PAGEWISE_FARMEM_DIR", dir)
            .env("PAGEWISE_FARMEM_SOCKETS", sockets_of(dir))
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        let l = pagewise_testkit::line_within(&mut out, child.id() as i32).unwrap_or_default();
        let v: serde_json::Value = serde_json::from_str(&l).expect("the serving line");
        assert_eq!(v["event"], "serving", "{l}");
        let args = v["podman_args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap().to_string())
            .collect();
        Serve {
            child,
            out,
            args,
            instance: v["instance"].as_str().unwrap().to_string(),
        }
    }

    /// SIGTERM; every line after the first, the last being `ended`.
    fn end(&mut self) -> Vec<serde_json::Value> {
        pagewise_sys::process::kill(self.child.id() as i32, libc::SIGTERM).unwrap();
        let st = self.child.wait().unwrap();
        assert_eq!(st.code(), Some(143), "farmem serve after SIGTERM");
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut self.out, &mut rest).unwrap();
        rest.lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

/// A test that failed leaves no server behind (holding the test's output
/// open).
impl Drop for Serve {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Where the servers over instance directory `dir` keep their sockets.
fn sockets_of(dir: &Path) -> PathBuf {
    let mut s = dir.as_os_str().to_owned();
    s.push("-sockets");
    PathBuf::from(s)
}

/// The target run in a default container with `more` arguments.
fn contained(name: &str, more: &[String], args: &[&str]) -> std::process::Output {
    let t = target();
    let dir = t.parent().unwrap();
    let _gone = Removed(name.to_string());
    podman_run_with(tmp(), name, dir, more, "/t/farmem_target", args)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap()
}

fn ok_output(o: &std::process::Output, what: &str) -> String {
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{what}: {err}");
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn a_default_containers_program_runs_in_far_memory_served_from_the_host() {
    need_support!();
    if let Some(why) = podman_missing() {
        pagewise_testkit::skip!("{why}");
        return;
    }
    let dir = temp_dir("farmem-serve");
    std::fs::create_dir_all(&dir).unwrap();
    let mut serve = Serve::start(&dir, &[]);
    let tag = std::process::id();

    // The programs' own checks and outputs, against native runs.
    for mode in [&["threads"][..], &["fork"], &["grow"], &["parked"]] {
        let name = format!("pagewise-test-{tag}-fm-{}", mode[0]);
        let got = ok_output(&contained(&name, &serve.args, mode), mode[0]);
        assert_eq!(got, plain(mode), "{mode:?} in a container, against native");
        println!("ok   {}: {}", mode[0], got.trim());
    }

    // A member as the host sees it, while it runs.
    let name = format!("pagewise-test-{tag}-fm-hold");
    let _gone = Removed(name.clone());
    let t = target();
    let mut hold = pagewise_testkit::Piped::start(&mut podman_run_with(
        tmp(),
        &name,
        t.parent().unwrap(),
        &serve.args,
        "/t/farmem_target",
        &["hold", "512", "4"],
    ));
    assert_eq!(hold.line(), "holding 512");
    let pid = pagewise_testkit::container::host_pid(&name);
    let ls = Command::new(BIN)
        .args(["farmem", "ls", "--json"])
        .env("PAGEWISE_FARMEM_DIR", &dir)
        .output()
        .unwrap();
    let ls: serde_json::Value = serde_json::from_slice(&ls.stdout).unwrap();
    let inst = ls["instances"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["instance_id"] == serve.instance.as_str())
        .expect("the served instance listed");
    assert!(
        inst["pids"].as_array().unwrap().contains(&pid.into()),
        "members by host pid: {} lists {}",
        pid,
        inst["pids"]
    );
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let filters = pagewise_mech::procfs::status_field(&status, "Seccomp_filters").unwrap();
    let plain_filters = container_filters(&format!("pagewise-test-{tag}-fm-plain"));
    assert_eq!(
        filters,
        plain_filters + 1,
        "the container's filters and the shim's own trap"
    );
    assert_eq!(
        pagewise_testkit::userfaultfds(pid),
        2,
        "the engine's userfaultfd and its staging one, none else"
    );
    assert_eq!(hold.line(), "hold bad 0");
    println!("ok   hold: host pid {pid} listed, {filters} filters, 2 userfaultfds");

    let lines = serve.end();
    let made: Vec<&serde_json::Value> = lines
        .iter()
        .filter(|l| l["event"] == "answered" && l["op"] == "userfaultfd")
        .collect();
    assert!(
        made.iter().all(|l| l["value"].as_i64().unwrap() >= 0),
        "{made:?}"
    );
    assert!(
        made.iter().any(|l| l["ns_pid"] != l["pid"]),
        "made inside containerised processes: {made:?}"
    );
    let rep = &lines.last().unwrap()["report"];
    assert_eq!(lines.last().unwrap()["event"], "ended");
    let faults = rep["page_fault_count"].as_u64().unwrap();
    let inline = rep["inline_faults"].as_u64().unwrap();
    assert!(faults > 1000 && inline > 0, "emulated: {rep}");
    println!(
        "ok   served {} userfaultfds; {faults} faults, {inline} inline",
        made.len()
    );
}

/// A container run as a user without privileges (`--user 1000:1000`), its
/// instance served by root and handed to that user (`--owner 1000`): the
/// program runs emulated, its output as native, listed by host pid; the
/// instance file and the socket belong to the user.
#[test]
fn a_containers_user_gets_an_instance_handed_to_it() {
    need_support!();
    if let Some(why) = podman_missing() {
        pagewise_testkit::skip!("{why}");
        return;
    }
    let dir = temp_dir("farmem-owner");
    std::fs::create_dir_all(&dir).unwrap();
    let mut serve = Serve::start(&dir, &["--owner", "1000"]);
    use std::os::unix::fs::MetadataExt;
    let socket = sockets_of(&dir).join(&serve.instance).join("uffd");
    for f in [dir.join(&serve.instance), socket] {
        assert_eq!(
            std::fs::metadata(&f).unwrap().uid(),
            1000,
            "{}",
            f.display()
        );
    }
    let mut more = serve.args.clone();
    more.extend(["--user".to_string(), "1000:1000".to_string()]);
    let name = format!("pagewise-test-{}-fm-user", std::process::id());
    let o = contained(&name, &more, &["threads"]);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(ok_output(&o, "threads as uid 1000"), plain(&["threads"]));
    assert!(!err.contains("running without"), "{err}");
    let lines = serve.end();
    let rep = &lines.last().unwrap()["report"];
    assert_eq!(rep["owner_uid"], 1000, "{rep}");
    let faults = rep["page_fault_count"].as_u64().unwrap();
    assert!(faults > 1000, "emulated: {rep}");
    let member = rep["members"][0]["pid"].as_i64().unwrap();
    assert!(
        lines
            .iter()
            .any(|l| l["op"] == "userfaultfd" && l["pid"] == member),
        "its userfaultfds made for its host pid {member}: {lines:?}"
    );
    println!("ok   uid 1000: {faults} faults, host pid {member}");
}

/// Seccomp filters of a plain default container's process.
fn container_filters(name: &str) -> u64 {
    let _gone = Removed(name.to_string());
    let mut sh = pagewise_testkit::Piped::start(&mut podman_run_with(
        tmp(),
        name,
        tmp(),
        &[],
        "/bin/sh",
        &["-c", "echo ready; read x"],
    ));
    assert_eq!(sh.line(), "ready");
    let pid = pagewise_testkit::container::host_pid(name);
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    pagewise_mech::procfs::status_field(&status, "Seccomp_filters").unwrap()
}

#[test]
fn without_a_server_the_shim_names_the_filter_and_the_program_runs() {
    need_support!();
    if let Some(why) = podman_missing() {
        pagewise_testkit::skip!("{why}");
        return;
    }
    let dir = temp_dir("farmem-noserve");
    std::fs::create_dir_all(&dir).unwrap();
    // An instance made on the host by a run, its directory mounted, but
    // nothing serving it.
    let mut host = Command::new(BIN)
        .args([
            "farmem",
            "run",
            "--instance",
            "noserve",
            "--local-pages",
            "64",
        ])
        .args(["--", "sleep", "30"])
        .env("PAGEWISE_FARMEM_DIR", &dir)
        .spawn()
        .unwrap();
    let file = dir.join("noserve");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !file.exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let d = dir.display();
    let shim = pagewise_testkit::host::shim_path().unwrap();
    let more: Vec<String> = [
        "-v".to_string(),
        format!("{d}:{d}"),
        "-v".into(),
        format!("{}:/run/pagewise/libpagewise_preload.so:ro", shim.display()),
        "-e".into(),
        "LD_PRELOAD=/run/pagewise/libpagewise_preload.so".into(),
        "-e".into(),
        format!("PAGEWISE_FARMEM_DIR={d}"),
        "-e".into(),
        "PAGEWISE_FARMEM=noserve".into(),
        "-e".into(),
        format!(
            "PAGEWISE_CONTRACT={} {}",
            pagewise_testkit::host::CONTRACT,
            pagewise_testkit::host::BUILD
        ),
    ]
    .into();
    let name = format!("pagewise-test-{}-fm-noserve", std::process::id());
    let o = contained(&name, &more, &["threads"]);
    let _ = pagewise_sys::process::kill(host.id() as i32, libc::SIGTERM);
    let _ = host.wait();
    let err = String::from_utf8_lossy(&o.stderr);
    let out = ok_output(&o, "threads without a server");
    assert_eq!(out, plain(&["threads"]));
    assert!(err.contains("seccomp filter"), "the cause named: {err}");
    assert!(err.contains("farmem serve"), "the way out named: {err}");
    assert!(
        err.contains("running without far-memory emulation"),
        "{err}"
    );
    println!("ok   said: {}", err.trim());
}
