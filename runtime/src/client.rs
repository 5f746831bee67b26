//! Clients, devices, device buffers and loaded executables.

use std::collections::HashMap;
use std::ffi::c_char;
use std::fmt;
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use crate::element::{byte_size, ElementType, HostBuffer, NativeType};
use crate::error::{Error, Result};
use crate::ffi;
use crate::options::CompileOptions;
use crate::plugin::{api_fn, copy_string, raw_named_values, raw_slice, Event, NamedValue, Plugin};
use crate::shape::ArrayShape;
use crate::topology::Executable;

/// Name of the CPU plugin's client option that sets the number of devices.
pub const CPU_DEVICE_COUNT_OPTION: &str = "cpu_device_count";

/// A device of a client (an addressable device).
pub struct Device {
    raw: NonNull<ffi::PJRT_Device>,
    index: usize,
    id: i32,
    kind: String,
    description: String,
}

// SAFETY: a `Device` is an immutable handle owned by its client: the raw pointer is only passed
// to thread-safe PJRT calls, and the other fields are plain data.
unsafe impl Send for Device {}
// SAFETY: as above; `&Device` only reads.
unsafe impl Sync for Device {}

impl Device {
    /// Position in [`Client::devices`]; argument list `i` of an execute goes to the
    /// executable's `i`-th device.
    pub fn index(&self) -> usize {
        self.index
    }

    /// The plugin's device id (`PJRT_DeviceDescription_Id`), as used in device assignments.
    pub fn id(&self) -> i32 {
        self.id
    }

    /// Kind of device, e.g. `cpu`.
    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// Short description from the plugin, e.g. `CpuDevice(id=0)`.
    pub fn description(&self) -> &str {
        &self.description
    }
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Device")
            .field("index", &self.index)
            .field("id", &self.id)
            .field("kind", &self.kind)
            .field("description", &self.description)
            .finish()
    }
}

pub(crate) struct ClientInner {
    pub(crate) plugin: Plugin,
    raw: NonNull<ffi::PJRT_Client>,
    devices: Vec<Device>,
    platform_name: String,
    platform_version: String,
}

// SAFETY: a PJRT client is thread-safe (PjRtClient's methods may be called concurrently from
// any thread); `ClientInner` is immutable after creation and destroys the client once, in Drop.
unsafe impl Send for ClientInner {}
// SAFETY: as above.
unsafe impl Sync for ClientInner {}

impl Drop for ClientInner {
    fn drop(&mut self) {
        let plugin = self.plugin.inner;
        if let Ok(f) = api_fn!(plugin, PJRT_Client_Destroy) {
            let mut args = ffi::PJRT_Client_Destroy_Args::init();
            args.client = self.raw.as_ptr();
            // SAFETY: the client is owned and destroyed exactly once; every buffer and
            // executable holds an `Arc<ClientInner>`, so none outlives it.
            let err = unsafe { f(&mut args) };
            plugin.ignore_error(err);
        }
    }
}

/// A PJRT client: the devices of one plugin instance, and what compiles and runs on them.
///
/// Cheap to clone (shared handle); buffers and executables keep their client alive.
#[derive(Clone)]
pub struct Client {
    inner: Arc<ClientInner>,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("platform", &self.inner.platform_name)
            .field("devices", &self.inner.devices.len())
            .finish_non_exhaustive()
    }
}

impl Plugin {
    /// Creates a client with plugin-specific create options.
    pub fn client(&self, options: &[(String, NamedValue)]) -> Result<Client> {
        Client::new(*self, options)
    }

    /// Creates a CPU client with `device_count` devices (option `cpu_device_count`, always
    /// passed: without it the XLA CPU plugin silently picks 4).
    ///
    /// The plugin runs every device's program on a thread pool per client, and its matmuls and
    /// other intra-op work on a second one, both sized by `PJRT_NPROC` or `NPROC` if set, else
    /// by the cores. Plugins older than C API 0.115
    /// ([`CPU_COLLECTIVES_NONBLOCKING_SINCE`]) block a pool thread in each collective until
    /// every device arrives, so with more devices than threads a program deadlocks (measured:
    /// `xla-cpu-pjrt` 0.0.1 (C API 0.81), 4 devices, `NPROC=2`, a train step's all-to-all,
    /// and `runtime/tests/cpu_threads.rs`): for those, unless the user set either variable,
    /// the client is created with `NPROC` at least `4 x device_count` (up to 4 collectives in
    /// flight per device). Newer plugins (`lammps-jax-pjrt-cpu` 0.11.2, JAX's own CPU client)
    /// do not block a thread per device and keep their default, one thread per core, as JAX
    /// does: 16 threads on 2 cores made the tiny train step 1.3x slower (measured, 4 devices).
    pub fn cpu_client(&self, device_count: usize) -> Result<Client> {
        let count = i64::try_from(device_count).ok().filter(|&n| n >= 1).ok_or(
            Error::InvalidDeviceCount {
                requested: device_count,
            },
        )?;
        let blocking_collectives = self.api_version() < CPU_COLLECTIVES_NONBLOCKING_SINCE;
        let client = with_cpu_threads(device_count, blocking_collectives, || {
            self.client(&[(
                CPU_DEVICE_COUNT_OPTION.to_string(),
                NamedValue::Int64(count),
            )])
        })?;
        if client.devices().len() != device_count {
            return Err(Error::PluginContract {
                operation: "PJRT_Client_Create",
                reason: format!(
                    "{device_count} CPU devices were requested, the client has {}",
                    client.devices().len()
                ),
            });
        }
        Ok(client)
    }
}

