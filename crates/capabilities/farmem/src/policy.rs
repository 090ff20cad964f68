//! Replacement policies: which local page to evict when a remote page comes in.
//!
//! Pages are named by their index in the emulated memory (all regions of an
//! instance, in order). The engine tells a policy when a page becomes local
//! ([`Policy::inserted`]) and when it leaves without an eviction
//! ([`Policy::removed`]), and asks it for a victim ([`Policy::victim`]),
//! which the policy forgets at once.
//!
//! **Learning which local pages are used.** The kernel offers no per-page
//! accessed bit to user space here (no idle page tracking), and a mapped page
//! is accessed without any fault. So a policy that wants to know asks the
//! engine to *park* pages ([`Policy::to_park`]): the engine moves a parked
//! page out of the region into staging, where it stays local (it counts
//! against the budget, and no link delay is charged). The next access to it
//! faults; the engine moves it straight back and tells the policy
//! ([`Policy::accessed`]) — a *soft fault*, counted apart from fetches. A
//! parked page chosen as a victim is already in staging. CLOCK parks each
//! page as its hand clears the page's bit; the LRU approximation does the
//! same to age pages. The price is one soft fault for each page used again
//! after its bit was cleared.
//!
//! **Why this module holds unsafe code.** A plugin is C code loaded into
//! the process (`dlopen`) and called through the function pointers of its
//! `PolicyOps` (the C ABI of `include/pagewise.h`): every call into it is a
//! foreign call, as at the C API's boundary.

use crate::{Error, Result};
use pagewise_mech::workload::Rng;
use std::collections::VecDeque;
use std::ffi::{c_char, c_int, c_void, CStr, CString};

/// A replacement policy.
pub trait Policy: Send {
    /// Its name, as `--policy` takes it.
    fn name(&self) -> &str;
    /// Page `page` became local.
    fn inserted(&mut self, page: usize);
    /// Page `page` stopped being local without being chosen (the program
    /// dropped or unmapped it).
    fn removed(&mut self, page: usize);
    /// Chooses a local page to evict and forgets it; `None` when it tracks none.
    fn victim(&mut self) -> Option<usize>;
    /// Pages to park so that their next access is seen (see the module
    /// docs); the engine asks after every [`Policy::victim`].
    fn to_park(&mut self, _out: &mut Vec<usize>) {}
    /// A parked page was accessed (and is mapped again).
    fn accessed(&mut self, _page: usize) {}
}

/// The policies built in, by name.
pub const NAMES: [&str; 4] = ["fifo", "random", "clock", "lru"];

/// A built-in policy by name.
pub fn by_name(name: &str, seed: u64) -> Option<Box<dyn Policy>> {
    match name {
        "fifo" => Some(Box::new(Fifo::default())),
        "random" => Some(Box::new(Random::new(seed))),
        "clock" => Some(Box::new(Clock::default())),
        "lru" => Some(Box::new(Aging::default())),
        _ => None,
    }
}

/// The local pages in a circle (a doubly linked list), each with its
/// history of use, and a hand.
#[derive(Debug, Default)]
struct Ring {
    /// page -> (previous, next, history). History bit 7 is "used since the
    /// hand last passed"; older passes shift right.
    links: std::collections::HashMap<usize, (usize, usize, u8)>,
    hand: Option<usize>,
}

impl Ring {
    fn len(&self) -> usize {
        self.links.len()
    }

    /// Adds a page just behind the hand (it was just used).
    fn insert(&mut self, page: usize) {
        if self.links.contains_key(&page) {
            return;
        }
        match self.hand {
            None => {
                self.links.insert(page, (page, page, 0x80));
                self.hand = Some(page);
            }
            Some(h) => {
                let prev = self.links[&h].0;
                self.links.insert(page, (prev, h, 0x80));
                self.links.get_mut(&prev).expect("linked").1 = page;
                self.links.get_mut(&h).expect("linked").0 = page;
            }
        }
    }

