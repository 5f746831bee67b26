//! Finding and provisioning PJRT plugin libraries.
//!
//! The CPU plugin comes from a pinned PyPI wheel (a zip) that is downloaded once with
//! `python3 -m pip download --no-deps` and unpacked into a cache directory:
//!
//! ```text
//! $TESSERA_CACHE_DIR (default $XDG_CACHE_HOME/tessera or ~/.cache/tessera)
//! └── pjrt-plugins/
//!     ├── lammps-jax-pjrt-cpu-0.11.2.lock   # file lock serialising provisioning
//!     └── lammps-jax-pjrt-cpu-0.11.2/       # appears atomically (rename), complete
//!         ├── tessera-plugin.manifest
//!         └── lammps_jax_pjrt_cpu/pjrt_c_api_cpu_plugin.so
//! ```
//!
//! Environment:
//! * `TESSERA_PJRT_PLUGIN=/path/to/plugin.so` — use this library, no provisioning;
//! * `TESSERA_CPU_PLUGIN_WHEEL=name==version` — which wheel provides the CPU plugin (default
//!   `lammps-jax-pjrt-cpu==0.11.2`; also known: `xla-cpu-pjrt==0.0.1`,
//!   `fastatomstruct-xla-cpu==2026.6.23`; for others the wheel's only `.so` is used);
//! * `TESSERA_LIBTPU=/path/to/libtpu.so` — the TPU compiler library to use, no provisioning;
//! * `TESSERA_LIBTPU_WHEEL=libtpu==version` — which libtpu wheel to provision (default
//!   [`WheelSpec::libtpu`]);
//! * `TESSERA_LIBTPU_CACHE_DIR` — where libtpu (a 210 MB download, 690 MB unpacked) is
//!   unpacked, when it should live apart from the other plugins (CI keeps it between runs);
//!   default: the cache root;
//! * `TESSERA_CACHE_DIR` — the cache root;
//! * `TESSERA_PYTHON` — the interpreter that runs pip (default `python3`).
//!   Ordinary `PIP_*` variables (index URL, find-links, proxy) reach pip unchanged.

use std::env;
use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufReader, BufWriter};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use fs4::fs_std::FileExt;

use crate::error::{Error, Result};

/// Variable naming a plugin library to use instead of a provisioned one.
pub const PLUGIN_ENV: &str = "TESSERA_PJRT_PLUGIN";
/// Variable choosing the CPU plugin wheel, `name==version`.
pub const CPU_WHEEL_ENV: &str = "TESSERA_CPU_PLUGIN_WHEEL";
/// Variable naming the libtpu library to use instead of the provisioned one.
pub const LIBTPU_ENV: &str = "TESSERA_LIBTPU";
/// Variable choosing the libtpu wheel, `libtpu==version`.
pub const LIBTPU_WHEEL_ENV: &str = "TESSERA_LIBTPU_WHEEL";
/// Variable overriding the cache root for libtpu only.
pub const LIBTPU_CACHE_DIR_ENV: &str = "TESSERA_LIBTPU_CACHE_DIR";
/// Variable overriding the cache root.
pub const CACHE_DIR_ENV: &str = "TESSERA_CACHE_DIR";
/// Variable choosing the Python interpreter that runs pip.
pub const PYTHON_ENV: &str = "TESSERA_PYTHON";

const MANIFEST: &str = "tessera-plugin.manifest";

/// A pinned wheel that contains a PJRT plugin library.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WheelSpec {
    name: String,
    version: String,
    library: Option<String>,
    header: Option<String>,
}

impl WheelSpec {
    /// `xla-cpu-pjrt==0.0.1` (OpenXLA; C API 0.81): the one that ships the `pjrt_c_api.h`
    /// this crate's binding is checked against. Not the default: its in-process collectives
    /// are not reproducible when the cores are loaded (see [`WheelSpec::lammps_jax_pjrt_cpu`]).
    pub fn xla_cpu_pjrt() -> Self {
        Self::known(
            "xla-cpu-pjrt",
            "0.0.1",
            "xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so",
        )
        .with_header("xla_plugins/xla_cpu_pjrt/include/pjrt_c_api.h")
    }