/// The environment variables the XLA CPU plugin sizes a client's thread pools by, in the
/// order it reads them (the first set one wins).
const CPU_THREADS_ENVS: [&str; 2] = ["PJRT_NPROC", "NPROC"];

/// The first C API version whose CPU plugin does not block a pool thread per device in a
/// collective (`lammps-jax-pjrt-cpu` 0.11.2; `xla-cpu-pjrt` 0.0.1, C API 0.81, blocks). No
/// plugin between the two was measured, so those are treated as blocking.
pub const CPU_COLLECTIVES_NONBLOCKING_SINCE: (i32, i32) = (0, 115);

/// Runs `create` (a CPU client's creation); where the plugin's collectives block a pool thread
/// (`blocking_collectives`), with `NPROC` at least `4 x devices` unless the user set the
/// plugin's thread count; see [`Plugin::cpu_client`].
fn with_cpu_threads<T>(
    devices: usize,
    blocking_collectives: bool,
    create: impl FnOnce() -> T,
) -> T {
    static USER_SET: OnceLock<bool> = OnceLock::new();
    static CREATING: Mutex<()> = Mutex::new(());
    let _serial = CREATING.lock().unwrap_or_else(PoisonError::into_inner);
    let user_set = *USER_SET.get_or_init(|| {
        CPU_THREADS_ENVS
            .iter()
            .any(|name| std::env::var_os(name).is_some())
    });
    // A non-blocking plugin's client is left alone (in a process that created a blocking
    // one's before, it inherits the raised `NPROC`: slower, never wrong).
    if user_set || !blocking_collectives {
        return create();
    }
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let threads = cores.max(4 * devices);
    // Read by the plugin while the client is created, under the lock above.
    std::env::set_var("NPROC", threads.to_string());
    create()
}

impl Client {
    /// Creates a client of `plugin` with the given create options.
    pub fn new(plugin: Plugin, options: &[(String, NamedValue)]) -> Result<Self> {
        let p = plugin.inner;
        let create = api_fn!(p, PJRT_Client_Create)?;
        let raw_options = raw_named_values(options);
        let mut args = ffi::PJRT_Client_Create_Args::init();
        args.create_options = raw_options.as_ptr();
        args.num_options = raw_options.len();
        // SAFETY: `args` is initialised; the options array and the strings/arrays it points to
        // (borrowed from `options`) outlive the call; the key-value callbacks are null.
        let err = unsafe { create(&mut args) };
        p.check(err, "PJRT_Client_Create")?;
        let raw = NonNull::new(args.client).ok_or_else(|| Error::PluginContract {
            operation: "PJRT_Client_Create",
            reason: "null client without an error".into(),
        })?;
        let mut inner = ClientInner {
            plugin,
            raw,
            devices: Vec::new(),
            platform_name: String::new(),
            platform_version: String::new(),
        };
        // From here on `inner` owns the client: an error below destroys it in Drop.
        inner.platform_name = client_string(&inner, StringQuery::PlatformName)?;
        inner.platform_version = client_string(&inner, StringQuery::PlatformVersion)?;
        inner.devices = addressable_devices(&inner)?;
        Ok(Self {
            inner: Arc::new(inner),
        })
    }

    /// A new CPU client with `device_count` devices, from [`Plugin::cpu`].
    pub fn cpu(device_count: usize) -> Result<Self> {
        Plugin::cpu()?.cpu_client(device_count)
    }

    /// A process-wide CPU client with `device_count` devices, created on first use (from
    /// [`Plugin::cpu`]) and shared by every later call with the same count. Plugin load and
    /// client creation cost tens of milliseconds; tests and tools should use this.
    ///
    /// Shared clients are never destroyed (they live until the process exits).
    pub fn cpu_shared(device_count: usize) -> Result<Self> {
        static SHARED: OnceLock<Mutex<HashMap<usize, Client>>> = OnceLock::new();
        let mut shared = SHARED
            .get_or_init(|| Mutex::new(HashMap::new()))
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(client) = shared.get(&device_count) {
            return Ok(client.clone());
        }
        let client = Self::cpu(device_count)?;
        shared.insert(device_count, client.clone());
        Ok(client)
    }

    /// The plugin this client belongs to.
    pub fn plugin(&self) -> Plugin {
        self.inner.plugin
    }

