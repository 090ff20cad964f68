//! `pagewise farmem serve`: a far-memory instance for programs in
//! containers (see `pagewise::farmem::serve`).

use anyhow::{Context, Result};
use pagewise::farmem::serve::{Event, Server};
use pagewise::farmem::{FarmemOptions, FarmemRun};
use pagewise::process::{container_of, ns_pid, ContainerRef};
use std::time::Duration;

/// Where the shim is mounted in a container.
pub const CONTAINER_SHIM: &str = "/run/pagewise/libpagewise_preload.so";

#[derive(clap::Args)]
pub struct ServeArgs {
    /// The instance's name (created, or joined when it exists). Default:
    /// a new name, said at start.
    #[arg(long)]
    instance: Option<String>,
    #[command(flatten)]
    settings: super::cmd_farmem::SettingsArgs,
    #[command(flatten)]
    program: super::cmd_farmem::ProgramArgs,
    /// Print one JSON object per line: `serving` first (with the podman
    /// arguments), one per request answered, and `ended` with the
    /// instance's report.
    #[arg(long)]
    json: bool,
    /// End after this many seconds (default: at SIGTERM or SIGINT).
    #[arg(long)]
    seconds: Option<u64>,
    /// The user (a uid) whose programs run in the instance, for containers
    /// run as that user (`podman run --user UID`): the instance made here
    /// is handed to it (only its owner's processes may join an instance).
    /// Default: the user running this command.
    #[arg(long, value_name = "UID")]
    owner: Option<u32>,
}

/// `farmem serve --json`: one object a line.
#[derive(serde::Serialize, schemars::JsonSchema)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum ServeLine<'a> {
    /// Serving: how to run a container's program in the instance.
    Serving {
        /// The instance.
        instance: String,
        /// The socket members in containers ask on.
        socket: String,
        /// The tag this run's members carry.
        tag: u32,
        /// The preload shim on the host, mounted into the container.
        shim: String,
        /// The arguments of `podman run` (or `docker run`) that put a
        /// container's program in the instance: the instance's directory
        /// and the shim mounted, the shim preloaded, the request set.
        podman_args: Vec<String>,
    },
    /// A request of a member answered.
    Answered {
        /// The asker's host pid.
        pid: i32,
        /// Its pid inside its pid namespace.
        ns_pid: Option<i32>,
        /// Its container, where its cgroup path names one.
        container: Option<ContainerRef>,
        /// `who` (its host pid) or `userfaultfd` (one made inside it).
        op: &'static str,
        /// The pid or descriptor number sent, or `-errno`.
        value: i64,
        /// The reason of a refusal ("" otherwise).
        why: String,
    },
    /// A connection that could not be answered.
    Failed {
        /// Why.
        why: String,
    },
    /// Serving ended: the instance's report (members by host pid).
    Ended {
        /// As `farmem run --json` reports a run.
        report: &'a pagewise::farmem::Report,
    },
}
impl crate::json::Printed for ServeLine<'_> {}

/// The `podman run` arguments that put a container's program in instance
/// `run` with `opts`.
fn podman_args(run: &FarmemRun, opts: &FarmemOptions, shim: &str) -> Result<Vec<String>> {
    let dir = pagewise::farmem::instance::dir();
    let dir = dir.display();
    // The server's socket: its instance's directory alone, read-only (a
    // socket is connected to on a read-only mount).
    let sockets = pagewise::farmem::serve::socket_dir();
    let sockets = sockets.display();
    let served = pagewise::farmem::serve::instance_socket_dir(run.instance().name());
    let served = served.display();
    let mut args = vec![
        "-v".to_string(),
        format!("{dir}:{dir}"),
        "-v".into(),
        format!("{served}:{served}:ro"),
        "-v".into(),
        format!("{shim}:{CONTAINER_SHIM}:ro"),
        "-e".into(),
        format!("LD_PRELOAD={CONTAINER_SHIM}"),
        "-e".into(),
        format!("PAGEWISE_FARMEM_DIR={dir}"),
        "-e".into(),
        format!("PAGEWISE_FARMEM_SOCKETS={sockets}"),
    ];
    // The request as `farmem run` makes it for a program it starts.
    let cmd = run.command(&["true".to_string()], opts)?;
    for (k, v) in cmd.get_envs() {
        let (Some(k), Some(v)) = (k.to_str(), v.and_then(|v| v.to_str())) else {
            continue;
        };
        if k != "LD_PRELOAD" {
            args.push("-e".into());
            args.push(format!("{k}={v}"));
        }
    }
    Ok(args)
}

