//! An agent's HTTP endpoint: `GET /metrics` (the Prometheus text the step
//! loop last published: OpenMetrics to a client whose `Accept` names it,
//! as Prometheus' does, the classic text format to any other), `GET
//! /healthz` (true while the loop steps) and
//! `GET /readyz` (true once it has stepped); any other path is 404, any
//! other method 405.
//!
//! Served by hyper on one thread of its own, with a single-threaded tokio
//! runtime: connections are answered concurrently, at most
//! [`MOST_CONNECTIONS`] at once (one more is closed at once), each within
//! [`HEADER_WITHIN`] for its request's head and [`CONNECTION_WITHIN`] in
//! all, one request a connection. Once its runtime and socket are made,
//! the thread confines itself to the system calls it needs
//! ([`CALLS`], `pagewise_sys::seccomp::confine_thread`): a request that
//! took it over could not open a file, start a program or trace a
//! process.
//!
//! Health is the step loop's: `/healthz` answers 200 while the last step
//! is at most [`STALE_STEPS`] intervals old (and, before the first, for
//! [`STARTUP`] after the start), 503 with the reason otherwise, so that a
//! kubelet restarts an agent whose loop is wedged, not one whose endpoint
//! is busy.

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Method, Request, Response, StatusCode};
use pagewise_mech::{Error, Result};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Most connections answered at once.
pub(crate) const MOST_CONNECTIONS: usize = 64;
/// How long a connection may take to send its request's head.
pub(crate) const HEADER_WITHIN: Duration = Duration::from_secs(2);
/// How long a connection may last in all, its answer written.
pub(crate) const CONNECTION_WITHIN: Duration = Duration::from_secs(5);
/// How many intervals without a step make the loop unhealthy.
pub(crate) const STALE_STEPS: u32 = 3;
/// How long the loop may take to its first step and still be healthy
/// (it measures and claims what it needs first).
pub(crate) const STARTUP: Duration = Duration::from_secs(120);

/// What the step loop publishes and the endpoint reads.
#[derive(Debug)]
struct State {
    text: String,
    started: Instant,
    last_step: Option<Instant>,
    interval: Duration,
}

/// The step loop's side of an endpoint: what it publishes.
#[derive(Debug, Clone)]
pub struct Published(Arc<Mutex<State>>);