    /// Platform name, e.g. `cpu`.
    pub fn platform_name(&self) -> &str {
        &self.inner.platform_name
    }

    /// Platform version string.
    pub fn platform_version(&self) -> &str {
        &self.inner.platform_version
    }

    /// The addressable devices, in the plugin's order.
    pub fn devices(&self) -> &[Device] {
        &self.inner.devices
    }

    fn device(&self, index: usize) -> Result<&Device> {
        self.inner.devices.get(index).ok_or(Error::DeviceIndex {
            index,
            device_count: self.inner.devices.len(),
        })
    }

    /// Compiles a StableHLO program given as MLIR text.
    ///
    /// A program the compiler rejects gives [`Error::Pjrt`] whose message is the compiler's.
    pub fn compile(&self, program: &str, options: &CompileOptions) -> Result<LoadedExecutable> {
        let p = self.inner.plugin.inner;
        let compile = api_fn!(p, PJRT_Client_Compile)?;
        let options_bytes = options.to_proto_bytes()?;
        let mut code = program.as_bytes().to_vec();
        let format = b"mlir";
        let mut raw_program = ffi::PJRT_Program::init();
        raw_program.code = code.as_mut_ptr().cast::<c_char>();
        raw_program.code_size = code.len();
        raw_program.format = format.as_ptr().cast::<c_char>();
        raw_program.format_size = format.len();
        let mut args = ffi::PJRT_Client_Compile_Args::init();
        args.client = self.inner.raw.as_ptr();
        args.program = &raw_program;
        args.compile_options = options_bytes.as_ptr().cast::<c_char>();
        args.compile_options_size = options_bytes.len();
        // SAFETY: `args` is initialised; program text, format and options bytes are owned here
        // and outlive the call; the client is alive.
        let err = unsafe { compile(&mut args) };
        p.check(err, "PJRT_Client_Compile")?;
        let raw = NonNull::new(args.executable).ok_or_else(|| Error::PluginContract {
            operation: "PJRT_Client_Compile",
            reason: "null executable without an error".into(),
        })?;
        LoadedExecutable::from_raw(self.inner.clone(), raw)
    }

    /// Copies a host array to device `device` (an index into [`Client::devices`]).
    pub fn buffer_from_host(&self, host: &HostBuffer, device: usize) -> Result<Buffer> {
        let p = self.inner.plugin.inner;
        let dev = self.device(device)?;
        let transfer = api_fn!(p, PJRT_Client_BufferFromHostBuffer)?;
        let mut args = ffi::PJRT_Client_BufferFromHostBuffer_Args::init();
        args.client = self.inner.raw.as_ptr();
        args.data = host.as_bytes().as_ptr().cast();
        args.type_ = host.element_type().to_raw();
        args.dims = host.dims().as_ptr();
        args.num_dims = host.dims().len();
        // The plugin copies the data before returning: `host` is borrowed only for the call.
        args.host_buffer_semantics = ffi::PJRT_HostBufferSemantics_kImmutableOnlyDuringCall;
        args.device = dev.raw.as_ptr();
        // SAFETY: `args` is initialised; `host`'s bytes match its dims and type (checked by
        // `HostBuffer`'s constructors) and, with `kImmutableOnlyDuringCall`, are only read
        // during the call; dims outlive the call; device and client are alive.
        let err = unsafe { transfer(&mut args) };
        // Own whatever the plugin returned before looking at the error.
        let done = Event::new(p, args.done_with_host_buffer);
        let buffer = NonNull::new(args.buffer).map(|raw| Buffer {
            client: self.inner.clone(),
            raw,
            device,
            element_type: host.element_type(),
            dims: host.dims().to_vec(),
        });
        p.check(err, "PJRT_Client_BufferFromHostBuffer")?;
        if let Some(done) = done {
            done.wait("PJRT_Client_BufferFromHostBuffer")?;
        }
        buffer.ok_or_else(|| Error::PluginContract {
            operation: "PJRT_Client_BufferFromHostBuffer",
            reason: "null buffer without an error".into(),
        })
    }

    /// Copies typed host data of shape `dims` to device `device`.
    pub fn buffer_from_slice<T: NativeType>(
        &self,
        data: &[T],
        dims: &[i64],
        device: usize,
    ) -> Result<Buffer> {
        self.buffer_from_host(&HostBuffer::from_slice(dims, data)?, device)
    }
}

enum StringQuery {
    PlatformName,
    PlatformVersion,
}

