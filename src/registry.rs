//! The built-in kernels by name: the one list that the CLI (`tessera kernels`, `ir`, `run`,
//! `compile kernel`), `tessera demo`, `tessera bench kernels`, the backend tests and the TPU
//! compile tests find kernels in. Adding a kernel here adds it to all of them.
//!
//! An entry ([`KernelInfo`]) carries the kernel's parameters (with defaults and help) and,
//! for given parameter values ([`KernelInfo::instance`]):
//! - the kernel definition, its default argument specs and the values of the arguments the
//!   parameters fix (splash's block tables);
//! - its f64 reference, written separately from the kernel, and inputs the reference is exact
//!   for ([`Instance::inputs`]; splash's backward kernels get the forward's residuals);
//! - its floating-point operations per call ([`Instance::flops`]);
//! - the parameter sets it is checked at ([`KernelInfo::cases`], each with the largest error
//!   allowed against the reference) and timed at ([`KernelInfo::bench`]);
//! - where it has one, XLA's own program for the same computation ([`Instance::xla_program`],
//!   `tessera bench kernels`' baseline).
//!
//! A kernel may run on a device mesh (the collectives: [`KernelInfo::on_mesh`]): its build
//! gives the mesh ([`Instance::mesh`]), each device has its own arguments and outputs, and its
//! reference computes every device's outputs from every device's arguments. [`Instance`] is
//! per device throughout (a one-device kernel has one argument list), and
//! [`Instance::run`] runs either kind, so every consumer has one code path.
//!
//! Two kinds of parameter: compile-time ones (block sizes, dtype, mask, flags), which change
//! the kernel, and sizes, which only set the default arguments (`tessera ir` instantiates
//! with them; `tessera run` takes sizes from its inputs and checks any size given against
//! them, [`KernelInfo::check_sizes`]).
//!
//! The example kernels' block sizes are const generics, so a run-time choice dispatches over a
//! fixed set of sizes ([`BLOCK_SIZES`]). The splash kernels are built as the splash plans
//! build them: a [`SplashAttention`] configured from the parameters, and the stage of its
//! forward or backward plan that runs the kernel (so the block-sparsity tables are the real
//! ones).

mod xla;

use std::collections::{BTreeMap, HashMap};

use std::sync::Arc;

use tessera_dsl::axes::Context;
use tessera_dsl::{
    with_float_type, ArgSpec, DType, DeviceAxis, HostArray, Kernel, KernelDef, KernelError,
    KernelRules,
};
use tessera_splash::reference::{self as splash_reference, RefInputs};
use tessera_splash::{
    stage_specs, BlockSizes, Dims, Features, Mask, SplashAttention, SplashError, SplashOptions,
    Stage, StageArg, Tensor,
};

use crate::backend::{self, Backend, RunError};
use crate::kernels::cache_update::{block_rows, cache_update, cache_update_reference};
use crate::kernels::collective::{
    all_gather, all_gather_matmul, all_gather_matmul_reference, all_gather_reference,
};
use crate::kernels::memory::{
    gather_tiles, gather_tiles_reference, ring_all_gather, ring_all_gather_reference, ring_mesh,
    ring_shift, ring_shift_reference, Ring, TILE_ROWS,
};
use crate::kernels::paged_attention::paged_attention_reference;
use crate::kernels::{flash_attention, matmul, paged_attention, pipelined_matmul, row_softmax};
use crate::reference::{attention_ref, matmul_ref, max_abs_diff, softmax_ref};

/// The block sizes the CLI can instantiate (each one a monomorphised kernel).
pub const BLOCK_SIZES: [usize; 7] = [8, 16, 32, 64, 128, 256, 512];

/// A size `tessera bench kernels` sets from the flag of its name (`matmul_size`:
/// `--matmul-size`): a bench parameter written `{name}` takes its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BenchSize {
    pub name: &'static str,
    pub default: usize,
    /// The flag's help.
    pub help: &'static str,
}

/// The sizes of `tessera bench kernels`, each written here once: the CLI makes its flags
/// from them and the bench sets of [`KERNELS`] name them.
pub mod bench_size {
    use super::BenchSize;

    pub const MATMUL_SIZE: BenchSize = BenchSize {
        name: "matmul_size",
        default: 2048,
        help: "Square size of the matmuls (the tiled kernel and XLA's dot, the peak)",
    };
    pub const MATMUL_BLOCK: BenchSize = BenchSize {
        name: "matmul_block",
        default: 512,
        help: "Block size of the tiled matmul kernel (all three dims), one of the registry's \
               block sizes",
    };
    pub const SEQ: BenchSize = BenchSize {
        name: "seq",
        default: 4096,
        help: "Sequence length of the attention kernels",
    };
    pub const HEADS: BenchSize = BenchSize {
        name: "heads",
        default: 8,
        help: "Heads of the attention kernels",
    };
    pub const HEAD_DIM: BenchSize = BenchSize {
        name: "head_dim",
        default: 64,
        help: "Head dim of the attention kernels",
    };
    pub const BLOCK: BenchSize = BenchSize {
        name: "block",
        default: 512,
        help: "Query and key block of the splash kernels",
    };
    pub const FLASH_BLOCK: BenchSize = BenchSize {
        name: "flash_block",
        default: 256,
        help: "Query and key block of the example flash attention kernel",
    };
    pub const SOFTMAX_BLOCK: BenchSize = BenchSize {
        name: "softmax_block",
        default: 64,
        help: "Rows per block of the row softmax (over a seq x seq array)",
    };
    pub const KV_PAGES: BenchSize = BenchSize {
        name: "kv_pages",
        default: 128,
        help: "Pages (of 16 tokens) per sequence of paged attention (8 sequences, 32 query \
               heads, 8 KV heads, head dim 128)",
    };
    pub const COLLECTIVE_SIZE: BenchSize = BenchSize {
        name: "collective_size",
        default: 1024,
        help: "Size of the collective kernels on 4 CPU devices: the all-gather's shards are \
               size x size, the all-gather matmul's x and weight size x size (256-blocks; a \
               multiple of 512)",
    };
}

/// Every size of `tessera bench kernels` ([`bench_size`]).
pub const BENCH_SIZES: &[BenchSize] = &[
    bench_size::MATMUL_SIZE,
    bench_size::MATMUL_BLOCK,
    bench_size::SEQ,
    bench_size::HEADS,
    bench_size::HEAD_DIM,
    bench_size::BLOCK,
    bench_size::FLASH_BLOCK,
    bench_size::SOFTMAX_BLOCK,
    bench_size::KV_PAGES,
    bench_size::COLLECTIVE_SIZE,
];

/// A parameter of a built-in kernel.
#[derive(Debug, Clone, Copy)]
pub struct ParamInfo {
    pub name: &'static str,
    pub default: &'static str,
    pub help: &'static str,
    /// For a size parameter, the argument dims it sets as (argument name, dim); empty for a
    /// compile-time parameter. An argument a kernel does not take is skipped.
    pub sets: &'static [(&'static str, usize)],
}

impl ParamInfo {
    /// A compile-time parameter.
    pub const fn compile_time(
        name: &'static str,
        default: &'static str,
        help: &'static str,
    ) -> Self {
        ParamInfo {
            name,
            default,
            help,
            sets: &[],
        }
    }

    /// A size parameter setting the argument dims `sets`.
    pub const fn size(
        name: &'static str,
        default: &'static str,
        help: &'static str,
        sets: &'static [(&'static str, usize)],
    ) -> Self {
        ParamInfo {
            name,
            default,
            help,
            sets,
        }
    }

    /// Whether this parameter is a size (sets argument dims) rather than compile-time.
    pub fn is_size(&self) -> bool {
        !self.sets.is_empty()
    }
}

