//! Raw `#[repr(C)]` binding of the subset of the PJRT C API (`pjrt_c_api.h`, version 0.81)
//! that tessera uses.
//!
//! Hand-written from the header shipped in the `xla-cpu-pjrt==0.0.1` wheel
//! (`xla_plugins/xla_cpu_pjrt/include/pjrt_c_api.h`). Nothing here is generated at build time.
//!
//! * Every struct is declared through the internal `pjrt_structs!` macro, which also records its size, alignment,
//!   `<name>_STRUCT_SIZE` and field offsets in [`STRUCT_LAYOUTS`]. The test
//!   `tests/ffi_layout.rs` compiles a C program against the real header and checks every one of
//!   them, plus every function-pointer offset of [`PJRT_Api`] and the enum values in
//!   [`ENUM_VALUES`].
//! * The API is append-only: callers set `struct_size` of every args struct to the size this
//!   binding was built with (`T::STRUCT_SIZE`), and must check the plugin's
//!   `PJRT_Api::struct_size` before reading a function pointer (an older plugin has a shorter
//!   table). The safe layer does both.
//! * Function-pointer slots of [`PJRT_Api`] that tessera does not call are typed [`Unbound`]: they
//!   are present (the table's layout must be exact) but never called.
//!
//! This module is public for advanced use and for the layout test; it carries no stability
//! promise beyond the C header's own.

#![allow(non_camel_case_types, non_snake_case, non_upper_case_globals)]

use core::ffi::{c_char, c_int, c_void};
use core::marker::{PhantomData, PhantomPinned};

/// Major version of the header this binding was written from.
pub const PJRT_API_MAJOR: c_int = 0;
/// Minor version of the header this binding was written from.
pub const PJRT_API_MINOR: c_int = 81;

/// Types for which the all-zero bit pattern is a valid value.
///
/// # Safety
/// Implement only for types whose every field (recursively) is an integer, a `bool`, a float, a
/// raw pointer or an `Option` of a function pointer.
pub unsafe trait Zeroable: Sized {
    /// The all-zero value.
    fn zeroed() -> Self {
        // SAFETY: the trait's contract says all-zero bits are a valid `Self`.
        unsafe { core::mem::zeroed() }
    }
}

// SAFETY: integers, bools and floats are valid when zero.
unsafe impl Zeroable for usize {}
// SAFETY: as above.
unsafe impl Zeroable for i32 {}
// SAFETY: as above.
unsafe impl Zeroable for u32 {}
// SAFETY: as above.
unsafe impl Zeroable for i64 {}
// SAFETY: as above.
unsafe impl Zeroable for f32 {}
// SAFETY: `false` is all-zero.
unsafe impl Zeroable for bool {}
// SAFETY: a null thin raw pointer is valid.
unsafe impl<T> Zeroable for *const T {}
// SAFETY: a null thin raw pointer is valid.
unsafe impl<T> Zeroable for *mut T {}
// SAFETY: `None` of a function pointer is the null pointer.
unsafe impl<A> Zeroable for Option<unsafe extern "C" fn(*mut A) -> *mut PJRT_Error> {}
// SAFETY: as above.
unsafe impl<A> Zeroable for Option<unsafe extern "C" fn(*mut A)> {}
// SAFETY: as above.
unsafe impl Zeroable for Option<unsafe extern "C" fn()> {}

const fn assert_zeroable<T: Zeroable>() {}

/// Layout of one bound struct as this binding sees it (checked against the C header in tests).
#[derive(Debug, Clone, Copy)]
pub struct StructLayout {
    /// C name of the struct.
    pub name: &'static str,
    /// `size_of`.
    pub size: usize,
    /// `align_of`.
    pub align: usize,
    /// End of the last field: the C header's `<name>_STRUCT_SIZE`.
    pub struct_size: usize,
    /// `(C field name, offset)` of every field.
    pub fields: &'static [(&'static str, usize)],
}

macro_rules! c_field_name {
    ($field:ident as $cname:ident) => {
        stringify!($cname)
    };
    ($field:ident) => {
        stringify!($field)
    };
}

