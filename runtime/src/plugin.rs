//! Loading a PJRT plugin, calling its function table, and turning `PJRT_Error`s into [`Error`]s.

use std::ffi::c_char;
use std::fmt;
use std::path::{Path, PathBuf};
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

use crate::error::{Error, ErrorCode, Result};
use crate::ffi::{self, PJRT_Api};

/// Reads a function pointer from the plugin's table, checking that the plugin's table is long
/// enough to contain the slot (older plugins have shorter tables) and that it is non-null.
/// Evaluates to `Result<unsafe extern "C" fn(..) -> ..>`.
macro_rules! api_fn {
    ($plugin:expr, $func:ident) => {{
        let plugin: &$crate::plugin::PluginInner = $plugin;
        let offset = ::core::mem::offset_of!($crate::ffi::PJRT_Api, $func);
        let slot = if offset + ::core::mem::size_of::<usize>() <= plugin.api_size {
            // SAFETY: `plugin.api` points to the plugin's function table, which is at least
            // `api_size` bytes long and lives for the whole process (the library is never
            // unloaded); the slot lies inside it. A slot holds a function pointer or null,
            // which is exactly the representation of `Option<unsafe extern "C" fn ..>`.
            unsafe { ::core::ptr::addr_of!((*plugin.api).$func).read() }
        } else {
            None
        };
        slot.ok_or_else(|| plugin.missing(stringify!($func)))
    }};
}
pub(crate) use api_fn;

/// A value of a PJRT named value: a plugin attribute, or a client/topology create option.
#[derive(Debug, Clone, PartialEq)]
pub enum NamedValue {
    /// `kString`.
    String(String),
    /// `kInt64`.
    Int64(i64),
    /// `kInt64List`.
    Int64List(Vec<i64>),
    /// `kFloat`.
    Float(f32),
    /// `kBool`.
    Bool(bool),
}

/// Builds the raw `PJRT_NamedValue` array for `options`; the result borrows from `options`.
pub(crate) fn raw_named_values(options: &[(String, NamedValue)]) -> Vec<ffi::PJRT_NamedValue> {
    options
        .iter()
        .map(|(name, value)| {
            let mut raw = ffi::PJRT_NamedValue::init();
            raw.name = name.as_ptr().cast::<c_char>();
            raw.name_size = name.len();
            match value {
                NamedValue::String(s) => {
                    raw.type_ = ffi::PJRT_NamedValue_kString;
                    raw.value.string_value = s.as_ptr().cast::<c_char>();
                    raw.value_size = s.len();
                }
                NamedValue::Int64(v) => {
                    raw.type_ = ffi::PJRT_NamedValue_kInt64;
                    raw.value.int64_value = *v;
                    raw.value_size = 1;
                }
                NamedValue::Int64List(v) => {
                    raw.type_ = ffi::PJRT_NamedValue_kInt64List;
                    raw.value.int64_array_value = v.as_ptr();
                    raw.value_size = v.len();
                }
                NamedValue::Float(v) => {
                    raw.type_ = ffi::PJRT_NamedValue_kFloat;
                    raw.value.float_value = *v;
                    raw.value_size = 1;
                }
                NamedValue::Bool(v) => {
                    raw.type_ = ffi::PJRT_NamedValue_kBool;
                    raw.value.bool_value = *v;
                    raw.value_size = 1;
                }
            }
            raw
        })
        .collect()
}

/// Copies a plugin-owned `(pointer, length)` string.
///
/// # Safety
/// `ptr` must be null or valid for reads of `len` bytes.
pub(crate) unsafe fn copy_string(ptr: *const c_char, len: usize) -> String {
    if ptr.is_null() || len == 0 {
        return String::new();
    }
    // SAFETY: guaranteed by the caller.
    let bytes = unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) };
    String::from_utf8_lossy(bytes).into_owned()
}