/// Why a registered kernel could not be built, checked or timed at the given parameters.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("unknown kernel `{name}`; built-in kernels: {}", .known.join(", "))]
    UnknownKernel {
        name: String,
        known: Vec<&'static str>,
    },
    #[error("kernel `{kernel}` has no parameter `{param}`; its parameters: {}", .known.join(", "))]
    UnknownParam {
        kernel: &'static str,
        param: String,
        known: Vec<&'static str>,
    },
    /// A value that does not parse as the parameter's kind.
    #[error("parameter {param}={value}: expected {expected}")]
    BadValue {
        param: String,
        value: String,
        expected: &'static str,
    },
    /// A block size with no monomorphised kernel.
    #[error(
        "parameter {param}={value}: the CLI instantiates block sizes {BLOCK_SIZES:?}; use the \
         library API for other sizes"
    )]
    BlockSize { param: String, value: usize },
    /// A size given beside arguments that say otherwise.
    #[error(
        "parameter {param}={value} disagrees with argument `{arg}` {spec}, whose dim {dim} is \
         {actual}; sizes come from the arguments, so drop {param} or pass arguments of that size"
    )]
    SizeMismatch {
        param: String,
        value: String,
        arg: &'static str,
        /// (Boxed: the error stays small.)
        spec: Box<ArgSpec>,
        dim: usize,
        actual: String,
    },
    /// A bench parameter `{name}` that is none of [`BENCH_SIZES`].
    #[error(
        "kernel `{kernel}`: bench parameter {param}={{{knob}}} names no size of `tessera bench \
         kernels`; known: {}",
        BENCH_SIZES.iter().map(|s| s.name).collect::<Vec<_>>().join(", ")
    )]
    UnknownKnob {
        kernel: &'static str,
        param: &'static str,
        knob: String,
    },
    /// Arrays that are not the kernel's arguments (count).
    #[error("kernel `{kernel}` takes {expected} arguments, got {got}")]
    Arguments {
        kernel: String,
        expected: usize,
        got: usize,
    },
    #[error("no splash plan runs a kernel named `{kernel}`")]
    NoSplashStage { kernel: String },
    /// The f64 reference cannot be computed from what the kernel takes.
    #[error("the f64 reference of `{kernel}` cannot be computed from {reason}")]
    NoReference {
        kernel: String,
        reason: &'static str,
    },
    #[error(transparent)]
    Splash(#[from] SplashError),
    #[error(transparent)]
    Hlo(#[from] tessera_hlo::HloError),
    #[error(transparent)]
    Kernel(#[from] KernelError),
}

/// A kernel definition, its default arguments (each device's, for a kernel on a mesh), the
/// values of the arguments the parameters fix (by position; `None` for data) and the device
/// mesh it runs on (empty: one device).
#[derive(Debug, Clone)]
pub struct Built {
    pub def: KernelDef,
    pub args: Vec<ArgSpec>,
    pub fixed: Vec<Option<HostArray>>,
    pub mesh: Vec<DeviceAxis>,
}

impl Built {
    /// A one-device kernel whose arguments are all data.
    fn data(def: KernelDef, args: Vec<ArgSpec>) -> Self {
        Self::on_mesh(def, args, Vec::new())
    }

    /// A kernel on the device mesh `mesh` whose arguments are all data.
    fn on_mesh(def: KernelDef, args: Vec<ArgSpec>, mesh: Vec<DeviceAxis>) -> Self {
        let fixed = vec![None; args.len()];
        Built {
            def,
            args,
            fixed,
            mesh,
        }
    }
}

type BuildFn = fn(&Params, &str) -> Result<Built, RegistryError>;
type ReferenceFn = fn(&Params, &str, &[HostArray]) -> Result<Vec<Vec<f64>>, RegistryError>;
/// Every device's outputs from every device's arguments.
type MeshReferenceFn =
    fn(&Params, &str, &[Vec<HostArray>]) -> Result<Vec<Vec<Vec<f64>>>, RegistryError>;

/// A kernel's f64 reference, written separately from the kernel.
#[derive(Debug, Clone, Copy)]
enum Reference {
    /// A one-device kernel's outputs from its arguments.
    Local(ReferenceFn),
    /// A kernel on a device mesh: every device's outputs from every device's arguments (an
    /// all-gather's output holds the others' inputs).
    Mesh(MeshReferenceFn),
}
type FlopsFn = fn(&Params, &str) -> Result<f64, RegistryError>;
type InputsFn = fn(&Params, &str, u64) -> Result<Vec<HostArray>, RegistryError>;
/// XLA's own program for what the kernel computes, from each device's argument specs and
/// the number of devices (one partition per device where more than one).
type XlaFn = fn(&[ArgSpec], usize) -> Result<tessera_hlo::Module, tessera_hlo::HloError>;

/// A parameter set a kernel is checked at, and the largest absolute error allowed against
/// its f64 reference (over every output).
#[derive(Debug, Clone, Copy)]
pub struct Case {
    pub params: &'static [(&'static str, &'static str)],
    pub tol: f64,
}

impl Case {
    /// The parameters as `NAME=VALUE` pairs for [`KernelInfo::instance`].
    pub fn given(&self) -> Vec<(String, String)> {
        owned(self.params)
    }
}

fn owned(params: &[(&str, &str)]) -> Vec<(String, String)> {
    params
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A built-in kernel.
#[derive(Debug, Clone, Copy)]
pub struct KernelInfo {
    pub name: &'static str,
    pub summary: &'static str,
    pub params: &'static [ParamInfo],
    /// Builds from the parameters; gets the kernel's name (one builder serves every splash
    /// kernel).
    build: BuildFn,
    /// The kernel's outputs computed in f64 from its arguments, written separately from the
    /// kernel; a [`Reference::Mesh`] one for a kernel that runs on a device mesh.
    reference: Reference,
    /// Floating-point operations of one call (on every device together; 0 for a kernel that
    /// only moves data).
    flops: FlopsFn,
    /// Arguments whose values the reference is exact for, where random data is not (splash's
    /// residuals); `None`: random data.
    inputs: Option<InputsFn>,
    /// XLA's own program for the same computation on the same arguments, written with the
    /// ordinary ops an XLA user writes: `tessera bench kernels` times it beside the kernel.
    xla: Option<XlaFn>,
    /// Where `tessera demo`, the backend tests and the Mosaic tests check the kernel.
    pub cases: &'static [Case],
    /// Where `tessera bench kernels` times it: one row per set (sets differ by dtype); a
    /// value `{knob}` is the bench size of that name ([`BENCH_SIZES`]).
    pub bench: &'static [&'static [(&'static str, &'static str)]],
}

/// Parameter values by name, as given on the command line (defaults filled in).
#[derive(Debug, Clone, Default)]
pub struct Params(BTreeMap<String, String>);

impl Params {
    fn bad(&self, name: &str, expected: &'static str) -> RegistryError {
        RegistryError::BadValue {
            param: name.to_string(),
            value: self.0.get(name).cloned().unwrap_or_default(),
            expected,
        }
    }

    fn usize(&self, name: &str) -> Result<usize, RegistryError> {
        match self.0[name].parse() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(self.bad(name, "a positive integer")),
        }
    }

    /// A positive integer, or the value of parameter `other` when the value is its name
    /// (a default such as `BKVC = BKV`).
    fn usize_or_same_as(&self, name: &str, other: &str) -> Result<usize, RegistryError> {
        if self.0[name] == other {
            self.usize(other)
        } else {
            self.usize(name)
        }
    }

    fn block(&self, name: &str) -> Result<usize, RegistryError> {
        let b = self.usize(name)?;
        if BLOCK_SIZES.contains(&b) {
            Ok(b)
        } else {
            Err(RegistryError::BlockSize {
                param: name.to_string(),
                value: b,
            })
        }
    }

    /// The compute dtype (`DType::compute_from_name`).
    fn dtype(&self) -> Result<DType, RegistryError> {
        self.0
            .get("dtype")
            .and_then(|d| DType::compute_from_name(d))
            .ok_or_else(|| self.bad("dtype", "f32 or bf16"))
    }

    fn bool(&self, name: &str) -> Result<bool, RegistryError> {
        self.0[name]
            .parse()
            .map_err(|_| self.bad(name, "true or false"))
    }
}

/// Calls `$m!(.. const_value)` with the const matching a run-time block size.
macro_rules! dispatch_block {
    ($value:expr, $m:ident ! ( $($args:tt)* )) => {
        match $value {
            8 => $m!($($args)* 8),
            16 => $m!($($args)* 16),
            32 => $m!($($args)* 32),
            64 => $m!($($args)* 64),
            128 => $m!($($args)* 128),
            256 => $m!($($args)* 256),
            512 => $m!($($args)* 512),
            other => unreachable!("block size {other} passed validation"),
        }
    };
}

/// Checks that `inputs` are as many as `kernel` takes.
fn expect_inputs(kernel: &str, inputs: &[HostArray], expected: usize) -> Result<(), RegistryError> {
    if inputs.len() == expected {
        return Ok(());
    }
    Err(RegistryError::Arguments {
        kernel: kernel.to_string(),
        expected,
        got: inputs.len(),
    })
}

fn build_matmul(p: &Params, _name: &str) -> Result<Built, RegistryError> {
    let (bm, bn, bk, dtype) = (p.block("BM")?, p.block("BN")?, p.block("BK")?, p.dtype()?);
    let (m, n, k) = (p.usize("M")?, p.usize("N")?, p.usize("K")?);
    macro_rules! with_k {
        ($t:ty; $a:literal $b:literal $c:literal) => {
            matmul::<$t, $a, $b, $c>()
        };
    }
    macro_rules! with_n {
        ($t:ty; $a:literal $b:literal) => {
            dispatch_block!(bk, with_k!($t; $a $b))
        };
    }
    macro_rules! with_m {
        ($t:ty; $a:literal) => {
            dispatch_block!(bn, with_n!($t; $a))
        };
    }
    let def = with_float_type!(dtype, T => dispatch_block!(bm, with_m!(T;)));
    Ok(Built::data(
        def,
        vec![ArgSpec::new(dtype, [m, k]), ArgSpec::new(dtype, [k, n])],
    ))
}

fn build_pipelined_matmul(p: &Params, _name: &str) -> Result<Built, RegistryError> {
    let (bm, bn, bk, dtype) = (p.block("BM")?, p.block("BN")?, p.block("BK")?, p.dtype()?);
    let (m, n, k) = (p.usize("M")?, p.usize("N")?, p.usize("K")?);
    let buffers = p.usize("BUFFERS")?;
    let def = with_float_type!(dtype, T => pipelined_matmul::<T>((bm, bn, bk), buffers));
    Ok(Built::data(
        def,
        vec![ArgSpec::new(dtype, [m, k]), ArgSpec::new(dtype, [k, n])],
    ))
}

fn matmul_reference(
    _: &Params,
    name: &str,
    x: &[HostArray],
) -> Result<Vec<Vec<f64>>, RegistryError> {
    expect_inputs(name, x, 2)?;
    let (m, k, n) = (x[0].shape()[0], x[0].shape()[1], x[1].shape()[1]);
    Ok(vec![matmul_ref(
        &x[0].to_f64_vec(),
        &x[1].to_f64_vec(),
        m,
        k,
        n,
    )])
}

fn matmul_flops(p: &Params, _: &str) -> Result<f64, RegistryError> {
    Ok(2.0 * (p.usize("M")? * p.usize("N")? * p.usize("K")?) as f64)
}

fn build_softmax(p: &Params, _name: &str) -> Result<Built, RegistryError> {
    let (br, dtype) = (p.block("BR")?, p.dtype()?);
    let (rows, cols) = (p.usize("R")?, p.usize("C")?);
    macro_rules! with_r {
        ($t:ty; $a:literal) => {
            row_softmax::<$t, $a>()
        };
    }
    let def = with_float_type!(dtype, T => dispatch_block!(br, with_r!(T;)));
    Ok(Built::data(def, vec![ArgSpec::new(dtype, [rows, cols])]))
}

fn softmax_reference(
    _: &Params,
    name: &str,
    x: &[HostArray],
) -> Result<Vec<Vec<f64>>, RegistryError> {
    expect_inputs(name, x, 1)?;
    let (r, c) = (x[0].shape()[0], x[0].shape()[1]);
    Ok(vec![softmax_ref(&x[0].to_f64_vec(), r, c)])
}

fn softmax_flops(p: &Params, _: &str) -> Result<f64, RegistryError> {
    // max, subtract, exp, sum, divide per element.
    Ok(5.0 * (p.usize("R")? * p.usize("C")?) as f64)
}

fn build_flash(p: &Params, _name: &str) -> Result<Built, RegistryError> {
    let (bq, bkv, dtype, causal) = (
        p.block("BQ")?,
        p.block("BKV")?,
        p.dtype()?,
        p.bool("causal")?,
    );
    let (s, d) = (p.usize("S")?, p.usize("D")?);
    macro_rules! with_kv {
        ($t:ty; $a:literal $b:literal) => {
            flash_attention::<$t, $a, $b>(causal)
        };
    }
    macro_rules! with_q {
        ($t:ty; $a:literal) => {
            dispatch_block!(bkv, with_kv!($t; $a))
        };
    }
    let def = with_float_type!(dtype, T => dispatch_block!(bq, with_q!(T;)));
    Ok(Built::data(def, vec![ArgSpec::new(dtype, [s, d]); 3]))
}

fn flash_reference(
    p: &Params,
    name: &str,
    x: &[HostArray],
) -> Result<Vec<Vec<f64>>, RegistryError> {
    expect_inputs(name, x, 3)?;
    let (s, d) = (x[0].shape()[0], x[0].shape()[1]);
    let [q, k, v] = [0, 1, 2].map(|i| x[i].to_f64_vec());
    Ok(vec![attention_ref(&q, &k, &v, s, d, p.bool("causal")?)])
}

fn flash_flops(p: &Params, _: &str) -> Result<f64, RegistryError> {
    let s = p.usize("S")?;
    let pairs = if p.bool("causal")? {
        s * (s + 1) / 2
    } else {
        s * s
    };
    // q k^T and p v: two D-long dot products per visible pair.
    Ok(4.0 * p.usize("D")? as f64 * pairs as f64)
}

/// The pages in paged attention's pool: `P`, or with `P=all` every sequence's own
/// (`B * pages_per_seq`).
fn paged_pool(p: &Params) -> Result<usize, RegistryError> {
    if p.0["P"] == "all" {
        Ok(p.usize("B")? * p.usize("pages_per_seq")?)
    } else {
        p.usize("P")
    }
}

/// The lengths and page table of paged attention's default arguments: sequence `b` holds
/// `max - (b * max) / B - 3 (b % 2)` tokens (clamped at 0; `max = pages_per_seq * page_size`:
/// full, partial and, for large `b`, short sequences), entry `j` of its table is page
/// `(b * pages_per_seq + 7 j mod pages_per_seq) mod P` (distinct pages, out of order, where
/// 7 does not divide `pages_per_seq` and the pool holds them all).
fn paged_tables(p: &Params) -> Result<(HostArray, HostArray), RegistryError> {
    let (b, pages, per_seq) = (p.usize("B")?, paged_pool(p)?, p.usize("pages_per_seq")?);
    let max = per_seq * p.usize("page_size")?;
    let lengths = (0..b)
        .map(|i| (max - i * max / b).saturating_sub(3 * (i % 2)) as i32)
        .collect();
    let table = (0..b * per_seq)
        .map(|i| (((i / per_seq) * per_seq + (7 * (i % per_seq)) % per_seq) % pages) as i32)
        .collect();
    Ok((
        HostArray::i32([b], lengths).expect("one length per sequence"),
        HostArray::i32([b, per_seq], table).expect("one page per entry"),
    ))
}

fn build_paged(p: &Params, _name: &str) -> Result<Built, RegistryError> {
    let (dtype, per_block) = (p.dtype()?, p.usize("pages_per_block")?);
    let [b, h, kvh, d] = ["B", "H", "KVH", "D"].map(|n| p.usize(n));
    let (b, h, kvh, d) = (b?, h?, kvh?, d?);
    let (pages, page_size, per_seq) = (
        p.usize("P")?,
        p.usize("page_size")?,
        p.usize("pages_per_seq")?,
    );
    let def = with_float_type!(dtype, T => paged_attention::<T>(per_block));
    let (lengths, table) = paged_tables(p)?;
    Ok(Built {
        def,
        args: vec![
            ArgSpec::new(dtype, [b, h, d]),
            ArgSpec::new(dtype, [kvh, pages, page_size, d]),
            ArgSpec::new(dtype, [kvh, pages, page_size, d]),
            ArgSpec::new(DType::I32, [b]),
            ArgSpec::new(DType::I32, [b, per_seq]),
        ],
        fixed: vec![None, None, None, Some(lengths), Some(table)],
        mesh: Vec::new(),
    })
}

fn paged_reference(
    _: &Params,
    name: &str,
    x: &[HostArray],
) -> Result<Vec<Vec<f64>>, RegistryError> {
    expect_inputs(name, x, 5)?;
    let lengths: Vec<i32> = x[3].to_f64_vec().iter().map(|&l| l as i32).collect();
    Ok(vec![paged_attention_reference(
        &x[0], &x[1], &x[2], &lengths, &x[4],
    )])
}

fn paged_flops(p: &Params, _: &str) -> Result<f64, RegistryError> {
    // q k^T and p v over each sequence's tokens: two D-long dot products per token and head.
    let (lengths, _) = paged_tables(p)?;
    let tokens: f64 = lengths.to_f64_vec().iter().sum();
    Ok(4.0 * (p.usize("H")? * p.usize("D")?) as f64 * tokens)
}

/// The ring of `devices` devices (the `context` axis) the collective kernels run on.
fn ring(p: &Params) -> Result<Vec<DeviceAxis>, RegistryError> {
    Ok(ring_mesh(p.usize("devices")?))
}

/// Refuses any dtype but f32 (the kernels that move f32 arrays only).
fn f32_only(p: &Params) -> Result<(), RegistryError> {
    if p.dtype()? != DType::F32 {
        return Err(p.bad("dtype", "f32 (the kernel moves f32 arrays)"));
    }
    Ok(())
}

fn build_all_gather(p: &Params, _name: &str) -> Result<Built, RegistryError> {
    build_ring(p, all_gather::<Ring, Context>(), "S")
}

/// Argument `i` of every device (checking each device has `expected` arguments).
fn device_shards(
    name: &str,
    x: &[Vec<HostArray>],
    expected: usize,
    i: usize,
) -> Result<Vec<HostArray>, RegistryError> {
    x.iter()
        .map(|device| {
            expect_inputs(name, device, expected)?;
            Ok(device[i].clone())
        })
        .collect()
}

fn all_gather_mesh_reference(
    _: &Params,
    name: &str,
    x: &[Vec<HostArray>],
) -> Result<Vec<Vec<Vec<f64>>>, RegistryError> {
    let shards = device_shards(name, x, 1, 0)?;
    let gathered = all_gather_reference(&shards).to_f64_vec();
    Ok(vec![vec![gathered]; x.len()])
}

fn build_all_gather_matmul(p: &Params, _name: &str) -> Result<Built, RegistryError> {
    let (dtype, n) = (p.dtype()?, p.usize("devices")?);
    let (bt, bf) = (p.usize("BT")?, p.usize("BF")?);
    let (t, k, f) = (p.usize("T")?, p.usize("K")?, p.usize("F")?);
    if k % n != 0 {
        return Err(p.bad(
            "K",
            "a multiple of `devices` (each device holds K / devices rows of w)",
        ));
    }
    let def = with_float_type!(dtype, T => all_gather_matmul::<T, Ring, Context>(bt, bf));
    Ok(Built::on_mesh(
        def,
        vec![ArgSpec::new(dtype, [t, k]), ArgSpec::new(dtype, [k / n, f])],
        ring(p)?,
    ))
}

fn all_gather_matmul_mesh_reference(
    _: &Params,
    name: &str,
    x: &[Vec<HostArray>],
) -> Result<Vec<Vec<Vec<f64>>>, RegistryError> {
    let shards = device_shards(name, x, 2, 1)?;
    Ok(x.iter()
        .map(|d| vec![all_gather_matmul_reference(&d[0], &shards)])
        .collect())
}

fn all_gather_matmul_flops(p: &Params, _: &str) -> Result<f64, RegistryError> {
    let per_device = 2.0 * (p.usize("T")? * p.usize("K")? * p.usize("F")?) as f64;
    Ok(per_device * p.usize("devices")? as f64)
}

/// `cache_update`'s slots: step `i` writes block `(5 i + 2) mod (R / rows)` (out of order;
/// distinct while `N <= R / rows` and 5 does not divide `R / rows`).
fn cache_slots(p: &Params) -> Result<HostArray, RegistryError> {
    let (n, r, rows) = (p.usize("N")?, p.usize("R")?, block_rows(p.dtype()?));
    if r % rows != 0 || r == 0 {
        return Err(p.bad(
            "R",
            "a positive multiple of the block (8 rows for f32, 16 for bf16)",
        ));
    }
    let slots = (0..n).map(|i| ((5 * i + 2) % (r / rows)) as i32).collect();
    Ok(HostArray::i32([n], slots).expect("one slot per step"))
}

fn build_cache_update(p: &Params, _name: &str) -> Result<Built, RegistryError> {
    let dtype = p.dtype()?;
    let slots = cache_slots(p)?;
    let (n, r, c) = (p.usize("N")?, p.usize("R")?, p.usize("C")?);
    Ok(Built {
        def: with_float_type!(dtype, T => cache_update::<T>()),
        args: vec![
            ArgSpec::of(&slots),
            ArgSpec::new(dtype, [r, c]),
            ArgSpec::new(dtype, [n * block_rows(dtype), c]),
        ],
        fixed: vec![Some(slots), None, None],
        mesh: Vec::new(),
    })
}

fn cache_update_ref(
    _: &Params,
    name: &str,
    x: &[HostArray],
) -> Result<Vec<Vec<f64>>, RegistryError> {
    expect_inputs(name, x, 3)?;
    let slots: Vec<i32> = x[0].to_f64_vec().iter().map(|&s| s as i32).collect();
    Ok(vec![cache_update_reference(&slots, &x[1], &x[2])])
}

/// `gather_tiles`' tile order: tile `g` is `(7 g + 3) mod (R / 8)` (out of order, repeating
/// where `G` exceeds the tiles of `x`).
fn tile_order(p: &Params) -> Result<HostArray, RegistryError> {
    let (g, r) = (p.usize("G")?, p.usize("R")?);
    if r % TILE_ROWS != 0 {
        return Err(p.bad("R", "a multiple of 8 (x is gathered in tiles of 8 rows)"));
    }
    let tiles = (0..g)
        .map(|i| ((7 * i + 3) % (r / TILE_ROWS)) as i32)
        .collect();
    Ok(HostArray::i32([g], tiles).expect("one entry per step"))
}

fn build_gather_tiles(p: &Params, _name: &str) -> Result<Built, RegistryError> {
    f32_only(p)?;
    let tiles = tile_order(p)?;
    let x = ArgSpec::new(DType::F32, [p.usize("R")?, p.usize("C")?]);
    Ok(Built {
        def: gather_tiles(),
        args: vec![ArgSpec::of(&tiles), x],
        fixed: vec![Some(tiles), None],
        mesh: Vec::new(),
    })
}

fn gather_tiles_ref(
    _: &Params,
    name: &str,
    x: &[HostArray],
) -> Result<Vec<Vec<f64>>, RegistryError> {
    expect_inputs(name, x, 2)?;
    let tiles: Vec<i32> = x[0].to_f64_vec().iter().map(|&t| t as i32).collect();
    Ok(vec![gather_tiles_reference(&tiles, &x[1])])
}

/// The f32 `[rows, C]` argument of the ring kernels, on a ring of `devices`.
fn build_ring(p: &Params, def: KernelDef, rows: &str) -> Result<Built, RegistryError> {
    f32_only(p)?;
    let spec = ArgSpec::new(DType::F32, [p.usize(rows)?, p.usize("C")?]);
    Ok(Built::on_mesh(def, vec![spec], ring(p)?))
}

fn ring_shift_mesh_reference(
    _: &Params,
    name: &str,
    x: &[Vec<HostArray>],
) -> Result<Vec<Vec<Vec<f64>>>, RegistryError> {
    let shards = device_shards(name, x, 1, 0)?;
    Ok(ring_shift_reference(&shards)
        .iter()
        .map(|a| vec![a.to_f64_vec()])
        .collect())
}

fn ring_all_gather_mesh_reference(
    _: &Params,
    name: &str,
    x: &[Vec<HostArray>],
) -> Result<Vec<Vec<Vec<f64>>>, RegistryError> {
    let shards = device_shards(name, x, 1, 0)?;
    let gathered = ring_all_gather_reference(&shards).to_f64_vec();
    Ok(vec![vec![gathered]; x.len()])
}

fn no_flops(_: &Params, _: &str) -> Result<f64, RegistryError> {
    Ok(0.0)
}

const DEVICES: ParamInfo = ParamInfo::compile_time(
    "devices",
    "4",
    "devices of the ring (the mesh's `context` axis) the kernel runs on",
);

/// A splash kernel as its plan runs it: the attention configured from the parameters, the
/// features it uses and the stage that runs `kernel`.
struct SplashSetup {
    attn: SplashAttention,
    features: Features,
    stage: Stage,
}

/// The stage named `kernel` of the plans of a [`SplashAttention`] configured from the
/// parameters (portable rules: `tessera ir --rules` checks the target's).
fn splash_setup(p: &Params, kernel: &str) -> Result<SplashSetup, RegistryError> {
    let dtype = p.dtype()?;
    let (bq, bkv) = (p.usize("BQ")?, p.usize("BKV")?);
    let bkv_compute = p.usize_or_same_as("BKVC", "BKV")?;
    // The mask's own message names the mask and the forms it takes.
    let mask = Mask::parse(&p.0["mask"])?;
    let soft_cap = match p.0["soft_cap"].as_str() {
        "none" => None,
        v => match v.parse::<f32>() {
            Ok(c) if c.is_finite() && c > 0.0 => Some(c),
            _ => return Err(p.bad("soft_cap", "none or a positive number")),
        },
    };
    let dims = Dims {
        batch: p.usize("B")?,
        heads: p.usize("H")?,
        kv_heads: p.usize("KVH")?,
        q_len: p.usize("SQ")?,
        kv_len: p.usize("SKV")?,
        head_dim: p.usize("D")?,
        head_dim_v: p.usize("D")?,
    };
    let fused = matches!(kernel, "splash_bwd_fused" | "splash_dq_reduce");
    let mut blocks = BlockSizes::uniform(bq, bkv).with_fused_bwd(fused);
    blocks.block_kv_compute = bkv_compute;
    blocks.block_kv_dkv_compute = bkv_compute;
    // dQ's own default split stands unless BKVC is given.
    if p.0["BKVC"] != "BKV" {
        blocks.block_kv_dq_compute = Some(bkv_compute);
    }
    let options = SplashOptions {
        soft_cap,
        ..SplashOptions::default()
    };
    let attn = SplashAttention::new(mask, dims, dtype, blocks, options, KernelRules::portable())?;
    let features = Features {
        segmented: p.bool("segmented")?,
        sinks: p.bool("sinks")?,
    };
    let stage = attn
        .forward_plan(features)
        .into_iter()
        .chain(attn.backward_plan(features))
        .find(|s| s.def.name() == kernel)
        .ok_or_else(|| RegistryError::NoSplashStage {
            kernel: kernel.to_string(),
        })?;
    Ok(SplashSetup {
        attn,
        features,
        stage,
    })
}

fn build_splash(p: &Params, kernel: &str) -> Result<Built, RegistryError> {
    let SplashSetup { attn, stage, .. } = splash_setup(p, kernel)?;
    let args = stage_specs(&stage, |t| attn.tensor_spec(t));
    let fixed = stage
        .args
        .iter()
        .map(|a| match a {
            StageArg::Const(c) => Some(c.clone()),
            _ => None,
        })
        .collect();
    Ok(Built {
        def: stage.def,
        args,
        fixed,
        mesh: Vec::new(),
    })
}

/// The f64 form of splash's inputs that the reference reads: q, k, v and, where the call
/// uses them, segment ids and sinks.
struct SplashRefData {
    q: Vec<f64>,
    k: Vec<f64>,
    v: Vec<f64>,
    q_segments: Option<Vec<i32>>,
    kv_segments: Option<Vec<i32>>,
    sinks: Option<Vec<f64>>,
}

impl SplashRefData {
    /// From the tensors of a call, when it has q, k and v.
    fn of(env: &HashMap<Tensor, HostArray>) -> Option<Self> {
        let f = |t: Tensor| env.get(&t).map(HostArray::to_f64_vec);
        let ids = |t: Tensor| {
            env.get(&t)
                .map(|a| a.to_f64_vec().iter().map(|&x| x as i32).collect())
        };
        Some(SplashRefData {
            q: f(Tensor::Q)?,
            k: f(Tensor::K)?,
            v: f(Tensor::V)?,
            q_segments: ids(Tensor::QSegments),
            kv_segments: ids(Tensor::KvSegments),
            sinks: f(Tensor::Sinks),
        })
    }

    fn inputs<'a>(&'a self, attn: &'a SplashAttention) -> RefInputs<'a> {
        let options = attn.options();
        RefInputs {
            q_segment_ids: self.q_segments.as_deref(),
            kv_segment_ids: self.kv_segments.as_deref(),
            sinks: self.sinks.as_deref(),
            offsets: options.offsets,
            soft_cap: options.soft_cap.map(f64::from),
            ..RefInputs::new(
                attn.dims(),
                (&self.q, &self.k, &self.v),
                attn.mask(),
                f64::from(attn.scale()),
            )
        }
    }
}

/// `rowsum(out * dout)` per query row, `[B, H, Sq]` flattened.
fn rowsum_product(out: &HostArray, dout: &HostArray) -> Vec<f64> {
    let dv = *out.shape().last().expect("rank 4");
    let (o, g) = (out.to_f64_vec(), dout.to_f64_vec());
    o.chunks(dv)
        .zip(g.chunks(dv))
        .map(|(o, g)| o.iter().zip(g).map(|(a, b)| a * b).sum())
        .collect()
}

/// Values for every tensor a splash kernel may read, consistent as a forward and backward
/// would leave them: random q, k, v, dout, sinks (and the fused backward's dQ partials),
/// three segments, and `out`, `lse`, `di` from the f64 reference (rounded as the kernels
/// store them).
fn splash_inputs(p: &Params, kernel: &str, seed: u64) -> Result<Vec<HostArray>, RegistryError> {
    let SplashSetup {
        attn,
        features,
        stage,
    } = splash_setup(p, kernel)?;
    let (d, dtype) = (attn.dims(), attn.dtype());
    let shape = |t: Tensor| attn.tensor_spec(t).shape;
    let mut env = HashMap::new();
    for (i, t) in [Tensor::Q, Tensor::K, Tensor::V, Tensor::DOut]
        .into_iter()
        .enumerate()
    {
        env.insert(t, HostArray::random(dtype, shape(t), seed + i as u64));
    }
    let thirds = |len: usize| (0..len).map(move |i| (3 * i / len) as i32);
    let q_ids: Vec<i32> = (0..d.batch).flat_map(|_| thirds(d.q_len)).collect();
    let kv_ids: Vec<i32> = (0..d.batch).flat_map(|_| thirds(d.kv_len)).collect();
    let ids = |t: Tensor, v: Vec<i32>| HostArray::i32(shape(t), v).expect("one id per position");
    env.insert(Tensor::QSegments, ids(Tensor::QSegments, q_ids));
    env.insert(Tensor::KvSegments, ids(Tensor::KvSegments, kv_ids));
    env.insert(
        Tensor::Sinks,
        HostArray::random(DType::F32, shape(Tensor::Sinks), seed + 4),
    );
    env.insert(
        Tensor::DqPartial,
        HostArray::random(
            attn.tensor_spec(Tensor::DqPartial).dtype,
            shape(Tensor::DqPartial),
            seed + 5,
        ),
    );
    // What the forward leaves for the backward: segments and sinks count where the call uses
    // them (its stages read placeholders otherwise).
    let used: HashMap<Tensor, HostArray> = env
        .iter()
        .filter(|(t, _)| match t {
            Tensor::QSegments | Tensor::KvSegments => features.segmented,
            Tensor::Sinks => features.sinks,
            _ => true,
        })
        .map(|(t, a)| (*t, a.clone()))
        .collect();
    let data = SplashRefData::of(&used).expect("q, k and v are random");
    let fwd = splash_reference::forward(&data.inputs(&attn));
    let out = HostArray::from_f64(dtype, shape(Tensor::Out), &fwd.out).expect("out's shape");
    let lse = HostArray::from_f64(DType::F32, shape(Tensor::Lse), &fwd.lse).expect("lse's shape");
    let di = rowsum_product(&out, &env[&Tensor::DOut]);
    env.insert(
        Tensor::Di,
        HostArray::from_f64(DType::F32, shape(Tensor::Di), &di).expect("di's shape"),
    );
    env.insert(Tensor::Out, out);
    env.insert(Tensor::Lse, lse);
    stage
        .args
        .iter()
        .map(|a| match a {
            StageArg::Const(c) => Ok(c.clone()),
            StageArg::Tensor(t) => Ok(env[t].clone()),
            StageArg::PerShard(_) => Err(RegistryError::NoReference {
                kernel: kernel.to_string(),
                reason: "per-shard tables",
            }),
        })
        .collect()
}

/// Each output of the splash stage, from its inputs: the forward's `out` and `lse`, the
/// gradients `dq`, `dk`, `dv` (the fused kernel's dQ per key block) from the f64 reference;
/// `di = rowsum(out * dout)`, the sinks' gradient and dQ's reduction from their definitions.
fn splash_reference_of(
    p: &Params,
    kernel: &str,
    x: &[HostArray],
) -> Result<Vec<Vec<f64>>, RegistryError> {
    let SplashSetup {
        attn,
        features,
        stage,
    } = splash_setup(p, kernel)?;
    expect_inputs(kernel, x, stage.args.len())?;
    let env: HashMap<Tensor, HostArray> = stage
        .args
        .iter()
        .zip(x)
        .filter_map(|(a, x)| match a {
            StageArg::Tensor(t) => Some((*t, x.clone())),
            _ => None,
        })
        .collect();
    // The backward kernels take the sinks only through `lse`: their f64 reference cannot
    // be had from their inputs.
    let reads_sinks = stage
        .args
        .iter()
        .any(|a| matches!(a, StageArg::Tensor(Tensor::Sinks)));
    let data = SplashRefData::of(&env).filter(|_| reads_sinks || !features.sinks);
    let reference = data.as_ref().map(|data| data.inputs(&attn));
    let dout = env.get(&Tensor::DOut).map(HostArray::to_f64_vec);
    let grads = match (&reference, &dout) {
        (Some(r), Some(g)) => Some(splash_reference::backward(r, g)),
        _ => None,
    };
    let missing = || RegistryError::NoReference {
        kernel: kernel.to_string(),
        reason: if features.sinks {
            "its inputs (with sinks, the backward kernels see them only through lse)"
        } else {
            "its inputs"
        },
    };
    let d = attn.dims();
    let mut outputs = Vec::new();
    for t in &stage.outputs {
        outputs.push(match t {
            Tensor::Out => splash_reference::forward(reference.as_ref().ok_or_else(missing)?).out,
            Tensor::Lse => splash_reference::forward(reference.as_ref().ok_or_else(missing)?).lse,
            Tensor::Di => rowsum_product(&env[&Tensor::Out], &env[&Tensor::DOut]),
            Tensor::DSinks => {
                let di = rowsum_product(&env[&Tensor::Out], &env[&Tensor::DOut]);
                let lse = env[&Tensor::Lse].to_f64_vec();
                let mut dsinks = vec![0.0; d.heads];
                if features.sinks {
                    let sinks = env[&Tensor::Sinks].to_f64_vec();
                    for (r, (di, lse)) in di.iter().zip(&lse).enumerate() {
                        let h = (r / d.q_len) % d.heads;
                        dsinks[h] -= (sinks[h] - lse).exp() * di;
                    }
                }
                dsinks
            }
            Tensor::Dq => match env.get(&Tensor::DqPartial) {
                Some(parts) => {
                    let n = parts.shape()[0];
                    let parts = parts.to_f64_vec();
                    let len = parts.len() / n;
                    (0..len)
                        .map(|i| (0..n).map(|b| parts[b * len + i]).sum())
                        .collect()
                }
                None => grads.as_ref().ok_or_else(missing)?.dq.clone(),
            },
            Tensor::Dk => grads.as_ref().ok_or_else(missing)?.dk.clone(),
            Tensor::Dv => grads.as_ref().ok_or_else(missing)?.dv.clone(),
            Tensor::DqPartial => splash_reference::dq_per_key_block(
                reference.as_ref().ok_or_else(missing)?,
                dout.as_deref().ok_or_else(missing)?,
                attn.block_sizes().block_kv_dkv,
            ),
            _ => return Err(missing()),
        });
    }
    Ok(outputs)
}

fn splash_flops(p: &Params, kernel: &str) -> Result<f64, RegistryError> {
    let s = splash_setup(p, kernel)?;
    Ok(s.attn.kernel_flops(kernel, s.attn.visible_pairs()))
}

/// Where every splash kernel is checked: f32 with a local window, segment ids and a soft cap
/// (GQA); bf16 causal (MQA). (Sinks reach the backward kernels only through `lse`, so their
/// references cannot be had from the kernels' inputs: splash's own tests cover them.)
const SPLASH_CASES: &[Case] = &[
    Case {
        params: &[
            ("dtype", "f32"),
            ("mask", "local:60:10"),
            ("segmented", "true"),
            ("soft_cap", "5.0"),
            ("H", "4"),
            ("KVH", "2"),
            ("SQ", "256"),
            ("SKV", "256"),
            ("D", "128"),
        ],
        tol: 1e-4,
    },
    Case {
        params: &[
            ("dtype", "bf16"),
            ("H", "2"),
            ("KVH", "1"),
            ("SQ", "256"),
            ("SKV", "256"),
            ("D", "128"),
        ],
        tol: 3e-2,
    },
];

/// Where every splash kernel is timed.
const SPLASH_BENCH: &[&[(&str, &str)]] = &[&[
    ("BQ", "{block}"),
    ("BKV", "{block}"),
    ("H", "{heads}"),
    ("KVH", "{heads}"),
    ("SQ", "{seq}"),
    ("SKV", "{seq}"),
    ("D", "{head_dim}"),
]];

/// A splash kernel: every one takes [`SPLASH_PARAMS`] and is built, checked and counted by
/// the splash functions.
const fn splash_kernel(name: &'static str, summary: &'static str) -> KernelInfo {
    KernelInfo {
        name,
        summary,
        params: SPLASH_PARAMS,
        build: build_splash,
        reference: Reference::Local(splash_reference_of),
        flops: splash_flops,
        inputs: Some(splash_inputs),
        xla: None,
        cases: SPLASH_CASES,
        bench: SPLASH_BENCH,
    }
}

const DTYPE: ParamInfo = ParamInfo::compile_time("dtype", "f32", "input dtype: f32 or bf16");
const BQ: ParamInfo = ParamInfo::compile_time("BQ", "128", "query rows per block");
const BKV: ParamInfo = ParamInfo::compile_time("BKV", "128", "keys per block");

/// The parameters every splash kernel takes (each kernel uses the sizes of its arguments).
const SPLASH_PARAMS: &[ParamInfo] = &[
    BQ,
    BKV,
    ParamInfo::compile_time("BKVC", "BKV", "keys per inner compute step (divides BKV)"),
    DTYPE,
    ParamInfo::compile_time(
        "mask",
        "causal",
        "full, causal, causal:OFFSET, local:LEFT:RIGHT or chunked:SIZE",
    ),
    ParamInfo::compile_time(
        "soft_cap",
        "none",
        "logit soft cap c (c * tanh(x / c)), or none",
    ),
    ParamInfo::compile_time("segmented", "false", "segment ids (packed sequences)"),
    ParamInfo::compile_time("sinks", "false", "attention sinks (one logit per head)"),
    ParamInfo::size(
        "B",
        "1",
        "batch",
        &[
            ("q", 0),
            ("k", 0),
            ("v", 0),
            ("q_seg", 0),
            ("kv_seg", 0),
            ("out", 0),
            ("dout", 0),
            ("lse", 0),
            ("di", 0),
            ("dq_partial", 1),
        ],
    ),
    ParamInfo::size(
        "H",
        "4",
        "query heads",
        &[
            ("q", 1),
            ("out", 1),
            ("dout", 1),
            ("lse", 1),
            ("di", 1),
            ("dq_partial", 2),
        ],
    ),
    ParamInfo::size(
        "KVH",
        "2",
        "key/value heads (divides H)",
        &[("k", 1), ("v", 1)],
    ),
    ParamInfo::size(
        "SQ",
        "512",
        "query sequence length",
        &[
            ("q", 2),
            ("q_seg", 1),
            ("out", 2),
            ("dout", 2),
            ("lse", 2),
            ("di", 2),
            ("dq_partial", 3),
        ],
    ),
    ParamInfo::size(
        "SKV",
        "512",
        "key sequence length",
        &[("k", 2), ("v", 2), ("kv_seg", 2)],
    ),
    ParamInfo::size(
        "D",
        "64",
        "head dim",
        &[
            ("q", 3),
            ("k", 3),
            ("v", 3),
            ("out", 3),
            ("dout", 3),
            ("dq_partial", 4),
        ],
    ),
];

/// Every built-in kernel.
pub const KERNELS: &[KernelInfo] = &[
    KernelInfo {
        name: "matmul",
        summary: "tiled matmul x[M,K] @ y[K,N] with an f32 scratch accumulator",
        params: &[
            ParamInfo::compile_time("BM", "128", "rows of x per block"),
            ParamInfo::compile_time("BN", "128", "columns of y per block"),
            ParamInfo::compile_time("BK", "128", "contraction per block"),
            DTYPE,
            ParamInfo::size("M", "256", "rows of x", &[("x", 0)]),
            ParamInfo::size("N", "256", "columns of y", &[("y", 1)]),
            ParamInfo::size("K", "512", "columns of x, rows of y", &[("x", 1), ("y", 0)]),
        ],
        build: build_matmul,
        reference: Reference::Local(matmul_reference),
        flops: matmul_flops,
        inputs: None,
        xla: None,
        // f32 accumulation of K products of magnitude <= 1.
        cases: &[
            Case {
                params: &[("dtype", "f32")],
                tol: 1e-4,
            },
            Case {
                params: &[("dtype", "f32"), ("BM", "64"), ("BN", "256"), ("K", "256")],
                tol: 1e-4,
            },
            Case {
                params: &[("dtype", "bf16"), ("BM", "16"), ("BK", "256"), ("M", "128")],
                tol: 1e-3,
            },
        ],
        bench: &[
            &[
                ("dtype", "f32"),
                ("BM", "{matmul_block}"),
                ("BN", "{matmul_block}"),
                ("BK", "{matmul_block}"),
                ("M", "{matmul_size}"),
                ("N", "{matmul_size}"),
                ("K", "{matmul_size}"),
            ],
            &[
                ("dtype", "bf16"),
                ("BM", "{matmul_block}"),
                ("BN", "{matmul_block}"),
                ("BK", "{matmul_block}"),
                ("M", "{matmul_size}"),
                ("N", "{matmul_size}"),
                ("K", "{matmul_size}"),
            ],
        ],
    },
    KernelInfo {
        name: "pipelined_matmul",
        summary: "matmul x[M,K] @ y[K,N] with x, y and out left in HBM and the blocks moved \
                  by a pipeline nested in the kernel body (Pallas' emit_pipeline), BUFFERS \
                  VMEM buffers per operand, accumulating in the f32 output block",
        params: &[
            ParamInfo::compile_time("BM", "8", "rows of x per block"),
            ParamInfo::compile_time("BN", "128", "columns of y per block"),
            ParamInfo::compile_time("BK", "128", "contraction per block"),
            ParamInfo::compile_time("BUFFERS", "2", "VMEM buffers per operand (2 or more)"),
            DTYPE,
            ParamInfo::size("M", "32", "rows of x", &[("x", 0)]),
            ParamInfo::size("N", "256", "columns of y", &[("y", 1)]),
            ParamInfo::size("K", "384", "columns of x, rows of y", &[("x", 1), ("y", 0)]),
        ],
        build: build_pipelined_matmul,
        reference: Reference::Local(matmul_reference),
        flops: matmul_flops,
        inputs: None,
        xla: None,
        // f32 accumulation of K products of magnitude <= 1.
        cases: &[
            Case {
                params: &[("dtype", "f32")],
                tol: 1e-4,
            },
            Case {
                params: &[
                    ("dtype", "f32"),
                    ("BUFFERS", "3"),
                    ("BM", "16"),
                    ("M", "48"),
                ],
                tol: 1e-4,
            },
            Case {
                params: &[("dtype", "bf16"), ("BM", "16"), ("BK", "256"), ("K", "512")],
                tol: 1e-3,
            },
        ],
        bench: &[&[
            ("dtype", "f32"),
            ("BM", "{matmul_block}"),
            ("BN", "{matmul_block}"),
            ("BK", "{matmul_block}"),
            ("M", "{matmul_size}"),
            ("N", "{matmul_size}"),
            ("K", "{matmul_size}"),
        ]],
    },
    KernelInfo {
        name: "row_softmax",
        summary: "softmax of each row of x[R,C], BR rows per step",
        params: &[
            ParamInfo::compile_time("BR", "8", "rows per block"),
            DTYPE,
            ParamInfo::size("R", "64", "rows", &[("x", 0)]),
            ParamInfo::size("C", "128", "columns", &[("x", 1)]),
        ],
        build: build_softmax,
        reference: Reference::Local(softmax_reference),
        flops: softmax_flops,
        inputs: None,
        xla: None,
        cases: &[
            Case {
                params: &[("dtype", "f32"), ("C", "256")],
                tol: 1e-6,
            },
            Case {
                params: &[("dtype", "f32"), ("BR", "32")],
                tol: 1e-6,
            },
            // One bf16 rounding of outputs below 1/16.
            Case {
                params: &[("dtype", "bf16"), ("BR", "16")],
                tol: 2e-4,
            },
        ],
        bench: &[&[("BR", "{softmax_block}"), ("R", "{seq}"), ("C", "{seq}")]],
    },
    KernelInfo {
        name: "flash_attention",
        summary: "single-head flash attention forward with online softmax",
        params: &[
            BQ,
            BKV,
            DTYPE,
            ParamInfo::compile_time(
                "causal",
                "false",
                "causal mask (j <= i), skipping masked blocks",
            ),
            ParamInfo::size(
                "S",
                "512",
                "sequence length",
                &[("q", 0), ("k", 0), ("v", 0)],
            ),
            ParamInfo::size("D", "64", "head dim", &[("q", 1), ("k", 1), ("v", 1)]),
        ],
        build: build_flash,
        reference: Reference::Local(flash_reference),
        flops: flash_flops,
        inputs: None,
        xla: None,
        cases: &[
            Case {
                params: &[("BQ", "64"), ("S", "256")],
                tol: 2e-6,
            },
            Case {
                params: &[
                    ("BQ", "32"),
                    ("BKV", "64"),
                    ("causal", "true"),
                    ("S", "256"),
                ],
                tol: 2e-6,
            },
            // p is rounded to bf16 before its matmul with v.
            Case {
                params: &[
                    ("dtype", "bf16"),
                    ("BKV", "64"),
                    ("causal", "true"),
                    ("S", "256"),
                ],
                tol: 2e-2,
            },
        ],
        bench: &[&[
            ("BQ", "{flash_block}"),
            ("BKV", "{flash_block}"),
            ("causal", "true"),
            ("S", "{seq}"),
            ("D", "{head_dim}"),
        ]],
    },
    KernelInfo {
        name: "paged_attention",
        summary: "decode attention over KV pages in HBM found through a page table (JAX's \
                  paged_attention), pages double-buffered into VMEM",
        params: &[
            ParamInfo::compile_time("pages_per_block", "4", "pages per copy block"),
            DTYPE,
            ParamInfo::size(
                "B",
                "4",
                "sequences",
                &[("q", 0), ("lengths", 0), ("page_indices", 0)],
            ),
            ParamInfo::size("H", "8", "query heads", &[("q", 1)]),
            ParamInfo::size(
                "KVH",
                "2",
                "key/value heads (divides H)",
                &[("k_pages", 0), ("v_pages", 0)],
            ),
            ParamInfo::size(
                "P",
                "64",
                "pages in the pool",
                &[("k_pages", 1), ("v_pages", 1)],
            ),
            ParamInfo::size(
                "page_size",
                "16",
                "tokens per page",
                &[("k_pages", 2), ("v_pages", 2)],
            ),
            ParamInfo::size(
                "pages_per_seq",
                "8",
                "page table entries per sequence",
                &[("page_indices", 1)],
            ),
            ParamInfo::size(
                "D",
                "128",
                "head dim",
                &[("q", 2), ("k_pages", 3), ("v_pages", 3)],
            ),
        ],
        build: build_paged,
        reference: Reference::Local(paged_reference),
        flops: paged_flops,
        inputs: None,
        xla: Some(|args, _| xla::paged_attention(args)),
        cases: &[
            Case {
                params: &[("dtype", "f32")],
                tol: 1e-5,
            },
            // MHA, one page per block.
            Case {
                params: &[("dtype", "f32"), ("KVH", "8"), ("pages_per_block", "1")],
                tol: 1e-5,
            },
            // Outputs rounded to bf16 (|out| <= 1).
            Case {
                params: &[("dtype", "bf16"), ("B", "3")],
                tol: 1e-2,
            },
        ],
        bench: &[
            &[
                ("dtype", "f32"),
                ("pages_per_block", "8"),
                ("B", "8"),
                ("H", "32"),
                ("KVH", "8"),
                ("pages_per_seq", "{kv_pages}"),
            ],
            &[
                ("dtype", "bf16"),
                ("pages_per_block", "8"),
                ("B", "8"),
                ("H", "32"),
                ("KVH", "8"),
                ("pages_per_seq", "{kv_pages}"),
            ],
        ],
    },
    KernelInfo {
        name: "cache_update",
        summary: "cache[R,C] with the row blocks (8 rows f32, 16 bf16) listed in a \
                  scalar-prefetched table replaced by the blocks of new, in place: out is \
                  cache's buffer (input_output_aliases), so unlisted blocks keep their values",
        params: &[
            DTYPE,
            ParamInfo::size("N", "3", "blocks updated (grid steps)", &[("slots", 0)]),
            ParamInfo::size(
                "R",
                "64",
                "rows of the cache (a multiple of 8)",
                &[("cache", 0)],
            ),
            ParamInfo::size("C", "128", "columns", &[("cache", 1), ("new", 1)]),
        ],
        build: build_cache_update,
        reference: Reference::Local(cache_update_ref),
        flops: no_flops,
        inputs: None,
        xla: None,
        // A copy: exact.
        cases: &[
            Case {
                params: &[("dtype", "f32")],
                tol: 1e-30,
            },
            Case {
                params: &[("dtype", "bf16"), ("N", "5"), ("R", "96"), ("C", "256")],
                tol: 1e-30,
            },
        ],
        bench: &[&[
            ("dtype", "f32"),
            ("R", "{collective_size}"),
            ("C", "{collective_size}"),
        ]],
    },
    KernelInfo {
        name: "gather_tiles",
        summary: "tiles of 8 rows of x[R,C] (left in HBM) in the order of a scalar-prefetched \
                  table, each step's copy double-buffered behind the one before",
        params: &[
            ParamInfo::compile_time("dtype", "f32", "input dtype: f32"),
            ParamInfo::size("G", "6", "tiles gathered (grid steps)", &[("tiles", 0)]),
            ParamInfo::size("R", "32", "rows of x (a multiple of 8)", &[("x", 0)]),
            ParamInfo::size("C", "128", "columns", &[("x", 1)]),
        ],
        build: build_gather_tiles,
        reference: Reference::Local(gather_tiles_ref),
        flops: no_flops,
        inputs: None,
        xla: None,
        // A copy: exact.
        cases: &[
            Case {
                params: &[],
                tol: 1e-30,
            },
            Case {
                params: &[("G", "9"), ("R", "16"), ("C", "256")],
                tol: 1e-30,
            },
        ],
        bench: &[&[("R", "{collective_size}"), ("C", "{collective_size}")]],
    },
    KernelInfo {
        name: "ring_shift",
        summary: "x[R,C] of the previous device on a ring, by one remote copy to the next \
                  device after meeting at the barrier; runs on `devices` devices",
        params: &[
            DEVICES,
            ParamInfo::compile_time("dtype", "f32", "input dtype: f32"),
            ParamInfo::size("R", "8", "rows", &[("x", 0)]),
            ParamInfo::size("C", "128", "columns", &[("x", 1)]),
        ],
        build: |p, _| build_ring(p, ring_shift(), "R"),
        reference: Reference::Mesh(ring_shift_mesh_reference),
        flops: no_flops,
        inputs: None,
        xla: Some(xla::ring_shift),
        cases: &[
            Case {
                params: &[],
                tol: 1e-30,
            },
            Case {
                params: &[("devices", "2"), ("R", "16")],
                tol: 1e-30,
            },
        ],
        bench: &[&[("R", "{collective_size}"), ("C", "{collective_size}")]],
    },
    KernelInfo {
        name: "ring_all_gather",
        summary: "all-gather of x[S,C] over a ring, each device forwarding the shard it \
                  received last (a fori_loop of remote copies); runs on `devices` devices",
        params: &[
            DEVICES,
            ParamInfo::compile_time("dtype", "f32", "input dtype: f32"),
            ParamInfo::size("S", "8", "rows per device", &[("x", 0)]),
            ParamInfo::size("C", "128", "columns", &[("x", 1)]),
        ],
        build: |p, _| build_ring(p, ring_all_gather(), "S"),
        reference: Reference::Mesh(ring_all_gather_mesh_reference),
        flops: no_flops,
        inputs: None,
        xla: Some(xla::all_gather),
        cases: &[
            Case {
                params: &[],
                tol: 1e-30,
            },
            Case {
                params: &[("devices", "2"), ("S", "16"), ("C", "256")],
                tol: 1e-30,
            },
        ],
        bench: &[&[("S", "{collective_size}"), ("C", "{collective_size}")]],
    },
    KernelInfo {
        name: "all_gather",
        summary: "all-gather of x[S,C] over a ring of devices with remote copies, halves \
                  travelling both ways (JAX's all_gather); runs on `devices` devices",
        params: &[
            DEVICES,
            ParamInfo::compile_time("dtype", "f32", "input dtype: f32"),
            ParamInfo::size("S", "16", "rows per device (even)", &[("x", 0)]),
            ParamInfo::size("C", "128", "columns", &[("x", 1)]),
        ],
        build: build_all_gather,
        reference: Reference::Mesh(all_gather_mesh_reference),
        flops: no_flops,
        inputs: None,
        xla: Some(xla::all_gather),
        // A copy: exact.
        cases: &[
            Case {
                params: &[],
                tol: 1e-30,
            },
            Case {
                params: &[("devices", "2"), ("S", "32"), ("C", "256")],
                tol: 1e-30,
            },
        ],
        bench: &[&[("S", "{collective_size}"), ("C", "{collective_size}")]],
    },
    KernelInfo {
        name: "all_gather_matmul",
        summary: "x[T,K] @ all_gather(w[K/devices,F]) over a ring of devices, each shard's \
                  remote copy overlapping the matmul of the one before (collective matmul)",
        params: &[
            ParamInfo::compile_time("BT", "16", "rows of x per block"),
            ParamInfo::compile_time("BF", "128", "columns of w per block"),
            DTYPE,
            DEVICES,
            ParamInfo::size("T", "32", "rows of x", &[("x", 0)]),
            ParamInfo::size(
                "K",
                "512",
                "columns of x; w's rows on all devices together",
                &[("x", 1)],
            ),
            ParamInfo::size("F", "256", "columns of w", &[("w", 1)]),
        ],
        build: build_all_gather_matmul,
        reference: Reference::Mesh(all_gather_matmul_mesh_reference),
        flops: all_gather_matmul_flops,
        inputs: None,
        xla: Some(xla::all_gather_matmul),
        cases: &[
            // f32 accumulation of K products of magnitude <= 1.
            Case {
                params: &[("dtype", "f32")],
                tol: 1e-4,
            },
            Case {
                params: &[("dtype", "f32"), ("devices", "2"), ("BF", "256")],
                tol: 1e-4,
            },
            // Outputs (|out| < 32 here) rounded to bf16.
            Case {
                params: &[("dtype", "bf16")],
                tol: 0.125,
            },
        ],
        bench: &[
            &[
                ("dtype", "f32"),
                ("BT", "256"),
                ("BF", "256"),
                ("T", "{collective_size}"),
                ("K", "{collective_size}"),
                ("F", "{collective_size}"),
            ],
            &[
                ("dtype", "bf16"),
                ("BT", "256"),
                ("BF", "256"),
                ("T", "{collective_size}"),
                ("K", "{collective_size}"),
                ("F", "{collective_size}"),
            ],
        ],
    },
    splash_kernel(
        "splash_fwd",
        "splash attention forward: out and logsumexp over the mask's non-empty blocks",
    ),
    splash_kernel(
        "splash_bwd_prep",
        "splash backward preprocessing: di = rowsum(out * dout) and the sinks' gradient",
    ),
    splash_kernel(
        "splash_dq",
        "splash backward dQ (separate backward kernels)",
    ),
    splash_kernel(
        "splash_dkv",
        "splash backward dK and dV (separate backward kernels)",
    ),
    splash_kernel(
        "splash_bwd_fused",
        "splash fused backward: dK, dV and dQ per key block in one kernel",
    ),
    splash_kernel(
        "splash_dq_reduce",
        "splash fused backward's dQ reduction over key blocks",
    ),
];

/// Looks a kernel up by name.
pub fn find(name: &str) -> Result<&'static KernelInfo, RegistryError> {
    KERNELS
        .iter()
        .find(|k| k.name == name)
        .ok_or_else(|| RegistryError::UnknownKernel {
            name: name.to_string(),
            known: KERNELS.iter().map(|k| k.name).collect(),
        })
}

