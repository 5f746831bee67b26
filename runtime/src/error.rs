//! The crate's error type.

use std::path::PathBuf;

use crate::element::ElementType;
use crate::shape::ArrayShape;

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Status code of a PJRT error (the abseil status codes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorCode {
    /// `CANCELLED`.
    Cancelled,
    /// `UNKNOWN`, or a code this binding does not know.
    Unknown,
    /// `INVALID_ARGUMENT`: typically a program the compiler rejects.
    InvalidArgument,
    /// `DEADLINE_EXCEEDED`.
    DeadlineExceeded,
    /// `NOT_FOUND`.
    NotFound,
    /// `ALREADY_EXISTS`.
    AlreadyExists,
    /// `PERMISSION_DENIED`.
    PermissionDenied,
    /// `RESOURCE_EXHAUSTED`.
    ResourceExhausted,
    /// `FAILED_PRECONDITION`.
    FailedPrecondition,
    /// `ABORTED`.
    Aborted,
    /// `OUT_OF_RANGE`.
    OutOfRange,
    /// `UNIMPLEMENTED`: the plugin does not support the operation.
    Unimplemented,
    /// `INTERNAL`.
    Internal,
    /// `UNAVAILABLE`.
    Unavailable,
    /// `DATA_LOSS`.
    DataLoss,
    /// `UNAUTHENTICATED`.
    Unauthenticated,
}

impl ErrorCode {
    /// Maps a raw `PJRT_Error_Code`; unknown values (and `OK`, which no error carries) map to
    /// [`ErrorCode::Unknown`].
    pub fn from_raw(code: u32) -> Self {
        match code {
            1 => Self::Cancelled,
            3 => Self::InvalidArgument,
            4 => Self::DeadlineExceeded,
            5 => Self::NotFound,
            6 => Self::AlreadyExists,
            7 => Self::PermissionDenied,
            8 => Self::ResourceExhausted,
            9 => Self::FailedPrecondition,
            10 => Self::Aborted,
            11 => Self::OutOfRange,
            12 => Self::Unimplemented,
            13 => Self::Internal,
            14 => Self::Unavailable,
            15 => Self::DataLoss,
            16 => Self::Unauthenticated,
            _ => Self::Unknown,
        }
    }
}

/// Everything that can go wrong in this crate. Every error a caller can cause is one of these;
/// nothing panics on user input.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A PJRT call returned an error; `message` is the plugin's own text (for a compile, the
    /// compiler's diagnostic).
    #[error("PJRT {operation} failed ({code:?}): {message}")]
    Pjrt {
        /// The C API function that failed, e.g. `PJRT_Client_Compile`.
        operation: &'static str,
        /// Status code reported by the plugin.
        code: ErrorCode,
        /// The plugin's message.
        message: String,
    },

    /// The shared library could not be loaded.
    #[error("cannot load PJRT plugin {}: {cause}", path.display())]
    Load {
        /// Path given.
        path: PathBuf,
        /// The dynamic loader's error. Part of the message, so not also a `source` (a chain
        /// printer would repeat it).
        cause: Box<dyn std::error::Error + Send + Sync>,
    },

    /// The library loaded but is not a usable PJRT plugin.
    #[error("{} is not a usable PJRT plugin: {reason}", path.display())]
    NotAPlugin {
        /// Path given.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },

    /// The plugin implements a different major version of the PJRT C API.
    #[error(
        "PJRT plugin {} implements C API {plugin_major}.{plugin_minor}, but tessera's binding \
         is for {binding_major}.{binding_minor}; the major versions must match",
        path.display()
    )]
    VersionMismatch {
        /// Path of the plugin.
        path: PathBuf,
        /// Major version reported by the plugin.
        plugin_major: i32,
        /// Minor version reported by the plugin.
        plugin_minor: i32,
        /// Major version of the binding.
        binding_major: i32,
        /// Minor version of the binding.
        binding_minor: i32,
    },

    /// The plugin's function table does not contain a function this crate needs (an older
    /// plugin), or the slot is null.
    #[error("the PJRT plugin (C API {major}.{minor}) does not provide {function}")]
    MissingFunction {
        /// The C API function.
        function: &'static str,
        /// Plugin's major version.
        major: i32,
        /// Plugin's minor version.
        minor: i32,
    },

    /// An environment variable names no plugin file: nothing, a directory or something that
    /// is not a regular file (`/dev/null`).
    #[error("{variable}={} {problem}; point it at the plugin's .so file", path.display())]
    PluginOverrideMissing {
        /// The variable, e.g. `TESSERA_PJRT_PLUGIN`.
        variable: &'static str,
        /// The path it holds.
        path: PathBuf,
        /// What it names instead: "does not exist", "is a directory", "is not a regular
        /// file".
        problem: &'static str,
    },

    /// libtpu is about to be loaded without a variable compile-only needs.
    #[error(
        "libtpu needs {variable}={value} in the environment for compile-only use (without it \
         libtpu queries a cloud metadata server or locks out other processes); set it, or call \
         tessera_runtime::provision::set_libtpu_compile_only_env() at the start of main"
    )]
    LibtpuEnvironment {
        /// The variable.
        variable: &'static str,
        /// The value it needs.
        value: &'static str,
    },

    /// libtpu's dumps were asked for after libtpu had loaded (it reads its flags once).
    #[error(
        "libtpu is already loaded, and it reads its dump flags (LIBTPU_INIT_ARGS) only when it \
         loads; call tessera_runtime::enable_libtpu_dumps() at the start of main, before \
         anything compiles for TPU"
    )]
    LibtpuAlreadyLoaded,

    /// libtpu's dumps were asked for twice in one process.
    #[error(
        "libtpu's dumps are already enabled in this process (into {}); call \
         tessera_runtime::enable_libtpu_dumps() once, at the start of main",
        path.display()
    )]
    LibtpuDumpsEnabled {
        /// The directory the first call made.
        path: std::path::PathBuf,
    },

    /// The Python interpreter used to download plugin wheels was not found.
    #[error(
        "cannot provision the PJRT plugin {spec}: the Python interpreter `{python}` was not \
         found. Install Python 3 with pip (e.g. `apt-get install python3 python3-pip`), set \
         TESSERA_PYTHON to an interpreter that has pip, or point TESSERA_PJRT_PLUGIN at a \
         plugin .so"
    )]
    PythonNotFound {
        /// The wheel requirement, `name==version`.
        spec: String,
        /// The interpreter tried.
        python: String,
    },

    /// The Python interpreter has no pip.
    #[error(
        "cannot provision the PJRT plugin {spec}: `{python} -m pip` is not available. Install \
         pip (e.g. `apt-get install python3-pip` or `{python} -m ensurepip`), or point \
         TESSERA_PJRT_PLUGIN at a plugin .so. pip said:\n{stderr_tail}"
    )]
    PipUnavailable {
        /// The wheel requirement.
        spec: String,
        /// The interpreter tried.
        python: String,
        /// Last lines of the interpreter's stderr.
        stderr_tail: String,
    },

    /// `pip download` failed.
    #[error(
        "cannot provision the PJRT plugin {spec}: `pip download` failed ({status}); check the \
         network or the package name/version, or point TESSERA_PJRT_PLUGIN at a plugin .so. \
         pip said:\n{stderr_tail}"
    )]
    PipFailed {
        /// The wheel requirement.
        spec: String,
        /// Exit status of pip.
        status: String,
        /// Last lines of pip's stderr.
        stderr_tail: String,
    },

    /// The downloaded wheel does not have the expected content.
    #[error("wheel {}: {reason}", wheel.display())]
    WheelContents {
        /// Path of the wheel file.
        wheel: PathBuf,
        /// What is wrong.
        reason: String,
    },

    /// A wheel spec string could not be parsed or is not known.
    #[error("invalid plugin wheel spec `{spec}`: {reason}")]
    InvalidWheelSpec {
        /// The string given.
        spec: String,
        /// What is wrong.
        reason: String,
    },

    /// No cache directory could be determined.
    #[error(
        "no cache directory for PJRT plugins: set TESSERA_CACHE_DIR (or XDG_CACHE_HOME or HOME)"
    )]
    NoCacheDir,

    /// A file-system or process operation failed.
    #[error("{context}: {cause}")]
    Io {
        /// What was being done.
        context: String,
        /// The OS error. Part of the message, so not also a `source` (a chain printer would
        /// repeat it).
        cause: std::io::Error,
    },

    /// Host data does not match its declared shape.
    #[error(
        "buffer of {element_type} {dims:?} needs {expected_bytes} bytes, but {actual_bytes} \
         were given"
    )]
    BufferSize {
        /// Element type.
        element_type: ElementType,
        /// Dimensions.
        dims: Vec<i64>,
        /// Bytes the shape needs.
        expected_bytes: usize,
        /// Bytes given.
        actual_bytes: usize,
    },

    /// Dimensions are negative or their product overflows.
    #[error("invalid dimensions {dims:?}: {reason}")]
    InvalidDims {
        /// Dimensions given.
        dims: Vec<i64>,
        /// What is wrong.
        reason: &'static str,
    },

    /// Host data was read back as a type it does not have.
    #[error("element type mismatch: the buffer holds {actual}, {expected} was requested")]
    ElementTypeMismatch {
        /// Type requested.
        expected: ElementType,
        /// Type of the buffer.
        actual: ElementType,
    },

    /// The plugin produced a buffer whose element type this crate does not support.
    /// A buffer whose element type tessera arrays do not hold (e.g. `f64` from a plugin).
    #[error(
        "the buffer holds {element_type}, which tessera arrays do not hold (f32, bf16, i32, i8, \
         bool)"
    )]
    NotAnArrayType {
        /// The buffer's element type.
        element_type: ElementType,
    },

    #[error("unsupported PJRT element type {raw}")]
    UnsupportedElementType {
        /// Raw `PJRT_Buffer_Type`.
        raw: u32,
    },

    /// A client was requested with an unusable number of devices.
    #[error("invalid device count {requested}: at least one device is needed")]
    InvalidDeviceCount {
        /// The count requested.
        requested: usize,
    },

    /// A platform name that is not `cpu`, `gpu` or `tpu`.
    #[error("unknown platform `{name}`; expected cpu, gpu or tpu")]
    UnknownPlatform {
        /// The name given.
        name: String,
    },

    /// The gpu platform was asked for, but no CUDA PJRT plugin is named.
    #[error(
        "the gpu backend needs a CUDA PJRT plugin: install the wheel (`pip install \
         jax-cuda12-pjrt jax-cuda12-plugin[with-cuda]`) and set {variable} to its \
         xla_cuda_plugin.so"
    )]
    NoGpuPlugin {
        /// The variable that names the plugin.
        variable: &'static str,
    },

    /// The tpu platform was asked for on a machine whose PCI bus has no TPU chip.
    #[error(
        "no TPU chips found on this machine (no TPU among the PCI devices in {}); the tpu \
         backend runs on a TPU VM, and `tessera compile --target tpu:TOPOLOGY` compiles for \
         one without chips",
        pci_devices.display()
    )]
    NoTpuChips {
        /// The PCI listing that was searched.
        pci_devices: PathBuf,
    },

    /// libtpu could not create a client on this machine's chips.
    #[error("libtpu found no usable TPU chips: {message}")]
    TpuClient {
        /// libtpu's message.
        message: String,
    },

    /// The platform has fewer devices than a program needs.
    #[error(
        "the program runs on {requested} {platform} devices, but this process has {available}; \
         use at most {available}"
    )]
    TooFewDevices {
        /// The platform.
        platform: crate::Platform,
        /// Devices the program needs.
        requested: usize,
        /// Devices the platform's client has.
        available: usize,
    },

    /// More than one process was asked for, which the platform's programs cannot use.
    #[error(
        "{variable}={processes} asks for {processes} processes, but tessera runs {platform} \
         programs in one process: {reason}"
    )]
    MultiProcess {
        /// The platform.
        platform: crate::Platform,
        /// The variable that asked.
        variable: &'static str,
        /// Processes asked for.
        processes: usize,
        /// Why one process.
        reason: &'static str,
    },

    /// The process-count variable does not hold a positive integer.
    #[error("{variable}={value:?} is not a process count; unset it or set it to 1")]
    InvalidProcessCount {
        /// The variable.
        variable: &'static str,
        /// Its value.
        value: String,
    },

    /// A device index is out of range.
    #[error("device index {index} is out of range: the client has {device_count} devices")]
    DeviceIndex {
        /// Index given.
        index: usize,
        /// Devices of the client.
        device_count: usize,
    },

    /// `execute` got a number of argument lists different from the executable's device count.
    #[error(
        "the executable runs on {expected} devices, but {actual} argument lists were given \
         (argument list i goes to device i)"
    )]
    DeviceCountMismatch {
        /// Devices of the executable.
        expected: usize,
        /// Argument lists given.
        actual: usize,
    },

    /// Argument lists of different lengths were given to `execute`.
    #[error(
        "argument list {device} has {actual} arguments, but argument list 0 has {expected}; \
         every device takes the same number of arguments"
    )]
    ArgumentCount {
        /// The offending argument list.
        device: usize,
        /// Length of list 0.
        expected: usize,
        /// Length of this list.
        actual: usize,
    },

    /// `execute` got a number of arguments per device different from the program's.
    #[error("the program takes {expected} arguments per device, but {actual} were given")]
    ParameterCount {
        /// Parameters of the compiled program.
        expected: usize,
        /// Arguments given per device.
        actual: usize,
    },

    /// An argument does not have the element type and dims of the program's parameter.
    #[error(
        "argument {argument} of list {list} is {actual}, but the program's parameter {argument} \
         is {expected}"
    )]
    ArgumentShape {
        /// Argument list index.
        list: usize,
        /// Argument index within the list.
        argument: usize,
        /// The parameter's shape.
        expected: ArrayShape,
        /// The buffer's shape.
        actual: ArrayShape,
    },

    /// A buffer passed to `execute` lives on another device than the one its list goes to.
    #[error(
        "argument {argument} of list {list} is on device {actual_device}, but list {list} runs \
         on device {expected_device}"
    )]
    WrongDevice {
        /// Argument list index.
        list: usize,
        /// Argument index within the list.
        argument: usize,
        /// Client device index the list runs on.
        expected_device: usize,
        /// Client device index the buffer is on.
        actual_device: usize,
    },

    /// An argument of `execute_donating` is donated on some devices and lent on others.
    #[error(
        "argument {argument} is donated on some devices but lent in list {list}; donate an \
         argument on every device or on none"
    )]
    DonationMismatch {
        /// Argument index within the lists.
        argument: usize,
        /// A list where it differs from list 0.
        list: usize,
    },

    /// A buffer or executable was used with a client that did not create it.
    #[error("{what} belongs to a different PJRT client")]
    ForeignObject {
        /// What was passed.
        what: &'static str,
    },

    /// Compile options are inconsistent.
    #[error("invalid compile options: {0}")]
    InvalidCompileOptions(CompileOptionsError),

    /// The plugin returned something that violates the C API contract.
    #[error("the PJRT plugin returned an invalid result from {operation}: {reason}")]
    PluginContract {
        /// The C API function.
        operation: &'static str,
        /// What was wrong.
        reason: String,
    },
}