    fn remove(&mut self, page: usize) {
        let Some((prev, next, _)) = self.links.remove(&page) else {
            return;
        };
        if self.links.is_empty() {
            self.hand = None;
            return;
        }
        self.links.get_mut(&prev).expect("linked").1 = next;
        self.links.get_mut(&next).expect("linked").0 = prev;
        if self.hand == Some(page) {
            self.hand = Some(next);
        }
    }

    fn history(&mut self, page: usize) -> &mut u8 {
        &mut self.links.get_mut(&page).expect("in the ring").2
    }

    fn advance(&mut self) {
        if let Some(h) = self.hand {
            self.hand = Some(self.links[&h].1);
        }
    }

    fn used(&mut self, page: usize) {
        if let Some(l) = self.links.get_mut(&page) {
            l.2 |= 0x80;
        }
    }
}

/// CLOCK (second chance): the hand clears a used page's bit and parks it
/// (so its next use is seen); a page whose bit is clear is evicted.
#[derive(Debug, Default)]
pub struct Clock {
    ring: Ring,
    park: Vec<usize>,
}

impl Policy for Clock {
    fn name(&self) -> &str {
        "clock"
    }
    fn inserted(&mut self, page: usize) {
        self.ring.insert(page);
    }
    fn removed(&mut self, page: usize) {
        self.ring.remove(page);
    }
    fn victim(&mut self) -> Option<usize> {
        let r = &mut self.ring;
        // Two turns at most: the first clears every bit.
        for _ in 0..=2 * r.len() {
            let p = r.hand?;
            let h = r.history(p);
            if *h & 0x80 != 0 {
                *h = 0;
                self.park.push(p);
                r.advance();
            } else {
                r.remove(p);
                return Some(p);
            }
        }
        None
    }
    fn to_park(&mut self, out: &mut Vec<usize>) {
        out.append(&mut self.park);
    }
    fn accessed(&mut self, page: usize) {
        self.ring.used(page);
    }
}

/// An LRU approximation by aging: each time the victim search passes a
/// page, its use bit shifts into an 8-bit history (and the page is parked
/// to see its next use); the victim is the page with the oldest history
/// among the next 16 from the hand.
#[derive(Debug, Default)]
pub struct Aging {
    ring: Ring,
    park: Vec<usize>,
}

impl Policy for Aging {
    fn name(&self) -> &str {
        "lru"
    }
    fn inserted(&mut self, page: usize) {
        self.ring.insert(page);
    }
    fn removed(&mut self, page: usize) {
        self.ring.remove(page);
    }
    fn victim(&mut self) -> Option<usize> {
        const WINDOW: usize = 16;
        let r = &mut self.ring;
        let mut best: Option<(u8, usize)> = None;
        for _ in 0..WINDOW.min(r.len()) {
            let p = r.hand?;
            // Pass the page: age its history, and park it if it was used.
            let h = r.history(p);
            let used = *h & 0x80 != 0;
            *h = (*h >> 1) & 0x7f | if used { 0x40 } else { 0 };
            let age = *h;
            if used {
                self.park.push(p);
            }
            if best.is_none_or(|(a, _)| age < a) {
                best = Some((age, p));
            }
            r.advance();
        }
        let (_, victim) = best?;
        r.remove(victim);
        self.park.retain(|&p| p != victim);
        Some(victim)
    }
    fn to_park(&mut self, out: &mut Vec<usize>) {
        out.append(&mut self.park);
    }
    fn accessed(&mut self, page: usize) {
        self.ring.used(page);
    }
}

/// The version of [`PolicyOps`] this pagewise speaks.
pub const POLICY_ABI_VERSION: u32 = 1;