impl KernelInfo {
    /// Whether the kernel runs on a device mesh (each device with its own arguments and
    /// outputs; [`Instance::mesh`]) rather than on one device.
    pub fn on_mesh(&self) -> bool {
        matches!(self.reference, Reference::Mesh(_))
    }

    /// Fills defaults and checks names.
    fn params_of(&self, given: &[(String, String)]) -> Result<Params, RegistryError> {
        let mut params = Params::default();
        for p in self.params {
            params.0.insert(p.name.to_string(), p.default.to_string());
        }
        for (name, value) in given {
            if !params.0.contains_key(name) {
                return Err(RegistryError::UnknownParam {
                    kernel: self.name,
                    param: name.clone(),
                    known: self.params.iter().map(|p| p.name).collect(),
                });
            }
            params.0.insert(name.clone(), value.clone());
        }
        Ok(params)
    }

    /// Fills defaults, checks names, and builds the definition and its default arguments.
    pub fn build(
        &self,
        given: &[(String, String)],
    ) -> Result<(KernelDef, Vec<ArgSpec>), RegistryError> {
        let built = (self.build)(&self.params_of(given)?, self.name)?;
        Ok((built.def, built.args))
    }

    /// The kernel at the given parameter values, with its reference, inputs and flop count.
    pub fn instance(&'static self, given: &[(String, String)]) -> Result<Instance, RegistryError> {
        let params = self.params_of(given)?;
        let built = (self.build)(&params, self.name)?;
        Ok(Instance {
            info: self,
            given: given.to_vec(),
            params,
            built,
        })
    }

