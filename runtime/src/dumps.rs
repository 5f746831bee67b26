//! libtpu's compiler dumps, read back compile by compile.
//!
//! libtpu writes what its compiler made of each kernel (the scheduled VLIW bundles, the slot
//! use per bundle) when its flag `--xla_jf_dump_to=DIR` is set. It reads its flags from
//! `LIBTPU_INIT_ARGS` once, when it loads (measured with libtpu 0.0.42.1: a value set after
//! the first topology was created changes nothing, and the flags are not compile options), so
//! the dump directory is a property of the process:
//!
//! - [`enable_libtpu_dumps`], called at the start of `main` (one thread, libtpu not loaded
//!   yet), creates a private temporary directory and adds the dump flags to
//!   `LIBTPU_INIT_ARGS`; a directory the user already named there is used as it is.
//! - [`Topology::compile_with_dumps`](crate::Topology::compile_with_dumps) compiles and
//!   returns the files that compile wrote. While libtpu dumps, compiles run one at a time in
//!   the process (every [`Topology::compile`](crate::Topology::compile) too), so each
//!   compile's files are its own; in the private directory they are removed once read (or
//!   unread), in a user's directory they stay.
//!
//! Nothing here starts a process; a process that loaded libtpu without the flags gets no
//! dumps (`None`), and starting over is the caller's decision.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock, PoisonError};

use crate::error::{Error, Result};

/// The variable libtpu reads its flags from when it loads.
pub const LIBTPU_INIT_ARGS: &str = "LIBTPU_INIT_ARGS";
/// libtpu's flag naming the directory it dumps each compiled kernel's bundles into.
const DUMP_TO: &str = "--xla_jf_dump_to=";
/// Only the final (scheduled) pass: the bundles as they run, and their slot use.
const FINAL_PASS_ONLY: &str = "--xla_jf_dump_llo_pass_label_regex=final";

/// The dump directory libtpu was loaded with in this process (`None` inside: loaded without
/// one); unset until libtpu loads.
static AT_LOAD: OnceLock<Option<DumpDir>> = OnceLock::new();
/// The private directory [`enable_libtpu_dumps`] made.
static PRIVATE: OnceLock<PathBuf> = OnceLock::new();
/// Compiles that collect dumps run one at a time.
static COLLECTING: Mutex<()> = Mutex::new(());

#[derive(Debug, Clone)]
struct DumpDir {
    path: PathBuf,
    /// Made by [`enable_libtpu_dumps`]: files are removed once read.
    private: bool,
}

/// The private dump directory of this process, while it exists; dropping it removes the
/// directory (at the end of `main`, after the last compile).
#[derive(Debug)]
pub struct LibtpuDumps {
    path: PathBuf,
    private: bool,
}

