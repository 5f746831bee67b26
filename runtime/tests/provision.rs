//! Plugin provisioning: concurrent provisioning into an empty cache, and the errors for a
//! missing interpreter, a failed download and a wheel without the expected library. Uses a
//! tiny locally built wheel and `pip download --no-index --find-links`, so it needs python3
//! with pip but no network.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier};

use tessera_runtime::{Error, Provisioner, WheelSpec};

const NAME: &str = "tessera-fake-plugin";
const VERSION: &str = "1.0.0";
const LIBRARY: &str = "tessera_fake_plugin/libfake_pjrt.so";
const LIBRARY_BYTES: &[u8] = b"not really a shared library, just bytes to unpack";

struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "tessera-provision-{tag}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Writes a minimal valid wheel for `NAME==VERSION` into `dir`.
fn write_fake_wheel(dir: &Path, extra_library: bool) {
    let dist = format!("{}-{VERSION}", NAME.replace('-', "_"));
    let path = dir.join(format!("{dist}-py3-none-any.whl"));
    let mut zip = zip::ZipWriter::new(std::fs::File::create(path).unwrap());
    let options = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated);
    let mut add = |name: &str, data: &[u8]| {
        zip.start_file(name, options).unwrap();
        zip.write_all(data).unwrap();
    };
    add(LIBRARY, LIBRARY_BYTES);
    if extra_library {
        add("tessera_fake_plugin/libother.so", b"x");
    }
    add(
        "tessera_fake_plugin/include/pjrt_c_api.h",
        b"/* header */\n",
    );
    add(
        &format!("{dist}.dist-info/METADATA"),
        format!("Metadata-Version: 2.1\nName: {NAME}\nVersion: {VERSION}\n").as_bytes(),
    );
    add(
        &format!("{dist}.dist-info/WHEEL"),
        b"Wheel-Version: 1.0\nGenerator: tessera-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    );
    add(&format!("{dist}.dist-info/RECORD"), b"");
    zip.finish().unwrap();
}

fn offline(cache: &Path, wheels: &Path) -> Provisioner {
    Provisioner::new(cache).with_pip_args([
        "--no-index".as_ref(),
        "--find-links".as_ref(),
        wheels.as_os_str(),
    ])
}

