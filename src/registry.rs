//! The built-in kernels by name, for the CLI: their compile-time parameters (with defaults)
//! and default argument shapes.
//!
//! Block sizes are const generics, so a run-time choice dispatches over a fixed set of sizes.

use std::collections::BTreeMap;

use half::bf16;
use tessera_dsl::{ArgSpec, DType, KernelDef};

use crate::kernels::{flash_attention, matmul, row_softmax};

/// The block sizes the CLI can instantiate (each one a monomorphised kernel).
pub const BLOCK_SIZES: [usize; 6] = [8, 16, 32, 64, 128, 256];

/// A compile-time parameter of a built-in kernel.
#[derive(Debug, Clone, Copy)]
pub struct ParamInfo {
    pub name: &'static str,
    pub default: &'static str,
    pub help: &'static str,
}

/// A kernel definition with its default arguments, or why the parameters are invalid.
pub type Built = Result<(KernelDef, Vec<ArgSpec>), String>;

/// A built-in kernel.
#[derive(Debug, Clone, Copy)]
pub struct KernelInfo {
    pub name: &'static str,
    pub summary: &'static str,
    pub params: &'static [ParamInfo],
    build: fn(&Params) -> Built,
}

/// Parameter values by name, as given on the command line (defaults filled in).
#[derive(Debug, Clone, Default)]
pub struct Params(BTreeMap<String, String>);

impl Params {
    fn usize(&self, name: &str) -> Result<usize, String> {
        let v = &self.0[name];
        v.parse()
            .map_err(|_| format!("parameter {name}={v}: expected a positive integer"))
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

fn build_matmul(p: &Params) -> Built {
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

fn build_softmax(p: &Params) -> Built {
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

fn build_flash(p: &Params) -> Built {
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

const DTYPE: ParamInfo = ParamInfo {
    name: "dtype",
    default: "f32",
    help: "input dtype: f32 or bf16",
};

/// Every built-in kernel.
pub const KERNELS: &[KernelInfo] = &[
    KernelInfo {
        name: "matmul",
        summary: "tiled matmul x[M,K] @ y[K,N] with an f32 scratch accumulator",
        params: &[
            ParamInfo {
                name: "BM",
                default: "128",
                help: "rows of x per block",
            },
            ParamInfo {
                name: "BN",
                default: "128",
                help: "columns of y per block",
            },
            ParamInfo {
                name: "BK",
                default: "128",
                help: "contraction per block",
            },
            DTYPE,
            ParamInfo {
                name: "M",
                default: "256",
                help: "rows of x",
            },
            ParamInfo {
                name: "N",
                default: "256",
                help: "columns of y",
            },
            ParamInfo {
                name: "K",
                default: "512",
                help: "columns of x, rows of y",
            },
        ],
        build: build_matmul,
    },
    KernelInfo {
        name: "row_softmax",
        summary: "softmax of each row of x[R,C], BR rows per step",
        params: &[
            ParamInfo {
                name: "BR",
                default: "8",
                help: "rows per block",
            },
            DTYPE,
            ParamInfo {
                name: "R",
                default: "64",
                help: "rows",
            },
            ParamInfo {
                name: "C",
                default: "128",
                help: "columns",
            },
        ],
        build: build_softmax,
    },
    KernelInfo {
        name: "flash_attention",
        summary: "single-head flash attention forward with online softmax",
        params: &[
            ParamInfo {
                name: "BQ",
                default: "128",
                help: "query rows per block",
            },
            ParamInfo {
                name: "BKV",
                default: "128",
                help: "keys per block",
            },
            DTYPE,
            ParamInfo {
                name: "causal",
                default: "false",
                help: "causal mask (j <= i), skipping masked blocks",
            },
            ParamInfo {
                name: "S",
                default: "512",
                help: "sequence length",
            },
            ParamInfo {
                name: "D",
                default: "64",
                help: "head dim",
            },
        ],
        build: build_flash,
    },
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
        (self.build)(&params)
    }
}
