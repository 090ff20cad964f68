//! CRIU's page-server wire, as `criu/page-xfer.c` speaks it: a fixed
//! header per command, host-endian, with the pages of an `ADD` after it.
//!
//! CRIU v4.2 sends a 32-byte header (`u32 cmd; u32 pad; u64 nr_pages;
//! u64 vaddr; u64 dst_id`); v3.17 to v4.1 sent 24 bytes (`u32 cmd; u32
//! nr_pages; u64 vaddr; u64 dst_id`). There is no version handshake: the
//! two are told apart from the first 24 bytes of a session
//! ([`Dialect::of_first`]). `cmd` is `flags << 16 | op`; `dst_id` is
//! `id << 8 | type` (type 1 a task's pagemap, 2 a shared-memory
//! segment's; older CRIUs sent other numbers, which are read as CRIU
//! reads them).

/// Bytes of the header CRIU v4.2 sends.
pub const HEADER_V42: usize = 32;
/// Bytes of the header CRIU v3.17 to v4.1 sent.
pub const HEADER_LEGACY: usize = 24;

/// `PS_IOV_ADD`: pages present, bytes follow.
pub const OP_ADD: u32 = 1;
/// `PS_IOV_HOLE`: pages in the parent dump, no bytes.
pub const OP_HOLE: u32 = 2;
/// `PS_IOV_OPEN`: the pagemap `dst_id` begins, no answer.
pub const OP_OPEN: u32 = 3;
/// `PS_IOV_OPEN2`: the pagemap `dst_id` begins; answered by one byte,
/// whether the server has a parent dump of it.
pub const OP_OPEN2: u32 = 4;
/// `PS_IOV_PARENT`: whether a parent dump exists; answered by an `int`.
pub const OP_PARENT: u32 = 5;
/// `PS_IOV_ADD_F`: pages with flags (`PE_*`); bytes follow when
/// `PE_PRESENT`.
pub const OP_ADD_F: u32 = 6;
/// `PS_IOV_GET`: a lazy-pages daemon asks for pages.
pub const OP_GET: u32 = 7;
/// `PS_IOV_CLOSE`: the dump is over; answered by an `int32` status.
pub const OP_CLOSE: u32 = 0x1023;
/// `PS_IOV_FORCE_CLOSE`: as `CLOSE`, after a failed dump.
pub const OP_FORCE_CLOSE: u32 = 0x1024;

/// `PE_PARENT`: the pages are in the parent dump.
pub const PE_PARENT: u32 = 1;
/// `PE_LAZY`: the pages are fetched when the restored process touches them.
pub const PE_LAZY: u32 = 2;
/// `PE_PRESENT`: the pages' bytes are in this dump.
pub const PE_PRESENT: u32 = 4;

/// Which header a peer sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Dialect {
    /// 32 bytes: CRIU v4.2 and on.
    V42,
    /// 24 bytes: CRIU v3.17 to v4.1.
    Legacy,
}

impl Dialect {
    /// Bytes of its header.
    pub fn header_len(self) -> usize {
        match self {
            Dialect::V42 => HEADER_V42,
            Dialect::Legacy => HEADER_LEGACY,
        }
    }

    /// The dialect of a session, from the first 24 bytes it sent. Bytes
    /// 16 to 24 are `vaddr` in v4.2 (0 in an `OPEN`, `OPEN2` or `PARENT`;
    /// page-aligned in a `GET`: either way its low byte is 0) and `dst_id`
    /// in the older header (its low byte is the pagemap's type, never 0).
    /// A first `GET` of the older header whose task id is a multiple of
    /// 256, or one of v4.2 at an unaligned address, is taken for the
    /// other: it is then refused as a malformed request.
    pub fn of_first(first: &[u8; HEADER_LEGACY]) -> Dialect {
        if first[16] == 0 {
            Dialect::V42
        } else {
            Dialect::Legacy
        }
    }
}

/// A command's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// The operation (`OP_*`).
    pub op: u32,
    /// Its flags (`PE_*`, for `ADD_F`).
    pub flags: u32,
    /// Pages it covers.
    pub nr_pages: u64,
    /// The address of the first (in a shared-memory segment: its offset).
    pub vaddr: u64,
    /// The pagemap it is about: `id << 8 | type`.
    pub dst_id: u64,
}

fn word(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_ne_bytes(w)
}

fn half(b: &[u8], at: usize) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&b[at..at + 4]);
    u32::from_ne_bytes(w)
}