#[test]
fn concurrent_provisioning_into_an_empty_cache() {
    let wheels = TempDir::new("wheels");
    write_fake_wheel(&wheels.0, false);
    let cache = TempDir::new("cache");
    let spec = WheelSpec::new(NAME, VERSION).unwrap();
    let provisioner = offline(&cache.0, &wheels.0);

    let threads = 4;
    let barrier = Arc::new(Barrier::new(threads));
    let results: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                let barrier = barrier.clone();
                let (provisioner, spec) = (&provisioner, &spec);
                s.spawn(move || {
                    barrier.wait();
                    provisioner.provision(spec)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let first = results[0].as_ref().unwrap_or_else(|e| panic!("{e}"));
    for r in &results {
        assert_eq!(r.as_ref().unwrap(), first);
    }
    assert_eq!(first.library, provisioner.plugin_dir(&spec).join(LIBRARY));
    assert_eq!(std::fs::read(&first.library).unwrap(), LIBRARY_BYTES);
    let header = first
        .header
        .as_ref()
        .expect("the header is found automatically");
    assert!(header.ends_with("include/pjrt_c_api.h"));
    // No temporary directories are left behind.
    let leftovers: Vec<_> = std::fs::read_dir(cache.0.join("pjrt-plugins"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".tmp-"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");

    // A second provisioning finds the cache without running pip (a broken interpreter proves
    // it is not run).
    let again = provisioner
        .clone()
        .with_python("/nonexistent/python3")
        .provision(&spec)
        .unwrap();
    assert_eq!(&again, first);
}

#[test]
fn concurrent_provisioning_from_two_processes() {
    // The child re-runs this test binary on `child_provisions`, which provisions into the cache
    // named by TESSERA_TEST_PROVISION_CACHE.
    let wheels = TempDir::new("wheels-proc");
    write_fake_wheel(&wheels.0, false);
    let cache = TempDir::new("cache-proc");
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..2)
        .map(|_| {
            std::process::Command::new(&exe)
                .args(["--exact", "child_provisions", "--nocapture"])
                .env("TESSERA_TEST_PROVISION_CACHE", &cache.0)
                .env("TESSERA_TEST_PROVISION_WHEELS", &wheels.0)
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    for mut child in children {
        assert!(child.wait().unwrap().success());
    }
    let spec = WheelSpec::new(NAME, VERSION).unwrap();
    let dir = Provisioner::new(&cache.0).plugin_dir(&spec);
    assert_eq!(std::fs::read(dir.join(LIBRARY)).unwrap(), LIBRARY_BYTES);
}

#[test]
fn child_provisions() {
    let (Some(cache), Some(wheels)) = (
        std::env::var_os("TESSERA_TEST_PROVISION_CACHE"),
        std::env::var_os("TESSERA_TEST_PROVISION_WHEELS"),
    ) else {
        return; // only meaningful as the child of the test above
    };
    let spec = WheelSpec::new(NAME, VERSION).unwrap();
    let plugin = offline(Path::new(&cache), Path::new(&wheels))
        .provision(&spec)
        .unwrap();
    assert_eq!(std::fs::read(plugin.library).unwrap(), LIBRARY_BYTES);
}

#[test]
fn missing_python_is_one_clear_error() {
    let cache = TempDir::new("nopython");
    let spec = WheelSpec::new(NAME, VERSION).unwrap();
    let err = Provisioner::new(&cache.0)
        .with_python("/nonexistent/bin/python3")
        .provision(&spec)
        .unwrap_err();
    assert!(matches!(err, Error::PythonNotFound { .. }), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("/nonexistent/bin/python3") && text.contains("pip"),
        "{text}"
    );
    assert!(text.contains("TESSERA_PJRT_PLUGIN"), "{text}");
}

#[test]
fn failed_download_carries_pip_stderr() {
    let wheels = TempDir::new("empty-wheels");
    let cache = TempDir::new("nodownload");
    let spec = WheelSpec::new("tessera-no-such-package", "0.0.1").unwrap();
    let err = offline(&cache.0, &wheels.0).provision(&spec).unwrap_err();
    match &err {
        Error::PipFailed {
            spec, stderr_tail, ..
        } => {
            assert_eq!(spec, "tessera-no-such-package==0.0.1");
            assert!(
                stderr_tail.contains("tessera-no-such-package"),
                "{stderr_tail}"
            );
        }
        other => panic!("expected PipFailed, got {other}"),
    }
    // Nothing half-made is left in the cache.
    let dir = Provisioner::new(&cache.0).plugin_dir(&spec);
    assert!(!dir.exists());
}

#[test]
fn wheel_without_the_named_library() {
    let wheels = TempDir::new("wheels-lib");
    write_fake_wheel(&wheels.0, true);
    let cache = TempDir::new("cache-lib");
    // Two .so files and no library named: ambiguous.
    let spec = WheelSpec::new(NAME, VERSION).unwrap();
    let err = offline(&cache.0, &wheels.0).provision(&spec).unwrap_err();
    assert!(matches!(err, Error::WheelContents { .. }), "{err}");
    // Naming a library that is not there.
    let spec = spec.with_library("nope/libnope.so");
    let err = offline(&cache.0, &wheels.0).provision(&spec).unwrap_err();
    assert!(err.to_string().contains("nope/libnope.so"), "{err}");
    // Naming the right one works.
    let spec = WheelSpec::new(NAME, VERSION).unwrap().with_library(LIBRARY);
    let plugin = offline(&cache.0, &wheels.0).provision(&spec).unwrap();
    assert_eq!(std::fs::read(plugin.library).unwrap(), LIBRARY_BYTES);
}
