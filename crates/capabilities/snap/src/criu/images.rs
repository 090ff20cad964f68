//! A dump kept by the page server written back out as CRIU's own image
//! files: `pagemap-ID.img` (or `pagemap-shmem-ID.img`) and `pages-N.img`
//! per pagemap, byte for byte what `criu page-server -D DIR` writes for
//! the same dump, so that `criu restore` reads them with the dump's other
//! images.
//!
//! A pagemap image is CRIU's two magics (`IMG_COMMON_MAGIC`,
//! `PAGEMAP_MAGIC`), then protobuf messages each after its `u32` size:
//! one `pagemap_head { pages_id }`, then one `pagemap_entry { vaddr,
//! compat_nr_pages, flags, nr_pages }` per run (images/pagemap.proto). A
//! pages image is the present pages' bytes in the pagemap's order, with
//! no header. CRIU's page server numbers the pages images from 0x10001 in
//! the order it opens the pagemaps (`up_page_ids_base`: above the ids a
//! `criu dump` writing into the same directory gives its own).

use std::io::Write;
use std::path::Path;

use pagewise_mech::PAGE_SIZE;

use super::{dumps_dir, DumpRecord};
use crate::disk::DiskStore;
use crate::Result;

/// `IMG_COMMON_MAGIC` (criu/include/magic.h).
pub const IMG_COMMON_MAGIC: u32 = 0x5456_4319;
/// `PAGEMAP_MAGIC` (criu/include/magic.h).
pub const PAGEMAP_MAGIC: u32 = 0x5608_4025;

/// The page server's first pages image is `pages-65537.img`.
const PAGES_ID_BASE: u64 = 0x10000;

/// What an export wrote.
#[derive(Debug, Clone, Default, serde::Serialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct Exported {
    /// The dump.
    pub dump: u64,
    /// The files written, in the order written.
    pub files: Vec<String>,
    /// Pages written into the pages images.
    pub pages: u64,
    /// Bytes written in all.
    pub bytes: u64,
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// One protobuf message after its size, as `pb_write_one` writes it.
fn message(out: &mut Vec<u8>, fields: &[(u8, u64)]) {
    let mut m = Vec::new();
    for &(field, v) in fields {
        varint(&mut m, u64::from(field) << 3);
        varint(&mut m, v);
    }
    out.extend_from_slice(&(m.len() as u32).to_ne_bytes());
    out.extend_from_slice(&m);
}

/// The dump record `dump` of the store at `dir`.
pub(super) fn record(dir: &Path, dump: u64) -> Result<DumpRecord> {
    let path = dumps_dir(dir).join(format!("dump-{dump}.json"));
    let text = std::fs::read(&path).map_err(|e| {
        crate::Error::from(pagewise_mech::Error::os(
            format!("reading {}", path.display()),
            e,
        ))
    })?;
    serde_json::from_slice(&text).map_err(|e| {
        pagewise_mech::Error::Corrupt {
            path: path.display().to_string(),
            what: format!("not a dump record: {e}"),
        }
        .into()
    })
}

/// Refuses a dump CRIU did not close (its session broke).
pub(super) fn closed(rec: &DumpRecord) -> Result<()> {
    if rec.closed {
        return Ok(());
    }
    Err(pagewise_mech::Error::os(
        format!("using dump {}", rec.dump),
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "the dump was cut short (CRIU never closed it): its pages are incomplete",
        ),
    )
    .into())
}

/// Writes dump `dump` of `store` into `out` (created if missing) as
/// CRIU's page server would have: see the module. A dump CRIU did not
/// close (its session broke) is refused.
pub fn export(store: &DiskStore, dump: u64, out: &Path) -> Result<Exported> {
    let rec = record(store.dir(), dump)?;
    closed(&rec)?;
    let io =
        |what: String, e: std::io::Error| crate::Error::from(pagewise_mech::Error::os(what, e));
    std::fs::create_dir_all(out).map_err(|e| io(format!("making {}", out.display()), e))?;
    let mut done = Exported {
        dump,
        ..Exported::default()
    };
    for (i, pm) in rec.pagemaps.iter().enumerate() {
        let pages_id = PAGES_ID_BASE + i as u64 + 1;
        let mut img = Vec::new();
        img.extend_from_slice(&IMG_COMMON_MAGIC.to_ne_bytes());
        img.extend_from_slice(&PAGEMAP_MAGIC.to_ne_bytes());
        message(&mut img, &[(1, pages_id)]);
        for r in &pm.runs {
            message(
                &mut img,
                &[
                    (1, r.vaddr),
                    (2, 0),
                    (4, u64::from(r.flags)),
                    (5, r.nr_pages),
                ],
            );
        }
        let name = if pm.shmem {
            format!("pagemap-shmem-{}.img", pm.id)
        } else {
            format!("pagemap-{}.img", pm.id)
        };
        let path = out.join(&name);
        std::fs::write(&path, &img).map_err(|e| io(format!("writing {}", path.display()), e))?;
        done.bytes += img.len() as u64;
        done.files.push(name);
        let name = format!("pages-{pages_id}.img");
        let path = out.join(&name);
        let f = std::fs::File::create(&path)
            .map_err(|e| io(format!("writing {}", path.display()), e))?;
        let mut w = std::io::BufWriter::with_capacity(1 << 20, f);
        let snap = store.load(pm.snapshot)?;
        crate::extract::raw(store, &snap, None, &mut w)?;
        w.flush()
            .map_err(|e| io(format!("writing {}", path.display()), e))?;
        done.pages += snap.pages();
        done.bytes += snap.pages() * PAGE_SIZE as u64;
        done.files.push(name);
    }
    Ok(done)
}