/// Borrows a plugin-owned `(pointer, length)` array; null or empty gives `&[]`.
///
/// # Safety
/// `ptr` must be null or valid for reads of `len` elements for `'a`.
pub(crate) unsafe fn raw_slice<'a, T>(ptr: *const T, len: usize) -> &'a [T] {
    if ptr.is_null() || len == 0 {
        return &[];
    }
    // SAFETY: guaranteed by the caller.
    unsafe { std::slice::from_raw_parts(ptr, len) }
}

/// The loaded plugin. Lives for the whole process (leaked once per path).
pub(crate) struct PluginInner {
    pub(crate) api: *const PJRT_Api,
    pub(crate) api_size: usize,
    path: PathBuf,
    major: i32,
    minor: i32,
    attributes: Vec<(String, NamedValue)>,
}

// SAFETY: the function table is immutable data owned by a library that is never unloaded; the
// PJRT C API functions used through it are thread-safe (PJRT clients, executables and buffers
// may be used from any thread), and `PluginInner`'s own fields are never mutated after load.
unsafe impl Send for PluginInner {}
// SAFETY: see `Send`; `&PluginInner` only reads immutable fields.
unsafe impl Sync for PluginInner {}

impl fmt::Debug for PluginInner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Plugin")
            .field("path", &self.path)
            .field("api_version", &(self.major, self.minor))
            .finish_non_exhaustive()
    }
}

impl PluginInner {
    pub(crate) fn missing(&self, function: &'static str) -> Error {
        Error::MissingFunction {
            function,
            major: self.major,
            minor: self.minor,
        }
    }

    /// Turns a returned `PJRT_Error*` into `Ok(())` (null) or `Err` (freeing the error).
    pub(crate) fn check(&self, err: *mut ffi::PJRT_Error, operation: &'static str) -> Result<()> {
        match NonNull::new(err) {
            None => Ok(()),
            Some(err) => Err(self.take_error(err, operation)),
        }
    }

    /// Reads message and code of an owned error, then destroys it.
    fn take_error(&self, err: NonNull<ffi::PJRT_Error>, operation: &'static str) -> Error {
        let message = match api_fn!(self, PJRT_Error_Message) {
            Ok(f) => {
                let mut args = ffi::PJRT_Error_Message_Args::init();
                args.error = err.as_ptr();
                // SAFETY: `args` is an initialised args struct and `err` an owned live error.
                unsafe { f(&mut args) };
                // SAFETY: the message has the lifetime of `err`, which is still alive.
                unsafe { copy_string(args.message, args.message_size) }
            }
            Err(_) => "(the plugin provides no PJRT_Error_Message)".to_string(),
        };
        let code = match api_fn!(self, PJRT_Error_GetCode) {
            Ok(f) => {
                let mut args = ffi::PJRT_Error_GetCode_Args::init();
                args.error = err.as_ptr();
                // SAFETY: as above.
                let nested = unsafe { f(&mut args) };
                if let Some(nested) = NonNull::new(nested) {
                    self.destroy_error(nested);
                    ErrorCode::Unknown
                } else {
                    ErrorCode::from_raw(args.code)
                }
            }
            Err(_) => ErrorCode::Unknown,
        };
        self.destroy_error(err);
        Error::Pjrt {
            operation,
            code,
            message,
        }
    }

    fn destroy_error(&self, err: NonNull<ffi::PJRT_Error>) {
        if let Ok(f) = api_fn!(self, PJRT_Error_Destroy) {
            let mut args = ffi::PJRT_Error_Destroy_Args::init();
            args.error = err.as_ptr();
            // SAFETY: `err` is owned by us and destroyed exactly once, here.
            unsafe { f(&mut args) };
        }
    }

    /// Frees an error returned from a destroy function, where nothing can be reported.
    pub(crate) fn ignore_error(&self, err: *mut ffi::PJRT_Error) {
        if let Some(err) = NonNull::new(err) {
            self.destroy_error(err);
        }
    }