    /// `fastatomstruct-xla-cpu==2026.6.23` (C API 0.106).
    pub fn fastatomstruct_xla_cpu() -> Self {
        Self::known(
            "fastatomstruct-xla-cpu",
            "2026.6.23",
            "fastatomstruct_xla_cpu/libpjrt_cpu.so",
        )
    }

    /// `lammps-jax-pjrt-cpu==0.11.2` (C API 0.115; XLA's CPU client built with StableHLO
    /// 1.20): the default CPU plugin. Measured on a 2-core machine with both cores busy, 20
    /// training steps on 4 devices: bit-identical in 18 of 18 runs (xla-cpu-pjrt 0.0.1: 3 of
    /// 8 runs had one step's collectives wrong), and 15% faster a step.
    pub fn lammps_jax_pjrt_cpu() -> Self {
        Self::known(
            "lammps-jax-pjrt-cpu",
            "0.11.2",
            "lammps_jax_pjrt_cpu/pjrt_c_api_cpu_plugin.so",
        )
    }

    /// `libtpu==0.0.50.1`: the TPU compiler and runtime (`libtpu/libtpu.so`), used
    /// compile-only through a topology. Pinned to the version the current `jax[tpu]==0.12.0.1`
    /// requires, so tessera's programs and JAX's are compiled by the compiler on today's TPU
    /// VMs. The previous pin, 0.0.42.1 (C API 0.112, the one `jax[tpu]==0.10.2` requires and
    /// tessera-jax uses under jax 0.10.2), stays selectable with
    /// `TESSERA_LIBTPU_WHEEL=libtpu==0.0.42.1`.
    pub fn libtpu() -> Self {
        Self::known("libtpu", "0.0.50.1", "libtpu/libtpu.so")
    }

    fn known(name: &str, version: &str, library: &str) -> Self {
        Self {
            name: name.into(),
            version: version.into(),
            library: Some(library.into()),
            header: None,
        }
    }

    /// The CPU plugin wheels this crate knows the layout of.
    pub fn known_cpu_wheels() -> Vec<Self> {
        vec![
            Self::xla_cpu_pjrt(),
            Self::fastatomstruct_xla_cpu(),
            Self::lammps_jax_pjrt_cpu(),
        ]
    }

    /// A wheel `name==version` whose library is found automatically (its only `.so`).
    pub fn new(name: &str, version: &str) -> Result<Self> {
        let spec = format!("{name}=={version}");
        let invalid = |reason: &str| Error::InvalidWheelSpec {
            spec: spec.clone(),
            reason: reason.to_string(),
        };
        let name_ok = |s: &str| {
            !s.is_empty()
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
                && s.starts_with(|c: char| c.is_ascii_alphanumeric())
        };
        if !name_ok(name) {
            return Err(invalid("the name must be letters, digits, '.', '_' or '-'"));
        }
        let version_ok = !version.is_empty()
            && version
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || ".+!_-".contains(c))
            && version.starts_with(|c: char| c.is_ascii_alphanumeric());
        if !version_ok {
            return Err(invalid(
                "the version must be an exact version such as 1.2.3",
            ));
        }
        Ok(Self {
            name: name.into(),
            version: version.into(),
            library: None,
            header: None,
        })
    }

    /// Parses `name==version`. A known name (see [`WheelSpec::known_cpu_wheels`]) keeps its
    /// known library path.
    pub fn parse(spec: &str) -> Result<Self> {
        let (name, version) =
            spec.trim()
                .split_once("==")
                .ok_or_else(|| Error::InvalidWheelSpec {
                    spec: spec.to_string(),
                    reason: "expected name==version, e.g. xla-cpu-pjrt==0.0.1".into(),
                })?;
        let mut parsed = Self::new(name.trim(), version.trim())?;
        let normalized = normalize(&parsed.name);
        if let Some(known) = Self::known_cpu_wheels()
            .into_iter()
            .find(|k| k.name == normalized)
        {
            parsed.library = known.library;
            parsed.header = known.header;
        }
        Ok(parsed)
    }

    /// Sets the library's path inside the wheel.
    pub fn with_library(mut self, path: &str) -> Self {
        self.library = Some(path.into());
        self
    }

    /// Sets the C header's path inside the wheel.
    pub fn with_header(mut self, path: &str) -> Self {
        self.header = Some(path.into());
        self
    }

    /// Package name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Exact version.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// The pip requirement, `name==version`.
    pub fn requirement(&self) -> String {
        format!("{}=={}", self.name, self.version)
    }

    fn dir_name(&self) -> String {
        format!("{}-{}", normalize(&self.name), self.version)
    }
}

