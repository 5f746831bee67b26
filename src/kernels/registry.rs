//! The example kernels' registration: the tiled matmul and its `Pipeline` form, the row
//! softmax and the single-head flash attention; their builds from the parameters, f64
//! references and flop counts, and their entries ([`KERNELS`], which [`crate::registry`]
//! lists first).

use tessera_dsl::{with_float_type, ArgSpec, HostArray};
use tessera_registry::{
    dispatch_block, expect_inputs, Built, Case, KernelInfo, ParamInfo, Params, Reference,
    RegistryError, BKV, BQ, DTYPE,
};

use crate::kernels::{flash_attention, matmul, pipelined_matmul, row_softmax};
use crate::reference::{attention_ref, matmul_ref, softmax_ref};

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

/// The example kernels.
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
        check_inputs: None,
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
        check_inputs: None,
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
        check_inputs: None,
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
        check_inputs: None,
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
];
