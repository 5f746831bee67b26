//! The files a command writes, the one output layer of the `tessera` commands and of
//! `examples/train.rs` (which includes this file by path): every path checked before
//! anything is computed (a probe file is created and removed in each directory), each result
//! written, once computed, to a temporary file (or directory) in its own directory and renamed
//! into place only when the command commits, so a failing command leaves no output behind
//! (and no half-written or stale mix of old and new results).
//!
//! Refused before anything runs: a file output that names a directory, an existing path
//! that is not a regular file (a device such as `/dev/null`, a pipe: renaming over it would
//! replace it), a directory that does not exist or cannot be written, two outputs naming one
//! path, and an output naming an input of the command.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use tempfile::{NamedTempFile, TempDir};
use tessera::dsl::HostArray;
use tessera::npy::write_npy;

/// Whether an output is one file or a directory of files (`--emit-mosaic DIR`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
}

/// Where an output's content waits until commit.
enum Temp {
    File(NamedTempFile),
    Dir(TempDir),
}

/// One output: the flag that named it, where it goes (as given, and its canonical directory
/// and file name) and, once written, the temporary file holding it.
struct Staged {
    label: String,
    path: PathBuf,
    kind: Kind,
    dir: PathBuf,
    name: PathBuf,
    temp: Option<Temp>,
}

impl Staged {
    /// A new temporary file beside the output: hidden, named after it.
    fn temp_file(&self) -> Result<NamedTempFile> {
        let mut prefix = std::ffi::OsString::from(".");
        prefix.push(&self.name);
        prefix.push(".");
        let mut builder = tempfile::Builder::new();
        builder.prefix(&prefix).suffix(".tmp");
        // Temporary files are private (0600); the output gets what a plain create gives
        // (0666 less the umask).
        #[cfg(unix)]
        builder.permissions(std::os::unix::fs::PermissionsExt::from_mode(0o666));
        builder.tempfile_in(&self.dir).with_context(|| {
            format!(
                "{} {}: cannot create a file in {}",
                self.label,
                self.path.display(),
                self.dir.display()
            )
        })
    }

    /// Writes the output into a new temporary file (or, for a directory output, a new
    /// temporary directory) with `write`; what it wrote is removed if it fails.
    fn write(&mut self, write: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
        let temp = match self.kind {
            Kind::File => Temp::File(self.temp_file()?),
            Kind::Dir => {
                let mut prefix = std::ffi::OsString::from(".");
                prefix.push(&self.name);
                prefix.push(".");
                let temp = tempfile::Builder::new()
                    .prefix(&prefix)
                    .suffix(".tmp")
                    .tempdir_in(&self.dir)
                    .with_context(|| {
                        format!(
                            "{} {}: cannot create a directory in {}",
                            self.label,
                            self.path.display(),
                            self.dir.display()
                        )
                    })?;
                Temp::Dir(temp)
            }
        };
        write(match &temp {
            Temp::File(f) => f.path(),
            Temp::Dir(d) => d.path(),
        })?;
        self.temp = Some(temp);
        Ok(())
    }

    /// Renames the written output into place: a file over its target; a directory as the
    /// target when there is none yet, else each of its files into the existing one.
    fn commit(self) -> Result<()> {
        let (label, path) = (self.label, self.path);
        let cannot =
            |e: &dyn std::fmt::Display| anyhow!("{label} {}: cannot write: {e}", path.display());
        match self.temp {
            None => bail!(
                "{label} {} was never written (a tessera bug)",
                path.display()
            ),
            Some(Temp::File(temp)) => {
                temp.persist(&path).map_err(|e| cannot(&e.error))?;
            }
            Some(Temp::Dir(temp)) => {
                let target = self.dir.join(&self.name);
                if !target.exists() {
                    std::fs::rename(temp.path(), &target).map_err(|e| cannot(&e))?;
                    // Renamed away: nothing is left for the guard to remove.
                    let _ = temp.keep();
                    return Ok(());
                }
                for entry in std::fs::read_dir(temp.path()).map_err(|e| cannot(&e))? {
                    let entry = entry.map_err(|e| cannot(&e))?;
                    std::fs::rename(entry.path(), target.join(entry.file_name()))
                        .map_err(|e| cannot(&e))?;
                }
            }
        }
        Ok(())
    }
}

/// A command's outputs, staged (see the module docs). Dropped without [`Outputs::commit`],
/// the temporary files are removed and nothing is written.
pub struct Outputs {
    staged: Vec<Staged>,
}

/// The directory `path` (named by `label`) goes in, canonicalised; it must exist.
fn parent(label: &str, path: &Path) -> Result<PathBuf> {
    let shown = path.display();
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => bail!("{label} {shown}: {} is not a directory", dir.display()),
        Err(_) => bail!(
            "{label} {shown}: the directory {} does not exist; create it first",
            dir.display()
        ),
    }
    dir.canonicalize()
        .with_context(|| format!("{label} {shown}: cannot resolve {}", dir.display()))
}

/// Where the directory output `path` would be: its parent canonicalised, and its name.
fn dir_identity(label: &str, path: &Path) -> Result<(PathBuf, PathBuf)> {
    let shown = path.display();
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => {
            let full = path
                .canonicalize()
                .with_context(|| format!("{label} {shown}: cannot resolve it"))?;
            return match (full.parent(), full.file_name()) {
                (Some(dir), Some(name)) => Ok((dir.to_path_buf(), PathBuf::from(name))),
                _ => bail!("{label} {shown} is the root directory; give a directory below it"),
            };
        }
        Ok(_) => bail!("{label} {shown} exists and is not a directory; give a directory path"),
        Err(_) => {}
    }
    let Some(name) = path.file_name() else {
        bail!("{label} {shown} names no directory; give a directory path");
    };
    Ok((parent(label, path)?, PathBuf::from(name)))
}