/// PEP 503 name normalisation: lowercase, runs of `-_.` become `-`.
fn normalize(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut sep = false;
    for c in name.chars() {
        if "-_.".contains(c) {
            sep = true;
        } else {
            if sep && !out.is_empty() {
                out.push('-');
            }
            sep = false;
            out.push(c.to_ascii_lowercase());
        }
    }
    out
}

/// A provisioned plugin: where its files are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProvisionedPlugin {
    /// The unpacked wheel directory.
    pub dir: PathBuf,
    /// The plugin shared library.
    pub library: PathBuf,
    /// `pjrt_c_api.h`, when the wheel ships it.
    pub header: Option<PathBuf>,
}

/// Downloads and unpacks plugin wheels into a cache directory, safely across threads and
/// processes.
#[derive(Debug, Clone)]
pub struct Provisioner {
    cache_dir: PathBuf,
    python: OsString,
    pip_args: Vec<OsString>,
}

impl Provisioner {
    /// A provisioner using `cache_dir` as cache root and `python3` to run pip.
    pub fn new(cache_dir: impl Into<PathBuf>) -> Self {
        Self {
            cache_dir: cache_dir.into(),
            python: "python3".into(),
            pip_args: Vec::new(),
        }
    }

    /// A provisioner configured from the environment (`TESSERA_CACHE_DIR`, `XDG_CACHE_HOME`,
    /// `HOME`, `TESSERA_PYTHON`).
    pub fn from_env() -> Result<Self> {
        Ok(Self::new(default_cache_dir()?).with_env_python())
    }

    /// Uses `TESSERA_PYTHON` to run pip, when set.
    fn with_env_python(mut self) -> Self {
        if let Some(python) = env::var_os(PYTHON_ENV).filter(|v| !v.is_empty()) {
            self.python = python;
        }
        self
    }

    /// Uses `python` to run `python -m pip`.
    pub fn with_python(mut self, python: impl Into<OsString>) -> Self {
        self.python = python.into();
        self
    }

