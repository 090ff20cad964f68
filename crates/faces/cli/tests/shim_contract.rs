//! The preload shim and pagewise agree on one versioned contract
//! (`pagewise_mech::shim`): a shim asked by a pagewise of another
//! contract does nothing it was asked, says so in one line, and the
//! program runs as it would without it.

mod support;
use support::*;

/// `echo hello` with the shim preloaded and `vars` set: its stdout and stderr.
fn echo_under_shim(shim: &std::path::Path, vars: &[(&str, &str)]) -> (String, String) {
    let mut c = Command::new("/bin/echo");
    c.arg("hello").env("LD_PRELOAD", shim);
    for k in [
        pagewise_mech::shim::env::CONTRACT,
        pagewise_mech::shim::env::FARMEM_INSTANCE,
        pagewise_mech::shim::env::PREZERO,
        pagewise_mech::shim::env::FARMEM_FAULT_PATH,
    ] {
        c.env_remove(k);
    }
    c.envs(vars.iter().copied());
    let out = c.output().unwrap();
    assert!(out.status.success(), "{out:?}");
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_shim_refuses_a_request_of_another_contract_in_one_line() {
    let Some(shim) = shim() else {
        pagewise_testkit::skip!("the preload shim is not built (cargo build --release)");
        return;
    };
    use pagewise_mech::shim::env;
    use pagewise_testkit::host::CONTRACT;
    // A far-memory request from a pagewise of contract 999: not joined (the
    // instance does not exist either; the contract is checked first).
    let (out, err) = echo_under_shim(
        &shim,
        &[
            (env::CONTRACT, "999 9.9.9"),
            (env::FARMEM_INSTANCE, "no-such-instance"),
        ],
    );
    assert_eq!(out, "hello\n");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("contract 999 (9.9.9)"), "{err}");
    assert!(
        err.contains(&format!("this shim speaks contract {CONTRACT}")),
        "{err}"
    );
    assert!(
        !err.contains("no-such-instance"),
        "acted on the request: {err}"
    );
    // A request with no contract at all (a pagewise before contracts).
    let (out, err) = echo_under_shim(&shim, &[(env::PREZERO, "1,1")]);
    assert_eq!(out, "hello\n");
    assert!(err.contains("contract unknown"), "{err}");
    // The same contract: the request is taken (pre-zeroing starts quietly).
    let ours = format!("{CONTRACT} {}", pagewise_testkit::host::BUILD);
    let (out, err) = echo_under_shim(&shim, &[(env::CONTRACT, &ours), (env::PREZERO, "1,1")]);
    assert_eq!(out, "hello\n");
    assert!(!err.contains("contract"), "{err}");
    // Nothing asked: nothing said.
    let (out, err) = echo_under_shim(&shim, &[]);
    assert_eq!((out.as_str(), err.as_str()), ("hello\n", ""));
}

#[test]
fn a_shim_refuses_a_value_it_cannot_read_naming_the_variable() {
    let Some(shim) = shim() else {
        pagewise_testkit::skip!("the preload shim is not built (cargo build --release)");
        return;
    };
    use pagewise_mech::shim::env;
    use pagewise_testkit::host::{BUILD, CONTRACT};
    let ours = format!("{CONTRACT} {BUILD}");
    // A far-memory request whose fault path is neither `thread` nor
    // `inline`: refused before the instance is looked at, never taken for
    // the default path.
    let (out, err) = echo_under_shim(
        &shim,
        &[
            (env::CONTRACT, &ours),
            (env::FARMEM_INSTANCE, "no-such-instance"),
            (env::FARMEM_FAULT_PATH, "sideways"),
        ],
    );
    assert_eq!(out, "hello\n");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("no far-memory emulation: PAGEWISE_FARMEM_FAULT_PATH=\"sideways\""),
        "{err}"
    );
    assert!(!err.contains("no-such-instance"), "acted on it: {err}");
    // A pre-zeroing request with a rate that is not a number.
    let (out, err) = echo_under_shim(&shim, &[(env::CONTRACT, &ours), (env::PREZERO, "1,fast")]);
    assert_eq!(out, "hello\n");
    assert!(
        err.contains("no pre-zeroing: PAGEWISE_PREZERO=\"fast\" is not a f64"),
        "{err}"
    );
}

#[test]
fn a_refused_request_is_not_inherited_where_it_was_for_the_program_alone() {
    let Some(shim) = shim() else {
        pagewise_testkit::skip!("the preload shim is not built (cargo build --release)");
        return;
    };
    use pagewise_mech::shim::env;
    // A shell under the shim, asked by a pagewise of another contract,
    // starts `env`: the program's own sockets and pre-zeroing are not
    // handed on to it; far memory (which children join) is.
    let out = Command::new("/bin/sh")
        .args(["-c", "env"])
        .env("LD_PRELOAD", &shim)
        .env(env::CONTRACT, "999 9.9.9")
        .env(env::TRACK_FD, "5")
        .env(env::PREZERO, "1,1")
        .env(env::FARMEM_INSTANCE, "no-such-instance")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let child_env = String::from_utf8_lossy(&out.stdout);
    for gone in [env::TRACK_FD, env::PREZERO] {
        assert!(
            !child_env.contains(&format!("{gone}=")),
            "{gone} inherited:\n{child_env}"
        );
    }
    assert!(
        child_env.contains(&format!("{}=no-such-instance", env::FARMEM_INSTANCE)),
        "{child_env}"
    );
}
