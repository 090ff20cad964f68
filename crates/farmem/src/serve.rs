//! Far memory for programs in containers: the privileged side of an
//! instance whose members run where they cannot make a userfaultfd.
//!
//! A program in a container runs under the runtime's seccomp profile,
//! which refuses `userfaultfd`, without the CAP_SYS_PTRACE that one
//! serving the kernel's faults needs, and in a pid namespace of its own.
//! Its preload shim joins the instance as any member does (the instance's
//! directory is mounted into the container), and asks the [`Server`]
//! over the instance's socket ([`pagewise_mech::inject::maker`]):
//!
//! - its pid as the host sees it, under which it joins, so that the
//!   instance lists members by host pid (`farmem ls` on the host names
//!   them as `ps` does);
//! - each userfaultfd its engine needs, made inside it while it is
//!   stopped for a moment, with its seccomp filters stepped around for
//!   that one call and left as they were; the descriptor stays in the
//!   program, which serves its own faults from then on as any member does.
//!
//! Only processes of the instance's owner are answered (as only they may
//! join it), and a userfaultfd is made only for a live member. The server
//! also leaves the slots of members that died without leaving, which
//! members in containers cannot judge.

use crate::instance::{Access, Instance};
use crate::{Error, Result};
use pagewise_mech::inject::maker::{self, Answered};
use std::os::fd::AsFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What the server did, for its log.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Event {
    /// A request answered (made, told, or refused with its reason).
    Answered(Answered),
    /// A connection that could not be answered, and why.
    Failed(String),
}

/// Serves the userfaultfd requests of an instance's members in containers
/// until stopped (or dropped); its socket is removed then.
pub struct Server {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    path: PathBuf,
}

/// How often the server looks for members that died without leaving.
const REAP_EVERY: Duration = Duration::from_millis(500);

impl Server {
    /// Starts serving instance `name` (opened as its owner, or as root)
    /// on its socket ([`maker::socket_path`]), leaving dead members of run
    /// `tag`; each event goes to `log`. Refused when another server serves
    /// it.
    pub fn start(name: &str, tag: u32, log: impl Fn(Event) + Send + 'static) -> Result<Self> {
        let inst = Instance::open(name, Access::Control)?;
        let path = maker::socket_path(&crate::instance::dir(), name);
        if path.exists() {
            if UnixStream::connect(&path).is_ok() {
                return Err(Error::os(
                    format!("serving {}", path.display()),
                    std::io::Error::new(
                        std::io::ErrorKind::AddrInUse,
                        "another pagewise farmem serve serves this instance",
                    ),
                ));
            }
            // Left by a server that was killed.
            let _ = std::fs::remove_file(&path);
        }
        let listener = UnixListener::bind(&path)
            .map_err(|e| Error::os(format!("binding {}", path.display()), e))?;
        // The instance's owner's processes alone may connect (root's: a
        // container's root without a user namespace).
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
            .and_then(|()| std::os::unix::fs::chown(&path, Some(inst.owner_uid()), None))
            .map_err(|e| Error::os(format!("chmod and chown of {}", path.display()), e))?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("pagewise-farmem-serve".into())
            .spawn(move || serve(&inst, tag, &listener, &flag, &log))
            .map_err(|e| Error::os("starting the server's thread", e))?;
        Ok(Server {
            stop,
            thread: Some(thread),
            path,
        })
    }

    /// The socket members ask on.
    pub fn socket(&self) -> &Path {
        &self.path
    }

    /// Stops serving and removes the socket.
    pub fn stop(mut self) {
        self.end();
    }

    fn end(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.end();
    }
}

/// Whether `pid` of uid `uid` may ask `op` of `inst`.
fn allowed(inst: &Instance, pid: i32, uid: u32, op: u32) -> std::result::Result<(), String> {
    let owner = inst.owner_uid();
    if uid != owner {
        return Err(format!(
            "process {pid} runs as uid {uid}, and instance {} belongs to uid {owner}: only \
             its owner's processes join it (run the container's program as uid {owner})",
            inst.name()
        ));
    }
    if op == maker::USERFAULTFD && !inst.members().iter().any(|m| m.pid == pid && m.live) {
        return Err(format!(
            "process {pid} is not a member of instance {}: a userfaultfd is made only for a \
             member",
            inst.name()
        ));
    }
    Ok(())
}

fn serve(
    inst: &Instance,
    tag: u32,
    listener: &UnixListener,
    stop: &AtomicBool,
    log: &dyn Fn(Event),
) {
    let mut reaped = Instant::now();
    while !stop.load(Ordering::SeqCst) {
        let ready = pagewise_sys::uffd::poll_readable(&[listener.as_fd()], 100).unwrap_or(0);
        if ready & 1 != 0 {
            match listener.accept() {
                Ok((mut s, _)) => {
                    let allow = |pid, uid, op| allowed(inst, pid, uid, op);
                    match maker::answer(&mut s, "far memory in a container", &allow) {
                        Ok(a) => log(Event::Answered(a)),
                        Err(e) => log(Event::Failed(e.to_string())),
                    }
                }
                Err(e) => log(Event::Failed(format!("accepting a connection: {e}"))),
            }
        }
        if reaped.elapsed() >= REAP_EVERY {
            reaped = Instant::now();
            // Leaving a slot that was left already changes nothing.
            for m in inst.members() {
                if m.tag == tag && !m.live {
                    inst.leave_pid(m.pid);
                }
            }
        }
    }
}

/// For a member: the server of instance `name`, if one serves it (its
/// socket is there: a program in a container with the instance's
/// directory mounted), and this process's pid as the server sees it.
pub fn served_as(name: &str) -> Option<Result<(PathBuf, i32)>> {
    let path = maker::socket_path(&crate::instance::dir(), name);
    if !path.exists() {
        return None;
    }
    let who = maker::ask(&path, maker::WHO, 0)
        .map_err(|e| {
            Error::os(
                format!("asking {} this process's host pid", path.display()),
                e,
            )
        })
        .and_then(|v| {
            i32::try_from(v).map_err(|_| {
                Error::os(
                    "reading the server's answer",
                    std::io::Error::other(format!("{v} is not a pid")),
                )
            })
        });
    Some(who.map(|pid| (path, pid)))
}

/// For a member: `userfaultfd(flags)` made inside this process by the
/// server at `path`; the descriptor's number here, checked to be a
/// userfaultfd (its owner is then the caller).
pub fn userfaultfd_from(path: &Path, flags: libc::c_int) -> std::io::Result<i32> {
    let v = maker::ask(path, maker::USERFAULTFD, flags as u32).map_err(|e| {
        std::io::Error::new(
            e.kind(),
            format!("the server of far memory ({}) refused: {e}", path.display()),
        )
    })?;
    let fd = i32::try_from(v).map_err(|_| std::io::Error::other(format!("fd {v}")))?;
    let link = std::fs::read_link(format!("/proc/self/fd/{fd}"))?;
    if link.as_os_str() != "anon_inode:[userfaultfd]" {
        return Err(std::io::Error::other(format!(
            "the server answered fd {fd}, which is {}, not a userfaultfd",
            link.display()
        )));
    }
    Ok(fd)
}