impl Header {
    /// Reads a header of `dialect` from `b` (at least its length).
    ///
    /// # Panics
    /// When `b` is shorter than the dialect's header.
    pub fn decode(dialect: Dialect, b: &[u8]) -> Header {
        let cmd = half(b, 0);
        let (nr_pages, vaddr, dst_id) = match dialect {
            Dialect::V42 => (word(b, 8), word(b, 16), word(b, 24)),
            Dialect::Legacy => (u64::from(half(b, 4)), word(b, 8), word(b, 16)),
        };
        Header {
            op: cmd & 0xffff,
            flags: cmd >> 16,
            nr_pages,
            vaddr,
            dst_id,
        }
    }

    /// Writes it as `dialect` does (the older header's `nr_pages` is 32
    /// bits: a larger count is cut, as CRIU's own cast cuts it).
    pub fn encode(&self, dialect: Dialect) -> Vec<u8> {
        let cmd = (self.flags << 16) | (self.op & 0xffff);
        let mut b = Vec::with_capacity(dialect.header_len());
        b.extend_from_slice(&cmd.to_ne_bytes());
        match dialect {
            Dialect::V42 => {
                b.extend_from_slice(&0u32.to_ne_bytes());
                b.extend_from_slice(&self.nr_pages.to_ne_bytes());
            }
            Dialect::Legacy => b.extend_from_slice(&(self.nr_pages as u32).to_ne_bytes()),
        }
        b.extend_from_slice(&self.vaddr.to_ne_bytes());
        b.extend_from_slice(&self.dst_id.to_ne_bytes());
        b
    }

    /// The flags the pages of an `ADD`, `ADD_F` or `HOLE` have, as CRIU's
    /// server reads them (`ADD` is present pages, `HOLE` pages in the
    /// parent); `None` for another command.
    pub fn page_flags(&self) -> Option<u32> {
        match self.op {
            OP_ADD_F => Some(self.flags),
            OP_ADD => Some(PE_PRESENT),
            OP_HOLE => Some(PE_PARENT),
            _ => None,
        }
    }
}

/// What a pagemap is of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Pagemap {
    /// A task's memory: `pagemap-ID.img`.
    Task,
    /// A shared-memory segment's: `pagemap-shmem-ID.img`.
    Shmem,
}

/// The pagemap and id `dst_id` names, as CRIU's `decode_pm` reads it
/// (the numbers older CRIUs sent included); `None` for another type.
pub fn decode_dst(dst_id: u64) -> Option<(Pagemap, u64)> {
    let id = dst_id >> 8;
    match dst_id & 0xff {
        1 | 10 | 11 | 16 | 17 => Some((Pagemap::Task, id)),
        2 | 27..=29 | 32..=34 => Some((Pagemap::Shmem, id)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_dialect_reads_back_what_it_writes_and_is_told_apart() {
        let open2 = Header {
            op: OP_OPEN2,
            flags: 0,
            nr_pages: 0,
            vaddr: 0,
            dst_id: 42 << 8 | 1,
        };
        let get = Header {
            op: OP_GET,
            flags: 0,
            nr_pages: 3,
            vaddr: 0x7f12_3456_7000,
            dst_id: 42,
        };
        let add = Header {
            op: OP_ADD_F,
            flags: PE_PRESENT | PE_LAZY,
            nr_pages: 9,
            vaddr: 0x5555_0000_1000,
            dst_id: 7 << 8 | 2,
        };
        for d in [Dialect::V42, Dialect::Legacy] {
            for h in [open2, get, add] {
                let b = h.encode(d);
                assert_eq!(b.len(), d.header_len(), "{d:?} {h:?}");
                assert_eq!(Header::decode(d, &b), h, "{d:?}");
            }
            // A session begins with OPEN2 (a dump) or GET (lazy pages).
            for first in [open2, get] {
                let b = first.encode(d);
                let f: [u8; HEADER_LEGACY] = b[..HEADER_LEGACY].try_into().unwrap();
                assert_eq!(Dialect::of_first(&f), d, "{first:?}");
            }
        }
        assert_eq!(add.page_flags(), Some(PE_PRESENT | PE_LAZY));
        assert_eq!(decode_dst(add.dst_id), Some((Pagemap::Shmem, 7)));
        assert_eq!(decode_dst(11), Some((Pagemap::Task, 0)));
        assert_eq!(decode_dst(5 << 8 | 3), None);
    }
}