/// A replacement policy written in C (or anything with a C ABI), loaded at
/// run time from a shared object that exports
/// `const pw_policy_ops *pw_policy_plugin(void)`. The engine calls it from
/// its handler thread only, one call at a time; pages are indices into the
/// emulated memory. In `include/pagewise.h` as `pw_policy_ops`; an example is
/// `examples/policy_lifo.c`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PolicyOps {
    /// Must be `PW_POLICY_ABI_VERSION` ([`POLICY_ABI_VERSION`]).
    pub abi_version: u32,
    /// The policy's name (a static string).
    pub name: *const c_char,
    /// Makes the policy's state from an argument string (may be empty);
    /// NULL on failure.
    pub create: Option<unsafe extern "C" fn(args: *const c_char) -> *mut c_void>,
    /// Frees the state.
    pub destroy: Option<unsafe extern "C" fn(state: *mut c_void)>,
    /// Page `page` became local.
    pub inserted: Option<unsafe extern "C" fn(state: *mut c_void, page: u64)>,
    /// Page `page` stopped being local without being chosen.
    pub removed: Option<unsafe extern "C" fn(state: *mut c_void, page: u64)>,
    /// Chooses a local page to evict into `*page` and forgets it; returns 0,
    /// or -1 when it tracks no page.
    pub victim: Option<unsafe extern "C" fn(state: *mut c_void, page: *mut u64) -> c_int>,
}

const _: () = assert!(std::mem::size_of::<PolicyOps>() == 56);

/// A policy loaded from a shared object.
pub struct Plugin {
    ops: PolicyOps,
    state: *mut c_void,
    name: String,
    // Declared last: the library is closed after the state is destroyed.
    _lib: pagewise_sys::dl::Library,
}

// SAFETY: the plugin contract (see `PolicyOps`) is that its functions may be
// called from any one thread at a time; the engine moves the policy to its
// handler thread and calls it only there.
unsafe impl Send for Plugin {}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plugin").field("name", &self.name).finish()
    }
}

impl Plugin {
    /// Loads the policy in the shared object at `path` and creates its
    /// state with `args`.
    ///
    /// # Safety
    /// Loading runs the object's code; it must follow the contract of
    /// [`PolicyOps`].
    pub unsafe fn load(path: &str, args: &str) -> Result<Self> {
        let bad = |what: String| Error::Plugin {
            path: path.to_string(),
            what,
        };
        // SAFETY: the caller accepts running the plugin's code.
        let lib =
            unsafe { pagewise_sys::dl::Library::open(path) }.map_err(|e| bad(e.to_string()))?;
        let sym = lib
            .symbol("pw_policy_plugin")
            .map_err(|e| bad(format!("no pw_policy_plugin: {e}")))?;
        // SAFETY: the contract says `pw_policy_plugin` has this signature.
        let entry: unsafe extern "C" fn() -> *const PolicyOps = unsafe { std::mem::transmute(sym) };
        // SAFETY: calling the plugin's entry point, per the contract.
        let ops_ptr = unsafe { entry() };
        // SAFETY: the contract says the pointer is NULL or a static `pw_policy_ops`.
        let ops = unsafe { ops_ptr.as_ref() }
            .copied()
            .ok_or_else(|| bad("pw_policy_plugin returned NULL".into()))?;
        if ops.abi_version != POLICY_ABI_VERSION {
            return Err(bad(format!(
                "ABI version {} (this pagewise speaks {POLICY_ABI_VERSION})",
                ops.abi_version
            )));
        }
        let (Some(create), Some(_), Some(_), Some(_), Some(_)) = (
            ops.create,
            ops.destroy,
            ops.inserted,
            ops.removed,
            ops.victim,
        ) else {
            return Err(bad("a function of pw_policy_ops is NULL".into()));
        };
        let name = if ops.name.is_null() {
            "plugin".to_string()
        } else {
            // SAFETY: a non-null name is a static NUL-terminated string (contract).
            unsafe { CStr::from_ptr(ops.name) }
                .to_string_lossy()
                .into_owned()
        };
        let c_args = CString::new(args).map_err(|_| bad("arguments hold a NUL byte".into()))?;
        // SAFETY: `create` follows the contract; `c_args` outlives the call.
        let state = unsafe { create(c_args.as_ptr()) };
        if state.is_null() {
            return Err(bad(format!("create({args:?}) failed")));
        }
        Ok(Plugin {
            ops,
            state,
            name,
            _lib: lib,
        })
    }
}