impl Error {
    pub(crate) fn io(context: impl Into<String>, cause: std::io::Error) -> Self {
        Self::Io {
            context: context.into(),
            cause,
        }
    }
}

/// How compile options or a device assignment are inconsistent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CompileOptionsError {
    /// A device assignment with no replica or no partition.
    #[error("a device assignment needs at least one replica and one partition")]
    EmptyAssignment,
    /// A row of the assignment table with another replica count than row 0.
    #[error("device assignment row {row} has {replicas} replicas, row 0 has {first_row}")]
    RaggedAssignment {
        row: usize,
        replicas: usize,
        first_row: usize,
    },
    /// A device named twice in the assignment.
    #[error("device {device} appears twice in the device assignment")]
    DuplicateDevice { device: i64 },
    /// A negative device id in the assignment.
    #[error("device id {device} in the device assignment is negative")]
    NegativeDevice { device: i64 },
    /// No replica or no partition.
    #[error("num_replicas ({replicas}) and num_partitions ({partitions}) must be at least 1")]
    NoDevices { replicas: usize, partitions: usize },
    /// More devices than an i32 counts.
    #[error("too many devices")]
    TooManyDevices,
    /// An assignment of another size than the options.
    #[error(
        "the device assignment is {assigned_replicas} replicas x {assigned_partitions} \
         partitions, but the options say {replicas} x {partitions}"
    )]
    AssignmentSize {
        assigned_replicas: usize,
        assigned_partitions: usize,
        replicas: usize,
        partitions: usize,
    },
}