fn client_string(client: &ClientInner, which: StringQuery) -> Result<String> {
    let p = client.plugin.inner;
    match which {
        StringQuery::PlatformName => {
            let f = api_fn!(p, PJRT_Client_PlatformName)?;
            let mut args = ffi::PJRT_Client_PlatformName_Args::init();
            args.client = client.raw.as_ptr();
            // SAFETY: `args` is initialised and the client alive.
            let err = unsafe { f(&mut args) };
            p.check(err, "PJRT_Client_PlatformName")?;
            // SAFETY: the string is owned by the client, alive during the copy.
            Ok(unsafe { copy_string(args.platform_name, args.platform_name_size) })
        }
        StringQuery::PlatformVersion => {
            let f = api_fn!(p, PJRT_Client_PlatformVersion)?;
            let mut args = ffi::PJRT_Client_PlatformVersion_Args::init();
            args.client = client.raw.as_ptr();
            // SAFETY: `args` is initialised and the client alive.
            let err = unsafe { f(&mut args) };
            p.check(err, "PJRT_Client_PlatformVersion")?;
            // SAFETY: the string is owned by the client, alive during the copy.
            Ok(unsafe { copy_string(args.platform_version, args.platform_version_size) })
        }
    }
}

fn addressable_devices(client: &ClientInner) -> Result<Vec<Device>> {
    let p = client.plugin.inner;
    let f = api_fn!(p, PJRT_Client_AddressableDevices)?;
    let mut args = ffi::PJRT_Client_AddressableDevices_Args::init();
    args.client = client.raw.as_ptr();
    // SAFETY: `args` is initialised and the client alive.
    let err = unsafe { f(&mut args) };
    p.check(err, "PJRT_Client_AddressableDevices")?;
    // SAFETY: the array is owned by the client and has `num_addressable_devices` entries.
    let raw = unsafe { raw_slice(args.addressable_devices, args.num_addressable_devices) };
    raw.iter()
        .enumerate()
        .map(|(index, &device)| {
            let raw = NonNull::new(device).ok_or_else(|| Error::PluginContract {
                operation: "PJRT_Client_AddressableDevices",
                reason: "null device".into(),
            })?;
            let description = device_description(p, raw)?;
            let d = crate::topology::describe(p, description)?;
            Ok(Device {
                raw,
                index,
                id: d.id,
                kind: d.kind,
                description: d.to_string,
            })
        })
        .collect()
}

fn device_description(
    p: &'static crate::plugin::PluginInner,
    device: NonNull<ffi::PJRT_Device>,
) -> Result<NonNull<ffi::PJRT_DeviceDescription>> {
    let f = api_fn!(p, PJRT_Device_GetDescription)?;
    let mut args = ffi::PJRT_Device_GetDescription_Args::init();
    args.device = device.as_ptr();
    // SAFETY: `args` is initialised and the device (owned by its live client) valid.
    let err = unsafe { f(&mut args) };
    p.check(err, "PJRT_Device_GetDescription")?;
    NonNull::new(args.device_description).ok_or_else(|| Error::PluginContract {
        operation: "PJRT_Device_GetDescription",
        reason: "null description".into(),
    })
}

/// An array on a device. Destroyed (device memory freed) on drop.
pub struct Buffer {
    client: Arc<ClientInner>,
    raw: NonNull<ffi::PJRT_Buffer>,
    device: usize,
    element_type: ElementType,
    dims: Vec<i64>,
}

// SAFETY: a PJRT buffer is thread-safe (PjRtBuffer may be read, copied to host and used as an
// execute argument concurrently from any thread); `Buffer` is immutable and destroys the buffer
// once, in Drop.
unsafe impl Send for Buffer {}
// SAFETY: as above; `&Buffer` only reads (only an owned `Buffer` can be donated, see
// `execute_donating`).
unsafe impl Sync for Buffer {}

impl fmt::Debug for Buffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Buffer")
            .field("device", &self.device)
            .field("element_type", &self.element_type)
            .field("dims", &self.dims)
            .finish()
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        let p = self.client.plugin.inner;
        if let Ok(f) = api_fn!(p, PJRT_Buffer_Destroy) {
            let mut args = ffi::PJRT_Buffer_Destroy_Args::init();
            args.buffer = self.raw.as_ptr();
            // SAFETY: the buffer is owned and destroyed exactly once; its client is alive.
            let err = unsafe { f(&mut args) };
            p.ignore_error(err);
        }
    }
}

impl Buffer {
    /// Queries element type and dims of an output buffer from the plugin.
    fn load_metadata(&mut self) -> Result<()> {
        let p = self.client.plugin.inner;
        let f = api_fn!(p, PJRT_Buffer_ElementType)?;
        let mut args = ffi::PJRT_Buffer_ElementType_Args::init();
        args.buffer = self.raw.as_ptr();
        // SAFETY: `args` is initialised and the buffer alive.
        let err = unsafe { f(&mut args) };
        p.check(err, "PJRT_Buffer_ElementType")?;
        self.element_type = ElementType::from_raw(args.type_)?;
        let f = api_fn!(p, PJRT_Buffer_Dimensions)?;
        let mut args = ffi::PJRT_Buffer_Dimensions_Args::init();
        args.buffer = self.raw.as_ptr();
        // SAFETY: `args` is initialised and the buffer alive.
        let err = unsafe { f(&mut args) };
        p.check(err, "PJRT_Buffer_Dimensions")?;
        // SAFETY: `num_dims` dims owned by the live buffer.
        self.dims = unsafe { raw_slice(args.dims, args.num_dims) }.to_vec();
        Ok(())
    }