impl Policy for Plugin {
    fn name(&self) -> &str {
        &self.name
    }
    fn inserted(&mut self, page: usize) {
        let f = self.ops.inserted.expect("checked at load");
        // SAFETY: the state came from `create` and is used from one thread.
        unsafe { f(self.state, page as u64) }
    }
    fn removed(&mut self, page: usize) {
        let f = self.ops.removed.expect("checked at load");
        // SAFETY: as in `inserted`.
        unsafe { f(self.state, page as u64) }
    }
    fn victim(&mut self) -> Option<usize> {
        let f = self.ops.victim.expect("checked at load");
        let mut page = 0u64;
        // SAFETY: as in `inserted`; `page` is a valid out-pointer.
        (unsafe { f(self.state, &mut page) } == 0).then_some(page as usize)
    }
}

impl Drop for Plugin {
    fn drop(&mut self) {
        let f = self.ops.destroy.expect("checked at load");
        // SAFETY: the state came from `create` and is destroyed once.
        unsafe { f(self.state) }
    }
}

/// First in, first out (DiME's policy): the page local the longest goes first.
#[derive(Debug, Default)]
pub struct Fifo {
    /// Pages in arrival order, with the arrival they stand for.
    queue: VecDeque<(usize, u64)>,
    /// The current arrival of each page, by page (0: not local); entries
    /// of the queue with another are stale (the page left, and maybe came
    /// back later).
    live: Vec<u64>,
    arrivals: u64,
}

impl Policy for Fifo {
    fn name(&self) -> &str {
        "fifo"
    }
    fn inserted(&mut self, page: usize) {
        self.arrivals += 1;
        if page >= self.live.len() {
            self.live.resize((page + 1).next_power_of_two(), 0);
        }
        self.live[page] = self.arrivals;
        self.queue.push_back((page, self.arrivals));
    }
    fn removed(&mut self, page: usize) {
        if let Some(a) = self.live.get_mut(page) {
            *a = 0;
        }
    }
    fn victim(&mut self) -> Option<usize> {
        while let Some((p, arrival)) = self.queue.pop_front() {
            if self.live[p] == arrival {
                self.live[p] = 0;
                return Some(p);
            }
        }
        None
    }
}

/// A local page chosen uniformly at random.
#[derive(Debug)]
pub struct Random {
    pages: Vec<usize>,
    /// Position of each page in `pages`.
    at: std::collections::HashMap<usize, usize>,
    rng: Rng,
}

impl Random {
    /// A random policy with a seed, so that runs repeat.
    pub(crate) fn new(seed: u64) -> Self {
        Random {
            pages: Vec::new(),
            at: Default::default(),
            rng: Rng::new(seed),
        }
    }

    fn take_at(&mut self, i: usize) -> usize {
        let p = self.pages.swap_remove(i);
        self.at.remove(&p);
        if let Some(&moved) = self.pages.get(i) {
            self.at.insert(moved, i);
        }
        p
    }
}

impl Policy for Random {
    fn name(&self) -> &str {
        "random"
    }
    fn inserted(&mut self, page: usize) {
        if !self.at.contains_key(&page) {
            self.at.insert(page, self.pages.len());
            self.pages.push(page);
        }
    }
    fn removed(&mut self, page: usize) {
        if let Some(&i) = self.at.get(&page) {
            self.take_at(i);
        }
    }
    fn victim(&mut self) -> Option<usize> {
        if self.pages.is_empty() {
            return None;
        }
        let i = self.rng.below(self.pages.len() as u64) as usize;
        Some(self.take_at(i))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifo_order_and_removals() {
        let mut f = Fifo::default();
        for p in [1, 2, 3, 4] {
            f.inserted(p);
        }
        f.removed(2);
        assert_eq!(f.victim(), Some(1));
        f.inserted(2);
        assert_eq!(f.victim(), Some(3));
        assert_eq!(f.victim(), Some(4));
        assert_eq!(f.victim(), Some(2));
        assert_eq!(f.victim(), None);
    }

    #[test]
    fn random_returns_each_page_once() {
        let mut r = Random::new(5);
        for p in 0..100 {
            r.inserted(p);
        }
        r.removed(50);
        let mut got: Vec<usize> = std::iter::from_fn(|| r.victim()).collect();
        got.sort();
        let want: Vec<usize> = (0..100).filter(|&p| p != 50).collect();
        assert_eq!(got, want);
    }
}
