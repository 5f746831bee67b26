//! The files a command writes: every path checked before anything is computed (a probe file
//! is created and removed in each directory), each result written, once computed, to a
//! temporary file in its own directory and renamed into place only when the whole command
//! succeeded, so a failing command leaves no output behind (and no half-written or stale mix
//! of old and new results).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use tempfile::NamedTempFile;
use tessera::dsl::HostArray;
use tessera::npy::write_npy;

/// One output: the flag that named it, where it goes (as given, and its canonical directory
/// and file name) and, once written, the temporary file holding it.
struct Staged {
    label: String,
    path: PathBuf,
    dir: PathBuf,
    name: PathBuf,
    temp: Option<NamedTempFile>,
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

    /// Writes the output into a new temporary file with `write`.
    fn write(&mut self, write: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
        let temp = self.temp_file()?;
        write(temp.path())?;
        self.temp = Some(temp);
        Ok(())
    }
}

/// A command's outputs, staged (see the module docs). Dropped without [`Outputs::commit`],
/// the temporary files are removed and nothing is written.
pub struct Outputs {
    staged: Vec<Staged>,
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
    let dir = dir
        .canonicalize()
        .with_context(|| format!("{label} {shown}: cannot resolve {}", dir.display()))?;
    Ok((dir, PathBuf::from(name)))
}

impl Outputs {
    /// Checks `outputs` (flag, path) and creates their temporary files. Refuses a path that
    /// is a directory or not a regular file, in a directory that does not exist or cannot be
    /// written, two outputs naming one file, and an output naming one of `inputs` (flag,
    /// path; inputs that do not exist are skipped: reading them reports it).
    pub fn prepare(outputs: &[(&str, &Path)], inputs: &[(&str, &Path)]) -> Result<Self> {
        let inputs: Vec<(&str, PathBuf)> = inputs
            .iter()
            .filter_map(|(label, p)| Some((*label, p.canonicalize().ok()?)))
            .collect();
        let mut seen: Vec<(&str, &Path, PathBuf)> = Vec::new();
        let mut staged = Vec::with_capacity(outputs.len());
        for &(label, path) in outputs {
            let (dir, name) = identity(label, path)?;
            let full = dir.join(&name);
            if let Some((other, other_path, _)) = seen.iter().find(|(_, _, f)| *f == full) {
                bail!(
                    "{other} {} and {label} {} name the same file; give each output its own \
                     file",
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
            let (label, path) = (s.label, s.path);
            let Some(temp) = s.temp else {
                bail!(
                    "{label} {} was never written (a tessera bug)",
                    path.display()
                );
            };
            temp.persist(&path).map_err(|e| {
                anyhow::anyhow!("{label} {}: cannot write: {}", path.display(), e.error)
            })?;
        }
        Ok(())
    }
}
