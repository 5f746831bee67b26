//! The devices a program runs on: one [`Platform`] per kind of PJRT plugin, and one way to
//! get a client of any of them ([`Platform::client`]).
//!
//! Every platform's devices are PJRT devices behind the same [`Client`]: compile, upload,
//! execute and download are the same calls for all of them. What differs is only where the
//! plugin comes from and whether this machine has the devices:
//!
//! | platform | plugin | devices |
//! |---|---|---|
//! | `cpu` | the provisioned XLA CPU plugin ([`crate::cpu_plugin_path`]) | N virtual devices of one process |
//! | `gpu` | a CUDA PJRT plugin named by `TESSERA_GPU_PJRT_PLUGIN` | the process's visible GPUs |
//! | `tpu` | libtpu ([`crate::libtpu_path`]) | the TPU chips on this machine's PCI bus |
//!
//! A platform whose devices are missing is refused with one sentence before any plugin is
//! loaded where that can be known ([`Error::NoGpuPlugin`], [`Error::NoTpuChips`]): a machine
//! without TPU chips never loads libtpu for a client (libtpu writes logs under `/tmp` and, on a
//! machine that is not a TPU VM, may wait minutes on a cloud metadata server).
//!
//! tessera runs a program in one process. [`PROCESSES_ENV`] asking for more is refused with
//! one sentence per platform: the XLA CPU plugin has no cross-process collectives; the CUDA
//! plugin would need a key-value store tessera does not pass; libtpu's own distributed
//! runtime could run a pod slice, but tessera feeds a program's arguments only to the devices
//! of its own process (see docs/architecture.md, "Devices").

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::{Mutex, PoisonError};

use crate::client::Client;
use crate::error::{Error, Result};
use crate::plugin::Plugin;

/// The variable that names the CUDA PJRT plugin library (`xla_cuda_plugin.so` of the
/// `jax-cuda12-pjrt` wheel).
pub const GPU_PLUGIN_ENV: &str = "TESSERA_GPU_PJRT_PLUGIN";

/// The variable that says how many processes run one program together (default 1).
pub const PROCESSES_ENV: &str = "TESSERA_NUM_PROCESSES";

/// Where Linux lists the PCI devices (each a directory with `vendor` and `device` files).
pub const PCI_DEVICES: &str = "/sys/bus/pci/devices";

/// Google's PCI vendor id.
const GOOGLE_PCI_VENDOR: &str = "0x1ae0";

/// PCI device ids of TPU chips (vendor [`GOOGLE_PCI_VENDOR`]), as JAX's hardware probe lists
/// them: v2/v3, an unnamed generation, v4, v5p, v5e, v6e, 7x. Google's other PCI devices
/// (gVNIC network cards on every Cloud VM) are not chips.
const TPU_PCI_DEVICE_IDS: [&str; 7] = [
    "0x0027", "0x0056", "0x005e", "0x0062", "0x0063", "0x006f", "0x0076",
];

/// A kind of device a program runs on, each behind its own PJRT plugin.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Platform {
    /// The XLA CPU plugin: N virtual devices of this process.
    Cpu,
    /// A CUDA PJRT plugin: the GPUs this process sees.
    Gpu,
    /// libtpu: the TPU chips of this machine.
    Tpu,
}

impl Platform {
    /// Every platform.
    pub const ALL: [Platform; 3] = [Platform::Cpu, Platform::Gpu, Platform::Tpu];

    /// `cpu`, `gpu` or `tpu`.
    pub fn name(self) -> &'static str {
        match self {
            Platform::Cpu => "cpu",
            Platform::Gpu => "gpu",
            Platform::Tpu => "tpu",
        }
    }

    /// Whether programs for this platform carry their kernels as Mosaic `tpu_custom_call`s,
    /// which only libtpu compiles (the XLA CPU and GPU compilers take kernels as plain
    /// StableHLO).
    pub fn takes_mosaic_kernels(self) -> bool {
        self == Platform::Tpu
    }

    /// A client with at least `devices` devices of this platform, shared by every later call
    /// in the process (a CPU client per device count; one GPU or TPU client per process, as
    /// their plugins allow). Programs compile for the client's first `devices` devices.
    ///
    /// Errors, each one sentence: a multi-process request ([`PROCESSES_ENV`]), no GPU plugin
    /// named, no TPU chips on this machine, fewer devices than `devices`, or the plugin's own
    /// failure to create a client.
    pub fn client(self, devices: usize) -> Result<Client> {
        if devices == 0 {
            return Err(Error::InvalidDeviceCount { requested: 0 });
        }
        check_single_process(self)?;
        let client = match self {
            Platform::Cpu => return Client::cpu_shared(devices),
            Platform::Gpu => shared(self, gpu_client)?,
            Platform::Tpu => shared(self, tpu_client)?,
        };
        let available = client.devices().len();
        if available < devices {
            return Err(Error::TooFewDevices {
                platform: self,
                requested: devices,
                available,
            });
        }
        Ok(client)
    }

    /// Why this platform's programs run in one process (what [`Error::MultiProcess`] says).
    fn single_process_reason(self) -> &'static str {
        match self {
            Platform::Cpu => {
                "the XLA CPU plugin has no collectives across processes; use more virtual \
                 devices in one process instead"
            }
            Platform::Gpu => {
                "tessera does not give the CUDA plugin the key-value store (node_id, \
                 num_nodes) a multi-process client needs"
            }
            Platform::Tpu => {
                "tessera feeds a program's arguments only to the devices of its own process; a \
                 multi-host TPU slice can be compiled for (`tessera compile --target tpu:...`) \
                 but not run"
            }
        }
    }
}

