//! Far memory for programs in containers: the privileged side of an
//! instance whose members run where they cannot make a userfaultfd.
//!
//! A program in a container runs under the runtime's seccomp profile,
//! which refuses `userfaultfd`, without the CAP_SYS_PTRACE that one
//! serving the kernel's faults needs, and in a pid namespace of its own.
//! Its preload shim joins the instance as any member does (the instance's
//! directory is mounted into the container), and asks the [`Server`]
//! over the instance's socket ([`pagewise_mech::inject::uffd_lending`]):
//!
//! - its pid as the host sees it, under which it joins, so that the
//!   instance lists members by host pid (`farmem ls` on the host names
//!   them as `ps` does);
//! - each userfaultfd its engine needs, made inside it while it is
//!   stopped for a moment, with its seccomp filters stepped around for
//!   that one call and left as they were; the descriptor stays in the
//!   program, which serves its own faults from then on as any member does.
//!
//! Who may ask, and what is checked (the book's security chapter has the
//! whole threat model):
//!
//! - Only processes of the instance's owner are answered (as only they may
//!   join it), and a userfaultfd is made only for a live member, the very
//!   process that connected (a pidfd of it), which sent every byte of the
//!   request, and which, once stopped, still runs as the owner in all its
//!   uids and is dumpable ([`uffd_lending`]'s module says how).
//! - Sockets live in a directory of their own per instance
//!   ([`instance_socket_dir`]) under [`socket_dir`], in which only root
//!   (or the user running the server) can create entries: a socket planted
//!   there first by another user is not possible, and a directory others
//!   could write is refused. The shim asks a socket only once the kernel
//!   says it is served by root or the instance's owner.
//! - Requests are answered concurrently ([`MOST_AT_ONCE`] at most; one
//!   more is refused as busy), each within one deadline from its
//!   acceptance ([`uffd_lending::TIMEOUT`]), so that a slow or idle peer holds
//!   only its own connection; a stop ends within a second.
//!
//! The server also leaves the slots of members that died without leaving,
//! which members in containers cannot judge.

use crate::instance::{Access, Instance};
use crate::{Error, Result};
use pagewise_mech::inject::uffd_lending::{self, Answered};
use std::os::fd::AsFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
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
/// Most connections answered at once; one more is refused as busy.
pub const MOST_AT_ONCE: usize = 32;
/// How long a stop waits for the answers under way.
const DRAIN: Duration = Duration::from_millis(700);

/// The directory of the servers' sockets: `PAGEWISE_FARMEM_SOCKETS`, else
/// `/run/pagewise/farmem`. Each instance served has a directory of its own
/// there, which the container mounts.
pub fn socket_dir() -> PathBuf {
    pagewise_mech::shim::farmem_sockets().unwrap_or_else(|| PathBuf::from("/run/pagewise/farmem"))
}

/// The directory that holds the socket of instance `name`'s server.
pub fn instance_socket_dir(name: &str) -> PathBuf {
    socket_dir().join(name)
}

/// The socket that serves instance `name`.
fn socket_path(name: &str) -> PathBuf {
    instance_socket_dir(name).join("uffd")
}

/// Whether a server listens on instance `name`'s socket now (in this
/// network namespace's `/proc/net/unix`): a run that ends leaves a served
/// instance to its server, whose members come and go.
pub(crate) fn is_served(name: &str) -> bool {
    const LISTENING: &str = "00010000";
    let path = socket_path(name);
    let Some(path) = path.to_str() else {
        return false;
    };
    std::fs::read_to_string("/proc/net/unix").is_ok_and(|t| {
        t.lines().skip(1).any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() >= 8 && f[3] == LISTENING && f[7] == path
        })
    })
}

/// Refuses a directory in which, or above which, anyone but root and this
/// process's user could create, rename or remove entries: a socket there
/// is the server's and no one else's.
fn check_private(d: &Path) -> Result<()> {
    let me = pagewise_sys::process::geteuid();
    let mut at = Some(d);
    while let Some(p) = at {
        let md = std::fs::symlink_metadata(p)
            .map_err(|e| Error::os(format!("reading {}", p.display()), e))?;
        let mode = md.permissions().mode();
        let sticky = mode & 0o1000 != 0;
        // Above the directory itself, a sticky shared directory (/tmp)
        // lets others add entries but not touch ours.
        let others_write = mode & 0o022 != 0 && (p == d || !sticky);
        if !md.is_dir() || (md.uid() != 0 && md.uid() != me) || others_write {
            return Err(Error::UnsafeSocketDirectory {
                dir: p.to_path_buf(),
                uid: md.uid(),
                mode: mode & 0o7777,
            });
        }
        at = p.parent().filter(|q| !q.as_os_str().is_empty());
    }
    Ok(())
}