    /// The kernel at bench parameter set `set` ([`KernelInfo::bench`]), each `{knob}` value
    /// given by `knob` (the bench's flags).
    pub fn bench_instance(
        &'static self,
        set: &[(&'static str, &'static str)],
        knob: impl Fn(&str) -> Option<String>,
    ) -> Result<Instance, RegistryError> {
        let mut given = Vec::with_capacity(set.len());
        for &(param, value) in set {
            let value = match value.strip_prefix('{').and_then(|v| v.strip_suffix('}')) {
                Some(name) => knob(name).ok_or_else(|| RegistryError::UnknownKnob {
                    kernel: self.name,
                    param,
                    knob: name.to_string(),
                })?,
                None => value.to_string(),
            };
            given.push((param.to_string(), value));
        }
        self.instance(&given)
    }

    /// Checks the size parameters in `given` against the arguments `args` of `def` (as run:
    /// sizes come from the inputs); a size given that disagrees with them is an error naming
    /// the parameter and the argument.
    pub fn check_sizes(
        &self,
        given: &[(String, String)],
        def: &KernelDef,
        args: &[ArgSpec],
    ) -> Result<(), RegistryError> {
        for (name, value) in given {
            let Some(param) = self.params.iter().find(|p| p.name == name) else {
                continue;
            };
            for &(arg, dim) in param.sets {
                let Some(i) = def.args().iter().position(|a| a.name == arg) else {
                    continue;
                };
                let Some(spec) = args.get(i) else { continue };
                let actual = spec.shape.get(dim).map(ToString::to_string);
                if actual.as_deref() != Some(value.as_str()) {
                    return Err(RegistryError::SizeMismatch {
                        param: name.clone(),
                        value: value.clone(),
                        arg: def.args()[i].name,
                        spec: Box::new(spec.clone()),
                        dim,
                        actual: actual.unwrap_or_else(|| "missing".into()),
                    });
                }
            }
        }
        Ok(())
    }
}

