//! The built-in kernels by name, for the CLI and other tools: their parameters (with
//! defaults and help), and for given parameter values the kernel definition and its default
//! argument specs.
//!
//! Two kinds of parameter: compile-time ones (block sizes, dtype, mask, flags), which change
//! the kernel, and sizes, which only set the default arguments (`tessera ir` instantiates
//! with them; `tessera run` takes sizes from its inputs and checks any size given against
//! them, [`KernelInfo::check_sizes`]).
//!
//! The example kernels' block sizes are const generics, so a run-time choice dispatches over a
//! fixed set of sizes. The splash kernels are built as the splash plans build them: a
//! [`SplashAttention`] configured from the parameters, and the stage of its forward or
//! backward plan that runs the kernel (so the block-sparsity tables are the real ones).

use std::collections::BTreeMap;

use half::bf16;
use tessera_dsl::{ArgSpec, DType, KernelDef, TargetRules};
use tessera_splash::{
    stage_specs, BlockSizes, Dims, Features, Mask, SplashAttention, SplashOptions,
};

use crate::kernels::{flash_attention, matmul, row_softmax};

/// The block sizes the CLI can instantiate (each one a monomorphised kernel).
pub const BLOCK_SIZES: [usize; 6] = [8, 16, 32, 64, 128, 256];

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

/// A kernel definition with its default arguments, or why the parameters are invalid.
pub type Built = Result<(KernelDef, Vec<ArgSpec>), String>;

/// A built-in kernel.
#[derive(Debug, Clone, Copy)]
pub struct KernelInfo {
    pub name: &'static str,
    pub summary: &'static str,
    pub params: &'static [ParamInfo],
    /// Builds from the parameters; gets the kernel's name (one builder serves every splash
    /// kernel).
    build: fn(&Params, &str) -> Built,
}

/// Parameter values by name, as given on the command line (defaults filled in).
#[derive(Debug, Clone, Default)]
pub struct Params(BTreeMap<String, String>);

impl Params {
    fn usize(&self, name: &str) -> Result<usize, String> {
        let v = &self.0[name];
        match v.parse() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(format!("parameter {name}={v}: expected a positive integer")),
        }
    }

    /// A positive integer, or the value of parameter `other` when the value is its name
    /// (a default such as `BKVC = BKV`).
    fn usize_or_same_as(&self, name: &str, other: &str) -> Result<usize, String> {
        if self.0[name] == other {
            self.usize(other)
        } else {
            self.usize(name)
        }
    }

    fn block(&self, name: &str) -> Result<usize, String> {
        let b = self.usize(name)?;
        if BLOCK_SIZES.contains(&b) {
            Ok(b)
        } else {
            Err(format!(
                "parameter {name}={b}: the CLI instantiates block sizes {BLOCK_SIZES:?}; \
                 use the library API for other sizes"
            ))
        }
    }

    fn dtype(&self) -> Result<DType, String> {
        let v = &self.0["dtype"];
        match DType::from_name(v) {
            Some(d @ (DType::F32 | DType::BF16)) => Ok(d),
            _ => Err(format!("parameter dtype={v}: expected f32 or bf16")),
        }
    }

    fn bool(&self, name: &str) -> Result<bool, String> {
        let v = &self.0[name];
        v.parse()
            .map_err(|_| format!("parameter {name}={v}: expected true or false"))
    }
}

/// Calls `$f!(const_value)` with the const matching a run-time block size.
macro_rules! dispatch_block {
    ($value:expr, $m:ident ! ( $($args:tt)* )) => {
        match $value {
            8 => $m!($($args)* 8),
            16 => $m!($($args)* 16),
            32 => $m!($($args)* 32),
            64 => $m!($($args)* 64),
            128 => $m!($($args)* 128),
            256 => $m!($($args)* 256),
            other => unreachable!("block size {other} passed validation"),
        }
    };
}

