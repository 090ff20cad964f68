//! A far-memory instance file (`farmem/instance`): the settings, members
//! and calibrations other processes wrote into it.

use anyhow::Result;
use pagewise_farmem::instance::{self, Access, Instance, Settings};
use std::path::{Path, PathBuf};

use super::Target;
use crate::mutate::Rng;

/// The instance file's reader, over files of a scratch directory.
pub(super) struct InstanceFile {
    seed: Vec<u8>,
    case: PathBuf,
}

impl InstanceFile {
    /// Points the instances' directory at `work` (for the whole process)
    /// and writes a valid instance with one member as the seed.
    pub(super) fn new(work: &Path) -> Result<InstanceFile> {
        std::env::set_var("PAGEWISE_FARMEM_DIR", work.join("farmem"));
        let name = "fuzz-seed";
        let _ = std::fs::remove_file(instance::dir().join(name));
        let inst = Instance::create(
            name,
            Settings::default().latency_ns(1000).local_pages(64),
            (1000, 100),
            (800, 50),
        )?;
        inst.join(std::process::id() as i32, 1)?;
        let path = instance::dir().join(name);
        let seed = std::fs::read(&path)?;
        drop(inst);
        let _ = std::fs::remove_file(&path);
        Ok(InstanceFile {
            seed,
            case: instance::dir().join("fuzz-case"),
        })
    }
}

impl Target for InstanceFile {
    fn feed(&self, input: &[u8]) -> bool {
        let _ = std::fs::remove_file(&self.case);
        std::fs::write(&self.case, input).expect("the scratch directory takes a file");
        let Ok(i) = Instance::open("fuzz-case", Access::Read) else {
            return false;
        };
        let members = i.members();
        let _ = i.settings();
        let _ = i.retired(None);
        let _ = i.is_stale();
        let _ = i.calibration(pagewise_farmem::FaultPath::Inline);
        !members.is_empty()
    }

    fn seeds(&self, _rng: &mut Rng) -> Vec<Vec<u8>> {
        vec![self.seed.clone()]
    }
}
