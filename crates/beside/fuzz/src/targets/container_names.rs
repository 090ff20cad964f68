//! What names a process's container and pod: the lines of
//! `/proc/PID/cgroup` (the runtimes' and the kubelet's cgroup paths) and
//! the names of the kubelet's pod directories (`NAMESPACE_NAME_UID`). Any
//! text is read or refused, never a panic; what is read is what the text
//! says.

use super::Target;
use crate::mutate::Rng;
use pagewise_mech::container::{parse_cgroup_file, parse_cgroup_path, parse_pod_dir};

/// Both readers.
pub(super) struct ContainerNames;

impl Target for ContainerNames {
    fn feed(&self, input: &[u8]) -> bool {
        let text = String::from_utf8_lossy(input);
        let mut read = false;
        for (_, path) in parse_cgroup_file(&text) {
            if let Some(c) = parse_cgroup_path(&path) {
                assert_eq!(c.id.len(), 64, "an id of {} characters", c.id.len());
                assert!(
                    path.to_ascii_lowercase().contains(&c.id),
                    "{path} does not name {}",
                    c.id
                );
                read = true;
            }
        }
        for line in text.lines() {
            if let Some((ns, name, uid)) = parse_pod_dir(line) {
                assert_eq!(format!("{ns}_{name}_{uid}"), line);
                read = true;
            }
        }
        read
    }

    fn seeds(&self, rng: &mut Rng) -> Vec<Vec<u8>> {
        let id = |rng: &mut Rng| -> String {
            (0..64)
                .map(|_| char::from_digit(rng.below(16) as u32, 16).unwrap_or('0'))
                .collect()
        };
        vec![
            format!("0::/machine.slice/libpod-{}.scope\n", id(rng)).into_bytes(),
            format!(
                "9:name=systemd:/kubepods/besteffort/pod0f6e3f1a-1b2c-4d5e-8f90-123456789abc/{}\n",
                id(rng)
            )
            .into_bytes(),
            format!(
                "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1a2b_c3.slice/cri-containerd-{}.scope\n",
                id(rng)
            )
            .into_bytes(),
            b"kube-system_coredns-5d78c9869d-x7k2p_0f6e3f1a-1b2c-4d5e-8f90-123456789abc\n".to_vec(),
        ]
    }
}