fn build_matmul(p: &Params, _name: &str) -> Built {
    let (bm, bn, bk, dtype) = (p.block("BM")?, p.block("BN")?, p.block("BK")?, p.dtype()?);
    let (m, n, k) = (p.usize("M")?, p.usize("N")?, p.usize("K")?);
    macro_rules! with_t {
        ($t:ty; $a:literal $b:literal $c:literal) => {
            matmul::<$t, $a, $b, $c>()
        };
    }
    macro_rules! with_k {
        ($t:ty; $a:literal $b:literal $c:literal) => {
            with_t!($t; $a $b $c)
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
    let def = match dtype {
        DType::BF16 => dispatch_block!(bm, with_m!(bf16;)),
        _ => dispatch_block!(bm, with_m!(f32;)),
    };
    Ok((
        def,
        vec![ArgSpec::new(dtype, [m, k]), ArgSpec::new(dtype, [k, n])],
    ))
}

fn build_softmax(p: &Params, _name: &str) -> Built {
    let (br, dtype) = (p.block("BR")?, p.dtype()?);
    let (rows, cols) = (p.usize("R")?, p.usize("C")?);
    macro_rules! with_t {
        ($t:ty; $a:literal) => {
            row_softmax::<$t, $a>()
        };
    }
    let def = match dtype {
        DType::BF16 => dispatch_block!(br, with_t!(bf16;)),
        _ => dispatch_block!(br, with_t!(f32;)),
    };
    Ok((def, vec![ArgSpec::new(dtype, [rows, cols])]))
}

fn build_flash(p: &Params, _name: &str) -> Built {
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
    let def = match dtype {
        DType::BF16 => dispatch_block!(bq, with_q!(bf16;)),
        _ => dispatch_block!(bq, with_q!(f32;)),
    };
    Ok((def, vec![ArgSpec::new(dtype, [s, d]); 3]))
}

/// Builds a splash kernel: the stage named `kernel` of the plans of a [`SplashAttention`]
/// configured from the parameters (portable rules: `tessera ir --rules` checks the target's).
fn build_splash(p: &Params, kernel: &str) -> Built {
    let dtype = p.dtype()?;
    let (bq, bkv) = (p.usize("BQ")?, p.usize("BKV")?);
    let bkv_compute = p.usize_or_same_as("BKVC", "BKV")?;
    // The mask's own message names the mask and the forms it takes.
    let mask = Mask::parse(&p.0["mask"]).map_err(|e| e.to_string())?;
    let soft_cap = match p.0["soft_cap"].as_str() {
        "none" => None,
        v => match v.parse::<f32>() {
            Ok(c) if c.is_finite() && c > 0.0 => Some(c),
            _ => {
                return Err(format!(
                    "parameter soft_cap={v}: expected none or a positive number"
                ))
            }
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
    let options = SplashOptions {
        soft_cap,
        ..SplashOptions::default()
    };
    let attn = SplashAttention::new(mask, dims, dtype, blocks, options, TargetRules::portable())
        .map_err(|e| e.to_string())?;
    let features = Features {
        segmented: p.bool("segmented")?,
        sinks: p.bool("sinks")?,
    };
    let stage = attn
        .forward_plan(features)
        .into_iter()
        .chain(attn.backward_plan(features))
        .find(|s| s.def.name() == kernel)
        .ok_or_else(|| format!("no splash plan runs a kernel named `{kernel}`"))?;
    let specs = stage_specs(&stage, |t| attn.tensor_spec(t));
    Ok((stage.def, specs))
}

/// A splash kernel: every one takes [`SPLASH_PARAMS`] and is built by [`build_splash`].
const fn splash_kernel(name: &'static str, summary: &'static str) -> KernelInfo {
    KernelInfo {
        name,
        summary,
        params: SPLASH_PARAMS,
        build: build_splash,
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
pub fn find(name: &str) -> Result<&'static KernelInfo, String> {
    KERNELS.iter().find(|k| k.name == name).ok_or_else(|| {
        let names: Vec<&str> = KERNELS.iter().map(|k| k.name).collect();
        format!(
            "unknown kernel `{name}`; built-in kernels: {}",
            names.join(", ")
        )
    })
}

impl KernelInfo {
    /// Fills defaults, checks names, and builds the definition and its default arguments.
    pub fn build(&self, given: &[(String, String)]) -> Built {
        let mut params = Params::default();
        for p in self.params {
            params.0.insert(p.name.to_string(), p.default.to_string());
        }
        for (name, value) in given {
            if !params.0.contains_key(name) {
                let names: Vec<&str> = self.params.iter().map(|p| p.name).collect();
                return Err(format!(
                    "kernel `{}` has no parameter `{name}`; its parameters: {}",
                    self.name,
                    names.join(", ")
                ));
            }
            params.0.insert(name.clone(), value.clone());
        }
        (self.build)(&params, self.name)
    }

    /// Checks the size parameters in `given` against the arguments `args` of `def` (as run:
    /// sizes come from the inputs); a size given that disagrees with them is an error naming
    /// the parameter and the argument.
    pub fn check_sizes(
        &self,
        given: &[(String, String)],
        def: &KernelDef,
        args: &[ArgSpec],
    ) -> Result<(), String> {
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
                    return Err(format!(
                        "parameter {name}={value} disagrees with argument `{arg}` {spec}, whose \
                         dim {dim} is {}; sizes come from the arguments, so drop {name} or pass \
                         arguments of that size",
                        actual.as_deref().unwrap_or("missing")
                    ));
                }
            }
        }
        Ok(())
    }
}