    fn read_attributes(&self) -> Result<Vec<(String, NamedValue)>> {
        let f = api_fn!(self, PJRT_Plugin_Attributes)?;
        let mut args = ffi::PJRT_Plugin_Attributes_Args::init();
        // SAFETY: `args` is an initialised args struct.
        let err = unsafe { f(&mut args) };
        self.check(err, "PJRT_Plugin_Attributes")?;
        // SAFETY: the plugin returns `num_attributes` values that live for the process.
        let raw = unsafe { raw_slice(args.attributes, args.num_attributes) };
        Ok(raw.iter().filter_map(read_named_value).collect())
    }
}

/// Copies one plugin-owned named value; `None` for an unknown type.
pub(crate) fn read_named_value(v: &ffi::PJRT_NamedValue) -> Option<(String, NamedValue)> {
    // SAFETY: the plugin provides `name_size` bytes at `name`.
    let name = unsafe { copy_string(v.name, v.name_size) };
    // Each arm reads the union member that `type_` says is live; strings and arrays have
    // `value_size` elements owned by the plugin for at least the duration of this copy.
    let value = match v.type_ {
        ffi::PJRT_NamedValue_kString => {
            // SAFETY: `kString` => `string_value` is live and points to `value_size` bytes.
            let s = unsafe { copy_string(v.value.string_value, v.value_size) };
            NamedValue::String(s)
        }
        ffi::PJRT_NamedValue_kInt64 => {
            // SAFETY: `kInt64` => `int64_value` is live.
            NamedValue::Int64(unsafe { v.value.int64_value })
        }
        ffi::PJRT_NamedValue_kInt64List => {
            // SAFETY: `kInt64List` => `int64_array_value` is live, `value_size` elements.
            let list = unsafe { raw_slice(v.value.int64_array_value, v.value_size) };
            NamedValue::Int64List(list.to_vec())
        }
        ffi::PJRT_NamedValue_kFloat => {
            // SAFETY: `kFloat` => `float_value` is live.
            NamedValue::Float(unsafe { v.value.float_value })
        }
        ffi::PJRT_NamedValue_kBool => {
            // SAFETY: `kBool` => the first byte holds a C `bool`; read as a byte, not as Rust
            // `bool`, so a value other than 0/1 cannot be undefined behaviour.
            let byte = unsafe { ptr::addr_of!(v.value).cast::<u8>().read() };
            NamedValue::Bool(byte != 0)
        }
        _ => return None,
    };
    Some((name, value))
}

/// An owned `PJRT_Event`, destroyed on drop.
pub(crate) struct Event {
    plugin: &'static PluginInner,
    raw: NonNull<ffi::PJRT_Event>,
}

impl Event {
    /// Takes ownership of `raw` (None if null).
    pub(crate) fn new(plugin: &'static PluginInner, raw: *mut ffi::PJRT_Event) -> Option<Self> {
        NonNull::new(raw).map(|raw| Self { plugin, raw })
    }

    /// Blocks until the event is ready; its error (if any) is reported as `operation`'s.
    pub(crate) fn wait(self, operation: &'static str) -> Result<()> {
        let f = api_fn!(self.plugin, PJRT_Event_Await)?;
        let mut args = ffi::PJRT_Event_Await_Args::init();
        args.event = self.raw.as_ptr();
        // SAFETY: the event is owned and alive until `self` drops (after this call).
        let err = unsafe { f(&mut args) };
        self.plugin.check(err, operation)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if let Ok(f) = api_fn!(self.plugin, PJRT_Event_Destroy) {
            let mut args = ffi::PJRT_Event_Destroy_Args::init();
            args.event = self.raw.as_ptr();
            // SAFETY: the event is owned and destroyed exactly once, here.
            let err = unsafe { f(&mut args) };
            self.plugin.ignore_error(err);
        }
    }
}

/// A loaded PJRT plugin (a shared library exporting `GetPjrtApi`).
///
/// Plugins are loaded once per canonical path and **never unloaded** (unloading the XLA plugins
/// crashes at exit), so a `Plugin` is a cheap `Copy` handle valid for the whole process.
#[derive(Clone, Copy)]
pub struct Plugin {
    pub(crate) inner: &'static PluginInner,
}