impl LibtpuDumps {
    /// Where libtpu writes its dumps.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for LibtpuDumps {
    fn drop(&mut self) {
        if self.private {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// Makes libtpu dump every kernel it compiles in this process: creates a private temporary
/// directory and appends `--xla_jf_dump_to=DIR --xla_jf_dump_llo_pass_label_regex=final` to
/// `LIBTPU_INIT_ARGS` (keeping the user's flags), unless `LIBTPU_INIT_ARGS` already names a
/// dump directory, which is then used as it is (created when missing) and never emptied.
///
/// Call it at the start of `main`, before other threads start (it changes the environment)
/// and before libtpu loads (libtpu reads the variable then, once); after libtpu has loaded it
/// is an error. Keep the returned value alive while compiling: dropping it removes the
/// private directory.
pub fn enable_libtpu_dumps() -> Result<LibtpuDumps> {
    if AT_LOAD.get().is_some() {
        return Err(Error::LibtpuAlreadyLoaded);
    }
    let current = std::env::var(LIBTPU_INIT_ARGS).unwrap_or_default();
    if let Some(path) = dump_dir_in(&current) {
        // libtpu no longer creates it when it loads (0.0.50.1), and the first compile lists
        // it: made here, as a dump flag the user gives promises.
        std::fs::create_dir_all(&path).map_err(|e| {
            Error::io(
                format!(
                    "creating {} (the dump directory {LIBTPU_INIT_ARGS} names)",
                    path.display()
                ),
                e,
            )
        })?;
        return Ok(LibtpuDumps {
            path,
            private: false,
        });
    }
    if let Some(path) = PRIVATE.get() {
        return Err(Error::LibtpuDumpsEnabled { path: path.clone() });
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let path = std::env::temp_dir().join(format!(
        "tessera-libtpu-dumps-{}-{nanos}",
        std::process::id()
    ));
    std::fs::create_dir_all(&path)
        .map_err(|e| Error::io(format!("creating {}", path.display()), e))?;
    let _ = PRIVATE.set(path.clone());
    let flags = format!("{DUMP_TO}{} {FINAL_PASS_ONLY}", path.display());
    let value = if current.trim().is_empty() {
        flags
    } else {
        format!("{} {flags}", current.trim())
    };
    std::env::set_var(LIBTPU_INIT_ARGS, value);
    Ok(LibtpuDumps {
        path,
        private: true,
    })
}

/// The directory libtpu writes its compiler dumps to in this process: `None` before libtpu
/// has loaded or when it loaded without `--xla_jf_dump_to`.
pub fn libtpu_dump_dir() -> Option<&'static Path> {
    AT_LOAD.get()?.as_ref().map(|d| d.path.as_path())
}

/// Records the dump directory libtpu sees as it loads (the first `Plugin::libtpu`).
pub(crate) fn record_libtpu_load() {
    AT_LOAD.get_or_init(|| {
        let args = std::env::var(LIBTPU_INIT_ARGS).unwrap_or_default();
        dump_dir_in(&args).map(|path| DumpDir {
            private: PRIVATE.get() == Some(&path),
            path,
        })
    });
}

/// The value of the last `--xla_jf_dump_to=` in `args` (libtpu's flags, space separated).
fn dump_dir_in(args: &str) -> Option<PathBuf> {
    args.split_whitespace()
        .rev()
        .find_map(|a| a.strip_prefix(DUMP_TO))
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
}

/// One file libtpu dumped during a compile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DumpFile {
    /// The file name (libtpu's: `<id>-<HLO instruction>-<NN>-<what>.txt`).
    pub name: String,
    pub text: String,
}

/// Runs `compile` and collects the dump files it wrote whose names `keep` accepts, when libtpu
/// dumps in this process (else runs it alone and returns `None`).
pub(crate) fn collecting<T>(
    keep: &dyn Fn(&str) -> bool,
    compile: impl FnOnce() -> Result<T>,
) -> Result<(T, Option<Vec<DumpFile>>)> {
    let Some(Some(dir)) = AT_LOAD.get() else {
        return Ok((compile()?, None));
    };
    let _one_at_a_time = COLLECTING.lock().unwrap_or_else(PoisonError::into_inner);
    let before = file_names(&dir.path)?;
    let result = compile();
    let new: Vec<String> = file_names(&dir.path)?
        .into_iter()
        .filter(|n| !before.contains(n))
        .collect();
    let mut files = Vec::new();
    let mut read_error = None;
    for name in &new {
        let path = dir.path.join(name);
        if result.is_ok() && read_error.is_none() && keep(name) {
            match std::fs::read_to_string(&path) {
                Ok(text) => files.push(DumpFile {
                    name: name.clone(),
                    text,
                }),
                Err(e) => read_error = Some(Error::io(format!("reading {}", path.display()), e)),
            }
        }
        if dir.private {
            let _ = std::fs::remove_file(&path);
        }
    }
    let value = result?;
    match read_error {
        Some(e) => Err(e),
        None => Ok((value, Some(files))),
    }
}

/// Names of the plain files directly in `dir`.
fn file_names(dir: &Path) -> Result<HashSet<String>> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| Error::io(format!("listing {}", dir.display()), e))?;
    let mut names = HashSet::new();
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(format!("listing {}", dir.display()), e))?;
        if entry.file_type().is_ok_and(|t| t.is_file()) {
            if let Some(name) = entry.file_name().to_str() {
                names.insert(name.to_string());
            }
        }
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_dump_flag_names_the_directory() {
        assert_eq!(dump_dir_in(""), None);
        assert_eq!(dump_dir_in("--xla_tpu_x=1"), None);
        assert_eq!(dump_dir_in("--xla_jf_dump_to="), None);
        assert_eq!(
            dump_dir_in("--a=1 --xla_jf_dump_to=/tmp/x  --xla_jf_dump_to=/tmp/y --b"),
            Some(PathBuf::from("/tmp/y"))
        );
    }
}