/// Declares `#[repr(C)]` structs, their `STRUCT_SIZE`, a [`Zeroable`] impl (checked per field)
/// and the [`STRUCT_LAYOUTS`] table. `pub rust_name as c_name: T` binds a field whose C name
/// differs (an anonymous union member).
macro_rules! pjrt_structs {
    ($(
        $(#[$sm:meta])*
        pub struct $name:ident {
            $( $(#[$fm:meta])* pub $field:ident $(as $cname:ident)? : $ty:ty, )*
        }
    )*) => {
        $(
            $(#[$sm])*
            #[repr(C)]
            #[derive(Debug, Clone, Copy)]
            pub struct $name {
                $(
                    $(#[$fm])*
                    #[doc = concat!("C field `", c_field_name!($field $(as $cname)?), "`.")]
                    pub $field: $ty,
                )*
            }

            impl $name {
                /// All fields zero (null pointers, `None` functions) except `struct_size`, which
                /// is set to [`Self::STRUCT_SIZE`]: the usual way to start an args struct.
                pub fn init() -> Self {
                    let mut s = <Self as Zeroable>::zeroed();
                    s.struct_size = Self::STRUCT_SIZE;
                    s
                }

                /// Offset of the end of the last field: the value for `struct_size`.
                pub const STRUCT_SIZE: usize = {
                    let mut end = 0;
                    $(
                        let e = core::mem::offset_of!($name, $field) + core::mem::size_of::<$ty>();
                        if e > end {
                            end = e;
                        }
                    )*
                    end
                };
            }

            // SAFETY: every field type is `Zeroable`, which the const block below checks.
            unsafe impl Zeroable for $name {}
            const _: () = { $( assert_zeroable::<$ty>(); )* };
        )*

        /// Layout of every struct declared in this module.
        pub const STRUCT_LAYOUTS: &[StructLayout] = &[
            $(
                StructLayout {
                    name: stringify!($name),
                    size: core::mem::size_of::<$name>(),
                    align: core::mem::align_of::<$name>(),
                    struct_size: $name::STRUCT_SIZE,
                    fields: &[ $( (c_field_name!($field $(as $cname)?),
                                   core::mem::offset_of!($name, $field)) ),* ],
                },
            )*
        ];
    };
}

macro_rules! opaque {
    ($($(#[$m:meta])* $name:ident),* $(,)?) => {
        $(
            $(#[$m])*
            #[repr(C)]
            #[derive(Debug)]
            pub struct $name {
                _data: [u8; 0],
                _marker: PhantomData<(*mut u8, PhantomPinned)>,
            }
        )*
    };
}

opaque!(
    /// Opaque error object; free with `PJRT_Error_Destroy`.
    PJRT_Error,
    /// Opaque extension chain node (always passed as null).
    PJRT_Extension_Base,
    /// Opaque event; free with `PJRT_Event_Destroy`.
    PJRT_Event,
    /// Opaque client; free with `PJRT_Client_Destroy`.
    PJRT_Client,
    /// Opaque device, owned by its client.
    PJRT_Device,
    /// Opaque memory space, owned by its client.
    PJRT_Memory,
    /// Opaque device description.
    PJRT_DeviceDescription,
    /// Opaque topology description.
    PJRT_TopologyDescription,
    /// Opaque compiled (unloaded) executable.
    PJRT_Executable,
    /// Opaque loaded executable.
    PJRT_LoadedExecutable,
    /// Opaque device buffer.
    PJRT_Buffer,
    /// Opaque execute context.
    PJRT_ExecuteContext,
    /// Opaque send-callback info (never used: always null).
    PJRT_SendCallbackInfo,
    /// Opaque recv-callback info (never used: always null).
    PJRT_RecvCallbackInfo,
    /// Opaque backing store of a serialized executable.
    PJRT_SerializedExecutable,
);

/// A PJRT function taking an args struct and returning an owned error (null on success).
pub type PjrtFn<A> = Option<unsafe extern "C" fn(args: *mut A) -> *mut PJRT_Error>;
/// A slot of [`PJRT_Api`] that tessera does not call. Present only for the table's layout.
pub type Unbound = Option<unsafe extern "C" fn()>;

/// C `PJRT_Error_Code`.
pub type PJRT_Error_Code = u32;
/// C `PJRT_NamedValue_Type`.
pub type PJRT_NamedValue_Type = u32;
/// C `PJRT_Buffer_Type`.
pub type PJRT_Buffer_Type = u32;
/// C `PJRT_HostBufferSemantics`.
pub type PJRT_HostBufferSemantics = u32;
/// C `PJRT_Buffer_MemoryLayout_Type`.
pub type PJRT_Buffer_MemoryLayout_Type = u32;

/// `PJRT_NamedValue_kString`.
pub const PJRT_NamedValue_kString: PJRT_NamedValue_Type = 0;
/// `PJRT_NamedValue_kInt64`.
pub const PJRT_NamedValue_kInt64: PJRT_NamedValue_Type = 1;
/// `PJRT_NamedValue_kInt64List`.
pub const PJRT_NamedValue_kInt64List: PJRT_NamedValue_Type = 2;
/// `PJRT_NamedValue_kFloat`.
pub const PJRT_NamedValue_kFloat: PJRT_NamedValue_Type = 3;
/// `PJRT_NamedValue_kBool`.
pub const PJRT_NamedValue_kBool: PJRT_NamedValue_Type = 4;

/// `PJRT_Buffer_Type_INVALID`.
pub const PJRT_Buffer_Type_INVALID: PJRT_Buffer_Type = 0;
/// `PJRT_Buffer_Type_PRED`.
pub const PJRT_Buffer_Type_PRED: PJRT_Buffer_Type = 1;
/// `PJRT_Buffer_Type_S8`.
pub const PJRT_Buffer_Type_S8: PJRT_Buffer_Type = 2;
/// `PJRT_Buffer_Type_S16`.
pub const PJRT_Buffer_Type_S16: PJRT_Buffer_Type = 3;
/// `PJRT_Buffer_Type_S32`.
pub const PJRT_Buffer_Type_S32: PJRT_Buffer_Type = 4;
/// `PJRT_Buffer_Type_S64`.
pub const PJRT_Buffer_Type_S64: PJRT_Buffer_Type = 5;
/// `PJRT_Buffer_Type_U8`.
pub const PJRT_Buffer_Type_U8: PJRT_Buffer_Type = 6;
/// `PJRT_Buffer_Type_U16`.
pub const PJRT_Buffer_Type_U16: PJRT_Buffer_Type = 7;
/// `PJRT_Buffer_Type_U32`.
pub const PJRT_Buffer_Type_U32: PJRT_Buffer_Type = 8;
/// `PJRT_Buffer_Type_U64`.
pub const PJRT_Buffer_Type_U64: PJRT_Buffer_Type = 9;
/// `PJRT_Buffer_Type_F16`.
pub const PJRT_Buffer_Type_F16: PJRT_Buffer_Type = 10;
/// `PJRT_Buffer_Type_F32`.
pub const PJRT_Buffer_Type_F32: PJRT_Buffer_Type = 11;
/// `PJRT_Buffer_Type_F64`.
pub const PJRT_Buffer_Type_F64: PJRT_Buffer_Type = 12;
/// `PJRT_Buffer_Type_BF16`.
pub const PJRT_Buffer_Type_BF16: PJRT_Buffer_Type = 13;

/// `PJRT_HostBufferSemantics_kImmutableOnlyDuringCall`.
pub const PJRT_HostBufferSemantics_kImmutableOnlyDuringCall: PJRT_HostBufferSemantics = 0;
/// `PJRT_HostBufferSemantics_kImmutableUntilTransferCompletes`.
pub const PJRT_HostBufferSemantics_kImmutableUntilTransferCompletes: PJRT_HostBufferSemantics = 1;

/// `PJRT_Buffer_MemoryLayout_Type_Tiled`.
pub const PJRT_Buffer_MemoryLayout_Type_Tiled: PJRT_Buffer_MemoryLayout_Type = 0;
/// `PJRT_Buffer_MemoryLayout_Type_Strides`.
pub const PJRT_Buffer_MemoryLayout_Type_Strides: PJRT_Buffer_MemoryLayout_Type = 1;

/// Value of every C enum constant and version macro used here, by C name (checked in tests).
pub const ENUM_VALUES: &[(&str, i64)] = &[
    ("PJRT_API_MAJOR", PJRT_API_MAJOR as i64),
    ("PJRT_API_MINOR", PJRT_API_MINOR as i64),
    ("PJRT_NamedValue_kString", PJRT_NamedValue_kString as i64),
    ("PJRT_NamedValue_kInt64", PJRT_NamedValue_kInt64 as i64),
    (
        "PJRT_NamedValue_kInt64List",
        PJRT_NamedValue_kInt64List as i64,
    ),
    ("PJRT_NamedValue_kFloat", PJRT_NamedValue_kFloat as i64),
    ("PJRT_NamedValue_kBool", PJRT_NamedValue_kBool as i64),
    ("PJRT_Buffer_Type_INVALID", PJRT_Buffer_Type_INVALID as i64),
    ("PJRT_Buffer_Type_PRED", PJRT_Buffer_Type_PRED as i64),
    ("PJRT_Buffer_Type_S8", PJRT_Buffer_Type_S8 as i64),
    ("PJRT_Buffer_Type_S16", PJRT_Buffer_Type_S16 as i64),
    ("PJRT_Buffer_Type_S32", PJRT_Buffer_Type_S32 as i64),
    ("PJRT_Buffer_Type_S64", PJRT_Buffer_Type_S64 as i64),
    ("PJRT_Buffer_Type_U8", PJRT_Buffer_Type_U8 as i64),
    ("PJRT_Buffer_Type_U16", PJRT_Buffer_Type_U16 as i64),
    ("PJRT_Buffer_Type_U32", PJRT_Buffer_Type_U32 as i64),
    ("PJRT_Buffer_Type_U64", PJRT_Buffer_Type_U64 as i64),
    ("PJRT_Buffer_Type_F16", PJRT_Buffer_Type_F16 as i64),
    ("PJRT_Buffer_Type_F32", PJRT_Buffer_Type_F32 as i64),
    ("PJRT_Buffer_Type_F64", PJRT_Buffer_Type_F64 as i64),
    ("PJRT_Buffer_Type_BF16", PJRT_Buffer_Type_BF16 as i64),
    (
        "PJRT_HostBufferSemantics_kImmutableOnlyDuringCall",
        PJRT_HostBufferSemantics_kImmutableOnlyDuringCall as i64,
    ),
    (
        "PJRT_HostBufferSemantics_kImmutableUntilTransferCompletes",
        PJRT_HostBufferSemantics_kImmutableUntilTransferCompletes as i64,
    ),
    (
        "PJRT_Buffer_MemoryLayout_Type_Tiled",
        PJRT_Buffer_MemoryLayout_Type_Tiled as i64,
    ),
    (
        "PJRT_Buffer_MemoryLayout_Type_Strides",
        PJRT_Buffer_MemoryLayout_Type_Strides as i64,
    ),
    ("PJRT_Error_Code_OK", 0),
    ("PJRT_Error_Code_CANCELLED", 1),
    ("PJRT_Error_Code_UNKNOWN", 2),
    ("PJRT_Error_Code_INVALID_ARGUMENT", 3),
    ("PJRT_Error_Code_DEADLINE_EXCEEDED", 4),
    ("PJRT_Error_Code_NOT_FOUND", 5),
    ("PJRT_Error_Code_ALREADY_EXISTS", 6),
    ("PJRT_Error_Code_PERMISSION_DENIED", 7),
    ("PJRT_Error_Code_RESOURCE_EXHAUSTED", 8),
    ("PJRT_Error_Code_FAILED_PRECONDITION", 9),
    ("PJRT_Error_Code_ABORTED", 10),
    ("PJRT_Error_Code_OUT_OF_RANGE", 11),
    ("PJRT_Error_Code_UNIMPLEMENTED", 12),
    ("PJRT_Error_Code_INTERNAL", 13),
    ("PJRT_Error_Code_UNAVAILABLE", 14),
    ("PJRT_Error_Code_DATA_LOSS", 15),
    ("PJRT_Error_Code_UNAUTHENTICATED", 16),
];

/// The anonymous value union of `PJRT_NamedValue`; which member is live is given by `type_`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union PJRT_NamedValue_Value {
    /// `kString`: `value_size` bytes, not NUL-terminated.
    pub string_value: *const c_char,
    /// `kInt64`.
    pub int64_value: i64,
    /// `kInt64List`: `value_size` elements.
    pub int64_array_value: *const i64,
    /// `kFloat`.
    pub float_value: f32,
    /// `kBool`.
    pub bool_value: bool,
}

// SAFETY: every member is valid when zero, and all-zero is a valid union value.
unsafe impl Zeroable for PJRT_NamedValue_Value {}

impl core::fmt::Debug for PJRT_NamedValue_Value {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("PJRT_NamedValue_Value { .. }")
    }
}

/// The anonymous layout union of `PJRT_Buffer_MemoryLayout`; `type_` says which is live.
#[repr(C)]
#[derive(Clone, Copy)]
pub union PJRT_Buffer_MemoryLayout_Value {
    /// `PJRT_Buffer_MemoryLayout_Type_Tiled`.
    pub tiled: PJRT_Buffer_MemoryLayout_Tiled,
    /// `PJRT_Buffer_MemoryLayout_Type_Strides`.
    pub strides: PJRT_Buffer_MemoryLayout_Strides,
}

// SAFETY: both members are `Zeroable` structs.
unsafe impl Zeroable for PJRT_Buffer_MemoryLayout_Value {}

impl core::fmt::Debug for PJRT_Buffer_MemoryLayout_Value {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("PJRT_Buffer_MemoryLayout_Value { .. }")
    }
}

/// `void PJRT_Error_Destroy(PJRT_Error_Destroy_Args*)`.
pub type PJRT_Error_Destroy = Option<unsafe extern "C" fn(args: *mut PJRT_Error_Destroy_Args)>;
/// `void PJRT_Error_Message(PJRT_Error_Message_Args*)`.
pub type PJRT_Error_Message = Option<unsafe extern "C" fn(args: *mut PJRT_Error_Message_Args)>;
/// `void (*)(PJRT_SerializedExecutable*)`.
pub type PJRT_SerializedExecutable_Deleter =
    Option<unsafe extern "C" fn(exec: *mut PJRT_SerializedExecutable)>;

pjrt_structs! {
    /// `struct PJRT_Api_Version`.
    pub struct PJRT_Api_Version {
        pub struct_size: usize,
        pub extension_start: *mut PJRT_Extension_Base,
        pub major_version: c_int,
        pub minor_version: c_int,
    }

    /// `struct PJRT_Error_Destroy_Args`.
    pub struct PJRT_Error_Destroy_Args {
        pub struct_size: usize,
        pub extension_start: *mut PJRT_Extension_Base,
        pub error: *mut PJRT_Error,
    }

    /// `struct PJRT_Error_Message_Args`.
    pub struct PJRT_Error_Message_Args {
        pub struct_size: usize,
        pub extension_start: *mut PJRT_Extension_Base,
        pub error: *const PJRT_Error,
        pub message: *const c_char,
        pub message_size: usize,
    }

    /// `struct PJRT_Error_GetCode_Args`.
    pub struct PJRT_Error_GetCode_Args {
        pub struct_size: usize,
        pub extension_start: *mut PJRT_Extension_Base,
        pub error: *const PJRT_Error,
        pub code: PJRT_Error_Code,
    }

    /// `struct PJRT_NamedValue` (the anonymous union is the field `value`).
    pub struct PJRT_NamedValue {
        pub struct_size: usize,
        pub extension_start: *mut PJRT_Extension_Base,
        pub name: *const c_char,
        pub name_size: usize,
        pub type_ as type: PJRT_NamedValue_Type,
        pub value as int64_value: PJRT_NamedValue_Value,
        pub value_size: usize,
    }

    /// `struct PJRT_Plugin_Initialize_Args`.
    pub struct PJRT_Plugin_Initialize_Args {
        pub struct_size: usize,
        pub extension_start: *mut PJRT_Extension_Base,
    }

    /// `struct PJRT_Plugin_Attributes_Args`.
    pub struct PJRT_Plugin_Attributes_Args {
        pub struct_size: usize,
        pub extension_start: *mut PJRT_Extension_Base,
        pub attributes: *const PJRT_NamedValue,
        pub num_attributes: usize,
    }

    /// `struct PJRT_Event_Destroy_Args`.
    pub struct PJRT_Event_Destroy_Args {
        pub struct_size: usize,
        pub extension_start: *mut PJRT_Extension_Base,
        pub event: *mut PJRT_Event,
    }

    /// `struct PJRT_Event_Await_Args`.
    pub struct PJRT_Event_Await_Args {
        pub struct_size: usize,
        pub extension_start: *mut PJRT_Extension_Base,
        pub event: *mut PJRT_Event,
    }

    /// `struct PJRT_Client_Create_Args`. The key-value callbacks are always null here.
    pub struct PJRT_Client_Create_Args {
        pub struct_size: usize,
        pub extension_start: *mut PJRT_Extension_Base,
        pub create_options: *const PJRT_NamedValue,
        pub num_options: usize,
        pub kv_get_callback: Option<unsafe extern "C" fn(args: *mut c_void) -> *mut PJRT_Error>,
        pub kv_get_user_arg: *mut c_void,
        pub kv_put_callback: Option<unsafe extern "C" fn(args: *mut c_void) -> *mut PJRT_Error>,
        pub kv_put_user_arg: *mut c_void,
        pub client: *mut PJRT_Client,
        pub kv_try_get_callback:
            Option<unsafe extern "C" fn(args: *mut c_void) -> *mut PJRT_Error>,
        pub kv_try_get_user_arg: *mut c_void,
    }

    /// `struct PJRT_Client_Destroy_Args`.
    pub struct PJRT_Client_Destroy_Args {
        pub struct_size: usize,
        pub extension_start: *mut PJRT_Extension_Base,
        pub client: *mut PJRT_Client,
    }

    /// `struct PJRT_Client_PlatformName_Args`.
    pub struct PJRT_Client_PlatformName_Args {
        pub struct_size: usize,
        pub extension_start: *mut PJRT_Extension_Base,
        pub client: *mut PJRT_Client,
        pub platform_name: *const c_char,
        pub platform_name_size: usize,
    }

    /// `struct PJRT_Client_PlatformVersion_Args`.
    pub struct PJRT_Client_PlatformVersion_Args {
        pub struct_size: usize,
        pub extension_start: *mut PJRT_Extension_Base,
        pub client: *mut PJRT_Client,
        pub platform_version: *const c_char,
        pub platform_version_size: usize,
    }

    /// `struct PJRT_Client_AddressableDevices_Args`.
    pub struct PJRT_Client_AddressableDevices_Args {
        pub struct_size: usize,
        pub extension_start: *mut PJRT_Extension_Base,
        pub client: *mut PJRT_Client,
        pub addressable_devices: *const *mut PJRT_Device,
        pub num_addressable_devices: usize,
    }

    /// `struct PJRT_Program`.
    pub struct PJRT_Program {
        pub struct_size: usize,
        pub extension_start: *mut PJRT_Extension_Base,
        pub code: *mut c_char,
        pub code_size: usize,
        pub format: *const c_char,
        pub format_size: usize,
    }

    /// `struct PJRT_Client_Compile_Args`.
    pub struct PJRT_Client_Compile_Args {
        pub struct_size: usize,
        pub extension_start: *mut PJRT_Extension_Base,
        pub client: *mut PJRT_Client,
        pub program: *const PJRT_Program,
        pub compile_options: *const c_char,
        pub compile_options_size: usize,
        pub executable: *mut PJRT_LoadedExecutable,
    }

    /// `struct PJRT_Buffer_MemoryLayout_Tiled`.
    pub struct PJRT_Buffer_MemoryLayout_Tiled {
        pub struct_size: usize,
        pub extension_start: *mut PJRT_Extension_Base,
        pub minor_to_major: *const i64,
        pub minor_to_major_size: usize,
        pub tile_dims: *const i64,
        pub tile_dim_sizes: *const usize,
        pub num_tiles: usize,
    }

    /// `struct PJRT_Buffer_MemoryLayout_Strides`.
    pub struct PJRT_Buffer_MemoryLayout_Strides {
        pub struct_size: usize,
        pub extension_start: *mut PJRT_Extension_Base,
        pub byte_strides: *const i64,
        pub num_byte_strides: usize,
    }

    /// `struct PJRT_Buffer_MemoryLayout` (the anonymous union is the field `value`).
    pub struct PJRT_Buffer_MemoryLayout {
        pub struct_size: usize,
        pub extension_start: *mut PJRT_Extension_Base,
        pub value as tiled: PJRT_Buffer_MemoryLayout_Value,
        pub type_ as type: PJRT_Buffer_MemoryLayout_Type,
    }

    /// `struct PJRT_Client_BufferFromHostBuffer_Args`.
    pub struct PJRT_Client_BufferFromHostBuffer_Args {
        pub struct_size: usize,
        pub extension_start: *mut PJRT_Extension_Base,
        pub client: *mut PJRT_Client,
        pub data: *const c_void,
        pub type_ as type: PJRT_Buffer_Type,
        pub dims: *const i64,
        pub num_dims: usize,
        pub byte_strides: *const i64,
        pub num_byte_strides: usize,
        pub host_buffer_semantics: PJRT_HostBufferSemantics,
        pub device: *mut PJRT_Device,
        pub memory: *mut PJRT_Memory,
        pub device_layout: *mut PJRT_Buffer_MemoryLayout,
        pub done_with_host_buffer: *mut PJRT_Event,
        pub buffer: *mut PJRT_Buffer,
    }

    /// `struct PJRT_DeviceDescription_Id_Args`.
    pub struct PJRT_DeviceDescription_Id_Args {
        pub struct_size: usize,
        pub extension_start: *mut PJRT_Extension_Base,
        pub device_description: *mut PJRT_DeviceDescription,
        pub id: c_int,
    }

    /// `struct PJRT_DeviceDescription_Kind_Args`.
    pub struct PJRT_DeviceDescription_Kind_Args {
        pub struct_size: usize,
        pub extension_start: *mut PJRT_Extension_Base,
        pub device_description: *mut PJRT_DeviceDescription,
        pub device_kind: *const c_char,
        pub device_kind_size: usize,
    }

    /// `struct PJRT_DeviceDescription_ToString_Args`.
    pub struct PJRT_DeviceDescription_ToString_Args {
        pub struct_size: usize,
        pub extension_start: *mut PJRT_Extension_Base,
        pub device_description: *mut PJRT_DeviceDescription,
        pub to_string: *const c_char,
        pub to_string_size: usize,
    }

    /// `struct PJRT_Device_GetDescription_Args`.
    pub struct PJRT_Device_GetDescription_Args {
        pub struct_size: usize,
        pub extension_start: *mut PJRT_Extension_Base,
        pub device: *mut PJRT_Device,
        pub device_description: *mut PJRT_DeviceDescription,
    }

    /// `struct PJRT_Executable_Destroy_Args`.
    pub struct PJRT_Executable_Destroy_Args {
        pub struct_size: usize,
        pub extension_start: *mut PJRT_Extension_Base,
        pub executable: *mut PJRT_Executable,
    }

    /// `struct PJRT_Executable_Name_Args`.
    pub struct PJRT_Executable_Name_Args {
        pub struct_size: usize,
        pub extension_start: *mut PJRT_Extension_Base,
        pub executable: *mut PJRT_Executable,
        pub executable_name: *const c_char,
        pub executable_name_size: usize,
    }

    /// `struct PJRT_Executable_NumReplicas_Args`.
    pub struct PJRT_Executable_NumReplicas_Args {
        pub struct_size: usize,
        pub extension_start: *mut PJRT_Extension_Base,
        pub executable: *mut PJRT_Executable,
        pub num_replicas: usize,
    }

    /// `struct PJRT_Executable_NumPartitions_Args`.
    pub struct PJRT_Executable_NumPartitions_Args {
        pub struct_size: usize,
        pub extension_start: *mut PJRT_Extension_Base,
        pub executable: *mut PJRT_Executable,
        pub num_partitions: usize,
    }

    /// `struct PJRT_Executable_NumOutputs_Args`.
    pub struct PJRT_Executable_NumOutputs_Args {
        pub struct_size: usize,
        pub extension_start: *mut PJRT_Extension_Base,
        pub executable: *mut PJRT_Executable,
        pub num_outputs: usize,
    }

    /// `struct PJRT_Executable_Serialize_Args`.
    pub struct PJRT_Executable_Serialize_Args {
        pub struct_size: usize,
        pub extension_start: *mut PJRT_Extension_Base,
        pub executable: *const PJRT_Executable,
        pub serialized_bytes: *const c_char,
        pub serialized_bytes_size: usize,
        pub serialized_executable: *mut PJRT_SerializedExecutable,
        pub serialized_executable_deleter: PJRT_SerializedExecutable_Deleter,
    }

    /// `struct PJRT_Executable_SizeOfGeneratedCodeInBytes_Args`.
    pub struct PJRT_Executable_SizeOfGeneratedCodeInBytes_Args {
        pub struct_size: usize,
        pub extension_start: *mut PJRT_Extension_Base,
        pub executable: *mut PJRT_Executable,
        pub size_in_bytes: i64,
    }

    /// `struct PJRT_Executable_GetCostAnalysis_Args`.
    pub struct PJRT_Executable_GetCostAnalysis_Args {
        pub struct_size: usize,
        pub extension_start: *mut PJRT_Extension_Base,
        pub executable: *mut PJRT_Executable,
        pub num_properties: usize,
        pub properties: *const PJRT_NamedValue,
    }

    /// `struct PJRT_Executable_GetCompiledMemoryStats_Args` (mirrors
    /// `xla::CompiledMemoryStats`).
    pub struct PJRT_Executable_GetCompiledMemoryStats_Args {
        pub struct_size: usize,
        pub extension_start: *mut PJRT_Extension_Base,
        pub executable: *mut PJRT_Executable,
        pub generated_code_size_in_bytes: i64,
        pub argument_size_in_bytes: i64,
        pub output_size_in_bytes: i64,
        pub alias_size_in_bytes: i64,
        pub temp_size_in_bytes: i64,
        pub host_generated_code_size_in_bytes: i64,
        pub host_argument_size_in_bytes: i64,
        pub host_output_size_in_bytes: i64,
        pub host_alias_size_in_bytes: i64,
        pub host_temp_size_in_bytes: i64,
        pub peak_memory_in_bytes: i64,
    }

    /// `struct PJRT_Executable_OptimizedProgram_Args`.
    pub struct PJRT_Executable_OptimizedProgram_Args {
        pub struct_size: usize,
        pub extension_start: *mut PJRT_Extension_Base,
        pub executable: *mut PJRT_Executable,
        pub program: *mut PJRT_Program,
    }

    /// `struct PJRT_LoadedExecutable_Destroy_Args`.
    pub struct PJRT_LoadedExecutable_Destroy_Args {
        pub struct_size: usize,
        pub extension_start: *mut PJRT_Extension_Base,
        pub executable: *mut PJRT_LoadedExecutable,
    }

    /// `struct PJRT_LoadedExecutable_GetExecutable_Args`.
    pub struct PJRT_LoadedExecutable_GetExecutable_Args {
        pub struct_size: usize,
        pub extension_start: *mut PJRT_Extension_Base,
        pub loaded_executable: *mut PJRT_LoadedExecutable,
        pub executable: *mut PJRT_Executable,
    }

    /// `struct PJRT_LoadedExecutable_AddressableDevices_Args`.
    pub struct PJRT_LoadedExecutable_AddressableDevices_Args {
        pub struct_size: usize,
        pub extension_start: *mut PJRT_Extension_Base,
        pub executable: *mut PJRT_LoadedExecutable,
        pub addressable_devices: *const *mut PJRT_Device,
        pub num_addressable_devices: usize,
    }

    /// `struct PJRT_ExecuteOptions`.
    pub struct PJRT_ExecuteOptions {
        pub struct_size: usize,
        pub extension_start: *mut PJRT_Extension_Base,
        pub send_callbacks: *mut *mut PJRT_SendCallbackInfo,
        pub recv_callbacks: *mut *mut PJRT_RecvCallbackInfo,
        pub num_send_ops: usize,
        pub num_recv_ops: usize,
        pub launch_id: c_int,
        pub non_donatable_input_indices: *const i64,
        pub num_non_donatable_input_indices: usize,
        pub context: *mut PJRT_ExecuteContext,
        pub call_location: *const c_char,
        pub num_tasks: usize,
        pub task_ids: *mut c_int,
        pub incarnation_ids: *mut i64,
    }

    /// `struct PJRT_LoadedExecutable_Execute_Args`.
    pub struct PJRT_LoadedExecutable_Execute_Args {
        pub struct_size: usize,
        pub extension_start: *mut PJRT_Extension_Base,
        pub executable: *mut PJRT_LoadedExecutable,
        pub options: *mut PJRT_ExecuteOptions,
        pub argument_lists: *const *const *mut PJRT_Buffer,
        pub num_devices: usize,
        pub num_args: usize,
        pub output_lists: *const *mut *mut PJRT_Buffer,
        pub device_complete_events: *mut *mut PJRT_Event,
        pub execute_device: *mut PJRT_Device,
    }

    /// `struct PJRT_Buffer_Destroy_Args`.
    pub struct PJRT_Buffer_Destroy_Args {
        pub struct_size: usize,
        pub extension_start: *mut PJRT_Extension_Base,
        pub buffer: *mut PJRT_Buffer,
    }

    /// `struct PJRT_Buffer_ElementType_Args`.
    pub struct PJRT_Buffer_ElementType_Args {
        pub struct_size: usize,
        pub extension_start: *mut PJRT_Extension_Base,
        pub buffer: *mut PJRT_Buffer,
        pub type_ as type: PJRT_Buffer_Type,
    }

    /// `struct PJRT_Buffer_Dimensions_Args`.
    pub struct PJRT_Buffer_Dimensions_Args {
        pub struct_size: usize,
        pub extension_start: *mut PJRT_Extension_Base,
        pub buffer: *mut PJRT_Buffer,
        pub dims: *const i64,
        pub num_dims: usize,
    }

    /// `struct PJRT_Buffer_ToHostBuffer_Args`.
    pub struct PJRT_Buffer_ToHostBuffer_Args {
        pub struct_size: usize,
        pub extension_start: *mut PJRT_Extension_Base,
        pub src: *mut PJRT_Buffer,
        pub host_layout: *mut PJRT_Buffer_MemoryLayout,
        pub dst: *mut c_void,
        pub dst_size: usize,
        pub event: *mut PJRT_Event,
    }

    /// `struct PJRT_TopologyDescription_Create_Args`.
    pub struct PJRT_TopologyDescription_Create_Args {
        pub struct_size: usize,
        pub extension_start: *mut PJRT_Extension_Base,
        pub topology_name: *const c_char,
        pub topology_name_size: usize,
        pub create_options: *const PJRT_NamedValue,
        pub num_options: usize,
        pub topology: *mut PJRT_TopologyDescription,
    }

    /// `struct PJRT_TopologyDescription_Destroy_Args`.
    pub struct PJRT_TopologyDescription_Destroy_Args {
        pub struct_size: usize,
        pub extension_start: *mut PJRT_Extension_Base,
        pub topology: *mut PJRT_TopologyDescription,
    }

    /// `struct PJRT_TopologyDescription_PlatformName_Args`.
    pub struct PJRT_TopologyDescription_PlatformName_Args {
        pub struct_size: usize,
        pub extension_start: *mut PJRT_Extension_Base,
        pub topology: *const PJRT_TopologyDescription,
        pub platform_name: *const c_char,
        pub platform_name_size: usize,
    }

    /// `struct PJRT_TopologyDescription_GetDeviceDescriptions_Args`.
    pub struct PJRT_TopologyDescription_GetDeviceDescriptions_Args {
        pub struct_size: usize,
        pub extension_start: *mut PJRT_Extension_Base,
        pub topology: *const PJRT_TopologyDescription,
        pub descriptions: *const *mut PJRT_DeviceDescription,
        pub num_descriptions: usize,
    }

    // --- Device residency (train): buffer state after donation ---------------------------

    /// `struct PJRT_Buffer_IsDeleted_Args`.
    pub struct PJRT_Buffer_IsDeleted_Args {
        pub struct_size: usize,
        pub extension_start: *mut PJRT_Extension_Base,
        pub buffer: *mut PJRT_Buffer,
        pub is_deleted: bool,
    }

    /// `struct PJRT_Buffer_OpaqueDeviceMemoryDataPointer_Args`.
    pub struct PJRT_Buffer_OpaqueDeviceMemoryDataPointer_Args {
        pub struct_size: usize,
        pub extension_start: *mut PJRT_Extension_Base,
        pub buffer: *mut PJRT_Buffer,
        pub device_memory_ptr: *mut c_void,
    }

    // --- end device residency ------------------------------------------------------------

    /// `struct PJRT_Compile_Args`.
    pub struct PJRT_Compile_Args {
        pub struct_size: usize,
        pub extension_start: *mut PJRT_Extension_Base,
        pub topology: *const PJRT_TopologyDescription,
        pub program: *const PJRT_Program,
        pub compile_options: *const c_char,
        pub compile_options_size: usize,
        pub client: *mut PJRT_Client,
        pub executable: *mut PJRT_Executable,
    }

    /// `struct PJRT_Api`: the function table returned by `GetPjrtApi`. Read it only through a
    /// pointer, after checking that `struct_size` covers the slot (older plugins are shorter).
    pub struct PJRT_Api {
        pub struct_size: usize,
        pub extension_start: *mut PJRT_Extension_Base,
        pub pjrt_api_version: PJRT_Api_Version,
        pub PJRT_Error_Destroy: PJRT_Error_Destroy,
        pub PJRT_Error_Message: PJRT_Error_Message,
        pub PJRT_Error_GetCode: PjrtFn<PJRT_Error_GetCode_Args>,
        pub PJRT_Plugin_Initialize: PjrtFn<PJRT_Plugin_Initialize_Args>,
        pub PJRT_Plugin_Attributes: PjrtFn<PJRT_Plugin_Attributes_Args>,
        pub PJRT_Event_Destroy: PjrtFn<PJRT_Event_Destroy_Args>,
        pub PJRT_Event_IsReady: Unbound,
        pub PJRT_Event_Error: Unbound,
        pub PJRT_Event_Await: PjrtFn<PJRT_Event_Await_Args>,
        pub PJRT_Event_OnReady: Unbound,
        pub PJRT_Client_Create: PjrtFn<PJRT_Client_Create_Args>,
        pub PJRT_Client_Destroy: PjrtFn<PJRT_Client_Destroy_Args>,
        pub PJRT_Client_PlatformName: PjrtFn<PJRT_Client_PlatformName_Args>,
        pub PJRT_Client_ProcessIndex: Unbound,
        pub PJRT_Client_PlatformVersion: PjrtFn<PJRT_Client_PlatformVersion_Args>,
        pub PJRT_Client_Devices: Unbound,
        pub PJRT_Client_AddressableDevices: PjrtFn<PJRT_Client_AddressableDevices_Args>,
        pub PJRT_Client_LookupDevice: Unbound,
        pub PJRT_Client_LookupAddressableDevice: Unbound,
        pub PJRT_Client_AddressableMemories: Unbound,
        pub PJRT_Client_Compile: PjrtFn<PJRT_Client_Compile_Args>,
        pub PJRT_Client_DefaultDeviceAssignment: Unbound,
        pub PJRT_Client_BufferFromHostBuffer: PjrtFn<PJRT_Client_BufferFromHostBuffer_Args>,
        pub PJRT_DeviceDescription_Id: PjrtFn<PJRT_DeviceDescription_Id_Args>,
        pub PJRT_DeviceDescription_ProcessIndex: Unbound,
        pub PJRT_DeviceDescription_Attributes: Unbound,
        pub PJRT_DeviceDescription_Kind: PjrtFn<PJRT_DeviceDescription_Kind_Args>,
        pub PJRT_DeviceDescription_DebugString: Unbound,
        pub PJRT_DeviceDescription_ToString: PjrtFn<PJRT_DeviceDescription_ToString_Args>,
        pub PJRT_Device_GetDescription: PjrtFn<PJRT_Device_GetDescription_Args>,
        pub PJRT_Device_IsAddressable: Unbound,
        pub PJRT_Device_LocalHardwareId: Unbound,
        pub PJRT_Device_AddressableMemories: Unbound,
        pub PJRT_Device_DefaultMemory: Unbound,
        pub PJRT_Device_MemoryStats: Unbound,
        pub PJRT_Memory_Id: Unbound,
        pub PJRT_Memory_Kind: Unbound,
        pub PJRT_Memory_DebugString: Unbound,
        pub PJRT_Memory_ToString: Unbound,
        pub PJRT_Memory_AddressableByDevices: Unbound,
        pub PJRT_Executable_Destroy: PjrtFn<PJRT_Executable_Destroy_Args>,
        pub PJRT_Executable_Name: PjrtFn<PJRT_Executable_Name_Args>,
        pub PJRT_Executable_NumReplicas: PjrtFn<PJRT_Executable_NumReplicas_Args>,
        pub PJRT_Executable_NumPartitions: PjrtFn<PJRT_Executable_NumPartitions_Args>,
        pub PJRT_Executable_NumOutputs: PjrtFn<PJRT_Executable_NumOutputs_Args>,
        pub PJRT_Executable_SizeOfGeneratedCodeInBytes:
            PjrtFn<PJRT_Executable_SizeOfGeneratedCodeInBytes_Args>,
        pub PJRT_Executable_GetCostAnalysis:
            PjrtFn<PJRT_Executable_GetCostAnalysis_Args>,
        pub PJRT_Executable_OutputMemoryKinds: Unbound,
        pub PJRT_Executable_OptimizedProgram:
            PjrtFn<PJRT_Executable_OptimizedProgram_Args>,
        pub PJRT_Executable_Serialize: PjrtFn<PJRT_Executable_Serialize_Args>,
        pub PJRT_LoadedExecutable_Destroy: PjrtFn<PJRT_LoadedExecutable_Destroy_Args>,
        pub PJRT_LoadedExecutable_GetExecutable: PjrtFn<PJRT_LoadedExecutable_GetExecutable_Args>,
        pub PJRT_LoadedExecutable_AddressableDevices:
            PjrtFn<PJRT_LoadedExecutable_AddressableDevices_Args>,
        pub PJRT_LoadedExecutable_Delete: Unbound,
        pub PJRT_LoadedExecutable_IsDeleted: Unbound,
        pub PJRT_LoadedExecutable_Execute: PjrtFn<PJRT_LoadedExecutable_Execute_Args>,
        pub PJRT_Executable_DeserializeAndLoad: Unbound,
        pub PJRT_LoadedExecutable_Fingerprint: Unbound,
        pub PJRT_Buffer_Destroy: PjrtFn<PJRT_Buffer_Destroy_Args>,
        pub PJRT_Buffer_ElementType: PjrtFn<PJRT_Buffer_ElementType_Args>,
        pub PJRT_Buffer_Dimensions: PjrtFn<PJRT_Buffer_Dimensions_Args>,
        pub PJRT_Buffer_UnpaddedDimensions: Unbound,
        pub PJRT_Buffer_DynamicDimensionIndices: Unbound,
        pub PJRT_Buffer_GetMemoryLayout: Unbound,
        pub PJRT_Buffer_OnDeviceSizeInBytes: Unbound,
        pub PJRT_Buffer_Device: Unbound,
        pub PJRT_Buffer_Memory: Unbound,
        pub PJRT_Buffer_Delete: Unbound,
        pub PJRT_Buffer_IsDeleted: PjrtFn<PJRT_Buffer_IsDeleted_Args>,
        pub PJRT_Buffer_CopyToDevice: Unbound,
        pub PJRT_Buffer_ToHostBuffer: PjrtFn<PJRT_Buffer_ToHostBuffer_Args>,
        pub PJRT_Buffer_IsOnCpu: Unbound,
        pub PJRT_Buffer_ReadyEvent: Unbound,
        pub PJRT_Buffer_UnsafePointer: Unbound,
        pub PJRT_Buffer_IncreaseExternalReferenceCount: Unbound,
        pub PJRT_Buffer_DecreaseExternalReferenceCount: Unbound,
        pub PJRT_Buffer_OpaqueDeviceMemoryDataPointer:
            PjrtFn<PJRT_Buffer_OpaqueDeviceMemoryDataPointer_Args>,
        pub PJRT_CopyToDeviceStream_Destroy: Unbound,
        pub PJRT_CopyToDeviceStream_AddChunk: Unbound,
        pub PJRT_CopyToDeviceStream_TotalBytes: Unbound,
        pub PJRT_CopyToDeviceStream_GranuleSize: Unbound,
        pub PJRT_CopyToDeviceStream_CurrentBytes: Unbound,
        pub PJRT_TopologyDescription_Create: PjrtFn<PJRT_TopologyDescription_Create_Args>,
        pub PJRT_TopologyDescription_Destroy: PjrtFn<PJRT_TopologyDescription_Destroy_Args>,
        pub PJRT_TopologyDescription_PlatformName:
            PjrtFn<PJRT_TopologyDescription_PlatformName_Args>,
        pub PJRT_TopologyDescription_PlatformVersion: Unbound,
        pub PJRT_TopologyDescription_GetDeviceDescriptions:
            PjrtFn<PJRT_TopologyDescription_GetDeviceDescriptions_Args>,
        pub PJRT_TopologyDescription_Serialize: Unbound,
        pub PJRT_TopologyDescription_Attributes: Unbound,
        pub PJRT_Compile: PjrtFn<PJRT_Compile_Args>,
        pub PJRT_Executable_OutputElementTypes: Unbound,
        pub PJRT_Executable_OutputDimensions: Unbound,
        pub PJRT_Buffer_CopyToMemory: Unbound,
        pub PJRT_Client_CreateViewOfDeviceBuffer: Unbound,
        pub PJRT_Executable_Fingerprint: Unbound,
        pub PJRT_Client_TopologyDescription: Unbound,
        pub PJRT_Executable_GetCompiledMemoryStats:
            PjrtFn<PJRT_Executable_GetCompiledMemoryStats_Args>,
        pub PJRT_Memory_Kind_Id: Unbound,
        pub PJRT_ExecuteContext_Create: Unbound,
        pub PJRT_ExecuteContext_Destroy: Unbound,
        pub PJRT_Buffer_CopyRawToHost: Unbound,
        pub PJRT_AsyncHostToDeviceTransferManager_Destroy: Unbound,
        pub PJRT_AsyncHostToDeviceTransferManager_TransferData: Unbound,
        pub PJRT_Client_CreateBuffersForAsyncHostToDevice: Unbound,
        pub PJRT_AsyncHostToDeviceTransferManager_RetrieveBuffer: Unbound,
        pub PJRT_AsyncHostToDeviceTransferManager_Device: Unbound,
        pub PJRT_AsyncHostToDeviceTransferManager_BufferCount: Unbound,
        pub PJRT_AsyncHostToDeviceTransferManager_BufferSize: Unbound,
        pub PJRT_AsyncHostToDeviceTransferManager_SetBufferError: Unbound,
        pub PJRT_AsyncHostToDeviceTransferManager_AddMetadata: Unbound,
        pub PJRT_Client_DmaMap: Unbound,
        pub PJRT_Client_DmaUnmap: Unbound,
        pub PJRT_Client_CreateUninitializedBuffer: Unbound,
        pub PJRT_Client_UpdateGlobalProcessInfo: Unbound,
        pub PJRT_TopologyDescription_Deserialize: Unbound,
        pub PJRT_Client_CreateAliasBuffer: Unbound,
        pub PJRT_Client_FulfillAliasBuffer: Unbound,
        pub PJRT_LoadedExecutable_GetDeviceAssignment: Unbound,
    }
}

/// Signature of the plugin's single exported symbol.
pub type GetPjrtApiFn = unsafe extern "C" fn() -> *const PJRT_Api;

/// Name of the plugin's exported entry point.
pub const GET_PJRT_API_SYMBOL: &[u8] = b"GetPjrtApi\0";