    /// Appends arguments to the `pip download` command line (e.g. `--no-index`,
    /// `--find-links DIR`).
    pub fn with_pip_args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        self.pip_args.extend(args.into_iter().map(Into::into));
        self
    }

    /// The cache root.
    pub fn cache_dir(&self) -> &Path {
        &self.cache_dir
    }

    /// Where `spec` is (or will be) unpacked.
    pub fn plugin_dir(&self, spec: &WheelSpec) -> PathBuf {
        self.cache_dir.join("pjrt-plugins").join(spec.dir_name())
    }

    /// Returns the unpacked wheel, downloading and unpacking it first if needed.
    ///
    /// Concurrent calls (threads or processes) for the same wheel are serialised by a file
    /// lock; the unpacked directory appears atomically (rename), so a reader never sees a
    /// partial one.
    pub fn provision(&self, spec: &WheelSpec) -> Result<ProvisionedPlugin> {
        let dir = self.plugin_dir(spec);
        if let Some(found) = read_manifest(&dir)? {
            return Ok(found);
        }
        let root = self.cache_dir.join("pjrt-plugins");
        fs::create_dir_all(&root)
            .map_err(|e| Error::io(format!("cannot create {}", root.display()), e))?;
        let lock_path = root.join(format!("{}.lock", spec.dir_name()));
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&lock_path)
            .map_err(|e| Error::io(format!("cannot open {}", lock_path.display()), e))?;
        lock.lock_exclusive()
            .map_err(|e| Error::io(format!("cannot lock {}", lock_path.display()), e))?;
        // Another thread or process may have finished while we waited.
        if let Some(found) = read_manifest(&dir)? {
            return Ok(found);
        }
        // We hold the lock: leftovers are from crashed runs, and an incomplete `dir` is junk.
        remove_stale(&root, spec)?;
        if dir.exists() {
            fs::remove_dir_all(&dir)
                .map_err(|e| Error::io(format!("cannot remove incomplete {}", dir.display()), e))?;
        }
        let tmp = root.join(format!(".tmp-{}-{}", spec.dir_name(), unique_suffix()));
        fs::create_dir(&tmp)
            .map_err(|e| Error::io(format!("cannot create {}", tmp.display()), e))?;
        let result = self.download_and_unpack(spec, &tmp, &dir);
        // Best effort: the wheel itself (tens of MB) is not kept.
        let _ = fs::remove_dir_all(&tmp);
        result?;
        drop(lock);
        read_manifest(&dir)?.ok_or_else(|| Error::WheelContents {
            wheel: dir.clone(),
            reason: "the unpacked plugin disappeared".into(),
        })
    }

    fn download_and_unpack(&self, spec: &WheelSpec, tmp: &Path, dir: &Path) -> Result<()> {
        let download = tmp.join("download");
        let unpacked = tmp.join("unpacked");
        for d in [&download, &unpacked] {
            fs::create_dir(d)
                .map_err(|e| Error::io(format!("cannot create {}", d.display()), e))?;
        }
        let wheel = self.pip_download(spec, &download)?;
        let (library, header) = unpack(&wheel, spec, &unpacked)?;
        let mut manifest = format!("spec={}\nlibrary={library}\n", spec.requirement());
        if let Some(header) = header {
            manifest.push_str(&format!("header={header}\n"));
        }
        let manifest_path = unpacked.join(MANIFEST);
        fs::write(&manifest_path, manifest)
            .map_err(|e| Error::io(format!("cannot write {}", manifest_path.display()), e))?;
        fs::rename(&unpacked, dir).map_err(|e| {
            Error::io(
                format!("cannot move {} to {}", unpacked.display(), dir.display()),
                e,
            )
        })
    }

    fn pip_download(&self, spec: &WheelSpec, dest: &Path) -> Result<PathBuf> {
        let requirement = spec.requirement();
        let python = self.python.to_string_lossy().into_owned();
        let output = Command::new(&self.python)
            .args(["-m", "pip", "download", "--no-deps", "--only-binary=:all:"])
            .args(["--disable-pip-version-check", "--no-input", "-d"])
            .arg(dest)
            .args(&self.pip_args)
            .arg(&requirement)
            .output()
            .map_err(|e| match e.kind() {
                io::ErrorKind::NotFound | io::ErrorKind::PermissionDenied => {
                    Error::PythonNotFound {
                        spec: requirement.clone(),
                        python: python.clone(),
                    }
                }
                _ => Error::io(format!("cannot run `{python} -m pip`"), e),
            })?;
        if !output.status.success() {
            let stderr = String::from_utf8_lossy(&output.stderr);
            let stderr_tail = tail(&stderr, 25);
            if stderr.contains("No module named pip") {
                return Err(Error::PipUnavailable {
                    spec: requirement,
                    python,
                    stderr_tail,
                });
            }
            return Err(Error::PipFailed {
                spec: requirement,
                status: output.status.to_string(),
                stderr_tail,
            });
        }
        let wheels: Vec<PathBuf> = fs::read_dir(dest)
            .map_err(|e| Error::io(format!("cannot read {}", dest.display()), e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "whl"))
            .collect();
        match wheels.as_slice() {
            [wheel] => Ok(wheel.clone()),
            _ => Err(Error::PipFailed {
                spec: requirement,
                status: format!(
                    "expected one wheel in {}, found {}",
                    dest.display(),
                    wheels.len()
                ),
                stderr_tail: tail(&String::from_utf8_lossy(&output.stderr), 25),
            }),
        }
    }
}