    /// Element type.
    pub fn element_type(&self) -> ElementType {
        self.element_type
    }

    /// Dimensions, major to minor.
    pub fn dims(&self) -> &[i64] {
        &self.dims
    }

    /// Index (in [`Client::devices`]) of the device holding the buffer.
    pub fn device_index(&self) -> usize {
        self.device
    }

    /// Copies the buffer to host memory (dense, row-major), waiting for the transfer.
    pub fn to_host(&self) -> Result<HostBuffer> {
        let p = self.client.plugin.inner;
        let f = api_fn!(p, PJRT_Buffer_ToHostBuffer)?;
        let expected = byte_size(self.element_type, &self.dims)?;
        // Ask for a dense major-to-minor layout explicitly (device layouts may differ).
        let minor_to_major: Vec<i64> = (0..self.dims.len() as i64).rev().collect();
        let mut tiled = ffi::PJRT_Buffer_MemoryLayout_Tiled::init();
        tiled.minor_to_major = minor_to_major.as_ptr();
        tiled.minor_to_major_size = minor_to_major.len();
        let mut layout = ffi::PJRT_Buffer_MemoryLayout::init();
        layout.value = ffi::PJRT_Buffer_MemoryLayout_Value { tiled };
        layout.type_ = ffi::PJRT_Buffer_MemoryLayout_Type_Tiled;

        let mut data = vec![0u8; expected];
        let mut args = ffi::PJRT_Buffer_ToHostBuffer_Args::init();
        args.src = self.raw.as_ptr();
        args.host_layout = &mut layout;
        args.dst = data.as_mut_ptr().cast();
        args.dst_size = data.len();
        // SAFETY: `args` is initialised; `data` has `dst_size` writable bytes and is neither
        // moved nor freed until the event is awaited below (or, on error, the call did not
        // start a transfer); the layout and its arrays outlive the call; the buffer is alive.
        let err = unsafe { f(&mut args) };
        let event = Event::new(p, args.event);
        p.check(err, "PJRT_Buffer_ToHostBuffer")?;
        if let Some(event) = event {
            event.wait("PJRT_Buffer_ToHostBuffer")?;
        }
        HostBuffer::from_bytes(self.element_type, &self.dims, data)
    }

    /// Copies the buffer to host and returns its elements as `T`.
    pub fn to_vec<T: NativeType>(&self) -> Result<Vec<T>> {
        self.to_host()?.to_vec()
    }

    /// Whether the plugin has deleted the buffer's memory (a donated buffer, once the program
    /// consumed it). A `Buffer` the caller still holds is never deleted: donation moves it.
    pub fn is_deleted(&self) -> Result<bool> {
        let p = self.client.plugin.inner;
        let f = api_fn!(p, PJRT_Buffer_IsDeleted)?;
        let mut args = ffi::PJRT_Buffer_IsDeleted_Args::init();
        args.buffer = self.raw.as_ptr();
        // SAFETY: `args` is initialised and the buffer alive (not yet destroyed).
        let err = unsafe { f(&mut args) };
        p.check(err, "PJRT_Buffer_IsDeleted")?;
        Ok(args.is_deleted)
    }

    /// The device address of the buffer's data, as an integer to compare (e.g. whether an
    /// output reuses a donated input's memory); never dereferenced.
    pub fn device_address(&self) -> Result<usize> {
        let p = self.client.plugin.inner;
        let f = api_fn!(p, PJRT_Buffer_OpaqueDeviceMemoryDataPointer)?;
        let mut args = ffi::PJRT_Buffer_OpaqueDeviceMemoryDataPointer_Args::init();
        args.buffer = self.raw.as_ptr();
        // SAFETY: `args` is initialised and the buffer alive; the pointer is only read as a
        // number.
        let err = unsafe { f(&mut args) };
        p.check(err, "PJRT_Buffer_OpaqueDeviceMemoryDataPointer")?;
        Ok(args.device_memory_ptr as usize)
    }
}

/// A launch id for every execution of the process (positive, wrapping). The CPU plugin keys
/// the rendezvous of a program's collectives by it (left at 0, every execution has run id 0),
/// so two executions never share a rendezvous.
fn next_launch_id() -> i32 {
    static NEXT: AtomicI32 = AtomicI32::new(1);
    NEXT.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
        Some(if n == i32::MAX { 1 } else { n + 1 })
    })
    .unwrap_or(1)
}

/// An argument of [`LoadedExecutable::execute_donating`].
#[derive(Debug)]
pub enum Argument<'b> {
    /// Lent for the call: the buffer stays valid.
    Lent(&'b Buffer),
    /// Given to the call: the program may reuse its memory for an output; the buffer is gone
    /// afterwards.
    Donated(Buffer),
}