pub fn serve(a: ServeArgs) -> Result<i32> {
    let want = a.settings.want(a.instance.as_deref())?;
    let opts = a.program.options()?;
    let existed = a
        .instance
        .as_deref()
        .is_some_and(pagewise::farmem::instance::exists);
    let run = FarmemRun::join_or_create(a.instance.as_deref(), "serve", want)?;
    let name = run.instance().name().to_string();
    if let Some(uid) = a.owner {
        if existed {
            run.finish();
            crate::usage!("--owner {uid}: instance {name} exists already, with its owner");
        }
        if let Err(e) = run.instance().hand_to(uid) {
            run.remove();
            return Err(anyhow::Error::new(e).context(format!("handing {name} to uid {uid}")));
        }
    }
    let shim = pagewise::shim::shim_path()?.display().to_string();
    let json = a.json;
    let server = Server::start(&name, run.tag(), move |e| say(e, json))
        .with_context(|| format!("serving instance {name}"))?;
    let args = podman_args(&run, &opts, &shim)?;
    let socket = server.socket().display().to_string();
    if json {
        let line = ServeLine::Serving {
            instance: name.clone(),
            socket,
            tag: run.tag(),
            shim,
            podman_args: args,
        };
        println!("{}", crate::json::line(&line)?);
    } else {
        // Quoted for a shell, so that the line runs pasted.
        let line = shlex::try_join(args.iter().map(String::as_str))
            .context("quoting the podman arguments")?;
        eprintln!(
            "pagewise farmem serve: instance {name} serves programs in containers on {socket}; \
             run them with:\n  podman run {line} IMAGE PROGRAM"
        );
    }
    let stop = crate::stop::Stop::take()?;
    let limit = a.seconds.map(Duration::from_secs);
    let started = std::time::Instant::now();
    while !stop.requested() && limit.is_none_or(|l| started.elapsed() < l) {
        stop.sleep(Duration::from_millis(200));
    }
    server.stop();
    run.reap_dead_members();
    let rep = run.report();
    let live = run.instance().members().iter().filter(|m| m.live).count();
    if json {
        println!("{}", crate::json::line(&ServeLine::Ended { report: &rep })?);
    } else {
        super::cmd_farmem::say_summary(&rep, a.settings.latency_ns);
    }
    if live > 0 {
        eprintln!(
            "pagewise farmem serve: {live} member(s) still run; instance {name} stays until they \
             end (their children after fork get no userfaultfd now)"
        );
    }
    run.finish();
    Ok(stop.status().unwrap_or(0))
}

/// One event of the server, said (a JSON line, or one line on stderr).
fn say(e: Event, json: bool) {
    let line = match e {
        Event::Answered(a) => ServeLine::Answered {
            pid: a.pid,
            ns_pid: ns_pid(a.pid),
            container: container_of(a.pid),
            op: a.op_name(),
            value: a.value,
            why: a.why,
        },
        Event::Failed(why) => ServeLine::Failed { why },
        _ => return,
    };
    if json {
        if let Ok(l) = crate::json::line(&line) {
            println!("{l}");
        }
        return;
    }
    match line {
        ServeLine::Answered {
            pid,
            ns_pid,
            container,
            op,
            value,
            why,
        } => {
            let inside = match (ns_pid, container) {
                (Some(n), Some(c)) => format!(" (pid {n} in container {})", c.id),
                (Some(n), None) if n != pid => format!(" (pid {n} in its pid namespace)"),
                _ => String::new(),
            };
            if value < 0 {
                eprintln!("pagewise farmem serve: refused {op} to process {pid}{inside}: {why}");
            } else if op == "userfaultfd" {
                eprintln!(
                    "pagewise farmem serve: made a userfaultfd (fd {value}) in process \
                     {pid}{inside}"
                );
            }
        }
        ServeLine::Failed { why } => eprintln!("pagewise farmem serve: {why}"),
        _ => {}
    }
}