impl fmt::Debug for Plugin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.fmt(f)
    }
}

static LOADED: Mutex<Vec<&'static PluginInner>> = Mutex::new(Vec::new());

impl Plugin {
    /// Loads (or returns the already loaded) plugin at `path`, checks its C API version and
    /// initialises it.
    ///
    /// Loading a shared library runs its initialisers: `path` must name a trusted PJRT plugin.
    /// A file that is not a PJRT plugin, or one of another major C API version, is reported as
    /// an error.
    pub fn load(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let canonical = std::fs::canonicalize(path)
            .map_err(|e| Error::io(format!("cannot open PJRT plugin {}", path.display()), e))?;
        let mut loaded = LOADED.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(inner) = loaded.iter().find(|p| p.path == canonical) {
            return Ok(Self { inner });
        }
        quiet_plugin_logs_unless_asked();
        let inner: &'static PluginInner = Box::leak(Box::new(load_uncached(canonical)?));
        loaded.push(inner);
        Ok(Self { inner })
    }

    /// Loads the CPU plugin found by [`crate::cpu_plugin_path`] (env override or provisioned
    /// wheel).
    pub fn cpu() -> Result<Self> {
        Self::load(crate::provision::cpu_plugin_path()?)
    }

    /// Loads libtpu (the TPU compiler) found by [`crate::provision::libtpu_path`] (env
    /// override or provisioned wheel), for compile-only through a [`crate::Topology`].
    ///
    /// libtpu must be loaded with [`crate::provision::LIBTPU_COMPILE_ONLY_ENV`] in the
    /// environment (else it queries a cloud metadata server for minutes and locks out other
    /// processes); a variable missing is an error naming it, and
    /// [`crate::provision::set_libtpu_compile_only_env`] sets them.
    pub fn libtpu() -> Result<Self> {
        let path = crate::provision::libtpu_path()?;
        // The first two change what libtpu does; the others only quiet its log.
        for &(name, value) in &crate::provision::LIBTPU_COMPILE_ONLY_ENV[..2] {
            if std::env::var_os(name).is_none() {
                return Err(Error::LibtpuEnvironment {
                    variable: name,
                    value,
                });
            }
        }
        crate::dumps::record_libtpu_load();
        Self::load(path)
    }

    /// Canonical path of the library.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// `(major, minor)` C API version the plugin implements.
    pub fn api_version(&self) -> (i32, i32) {
        (self.inner.major, self.inner.minor)
    }

    /// The plugin's attributes (`xla_version`, `stablehlo_current_version`, ...).
    pub fn attributes(&self) -> &[(String, NamedValue)] {
        &self.inner.attributes
    }

    /// One attribute by name.
    pub fn attribute(&self, name: &str) -> Option<&NamedValue> {
        self.inner
            .attributes
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v)
    }
}

