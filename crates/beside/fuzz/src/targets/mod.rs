//! The targets, by name.

use anyhow::{bail, Result};
use std::path::{Path, PathBuf};

use crate::mutate::Rng;

mod container_names;
mod criu_images;
mod criu_page_server;
mod instance;
mod prezero_report;
mod process_record;
mod seccomp_filter;
mod shim_hello;
mod store;
mod track_protocol;
mod uffd_maker;
mod wire;

/// The targets' names (those of `corpus/` and of `fuzz/fuzz_targets/`).
pub const NAMES: [&str; 12] = [
    "wire",
    "criu-page-server",
    "criu-images",
    "track-protocol",
    "shim-hello",
    "prezero-report",
    "instance",
    "store",
    "process-record",
    "seccomp-filter",
    "uffd-maker",
    "container-names",
];

/// One parser under test, set up once, fed many inputs.
pub trait Target: Send + Sync {
    /// Feeds one input to the parser; whether it was read as valid.
    /// Panics on a bug.
    fn feed(&self, input: &[u8]) -> bool;
    /// Valid inputs built with the real formats.
    fn seeds(&self, rng: &mut Rng) -> Vec<Vec<u8>>;
}

/// Sets up the target `name`, with scratch files under `work` (an empty
/// directory of its own).
pub fn open(name: &str, work: &Path) -> Result<Box<dyn Target>> {
    std::fs::create_dir_all(work)?;
    Ok(match name {
        "wire" => Box::new(wire::Wire::new(work)?),
        "criu-page-server" => Box::new(criu_page_server::CriuPageServer::new(work)?),
        "criu-images" => Box::new(criu_images::CriuImages::new(work)?),
        "track-protocol" => Box::new(track_protocol::TrackProtocol),
        "shim-hello" => Box::new(shim_hello::ShimHello),
        "prezero-report" => Box::new(prezero_report::PrezeroReport),
        "instance" => Box::new(instance::InstanceFile::new(work)?),
        "store" => Box::new(store::Store::new(work)?),
        "process-record" => Box::new(process_record::ProcessRecordTarget),
        "seccomp-filter" => Box::new(seccomp_filter::SeccompFilter),
        "uffd-maker" => Box::new(uffd_maker::UffdMaker),
        "container-names" => Box::new(container_names::ContainerNames),
        other => bail!("no fuzz target {other:?}: {}", NAMES.join(", ")),
    })
}

/// The committed seeds of `crates/beside/fuzz/corpus/TARGET/`.
pub fn corpus_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(name)
}

/// Little-endian words.
fn le(v: &[u64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Sends `input` to `listener` from a peer thread (which then reads the
/// answer to its end) and has `serve` serve the accepted connection;
/// what `serve` said of it.
fn over_loopback(
    listener: &std::net::TcpListener,
    input: &[u8],
    serve: impl FnOnce(std::net::TcpStream) -> bool,
) -> bool {
    let addr = listener.local_addr().expect("a bound socket");
    let data = input.to_vec();
    let peer = std::thread::spawn(move || {
        if let Ok(mut s) = std::net::TcpStream::connect(addr) {
            let _ = std::io::Write::write_all(&mut s, &data);
            let _ = s.shutdown(std::net::Shutdown::Write);
            let mut sink = Vec::new();
            let _ = std::io::Read::read_to_end(&mut s, &mut sink);
        }
    });
    let (s, _) = listener.accept().expect("loopback accepts");
    let read = serve(s);
    peer.join().expect("the peer thread ends");
    read
}