impl Argument<'_> {
    fn buffer(&self) -> &Buffer {
        match self {
            Argument::Lent(b) => b,
            Argument::Donated(b) => b,
        }
    }
}

/// A program compiled for and loaded on a client's devices.
pub struct LoadedExecutable {
    client: Arc<ClientInner>,
    raw: NonNull<ffi::PJRT_LoadedExecutable>,
    devices: Vec<usize>,
    num_outputs: usize,
    name: String,
    parameters: Option<Vec<ArrayShape>>,
}

// SAFETY: a PJRT loaded executable is thread-safe (PjRtLoadedExecutable::Execute may be called
// concurrently); the wrapper is immutable and destroys the executable once, in Drop.
unsafe impl Send for LoadedExecutable {}
// SAFETY: as above.
unsafe impl Sync for LoadedExecutable {}

impl fmt::Debug for LoadedExecutable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoadedExecutable")
            .field("name", &self.name)
            .field("devices", &self.devices)
            .field("num_outputs", &self.num_outputs)
            .finish()
    }
}

impl Drop for LoadedExecutable {
    fn drop(&mut self) {
        let p = self.client.plugin.inner;
        if let Ok(f) = api_fn!(p, PJRT_LoadedExecutable_Destroy) {
            let mut args = ffi::PJRT_LoadedExecutable_Destroy_Args::init();
            args.executable = self.raw.as_ptr();
            // SAFETY: owned, destroyed exactly once; its client is alive.
            let err = unsafe { f(&mut args) };
            p.ignore_error(err);
        }
    }
}

impl LoadedExecutable {
    fn from_raw(
        client: Arc<ClientInner>,
        raw: NonNull<ffi::PJRT_LoadedExecutable>,
    ) -> Result<Self> {
        let p = client.plugin.inner;
        // Owned from the start: an error below destroys it.
        let mut exe = Self {
            client,
            raw,
            devices: Vec::new(),
            num_outputs: 0,
            name: String::new(),
            parameters: None,
        };

        let unloaded = exe.executable()?;
        exe.num_outputs = unloaded.num_outputs()?;
        exe.name = unloaded.name()?;
        // Best effort: without a signature, `execute` leaves argument checking to the plugin.
        exe.parameters = unloaded.parameters().ok().flatten();
        drop(unloaded);

        let f = api_fn!(p, PJRT_LoadedExecutable_AddressableDevices)?;
        let mut args = ffi::PJRT_LoadedExecutable_AddressableDevices_Args::init();
        args.executable = raw.as_ptr();
        // SAFETY: `args` is initialised and the executable alive.
        let err = unsafe { f(&mut args) };
        p.check(err, "PJRT_LoadedExecutable_AddressableDevices")?;
        // SAFETY: `num_addressable_devices` entries owned by the live executable.
        let raw_devices =
            unsafe { raw_slice(args.addressable_devices, args.num_addressable_devices) };
        exe.devices = raw_devices
            .iter()
            .map(|&d| {
                exe.client
                    .devices
                    .iter()
                    .position(|c| c.raw.as_ptr() == d)
                    .ok_or_else(|| Error::PluginContract {
                        operation: "PJRT_LoadedExecutable_AddressableDevices",
                        reason: "a device that is not one of the client's".into(),
                    })
            })
            .collect::<Result<_>>()?;
        Ok(exe)
    }

    /// Name of the compiled module.
    /// The compiled executable behind this loaded one (a new handle to it): its memory
    /// statistics, cost analysis and optimized program.
    pub fn executable(&self) -> Result<Executable> {
        let p = self.client.plugin.inner;
        let f = api_fn!(p, PJRT_LoadedExecutable_GetExecutable)?;
        let mut args = ffi::PJRT_LoadedExecutable_GetExecutable_Args::init();
        args.loaded_executable = self.raw.as_ptr();
        // SAFETY: `args` is initialised and the executable alive.
        let err = unsafe { f(&mut args) };
        p.check(err, "PJRT_LoadedExecutable_GetExecutable")?;
        Executable::from_raw(self.client.plugin, args.executable)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Number of devices the executable runs on (= number of argument lists `execute` takes).
    pub fn num_devices(&self) -> usize {
        self.devices.len()
    }

    /// Indices (in [`Client::devices`]) of the devices, in execution order: argument list `i`
    /// runs on device `device_indices()[i]`.
    pub fn device_indices(&self) -> &[usize] {
        &self.devices
    }

    /// Outputs per device.
    pub fn num_outputs(&self) -> usize {
        self.num_outputs
    }

    /// The per-device parameters of the compiled program, when the plugin reports them.
    /// `execute` checks every argument against them before anything reaches the plugin.
    pub fn parameters(&self) -> Option<&[ArrayShape]> {
        self.parameters.as_deref()
    }

    /// Runs the program on all its devices: `argument_lists[i]` are the arguments of the
    /// executable's device `i` (each buffer must live on that device). Returns the outputs per
    /// device, after every device finished.
    ///
    /// Arguments are never donated: they stay valid after the call.
    pub fn execute<'b, L: AsRef<[&'b Buffer]>>(
        &self,
        argument_lists: &[L],
    ) -> Result<Vec<Vec<Buffer>>> {
        let lists: Vec<&[&Buffer]> = argument_lists.iter().map(AsRef::as_ref).collect();
        let num_args = lists.first().map_or(0, |l| l.len());
        self.execute_raw(&lists, &vec![false; num_args])
    }