/// The last `lines` lines of `text`.
fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.trim_end().lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

fn unique_suffix() -> String {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!(
        "{}-{}-{nanos}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

fn remove_stale(root: &Path, spec: &WheelSpec) -> Result<()> {
    let prefix = format!(".tmp-{}-", spec.dir_name());
    let entries =
        fs::read_dir(root).map_err(|e| Error::io(format!("cannot read {}", root.display()), e))?;
    for entry in entries.flatten() {
        if entry.file_name().to_string_lossy().starts_with(&prefix) {
            // Best effort: a leftover that cannot be removed does not block provisioning.
            let _ = fs::remove_dir_all(entry.path());
        }
    }
    Ok(())
}

/// Reads a complete unpacked plugin directory; `None` if absent or incomplete.
fn read_manifest(dir: &Path) -> Result<Option<ProvisionedPlugin>> {
    let text = match fs::read_to_string(dir.join(MANIFEST)) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(Error::io(
                format!("cannot read {}", dir.join(MANIFEST).display()),
                e,
            ))
        }
    };
    let field = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key).and_then(|v| v.strip_prefix('=')))
    };
    let Some(library) = field("library").map(|l| dir.join(l)) else {
        return Ok(None);
    };
    if !library.is_file() {
        return Ok(None);
    }
    let header = field("header").map(|h| dir.join(h)).filter(|h| h.is_file());
    Ok(Some(ProvisionedPlugin {
        dir: dir.to_path_buf(),
        library,
        header,
    }))
}

/// Extracts the library (and header, if any) of `wheel` into `dest`; returns their relative
/// paths.
fn unpack(wheel: &Path, spec: &WheelSpec, dest: &Path) -> Result<(String, Option<String>)> {
    let contents = |reason: String| Error::WheelContents {
        wheel: wheel.to_path_buf(),
        reason,
    };
    let file =
        File::open(wheel).map_err(|e| Error::io(format!("cannot open {}", wheel.display()), e))?;
    let mut zip = zip::ZipArchive::new(BufReader::new(file))
        .map_err(|e| contents(format!("not a readable zip: {e}")))?;
    let names: Vec<String> = zip.file_names().map(str::to_string).collect();
    let is_library = |n: &str| n.ends_with(".so") || n.contains(".so.");
    let library = match &spec.library {
        Some(l) if names.iter().any(|n| n == l) => l.clone(),
        wanted => {
            let libraries: Vec<&String> = names.iter().filter(|n| is_library(n)).collect();
            match (wanted, libraries.as_slice()) {
                (None, [only]) => (*only).clone(),
                (Some(l), found) => {
                    return Err(contents(format!(
                        "has no {l}; shared libraries in it: {found:?}"
                    )))
                }
                (None, found) => {
                    return Err(contents(format!(
                        "expected exactly one shared library, found {found:?}; name it with \
                         WheelSpec::with_library"
                    )))
                }
            }
        }
    };
    let header = match &spec.header {
        Some(h) if names.iter().any(|n| n == h) => Some(h.clone()),
        _ => names.iter().find(|n| n.ends_with("/pjrt_c_api.h")).cloned(),
    };
    for rel in std::iter::once(&library).chain(header.as_ref()) {
        let mut entry = zip
            .by_name(rel)
            .map_err(|e| contents(format!("cannot read entry {rel}: {e}")))?;
        let safe = entry
            .enclosed_name()
            .ok_or_else(|| contents(format!("entry {rel} escapes the wheel directory")))?;
        let target = dest.join(safe);
        if let Some(parent) = target.parent() {
            fs::create_dir_all(parent)
                .map_err(|e| Error::io(format!("cannot create {}", parent.display()), e))?;
        }
        let out = File::create(&target)
            .map_err(|e| Error::io(format!("cannot create {}", target.display()), e))?;
        let mut out = BufWriter::new(out);
        io::copy(&mut entry, &mut out)
            .and_then(|_| out.into_inner().map_err(|e| e.into_error())?.sync_all())
            .map_err(|e| Error::io(format!("cannot extract {rel} to {}", target.display()), e))?;
    }
    Ok((library, header))
}