fn load_uncached(path: PathBuf) -> Result<PluginInner> {
    // SAFETY: loading a shared library runs its initialisers; `Plugin::load` documents that the
    // path must name a trusted PJRT plugin.
    let library = unsafe { libloading::Library::new(&path) }.map_err(|e| Error::Load {
        path: path.clone(),
        cause: Box::new(e),
    })?;
    // SAFETY: every PJRT plugin exports `GetPjrtApi` with this signature (pjrt_c_api.h).
    let get_api = unsafe { library.get::<ffi::GetPjrtApiFn>(ffi::GET_PJRT_API_SYMBOL) }
        .map(|symbol| *symbol)
        .map_err(|e| Error::NotAPlugin {
            path: path.clone(),
            reason: format!("it does not export GetPjrtApi ({e})"),
        })?;
    // Never unload: the XLA plugins crash when unloaded, and `get_api` plus the table it returns
    // must stay valid for the whole process.
    std::mem::forget(library);

    // SAFETY: `get_api` is the plugin's entry point; it takes no arguments.
    let api = unsafe { get_api() };
    if api.is_null() {
        return Err(Error::NotAPlugin {
            path,
            reason: "GetPjrtApi returned null".into(),
        });
    }
    // SAFETY: every PJRT_Api table starts with its `struct_size`.
    let api_size = unsafe { ptr::addr_of!((*api).struct_size).read() };
    let version_end =
        std::mem::offset_of!(PJRT_Api, pjrt_api_version) + size_of::<ffi::PJRT_Api_Version>();
    if api_size < version_end {
        return Err(Error::NotAPlugin {
            path,
            reason: format!("its PJRT_Api table is only {api_size} bytes"),
        });
    }
    // SAFETY: the version lies within the first `api_size` bytes of the table.
    let version = unsafe { ptr::addr_of!((*api).pjrt_api_version).read() };
    if version.major_version != ffi::PJRT_API_MAJOR {
        return Err(Error::VersionMismatch {
            path,
            plugin_major: version.major_version,
            plugin_minor: version.minor_version,
            binding_major: ffi::PJRT_API_MAJOR,
            binding_minor: ffi::PJRT_API_MINOR,
        });
    }
    let mut inner = PluginInner {
        api,
        api_size,
        path,
        major: version.major_version,
        minor: version.minor_version,
        attributes: Vec::new(),
    };
    let init = api_fn!(&inner, PJRT_Plugin_Initialize)?;
    let mut args = ffi::PJRT_Plugin_Initialize_Args::init();
    // SAFETY: `args` is an initialised args struct; called once per loaded library.
    let err = unsafe { init(&mut args) };
    inner.check(err, "PJRT_Plugin_Initialize")?;
    // Attributes are informational; an old plugin without them is still usable.
    inner.attributes = inner.read_attributes().unwrap_or_default();
    Ok(inner)
}

/// The variable that lets the plugin's log lines through, like the CLI's `-v`.
pub const VERBOSE_VAR: &str = "TESSERA_VERBOSE";

/// The XLA plugin's log threshold (TensorFlow's variable, which the plugins' logging reads):
/// 2 drops INFO and WARNING lines (absl's "All log messages before absl::InitializeLog()",
/// `cpu_device_count set`, the GSPMD deprecation warning, Shardy's `HloShardingV3` notice,
/// libtpu's start-up lines), keeps errors.
const PLUGIN_LOG_VAR: &str = "TF_CPP_MIN_LOG_LEVEL";

/// Set by `configure_plugin_logs(true)`: let the plugins' lines through.
static VERBOSE: AtomicBool = AtomicBool::new(false);

/// Chooses whether the PJRT plugins' INFO and warning lines reach stderr. They do not by
/// default (as in JAX): every plugin load keeps them off unless this was called with `true`,
/// `TESSERA_VERBOSE=1` is set, or the user set `TF_CPP_MIN_LOG_LEVEL` themselves. Only the
/// first plugin load of a process reads the choice (the plugins read the variable once), so
/// call it before loading one; `false` also applies it at once, so processes started
/// afterwards (the CLI bench's memory probes) inherit the quiet setting.
pub fn configure_plugin_logs(verbose: bool) {
    VERBOSE.store(verbose, Ordering::Relaxed);
    quiet_plugin_logs_unless_asked();
}

/// Sets `TF_CPP_MIN_LOG_LEVEL=2` unless verbose logs were asked for (see
/// [`configure_plugin_logs`]). Runs before every plugin load, under the load lock; the
/// variable is set once per process at most (afterwards the user's-own check finds it).
/// Changing the environment races with C code reading it on other threads, which is why
/// it happens before the first plugin (and its threads) exists.
fn quiet_plugin_logs_unless_asked() {
    let from_env = std::env::var_os(VERBOSE_VAR).is_some_and(|v| !v.is_empty() && v != "0");
    if VERBOSE.load(Ordering::Relaxed) || from_env || std::env::var_os(PLUGIN_LOG_VAR).is_some() {
        return;
    }
    std::env::set_var(PLUGIN_LOG_VAR, "2");
}