/// A registered kernel at given parameter values: its definition and default arguments, and
/// what checks and times it.
#[derive(Debug, Clone)]
pub struct Instance {
    pub info: &'static KernelInfo,
    /// The parameters given (the others at their defaults).
    given: Vec<(String, String)>,
    params: Params,
    built: Built,
}

impl Instance {
    /// The parameters given, `NAME=VALUE ...` (the others at their defaults).
    pub fn label(&self) -> String {
        let shown: Vec<String> = self.given.iter().map(|(k, v)| format!("{k}={v}")).collect();
        shown.join(" ")
    }

    pub fn def(&self) -> &KernelDef {
        &self.built.def
    }

    /// The default arguments (scalar prefetch, then inputs).
    pub fn args(&self) -> &[ArgSpec] {
        &self.built.args
    }

    /// The dtype parameter (every registered kernel has one).
    pub fn dtype(&self) -> Result<DType, RegistryError> {
        self.params.dtype()
    }

    /// The device mesh the kernel runs on: its axes with their sizes (empty: one device).
    pub fn mesh(&self) -> &[DeviceAxis] {
        &self.built.mesh
    }
    /// The devices one call runs on (1 for a one-device kernel).
    pub fn devices(&self) -> usize {
        self.built.mesh.iter().map(|a| a.size).product()
    }
    /// The kernel instantiated for its default arguments on its mesh under `rules`.
    pub fn instantiate(&self, rules: &KernelRules) -> Result<Arc<Kernel>, KernelError> {
        self.built
            .def
            .instantiate_on(&self.built.args, &self.built.mesh, rules)
    }
    /// Each device's arguments for the default specs (one list for a one-device kernel) whose
    /// values the reference is exact for (splash's backward kernels get a forward's
    /// residuals); the arguments the parameters fix keep their values. Deterministic in
    /// `seed`; the devices' data differ.
    pub fn inputs(&self, seed: u64) -> Result<Vec<Vec<HostArray>>, RegistryError> {
        (0..self.devices() as u64)
            .map(|d| match self.info.inputs {
                Some(f) => f(&self.params, self.info.name, seed + 1000 * d),
                None => Ok(self.device_random_inputs(seed + 1000 * d)),
            })
            .collect()
    }
    /// Each device's random arguments for the default specs (floats uniform in [-1, 1),
    /// integers 0); the arguments the parameters fix keep their values. For timing.
    pub fn random_inputs(&self, seed: u64) -> Vec<Vec<HostArray>> {
        (0..self.devices() as u64)
            .map(|d| self.device_random_inputs(seed + 1000 * d))
            .collect()
    }
    fn device_random_inputs(&self, seed: u64) -> Vec<HostArray> {
        self.built
            .args
            .iter()
            .zip(&self.built.fixed)
            .enumerate()
            .map(|(i, (spec, fixed))| match fixed {
                Some(a) => a.clone(),
                None if spec.dtype.is_float() => {
                    HostArray::random(spec.dtype, spec.shape.clone(), seed + i as u64)
                }
                None => HostArray::zeros(spec.dtype, spec.shape.clone()),
            })
            .collect()
    }
    /// Whether argument `i` is fixed by the parameters (a table) rather than data.
    pub fn is_fixed(&self, i: usize) -> bool {
        self.built.fixed.get(i).is_some_and(Option::is_some)
    }
    /// Each device's outputs for `inputs` (each device's arguments), computed in f64 by the
    /// reference.
    pub fn reference(
        &self,
        inputs: &[Vec<HostArray>],
    ) -> Result<Vec<Vec<Vec<f64>>>, RegistryError> {
        match self.info.reference {
            Reference::Local(f) => inputs
                .iter()
                .map(|x| f(&self.params, self.info.name, x))
                .collect(),
            Reference::Mesh(f) => f(&self.params, self.info.name, inputs),
        }
    }
    /// XLA's own program computing what the kernel does, on the same arguments (each
    /// device's, in a program of one partition per device for a kernel on a mesh); `None`
    /// where the registry has none.
    pub fn xla_program(&self) -> Option<Result<tessera_hlo::Module, RegistryError>> {
        let f = self.info.xla?;
        Some(f(&self.built.args, self.devices()).map_err(RegistryError::from))
    }
    /// Floating-point operations of one call at the default arguments, on every device
    /// together (0 for a kernel that only moves data).
    pub fn flops(&self) -> Result<f64, RegistryError> {
        (self.info.flops)(&self.params, self.info.name)
    }
    /// Runs the kernel on `backend` under `rules`: `inputs[d]` are device `d`'s arguments;
    /// returns each device's outputs. A one-device kernel runs as
    /// [`backend::run`], a kernel on a mesh as [`backend::run_on_devices`].
    pub fn run(
        &self,
        inputs: &[Vec<HostArray>],
        backend: Backend,
        rules: &KernelRules,
    ) -> Result<Vec<Vec<HostArray>>, RunError> {
        match (self.built.mesh.is_empty(), inputs) {
            (true, [one]) => Ok(vec![backend::run(&self.built.def, one, backend, rules)?]),
            _ => backend::run_on_devices(&self.built.def, &self.built.mesh, inputs, backend, rules),
        }
    }
    /// The largest absolute difference between `outputs` (each device's, of a run on
    /// `inputs`) and the reference, over every device and output (NaN counts as the
    /// largest).
    pub fn max_error(
        &self,
        inputs: &[Vec<HostArray>],
        outputs: &[Vec<HostArray>],
    ) -> Result<f64, RegistryError> {
        let want = self.reference(inputs)?;
        let count = |o: &[Vec<_>]| o.iter().map(Vec::len).collect::<Vec<_>>();
        let got_counts: Vec<usize> = outputs.iter().map(Vec::len).collect();
        if count(&want) != got_counts {
            return Err(RegistryError::Arguments {
                kernel: self.info.name.to_string(),
                expected: want.iter().map(Vec::len).sum(),
                got: got_counts.iter().sum(),
            });
        }
        Ok(outputs
            .iter()
            .flatten()
            .zip(want.iter().flatten())
            .map(|(got, want)| max_abs_diff(&got.to_f64_vec(), want).0)
            .fold(0.0, |a: f64, b| if b.is_nan() || b > a { b } else { a }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every entry has cases and bench sets that build, bench values that name known knobs,
    /// and a reference with one output per kernel output.
    #[test]
    fn every_kernel_has_cases_a_reference_and_bench_parameters() {
        for info in KERNELS {
            assert!(!info.cases.is_empty(), "{}: no cases", info.name);
            assert!(!info.bench.is_empty(), "{}: no bench parameters", info.name);
            for case in info.cases {
                let inst = info
                    .instance(&case.given())
                    .unwrap_or_else(|e| panic!("{} {:?}: {e}", info.name, case.params));
                assert!(case.tol > 0.0);
                let inputs = inst.inputs(1).unwrap();
                assert_eq!(inputs.len(), inst.devices(), "{}", info.name);
                assert_eq!(info.on_mesh(), !inst.mesh().is_empty(), "{}", info.name);
                for device in &inputs {
                    assert_eq!(device.len(), inst.args().len(), "{}", info.name);
                    for (a, spec) in device.iter().zip(inst.args()) {
                        assert_eq!(&ArgSpec::of(a), spec, "{}", info.name);
                    }
                }
                let outputs = inst
                    .instantiate(&KernelRules::tpu())
                    .unwrap_or_else(|e| panic!("{} {:?}: {e}", info.name, case.params))
                    .operands
                    .iter()
                    .filter(|o| o.role == tessera_dsl::ir::OperandRole::Output)
                    .map(|o| o.array_shape.iter().product::<usize>())
                    .collect::<Vec<_>>();
                for want in inst.reference(&inputs).unwrap() {
                    let want: Vec<usize> = want.iter().map(Vec::len).collect();
                    assert_eq!(want, outputs, "{} {:?}", info.name, case.params);
                }
                // 0: a kernel that only moves data.
                assert!(inst.flops().unwrap() >= 0.0, "{}", info.name);
            }
            for set in info.bench {
                // Small values for every knob: the sets resolve and build.
                let knob = |name: &str| -> Option<String> {
                    BENCH_SIZES.iter().any(|s| s.name == name).then(|| {
                        match name {
                            "heads" => "2",
                            "head_dim" => "64",
                            "collective_size" => "512",
                            _ => "128",
                        }
                        .to_string()
                    })
                };
                info.bench_instance(set, knob)
                    .unwrap_or_else(|e| panic!("{} bench: {e}", info.name));
            }
        }
    }

    #[test]
    fn errors_name_the_culprit() {
        let matmul = find("matmul").unwrap();
        let e = |given: &[(&str, &str)]| matmul.build(&owned(given)).unwrap_err().to_string();
        assert!(e(&[("BM", "48")]).contains("block sizes"));
        assert!(e(&[("dtype", "f64")]).contains("parameter dtype=f64: expected f32 or bf16"));
        assert!(e(&[("nope", "1")]).contains("has no parameter `nope`"));
        let e = find("conv").unwrap_err().to_string();
        assert!(
            e.starts_with("unknown kernel `conv`; built-in kernels: matmul"),
            "{e}"
        );
        let e = matmul
            .bench_instance(&[("M", "{size}")], |_| None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("bench parameter M={size}"), "{e}");
    }
}