/// The cache root: `TESSERA_CACHE_DIR`, else `$XDG_CACHE_HOME/tessera`, else
/// `~/.cache/tessera`.
pub fn default_cache_dir() -> Result<PathBuf> {
    let var = |name: &str| {
        env::var_os(name)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(dir) = var(CACHE_DIR_ENV) {
        return Ok(dir);
    }
    if let Some(xdg) = var("XDG_CACHE_HOME").filter(|p| p.is_absolute()) {
        return Ok(xdg.join("tessera"));
    }
    var("HOME")
        .map(|home| home.join(".cache").join("tessera"))
        .ok_or(Error::NoCacheDir)
}

/// The wheel that provides the CPU plugin: `TESSERA_CPU_PLUGIN_WHEEL` if set, else
/// `lammps-jax-pjrt-cpu==0.11.2`.
pub fn cpu_plugin_wheel() -> Result<WheelSpec> {
    match env::var(CPU_WHEEL_ENV) {
        Ok(spec) if !spec.trim().is_empty() => WheelSpec::parse(&spec),
        Ok(_) | Err(env::VarError::NotPresent) => Ok(WheelSpec::lammps_jax_pjrt_cpu()),
        Err(env::VarError::NotUnicode(v)) => Err(Error::InvalidWheelSpec {
            spec: v.to_string_lossy().into_owned(),
            reason: format!("{CPU_WHEEL_ENV} is not valid UTF-8"),
        }),
    }
}

/// Provisions `spec` with a [`Provisioner`] configured from the environment.
pub fn provision_wheel(spec: &WheelSpec) -> Result<ProvisionedPlugin> {
    Provisioner::from_env()?.provision(spec)
}

/// The library named by `variable`, if set; an error if it names no file.
pub(crate) fn library_override(variable: &'static str) -> Result<Option<PathBuf>> {
    let Some(path) = env::var_os(variable).filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    let path = PathBuf::from(path);
    // `metadata` follows symlinks: a link to the library is fine.
    let problem = match fs::metadata(&path) {
        Ok(m) if m.is_file() => return Ok(Some(path)),
        Ok(m) if m.is_dir() => "is a directory",
        Ok(_) => "is not a regular file",
        Err(_) => "does not exist",
    };
    Err(Error::PluginOverrideMissing {
        variable,
        path,
        problem,
    })
}

/// Path of the CPU plugin library: `TESSERA_PJRT_PLUGIN` if set (it must name a file), else the
/// library of the provisioned [`cpu_plugin_wheel`] (downloaded on first use).
pub fn cpu_plugin_path() -> Result<PathBuf> {
    if let Some(path) = library_override(PLUGIN_ENV)? {
        return Ok(path);
    }
    Ok(provision_wheel(&cpu_plugin_wheel()?)?.library)
}

/// The wheel that provides libtpu: `TESSERA_LIBTPU_WHEEL` if set (its library is
/// `libtpu/libtpu.so`), else [`WheelSpec::libtpu`].
pub fn libtpu_wheel() -> Result<WheelSpec> {
    match env::var(LIBTPU_WHEEL_ENV) {
        Ok(spec) if !spec.trim().is_empty() => {
            Ok(WheelSpec::parse(&spec)?.with_library("libtpu/libtpu.so"))
        }
        Ok(_) | Err(env::VarError::NotPresent) => Ok(WheelSpec::libtpu()),
        Err(env::VarError::NotUnicode(v)) => Err(Error::InvalidWheelSpec {
            spec: v.to_string_lossy().into_owned(),
            reason: format!("{LIBTPU_WHEEL_ENV} is not valid UTF-8"),
        }),
    }
}

/// Environment libtpu reads when it loads, set for compile-only use: skip the cloud metadata
/// server (on a machine that is not a TPU VM its queries time out, for minutes), let several
/// processes load libtpu at once (its `/tmp/libtpu_lockfile` guards TPU devices, which a
/// compile-only process never opens), and describe the local host so libtpu does not log
/// errors about it. The compiled program depends only on the topology it is compiled for
/// (measured: identical executables for v5e with and without the last two).
pub const LIBTPU_COMPILE_ONLY_ENV: [(&str, &str); 4] = [
    ("TPU_SKIP_MDS_QUERY", "1"),
    ("ALLOW_MULTIPLE_LIBTPU_LOAD", "1"),
    ("TPU_WORKER_HOSTNAMES", "localhost"),
    ("TPU_ACCELERATOR_TYPE", "v5p-8"),
];

/// The libtpu flag that keeps libtpu from remapping the program's text to huge pages: libtpu
/// 0.0.50.1 tries it when it starts and, where the binary's text is not 2 MiB-aligned in its
/// file (tessera's, on these machines), writes `E... hugepage_text.cc:344] RAW: File offset
/// incorrectly aligned for file-backed THP` to stderr, past `TF_CPP_MIN_LOG_LEVEL`. A
/// compile gains nothing from the remap; 0.0.42.1 accepts the flag too.
pub const LIBTPU_NO_HUGEPAGE_TEXT_FLAG: &str = "--hugepage_text=false";

/// Sets each of [`LIBTPU_COMPILE_ONLY_ENV`] that is not set yet, and adds
/// [`LIBTPU_NO_HUGEPAGE_TEXT_FLAG`] to `LIBTPU_INIT_ARGS` unless it names `hugepage_text`
/// already. Call it before other threads read the environment (at the start of `main`; tests
/// get them from `.cargo/config.toml`): changing the environment while another thread reads
/// it is a data race in libc.
pub fn set_libtpu_compile_only_env() {
    for (name, value) in LIBTPU_COMPILE_ONLY_ENV {
        if env::var_os(name).is_none() {
            env::set_var(name, value);
        }
    }
    let init_args = env::var(crate::LIBTPU_INIT_ARGS).unwrap_or_default();
    if !init_args.contains("hugepage_text") {
        let flags = format!("{init_args} {LIBTPU_NO_HUGEPAGE_TEXT_FLAG}");
        env::set_var(crate::LIBTPU_INIT_ARGS, flags.trim_start());
    }
}

/// Path of libtpu (the TPU compiler, for compile-only): `TESSERA_LIBTPU` if set (it must
/// exist), else the library of the provisioned [`libtpu_wheel`], unpacked under
/// `TESSERA_LIBTPU_CACHE_DIR` or the cache root (downloaded on first use, ~210 MB).
pub fn libtpu_path() -> Result<PathBuf> {
    if let Some(path) = library_override(LIBTPU_ENV)? {
        return Ok(path);
    }
    let cache = match env::var_os(LIBTPU_CACHE_DIR_ENV).filter(|v| !v.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => default_cache_dir()?,
    };
    let provisioner = Provisioner::new(cache).with_env_python();
    Ok(provisioner.provision(&libtpu_wheel()?)?.library)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_known_and_unknown_specs() {
        let s = WheelSpec::parse("xla_cpu_pjrt==0.0.1").unwrap();
        assert_eq!(s.library, WheelSpec::xla_cpu_pjrt().library);
        assert_eq!(s.dir_name(), "xla-cpu-pjrt-0.0.1");
        let s = WheelSpec::parse(" lammps-jax-pjrt-cpu == 0.11.2 ").unwrap();
        assert_eq!(s, WheelSpec::lammps_jax_pjrt_cpu());
        let s = WheelSpec::parse("Some.Other_pkg==1.0rc1").unwrap();
        assert_eq!(s.library, None);
        assert_eq!(s.dir_name(), "some-other-pkg-1.0rc1");
        for bad in [
            "xla-cpu-pjrt",
            "==1",
            "x==",
            "--index-url==1",
            "x==1 2",
            "x==>=1",
        ] {
            assert!(
                matches!(WheelSpec::parse(bad), Err(Error::InvalidWheelSpec { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn tail_keeps_last_lines() {
        assert_eq!(tail("a\nb\nc\n", 2), "b\nc");
        assert_eq!(tail("a", 5), "a");
    }
}