    /// Runs like [`LoadedExecutable::execute`], with some arguments given to the program
    /// ([`Argument::Donated`]) rather than lent: the program may write its outputs into their
    /// memory (where it aliases an output to that parameter, `tf.aliasing_output`), and the
    /// buffers are gone after the call. This is how state stays on the devices from one step
    /// to the next without a second copy: pass the step's outputs back in, donated.
    ///
    /// An argument is donated on every device or on none (PJRT's donation is per parameter).
    /// A donated buffer is moved into the call, so using it afterwards does not compile:
    ///
    /// ```compile_fail
    /// # use tessera_runtime::{Argument, Buffer, LoadedExecutable};
    /// fn step(exe: &LoadedExecutable, state: Buffer) {
    ///     let _next = exe.execute_donating(vec![vec![Argument::Donated(state)]]);
    ///     let _ = state.to_host(); // error[E0382]: borrow of moved value: `state`
    /// }
    /// ```
    ///
    /// What the XLA CPU plugins (`lammps-jax-pjrt-cpu` 0.11.2, `xla-cpu-pjrt` 0.0.1) do, measured
    /// by `tests/donation.rs`:
    /// a donated argument that the program aliases to an output is consumed (the plugin marks
    /// it deleted) and the output lives at the same device address; a donated argument the
    /// program does not alias is left alone by the plugin and freed here.
    pub fn execute_donating(
        &self,
        argument_lists: Vec<Vec<Argument<'_>>>,
    ) -> Result<Vec<Vec<Buffer>>> {
        let num_args = argument_lists.first().map_or(0, Vec::len);
        let mut donated = vec![false; num_args];
        if let Some(first) = argument_lists.first() {
            for (i, a) in first.iter().enumerate() {
                donated[i] = matches!(a, Argument::Donated(_));
            }
        }
        for (list, args) in argument_lists.iter().enumerate() {
            for (argument, a) in args.iter().enumerate() {
                let is_donated = matches!(a, Argument::Donated(_));
                if donated.get(argument).is_some_and(|&d| d != is_donated) {
                    return Err(Error::DonationMismatch { argument, list });
                }
            }
        }
        let lists: Vec<Vec<&Buffer>> = argument_lists
            .iter()
            .map(|l| l.iter().map(Argument::buffer).collect())
            .collect();
        let slices: Vec<&[&Buffer]> = lists.iter().map(Vec::as_slice).collect();
        let outputs = self.execute_raw(&slices, &donated);
        // The donated buffers die here, after every device finished with them (or failed).
        drop(lists);
        drop(argument_lists);
        outputs
    }