impl fmt::Display for Platform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Platform {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Platform::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| Error::UnknownPlatform { name: s.into() })
    }
}

/// Refuses a multi-process request: tessera runs a program in one process on every platform
/// (see [`Platform::single_process_reason`]).
fn check_single_process(platform: Platform) -> Result<()> {
    let Some(value) = std::env::var_os(PROCESSES_ENV) else {
        return Ok(());
    };
    let value = value.to_string_lossy().into_owned();
    match value.trim().parse::<usize>() {
        Ok(1) => Ok(()),
        Ok(processes) if processes > 1 => Err(Error::MultiProcess {
            platform,
            variable: PROCESSES_ENV,
            processes,
            reason: platform.single_process_reason(),
        }),
        _ => Err(Error::InvalidProcessCount {
            variable: PROCESSES_ENV,
            value,
        }),
    }
}

/// The process's one client of `platform`, created by `create` on first success (a failure
/// is not kept: the next call tries again).
fn shared(platform: Platform, create: fn() -> Result<Client>) -> Result<Client> {
    static CLIENTS: Mutex<Option<HashMap<Platform, Client>>> = Mutex::new(None);
    let mut clients = CLIENTS.lock().unwrap_or_else(PoisonError::into_inner);
    let clients = clients.get_or_insert_with(HashMap::new);
    if let Some(c) = clients.get(&platform) {
        return Ok(c.clone());
    }
    let client = create()?;
    clients.insert(platform, client.clone());
    Ok(client)
}

/// A client of the CUDA plugin named by [`GPU_PLUGIN_ENV`], with the plugin's default options
/// (every visible GPU).
fn gpu_client() -> Result<Client> {
    let path = crate::provision::library_override(GPU_PLUGIN_ENV)?.ok_or(Error::NoGpuPlugin {
        variable: GPU_PLUGIN_ENV,
    })?;
    Client::new(Plugin::load(path)?, &[])
}

/// A client of libtpu on this machine's TPU chips. Without chips on the PCI bus libtpu is not
/// loaded at all. tessera passes libtpu no create options and sets no variables: on a TPU VM
/// libtpu learns the host and its slice from the VM's metadata server or from its own
/// `TPU_*` variables (see docs/architecture.md, "Devices").
fn tpu_client() -> Result<Client> {
    let chips = tpu_chips_in(Path::new(PCI_DEVICES));
    if chips == 0 {
        return Err(Error::NoTpuChips {
            pci_devices: PathBuf::from(PCI_DEVICES),
        });
    }
    libtpu_client()
}

/// A client of libtpu, loaded from [`crate::libtpu_path`], whatever this machine has: on a
/// machine without chips libtpu's own error ([`Error::TpuClient`]).
pub fn libtpu_client() -> Result<Client> {
    let plugin = Plugin::load(crate::provision::libtpu_path()?)?;
    Client::new(plugin, &[]).map_err(|e| match e {
        Error::Pjrt { message, .. } => Error::TpuClient { message },
        other => other,
    })
}

/// The TPU chips on this machine's PCI bus ([`PCI_DEVICES`]): devices of Google's vendor id
/// with a TPU device id.
pub fn tpu_chips() -> usize {
    tpu_chips_in(Path::new(PCI_DEVICES))
}

/// The TPU chips among the PCI devices listed in `dir` (0 when it cannot be read).
pub fn tpu_chips_in(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let read = |path: PathBuf| std::fs::read_to_string(path).map(|s| s.trim().to_string());
    entries
        .flatten()
        .filter(|e| read(e.path().join("vendor")).is_ok_and(|v| v == GOOGLE_PCI_VENDOR))
        .filter(|e| {
            read(e.path().join("device")).is_ok_and(|d| TPU_PCI_DEVICE_IDS.contains(&d.as_str()))
        })
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn platforms_parse_by_name() {
        for p in Platform::ALL {
            assert_eq!(p.name().parse::<Platform>().unwrap(), p);
        }
        let e = "interpret".parse::<Platform>().unwrap_err().to_string();
        assert_eq!(e, "unknown platform `interpret`; expected cpu, gpu or tpu");
    }

    /// A PCI listing with a gVNIC (Google's vendor, not a chip), another vendor's device with a
    /// TPU-like id, and two v5e chips.
    #[test]
    fn tpu_chips_are_google_devices_with_tpu_ids() {
        let dir = std::env::temp_dir().join(format!("tessera-pci-{}", std::process::id()));
        let devices = [
            ("0000:00:04.0", "0x1ae0", "0x0042"),
            ("0000:00:05.0", "0x8086", "0x0063"),
            ("0000:00:06.0", "0x1ae0", "0x0063"),
            ("0000:00:07.0", "0x1ae0\n", "0x0063\n"),
        ];
        for (name, vendor, device) in devices {
            let d = dir.join(name);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("vendor"), vendor).unwrap();
            std::fs::write(d.join("device"), device).unwrap();
        }
        let chips = tpu_chips_in(&dir);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(chips, 2);
        assert_eq!(tpu_chips_in(&dir), 0, "an unreadable listing has no chips");
    }
}