/// Makes (or checks) the directory of instance `name`'s socket; its path.
fn make_socket_dir(name: &str) -> Result<PathBuf> {
    let base = socket_dir();
    if !base.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(&base)
            .map_err(|e| Error::os(format!("making {}", base.display()), e))?;
    }
    check_private(&base)?;
    let d = instance_socket_dir(name);
    match std::fs::DirBuilder::new().mode(0o755).create(&d) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(Error::os(format!("making {}", d.display()), e)),
    }
    // Made here with this mode; a directory left by a server that was
    // killed is checked as the base is.
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| Error::os(format!("chmod of {}", d.display()), e))?;
    check_private(&d)?;
    Ok(d)
}

impl Server {
    /// Starts serving instance `name` (opened as its owner, or as root)
    /// on its socket (`NAME/uffd` under [`socket_dir`]), leaving dead members of run
    /// `tag`; each event goes to `log`. Refused when another server serves
    /// it, or where the socket's directory could be written by others.
    pub fn start(
        name: &str,
        tag: u32,
        log: impl Fn(Event) + Send + Sync + 'static,
    ) -> Result<Self> {
        let inst = Instance::open(name, Access::Control)?;
        make_socket_dir(name)?;
        let path = socket_path(name);
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
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
            .and_then(|()| std::os::unix::fs::chown(&path, Some(inst.owner_uid()), None))
            .map_err(|e| Error::os(format!("chmod and chown of {}", path.display()), e))?;
        // Each request's bytes say who sent them, from the first on.
        pagewise_sys::socket::set_passcred(listener.as_fd())
            .map_err(|e| Error::os("SO_PASSCRED on the server's socket", e))?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let inst = Arc::new(inst);
        let log: Arc<dyn Fn(Event) + Send + Sync> = Arc::new(log);
        let (confined, was) = std::sync::mpsc::sync_channel(1);
        let thread = std::thread::Builder::new()
            .name("pw-farmem-accept".into())
            .spawn(move || {
                // Answering stops the member under ptrace and steps around
                // its filters, which the kernel allows only to a tracer under
                // none: the answers are started by a thread made before this
                // one confines itself, to which it hands each connection.
                let (hand, handed) = std::sync::mpsc::channel();
                let answers = {
                    let (inst, stop, log) = (inst.clone(), flag.clone(), log.clone());
                    std::thread::Builder::new()
                        .name("pw-farmem-hand".into())
                        .spawn(move || answer_handed(&inst, handed, &stop, &log))
                };
                // Before the first peer: the thread that accepts gets the
                // calls accepting needs, nothing more (see OWN_CALLS).
                let r = answers.and_then(|a| confine().map(|_| a));
                let answers = match r {
                    Ok(a) => {
                        let _ = confined.send(Ok(()));
                        a
                    }
                    Err(e) => {
                        let _ = confined.send(Err(e));
                        return;
                    }
                };
                accept(&inst, tag, &listener, &flag, &log, hand);
                let _ = answers.join();
            })
            .map_err(|e| Error::os("starting the server's thread", e))?;
        let r = was
            .recv()
            .unwrap_or_else(|_| Err(std::io::Error::other("the thread ended")));
        if let Err(e) = r {
            let _ = thread.join();
            return Err(Error::os("confining the server's thread (seccomp)", e));
        }
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

    /// Stops serving (at once for requests still arriving, within
    /// 0.7 s for those being answered) and removes the socket.
    pub fn stop(mut self) {
        self.end();
    }

    fn end(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
        if let Some(d) = self.path.parent() {
            let _ = std::fs::remove_dir(d);
        }
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
    if op == uffd_lending::USERFAULTFD && !inst.members().iter().any(|m| m.pid == pid && m.live) {
        return Err(format!(
            "process {pid} is not a member of instance {}: a userfaultfd is made only for a \
             member",
            inst.name()
        ));
    }
    Ok(())
}

/// The answers under way, and a way to wait until they are done.
#[derive(Default)]
struct UnderWay {
    n: Mutex<usize>,
    done: Condvar,
}

impl UnderWay {
    fn begin(&self) -> bool {
        let mut n = self.n.lock().unwrap_or_else(|e| e.into_inner());
        if *n >= MOST_AT_ONCE {
            return false;
        }
        *n += 1;
        true
    }

    fn end(&self) {
        let mut n = self.n.lock().unwrap_or_else(|e| e.into_inner());
        *n = n.saturating_sub(1);
        self.done.notify_all();
    }

    /// Waits until none is under way, at most `within`.
    fn drain(&self, within: Duration) {
        let deadline = Instant::now() + within;
        let mut n = self.n.lock().unwrap_or_else(|e| e.into_inner());
        while *n > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            n = self
                .done
                .wait_timeout(n, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

/// The calls the thread that accepts members makes beyond
/// [`pagewise_sys::seccomp::THREAD_CALLS`]: accepting, and reading the
/// instance and `/proc` to reap the slots of members that died. Not among
/// them: starting a program, making, connecting or binding a socket,
/// tracing or reading another process, mounting, changing who the process
/// is, removing or renaming a file. The threads that answer cannot be
/// confined: stepping around a member's filters
/// (`PTRACE_O_SUSPEND_SECCOMP`) and reading them are refused by the
/// kernel to a tracer under a filter of its own.
const OWN_CALLS: &[libc::c_long] = &[
    libc::SYS_accept4,
    libc::SYS_accept,
    libc::SYS_getsockopt,
    libc::SYS_setsockopt,
    libc::SYS_openat,
    libc::SYS_lseek,
    libc::SYS_pread64,
    libc::SYS_fstat,
    libc::SYS_newfstatat,
    libc::SYS_statx,
    libc::SYS_getdents64,
    libc::SYS_readlink,
    libc::SYS_readlinkat,
    libc::SYS_flock,
];

/// Confines the calling thread to [`OWN_CALLS`] and the basics (see
/// `pagewise_sys::seccomp::confine_thread` for what `Ok(false)` says).
fn confine() -> std::io::Result<bool> {
    pagewise_sys::seccomp::confine_thread(
        &[pagewise_sys::seccomp::THREAD_CALLS, OWN_CALLS].concat(),
    )
}

/// Accepts connections until `stop`, handing each (with when it was
/// accepted) to the thread that answers; reaps the slots of members that
/// died.
fn accept(
    inst: &Arc<Instance>,
    tag: u32,
    listener: &UnixListener,
    stop: &Arc<AtomicBool>,
    log: &Arc<dyn Fn(Event) + Send + Sync>,
    hand: std::sync::mpsc::Sender<(UnixStream, Instant)>,
) {
    let mut reaped = Instant::now();
    while !stop.load(Ordering::SeqCst) {
        let ready = pagewise_sys::uffd::poll_readable(&[listener.as_fd()], 100).unwrap_or(0);
        if ready & 1 != 0 {
            match listener.accept() {
                Ok((s, _)) => {
                    let _ = hand.send((s, Instant::now()));
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

/// Answers each connection handed over, until the thread that accepts
/// ends; then waits for the answers under way ([`DRAIN`] at most).
fn answer_handed(
    inst: &Arc<Instance>,
    handed: std::sync::mpsc::Receiver<(UnixStream, Instant)>,
    stop: &Arc<AtomicBool>,
    log: &Arc<dyn Fn(Event) + Send + Sync>,
) {
    let under_way = Arc::new(UnderWay::default());
    for (s, accepted) in handed {
        answer_apart(inst, s, accepted, stop, log, &under_way);
    }
    under_way.drain(DRAIN);
}

/// One answer under way, counted out when it ends.
struct Done(Arc<UnderWay>);

impl Drop for Done {
    fn drop(&mut self) {
        self.0.end();
    }
}

/// Answers connection `s` on a thread of its own, or refuses it as busy
/// where [`MOST_AT_ONCE`] are under way.
fn answer_apart(
    inst: &Arc<Instance>,
    mut s: UnixStream,
    accepted: Instant,
    stop: &Arc<AtomicBool>,
    log: &Arc<dyn Fn(Event) + Send + Sync>,
    under_way: &Arc<UnderWay>,
) {
    if !under_way.begin() {
        let who = pagewise_sys::process::peer_credentials(s.as_fd()).map_or(0, |c| c.0);
        let _ = s.set_write_timeout(Some(Duration::from_millis(100)));
        let why = format!("the server answers {MOST_AT_ONCE} requests at once: try again");
        let _ = uffd_lending::write_answer(&mut s, -(libc::EAGAIN as i64), &why);
        log(Event::Failed(format!(
            "refused process {who} as busy: {why}"
        )));
        return;
    }
    let (inst, stop, said, done) = (inst.clone(), stop.clone(), log.clone(), under_way.clone());
    let spawned = std::thread::Builder::new()
        .name("pagewise-farmem-answer".into())
        .spawn(move || {
            // Counted out even should the answer panic.
            let _done = Done(done);
            let allow = |pid, uid, op| allowed(&inst, pid, uid, op);
            let deadline = accepted + uffd_lending::TIMEOUT;
            match uffd_lending::answer(&mut s, "far memory in a container", &allow, deadline, &stop)
            {
                Ok(a) => said(Event::Answered(a)),
                Err(e) => said(Event::Failed(e.to_string())),
            }
        });
    if let Err(e) = spawned {
        under_way.end();
        log(Event::Failed(format!("starting a thread to answer: {e}")));
    }
}

/// For a member: the server of instance `name` (owned by uid `owner`),
/// if one serves it (its socket is there: a program in a container with
/// the socket's directory mounted), and this process's pid as the server
/// sees it. A socket answered by anyone but root or `owner` is refused.
pub fn served_as(name: &str, owner: u32) -> Option<Result<(PathBuf, i32)>> {
    let path = socket_path(name);
    if !path.exists() {
        return None;
    }
    let who = uffd_lending::ask(&path, uffd_lending::WHO, 0, &[0, owner])
        .map_err(|e| {
            Error::os(
                format!("asking {} this process's host pid", path.display()),
                e,
            )
        })
        .and_then(|v| {
            i32::try_from(v).ok().filter(|&p| p > 1).ok_or_else(|| {
                Error::os(
                    "reading the server's answer",
                    std::io::Error::other(format!("{v} is not a member's pid")),
                )
            })
        });
    Some(who.map(|pid| (path, pid)))
}

/// For a member: `userfaultfd(flags)` made inside this process by the
/// server at `path` (run by root or `owner`); the descriptor's number
/// here, checked to be a userfaultfd (its owner is then the caller).
pub fn userfaultfd_from(path: &Path, owner: u32, flags: libc::c_int) -> std::io::Result<i32> {
    let v = uffd_lending::ask(path, uffd_lending::USERFAULTFD, flags as u32, &[0, owner]).map_err(
        |e| {
            std::io::Error::new(
                e.kind(),
                format!("the server of far memory ({}) refused: {e}", path.display()),
            )
        },
    )?;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Under the server's filter a thread cannot start a program or make
    /// a socket; it still reads `/proc` and starts a thread.
    #[test]
    fn the_servers_filter_refuses_what_answering_does_not_need() {
        if !cfg!(target_arch = "x86_64") {
            return;
        }
        let got = std::thread::spawn(|| {
            confine().unwrap();
            let errno = |r: std::io::Result<()>| r.err().and_then(|e| e.raw_os_error());
            let dir = std::env::temp_dir().join(format!("pagewise-sock-{}", std::process::id()));
            let socket = errno(std::os::unix::net::UnixListener::bind(&dir).map(drop));
            let exec = errno(std::process::Command::new("/bin/true").status().map(drop));
            let status = std::fs::read_to_string("/proc/self/status").is_ok();
            let child = std::thread::spawn(|| 3).join().unwrap();
            (socket, exec, status, child)
        })
        .join()
        .unwrap();
        assert_eq!(
            (got.0, got.1),
            (Some(libc::EPERM), Some(libc::EPERM)),
            "socket, execve"
        );
        assert!(got.2 && got.3 == 3, "reading /proc and a thread pass");
    }
}