    fn execute_raw(
        &self,
        argument_lists: &[&[&Buffer]],
        donated: &[bool],
    ) -> Result<Vec<Vec<Buffer>>> {
        let p = self.client.plugin.inner;
        let num_devices = self.devices.len();
        if argument_lists.len() != num_devices {
            return Err(Error::DeviceCountMismatch {
                expected: num_devices,
                actual: argument_lists.len(),
            });
        }
        let num_args = argument_lists.first().map_or(0, |l| l.len());
        let mut raw_lists: Vec<Vec<*mut ffi::PJRT_Buffer>> = Vec::with_capacity(num_devices);
        for (list, &args) in argument_lists.iter().enumerate() {
            if args.len() != num_args {
                return Err(Error::ArgumentCount {
                    device: list,
                    expected: num_args,
                    actual: args.len(),
                });
            }
            if let Some(params) = &self.parameters {
                if params.len() != num_args {
                    return Err(Error::ParameterCount {
                        expected: params.len(),
                        actual: num_args,
                    });
                }
                for (argument, (buffer, param)) in args.iter().zip(params).enumerate() {
                    if buffer.element_type != param.element_type || buffer.dims != param.dims {
                        return Err(Error::ArgumentShape {
                            list,
                            argument,
                            expected: param.clone(),
                            actual: ArrayShape {
                                element_type: buffer.element_type,
                                dims: buffer.dims.clone(),
                            },
                        });
                    }
                }
            }
            for (argument, buffer) in args.iter().enumerate() {
                if !Arc::ptr_eq(&buffer.client, &self.client) {
                    return Err(Error::ForeignObject {
                        what: "an execute argument",
                    });
                }
                if buffer.device != self.devices[list] {
                    return Err(Error::WrongDevice {
                        list,
                        argument,
                        expected_device: self.devices[list],
                        actual_device: buffer.device,
                    });
                }
            }
            raw_lists.push(args.iter().map(|b| b.raw.as_ptr()).collect());
        }
        let list_ptrs: Vec<*const *mut ffi::PJRT_Buffer> =
            raw_lists.iter().map(|l| l.as_ptr()).collect();
        let mut outputs: Vec<Vec<*mut ffi::PJRT_Buffer>> =
            vec![vec![ptr::null_mut(); self.num_outputs]; num_devices];
        let output_ptrs: Vec<*mut *mut ffi::PJRT_Buffer> =
            outputs.iter_mut().map(|l| l.as_mut_ptr()).collect();
        let mut events: Vec<*mut ffi::PJRT_Event> = vec![ptr::null_mut(); num_devices];
        // PJRT donates every parameter the program aliases unless listed here.
        let non_donatable: Vec<i64> = (0..num_args)
            .filter(|&i| !donated.get(i).copied().unwrap_or(false))
            .map(|i| i as i64)
            .collect();

        let f = api_fn!(p, PJRT_LoadedExecutable_Execute)?;
        let mut options = ffi::PJRT_ExecuteOptions::init();
        options.launch_id = next_launch_id();
        options.non_donatable_input_indices = non_donatable.as_ptr();
        options.num_non_donatable_input_indices = non_donatable.len();
        let mut args = ffi::PJRT_LoadedExecutable_Execute_Args::init();
        args.executable = self.raw.as_ptr();
        args.options = &mut options;
        args.argument_lists = list_ptrs.as_ptr();
        args.num_devices = num_devices;
        args.num_args = num_args;
        args.output_lists = output_ptrs.as_ptr();
        args.device_complete_events = events.as_mut_ptr();
        // SAFETY: `args` is initialised; the argument lists hold `num_devices` x `num_args`
        // live buffers of this client (borrowed for the call, kept alive by the caller; a
        // donated one is owned by the caller until after the call, which may only mark it
        // deleted); the
        // output lists have `num_devices` x `num_outputs` writable slots and the events array
        // `num_devices`; options and the non-donatable index list outlive the call.
        let err = unsafe { f(&mut args) };
        drop(output_ptrs);

        // Own everything the plugin wrote before looking at the error.
        let events: Vec<Event> = events
            .into_iter()
            .filter_map(|e| Event::new(p, e))
            .collect();
        let owned: Vec<Vec<Option<Buffer>>> = outputs
            .iter()
            .enumerate()
            .map(|(i, list)| {
                list.iter()
                    .map(|&raw| {
                        NonNull::new(raw).map(|raw| Buffer {
                            client: self.client.clone(),
                            raw,
                            device: self.devices[i],
                            // Placeholders until `load_metadata`.
                            element_type: ElementType::U8,
                            dims: Vec::new(),
                        })
                    })
                    .collect()
            })
            .collect();
        p.check(err, "PJRT_LoadedExecutable_Execute")?;

        // Wait for every device, keeping the first error.
        let mut first_error = None;
        for event in events {
            if let Err(e) = event.wait("PJRT_LoadedExecutable_Execute") {
                first_error.get_or_insert(e);
            }
        }
        if let Some(e) = first_error {
            return Err(e);
        }

        owned
            .into_iter()
            .map(|list| {
                list.into_iter()
                    .map(|slot| {
                        let mut buffer = slot.ok_or_else(|| Error::PluginContract {
                            operation: "PJRT_LoadedExecutable_Execute",
                            reason: "a null output buffer without an error".into(),
                        })?;
                        buffer.load_metadata()?;
                        Ok(buffer)
                    })
                    .collect()
            })
            .collect()
    }

    /// Copies host arrays to the executable's devices (list `i` to its device `i`), runs, and
    /// copies every output back: the one-call form for tests and small programs.
    pub fn execute_host<L: AsRef<[HostBuffer]>>(
        &self,
        argument_lists: &[L],
    ) -> Result<Vec<Vec<HostBuffer>>> {
        if argument_lists.len() != self.devices.len() {
            return Err(Error::DeviceCountMismatch {
                expected: self.devices.len(),
                actual: argument_lists.len(),
            });
        }
        let client = Client {
            inner: self.client.clone(),
        };
        let buffers: Vec<Vec<Buffer>> = argument_lists
            .iter()
            .zip(&self.devices)
            .map(|(list, &device)| {
                list.as_ref()
                    .iter()
                    .map(|h| client.buffer_from_host(h, device))
                    .collect()
            })
            .collect::<Result<_>>()?;
        let refs: Vec<Vec<&Buffer>> = buffers.iter().map(|l| l.iter().collect()).collect();
        let outputs = self.execute(&refs)?;
        outputs
            .iter()
            .map(|list| list.iter().map(Buffer::to_host).collect())
            .collect()
    }
}