impl Published {
    /// Nothing published yet, for a loop that steps every `interval`.
    pub(crate) fn new(interval: Duration, text: String) -> Self {
        Published(Arc::new(Mutex::new(State {
            text,
            started: Instant::now(),
            last_step: None,
            interval,
        })))
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A step was made; `text` is the metrics after it.
    pub(crate) fn stepped(&self, text: String) {
        let mut s = self.state();
        s.text = text;
        s.last_step = Some(Instant::now());
    }

    /// Whether the loop is healthy now: the reason where not.
    fn health(&self) -> std::result::Result<(), String> {
        let s = self.state();
        let stale = s.interval * STALE_STEPS + Duration::from_secs(1);
        match s.last_step {
            Some(t) if t.elapsed() <= stale => Ok(()),
            Some(t) => Err(format!(
                "no step for {:.1} s (one is due every {:.1} s)",
                t.elapsed().as_secs_f64(),
                s.interval.as_secs_f64()
            )),
            None if s.started.elapsed() <= STARTUP => Ok(()),
            None => Err(format!(
                "no step in the {:.0} s since the start",
                s.started.elapsed().as_secs_f64()
            )),
        }
    }

    /// Whether the first step was made.
    fn ready(&self) -> bool {
        self.state().last_step.is_some()
    }

    fn text(&self) -> String {
        self.state().text.clone()
    }
}

/// The system calls the endpoint's thread makes once confined: its
/// runtime's (epoll, the timer, the waker), its sockets', the allocator's
/// and a thread's own.
const CALLS: &[libc::c_long] = &[
    libc::SYS_read,
    libc::SYS_write,
    libc::SYS_writev,
    libc::SYS_readv,
    libc::SYS_recvfrom,
    libc::SYS_sendto,
    libc::SYS_recvmsg,
    libc::SYS_sendmsg,
    libc::SYS_close,
    libc::SYS_shutdown,
    libc::SYS_accept4,
    libc::SYS_accept,
    libc::SYS_getsockopt,
    libc::SYS_setsockopt,
    libc::SYS_getpeername,
    libc::SYS_getsockname,
    libc::SYS_fcntl,
    libc::SYS_ioctl,
    libc::SYS_epoll_wait,
    libc::SYS_epoll_pwait,
    libc::SYS_epoll_pwait2,
    libc::SYS_epoll_ctl,
    libc::SYS_poll,
    libc::SYS_ppoll,
    libc::SYS_futex,
    libc::SYS_sched_yield,
    libc::SYS_clock_gettime,
    libc::SYS_clock_nanosleep,
    libc::SYS_nanosleep,
    libc::SYS_gettid,
    libc::SYS_getpid,
    libc::SYS_getrandom,
    libc::SYS_mmap,
    libc::SYS_munmap,
    libc::SYS_mremap,
    libc::SYS_madvise,
    libc::SYS_brk,
    libc::SYS_mprotect,
    libc::SYS_rt_sigprocmask,
    libc::SYS_rt_sigreturn,
    libc::SYS_sigaltstack,
    libc::SYS_restart_syscall,
    libc::SYS_exit,
    libc::SYS_exit_group,
];

/// A running endpoint; stopped when dropped.
pub struct Endpoint {
    addr: std::net::SocketAddr,
    stop: Arc<tokio::sync::Notify>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Endpoint {
    /// Listens on `addr` and serves `published` from a thread of its own
    /// (see the module). Refused where the address cannot be had, or the
    /// thread could not be confined (then it does not serve).
    pub(crate) fn start(addr: &str, published: Published) -> Result<Endpoint> {
        let l = std::net::TcpListener::bind(addr)
            .map_err(|e| Error::os(format!("listening on {addr}"), e))?;
        let local = l
            .local_addr()
            .map_err(|e| Error::os(format!("the address of {addr}"), e))?;
        l.set_nonblocking(true)
            .map_err(|e| Error::os("a non-blocking listener", e))?;
        let stop = Arc::new(tokio::sync::Notify::new());
        let told = stop.clone();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("pagewise-http".into())
            .spawn(move || serve(l, published, told, ready_tx))
            .map_err(|e| Error::os("starting the endpoint's thread", e))?;
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(Endpoint {
                addr: local,
                stop,
                thread: Some(thread),
            }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => Err(Error::os(
                "starting the endpoint",
                std::io::Error::other("its thread ended before it served"),
            )),
        }
    }

    /// The address it answers on.
    pub fn local_addr(&self) -> std::net::SocketAddr {
        self.addr
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.stop.notify_one();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The endpoint's thread: the runtime and listener made, the thread
/// confined, then connections served until `stop`.
fn serve(
    l: std::net::TcpListener,
    published: Published,
    stop: Arc<tokio::sync::Notify>,
    ready: std::sync::mpsc::Sender<Result<()>>,
) {
    let made = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .map_err(|e| Error::os("the endpoint's runtime", e))
        .and_then(|rt| {
            let l = rt
                .block_on(async { tokio::net::TcpListener::from_std(l) })
                .map_err(|e| Error::os("the endpoint's listener", e))?;
            // Ok(false) off x86-64: the one rule of confine_thread.
            pagewise_sys::seccomp::confine_thread(CALLS)
                .map_err(|e| Error::os("confining the endpoint's thread (seccomp)", e))?;
            Ok((rt, l))
        });
    let (rt, l) = match made {
        Ok(v) => {
            let _ = ready.send(Ok(()));
            v
        }
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let slots = Arc::new(tokio::sync::Semaphore::new(MOST_CONNECTIONS));
    rt.block_on(async move {
        let local = tokio::task::LocalSet::new();
        local
            .run_until(async move {
                loop {
                    let (s, _) = tokio::select! {
                        _ = stop.notified() => return,
                        a = l.accept() => match a {
                            Ok(a) => a,
                            Err(_) => continue,
                        },
                    };
                    let Ok(permit) = slots.clone().try_acquire_owned() else {
                        // One more than is answered at once: closed now.
                        drop(s);
                        continue;
                    };
                    let published = published.clone();
                    tokio::task::spawn_local(async move {
                        let io = hyper_util::rt::TokioIo::new(s);
                        let answer = hyper::service::service_fn(move |req| {
                            let r = respond(&published, &req);
                            async move { Ok::<_, std::convert::Infallible>(r) }
                        });
                        let conn = hyper::server::conn::http1::Builder::new()
                            .timer(hyper_util::rt::TokioTimer::new())
                            .header_read_timeout(HEADER_WITHIN)
                            .keep_alive(false)
                            .max_buf_size(8192)
                            .serve_connection(io, answer);
                        let _ = tokio::time::timeout(CONNECTION_WITHIN, conn).await;
                        drop(permit);
                    });
                }
            })
            .await;
    });
}

/// The answer to one request.
fn respond(p: &Published, req: &Request<hyper::body::Incoming>) -> Response<Full<Bytes>> {
    let text = |status: StatusCode, kind: &'static str, body: String| {
        let mut r = Response::new(Full::new(Bytes::from(body)));
        *r.status_mut() = status;
        r.headers_mut().insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static(kind),
        );
        r
    };
    let path = req.uri().path();
    #[cfg(test)]
    if path == "/test-open" {
        // For the confinement test: a call the thread is not allowed.
        let f = std::fs::File::open("/etc/hostname");
        let e = f.err().and_then(|e| e.raw_os_error()).unwrap_or(0);
        return text(StatusCode::OK, "text/plain", format!("{e}"));
    }
    if !matches!(path, "/metrics" | "/healthz" | "/readyz") {
        return text(
            StatusCode::NOT_FOUND,
            "text/plain",
            format!("no {path} here: /metrics, /healthz, /readyz\n"),
        );
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut r = text(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            format!("{} {path}: only GET\n", req.method()),
        );
        r.headers_mut().insert(
            hyper::header::ALLOW,
            hyper::header::HeaderValue::from_static("GET, HEAD"),
        );
        return r;
    }
    match path {
        // OpenMetrics to a scraper that asks for it (Prometheus), the
        // classic text to any other.
        "/metrics" => match req
            .headers()
            .get_all(hyper::header::ACCEPT)
            .iter()
            .any(|v| {
                v.to_str()
                    .is_ok_and(|v| v.contains("application/openmetrics-text"))
            }) {
            true => text(StatusCode::OK, crate::CONTENT_TYPE, p.text()),
            false => text(
                StatusCode::OK,
                crate::CLASSIC_CONTENT_TYPE,
                crate::exposition::classic(&p.text()),
            ),
        },
        "/healthz" => match p.health() {
            Ok(()) => text(StatusCode::OK, "text/plain", "ok\n".into()),
            Err(why) => text(
                StatusCode::SERVICE_UNAVAILABLE,
                "text/plain",
                format!("{why}\n"),
            ),
        },
        _ => match p.ready() {
            true => text(StatusCode::OK, "text/plain", "ready\n".into()),
            false => text(
                StatusCode::SERVICE_UNAVAILABLE,
                "text/plain",
                "starting: no step made yet\n".into(),
            ),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpStream;

    /// One request: its status and body.
    fn get(addr: std::net::SocketAddr, method: &str, path: &str) -> (u16, String) {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        write!(s, "{method} {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        let status = out.split_whitespace().nth(1).unwrap().parse().unwrap();
        let body = out
            .split_once("\r\n\r\n")
            .map(|x| x.1)
            .unwrap_or("")
            .to_string();
        (status, body)
    }

    fn endpoint(interval: Duration) -> (Endpoint, Published) {
        let p = Published::new(interval, "# nothing yet\n".into());
        (Endpoint::start("127.0.0.1:0", p.clone()).unwrap(), p)
    }

    #[test]
    fn only_its_three_paths_are_answered_and_only_to_get() {
        let (e, p) = endpoint(Duration::from_secs(1));
        let a = e.local_addr();
        assert_eq!(get(a, "GET", "/readyz").0, 503, "not ready before a step");
        p.stepped("pagewise_up 1\n".into());
        assert_eq!(get(a, "GET", "/metrics"), (200, "pagewise_up 1\n".into()));
        assert_eq!(get(a, "GET", "/healthz").0, 200);
        assert_eq!(get(a, "GET", "/readyz").0, 200);
        assert_eq!(get(a, "GET", "/").0, 404);
        assert_eq!(get(a, "GET", "/metrics/x").0, 404);
        assert_eq!(get(a, "POST", "/metrics").0, 405);
        assert_eq!(get(a, "DELETE", "/healthz").0, 405);
    }

    #[test]
    fn healthz_fails_once_the_loop_stops_stepping() {
        let (e, p) = endpoint(Duration::from_millis(10));
        p.stepped(String::new());
        assert_eq!(get(e.local_addr(), "GET", "/healthz").0, 200);
        // Stale after 3 intervals and a second: waited for, at most 30 s.
        let deadline = Instant::now() + Duration::from_secs(30);
        while p.health().is_ok() {
            assert!(Instant::now() < deadline, "the loop never went stale");
            std::thread::sleep(Duration::from_millis(50));
        }
        let (status, why) = get(e.local_addr(), "GET", "/healthz");
        assert_eq!(status, 503, "{why}");
        assert!(why.contains("no step for"), "{why}");
    }

    /// Idle peers and one that sends its head a byte at a time do not
    /// delay a probe; one more than the cap is closed at once; an idle
    /// peer is closed after the head's deadline.
    #[test]
    fn idle_and_slow_peers_do_not_delay_a_probe() {
        let (e, p) = endpoint(Duration::from_secs(1));
        p.stepped(String::new());
        let a = e.local_addr();
        let idle: Vec<TcpStream> = (0..MOST_CONNECTIONS - 2)
            .map(|_| TcpStream::connect(a).unwrap())
            .collect();
        let mut slow = TcpStream::connect(a).unwrap();
        slow.write_all(b"GET /metr").unwrap();
        let mut worst = Duration::ZERO;
        for _ in 0..5 {
            let t = Instant::now();
            assert_eq!(get(a, "GET", "/healthz").0, 200);
            worst = worst.max(t.elapsed());
        }
        assert!(
            worst < Duration::from_secs(1),
            "a probe took {worst:?} beside {} idle peers",
            idle.len()
        );
        // The cap: the connections above are in; two more fill it, the
        // next is closed unanswered.
        let _fill: Vec<TcpStream> = (0..2).map(|_| TcpStream::connect(a).unwrap()).collect();
        let mut over = TcpStream::connect(a).unwrap();
        over.set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let mut b = [0u8; 16];
        assert_eq!(over.read(&mut b).unwrap_or(0), 0, "closed at once");
        // An idle peer is let go after the head's deadline.
        let mut first = idle.into_iter().next().unwrap();
        first
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let t = Instant::now();
        let n = first.read(&mut b).unwrap_or(0);
        let _ = n;
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "the idle peer was closed"
        );
        println!("ok   worst probe {worst:?} beside idle and slow peers");
    }

    #[test]
    fn the_endpoints_thread_is_refused_a_call_it_does_not_need() {
        if !cfg!(target_arch = "x86_64") {
            return;
        }
        let (e, _p) = endpoint(Duration::from_secs(1));
        let (status, errno) = get(e.local_addr(), "GET", "/test-open");
        assert_eq!(status, 200);
        assert_eq!(
            errno.trim(),
            libc::EPERM.to_string(),
            "open(2) refused with EPERM"
        );
        assert!(
            std::fs::File::open("/etc/hostname").is_ok(),
            "this thread is free"
        );
    }
}