/// Where `path` would be, independent of how it is spelled: its directory canonicalised,
/// and its file name.
fn identity(label: &str, path: &Path) -> Result<(PathBuf, PathBuf)> {
    let shown = path.display();
    let Some(name) = path.file_name() else {
        bail!("{label} {shown} names a directory; give a file path");
    };
    if path
        .as_os_str()
        .to_string_lossy()
        .ends_with(std::path::MAIN_SEPARATOR)
    {
        bail!("{label} {shown} names a directory; give a file path");
    }
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => bail!("{label} {shown} is a directory; give a file path"),
        Ok(m) if !m.is_file() => {
            bail!("{label} {shown} is not a regular file; give a file path")
        }
        _ => {}
    }
    Ok((parent(label, path)?, PathBuf::from(name)))
}

impl Outputs {
    /// Checks the file outputs `outputs` (flag, path) as [`Outputs::prepare_kinds`] does.
    pub fn prepare(outputs: &[(&str, &Path)], inputs: &[(&str, &Path)]) -> Result<Self> {
        let outputs: Vec<(&str, &Path, Kind)> =
            outputs.iter().map(|&(l, p)| (l, p, Kind::File)).collect();
        Self::prepare_kinds(&outputs, inputs)
    }

    /// Checks `outputs` (flag, path, kind) and that their directories can be written (a
    /// probe file is created and removed). Refuses a file path that is a directory or not a
    /// regular file, a directory path that is not a directory, a missing parent directory,
    /// two outputs naming one path, and an output naming one of `inputs` (flag, path; inputs
    /// that do not exist are skipped: reading them reports it).
    pub fn prepare_kinds(
        outputs: &[(&str, &Path, Kind)],
        inputs: &[(&str, &Path)],
    ) -> Result<Self> {
        let inputs: Vec<(&str, PathBuf)> = inputs
            .iter()
            .filter_map(|(label, p)| Some((*label, p.canonicalize().ok()?)))
            .collect();
        let mut seen: Vec<(&str, &Path, PathBuf)> = Vec::new();
        let mut staged = Vec::with_capacity(outputs.len());
        for &(label, path, kind) in outputs {
            let (dir, name) = match kind {
                Kind::File => identity(label, path)?,
                Kind::Dir => dir_identity(label, path)?,
            };
            let full = dir.join(&name);
            if let Some((other, other_path, _)) = seen.iter().find(|(_, _, f)| *f == full) {
                bail!(
                    "{other} {} and {label} {} name the same path; give each output its own \
                     path",
                    other_path.display(),
                    path.display()
                );
            }
            if let Some((input, _)) = inputs.iter().find(|(_, p)| *p == full) {
                bail!(
                    "{label} {} is also the input {input}; writing it would overwrite the \
                     input, so give the output another file",
                    path.display()
                );
            }
            seen.push((label, path, full));
            let output = Staged {
                label: label.to_string(),
                path: path.to_path_buf(),
                kind,
                dir,
                name,
                temp: None,
            };
            // Can the directory be written? (The probe is removed at once, so an interrupted
            // computation leaves nothing behind.)
            drop(output.temp_file()?);
            staged.push(output);
        }
        Ok(Outputs { staged })
    }

    /// The index of the first output named by `label`.
    pub fn position(&self, label: &str) -> Option<usize> {
        self.staged.iter().position(|s| s.label == label)
    }

    /// Writes output `label` (its first) with `write`, given the temporary path to write
    /// (a file, or a directory for a [`Kind::Dir`] output).
    pub fn write_with(
        &mut self,
        label: &str,
        write: impl FnOnce(&Path) -> Result<()>,
    ) -> Result<()> {
        let i = self
            .position(label)
            .ok_or_else(|| anyhow!("{label} is not an output of this command (a tessera bug)"))?;
        self.staged[i].write(write)
    }

    /// Writes output `index` as a `.npy` file (into a temporary file beside it).
    pub fn write_npy(&mut self, index: usize, a: &HostArray) -> Result<()> {
        let s = &mut self.staged[index];
        let (label, shown) = (s.label.clone(), s.path.display().to_string());
        s.write(|temp| {
            write_npy(temp, a).map_err(|e| anyhow::anyhow!("{label} {shown}: {}", e.message))
        })
    }

    /// Writes output `label` as a `.npy` file, when the command has it.
    pub fn write_npy_if(&mut self, label: &str, a: &HostArray) -> Result<()> {
        match self.position(label) {
            Some(i) => self.write_npy(i, a),
            None => Ok(()),
        }
    }

    /// Writes output `label` as text, when the command has it.
    pub fn write_text_if(&mut self, label: &str, text: &str) -> Result<()> {
        let Some(s) = self.position(label).map(|i| &mut self.staged[i]) else {
            return Ok(());
        };
        let (label, shown) = (s.label.clone(), s.path.display().to_string());
        s.write(|temp| {
            std::fs::write(temp, text).with_context(|| format!("{label} {shown}: cannot write"))
        })
    }

    /// Renames every output into place.
    pub fn commit(self) -> Result<()> {
        for s in self.staged {
            s.commit()?;
        }
        Ok(())
    }
}
