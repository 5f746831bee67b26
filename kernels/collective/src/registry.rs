//! The kernels that move their own data: `gather_tiles` (one device, copies from HBM) and
//! the kernels on a ring of devices with remote copies (`ring_shift`, `ring_all_gather`,
//! `all_gather`, `all_to_all`, `all_gather_matmul`, `ulysses_attention`): their builds (on the device mesh), every device's f64
//! reference, flop counts, XLA's own collectives for the same data, and entries
//! ([`KERNELS`], which the facade's registry lists).

use tessera_dsl::axes::Context;
use tessera_dsl::{with_float_type, ArgSpec, DType, DeviceAxis, HostArray, KernelDef};
use tessera_hlo::{
    ComparisonDirection, DotDims, FuncBuilder, Grouping, HloError, Module, Reducer, TensorType,
    Value,
};
use tessera_registry::xla::{group, spmd};
use tessera_registry::{
    expect_inputs, no_flops, Built, Case, KernelInfo, ParamInfo, Params, Reference, RegistryError,
    DTYPE,
};

use crate::collective::{
    all_gather_matmul, all_gather_matmul_reference, all_gather_of, all_gather_reference,
    all_to_all_of, all_to_all_reference,
};
use crate::memory::{
    gather_tiles_of, gather_tiles_reference, ring_all_gather_of, ring_all_gather_reference,
    ring_mesh, ring_shift_of, ring_shift_reference, tile_rows, RingMesh,
};
use crate::ulysses::{ulysses_attention_of, ulysses_attention_reference, Logits};

/// The element dtype of a kernel that only copies: any kernel element type (bool builds, and
/// the TPU rules refuse it with their sentence: Mosaic keeps no `i1` arrays in memory).
fn copy_dtype(p: &Params) -> Result<DType, RegistryError> {
    let name = p.get("dtype");
    DType::compute_from_name(name)
        .or_else(|| DType::from_name(name))
        .ok_or_else(|| p.bad("dtype", "f32, bf16, i32, i8 or bool"))
}

/// Evaluates `$body` with `$T` the Rust element type of `$dtype`.
macro_rules! with_copy_type {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            DType::F32 => {
                type $T = f32;
                $body
            }
            DType::BF16 => {
                type $T = tessera_dsl::prelude::bf16;
                $body
            }
            DType::I32 => {
                type $T = i32;
                $body
            }
            DType::I8 => {
                type $T = i8;
                $body
            }
            DType::Bool => {
                type $T = bool;
                $body
            }
        }
    };
}

/// `gather_tiles`' tile order: tile `g` is `(7 g + 3) mod (R / r)` with `r` rows per tile
/// (`tile_rows` of the dtype: out of order, repeating where `G` exceeds the tiles of `x`).
fn tile_order(p: &Params, dtype: DType) -> Result<HostArray, RegistryError> {
    let (g, r, rows) = (p.usize("G")?, p.usize("R")?, tile_rows(dtype));
    if r % rows != 0 {
        return Err(p.bad(
            "R",
            match rows {
                8 => "a multiple of 8 (x is gathered in tiles of 8 rows, 32-bit TPU tiles)",
                16 => "a multiple of 16 (x is gathered in tiles of 16 rows, bf16 TPU tiles)",
                _ => "a multiple of 32 (x is gathered in tiles of 32 rows, 8-bit TPU tiles)",
            },
        ));
    }
    let tiles = (0..g).map(|i| ((7 * i + 3) % (r / rows)) as i32).collect();
    Ok(HostArray::i32([g], tiles).expect("one entry per step"))
}

fn build_gather_tiles(p: &Params, _name: &str) -> Result<Built, RegistryError> {
    let dtype = copy_dtype(p)?;
    let tiles = tile_order(p, dtype)?;
    let x = ArgSpec::new(dtype, [p.usize("R")?, p.usize("C")?]);
    Ok(Built {
        def: with_copy_type!(dtype, T => gather_tiles_of::<T>()),
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

/// The ring of `devices` devices (the `context` axis) the collective kernels run on.
fn ring(p: &Params) -> Result<Vec<DeviceAxis>, RegistryError> {
    Ok(ring_mesh(p.usize("devices")?))
}

fn build_all_gather(p: &Params, _name: &str) -> Result<Built, RegistryError> {
    build_ring(
        p,
        "S",
        |d| with_copy_type!(d, T => all_gather_of::<T, RingMesh, Context>()),
    )
}

/// SplitMix64: the integer data of [`copy_inputs`].
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// One device's arguments of a kernel that only copies: the ones the parameters fix as
/// fixed, floats uniform in [-1, 1) as for every kernel (argument `i` from seed `seed + i`),
/// integers over their whole range (random data rounds to zeros there, which a copy to the
/// wrong place would not show).
fn copy_inputs(p: &Params, name: &str, seed: u64) -> Result<Vec<HostArray>, RegistryError> {
    let info = KERNELS
        .iter()
        .find(|k| k.name == name)
        .expect("a kernel of this family");
    let built = (info.build)(p, name)?;
    Ok(built
        .args
        .iter()
        .zip(built.fixed)
        .enumerate()
        .map(|(i, (spec, fixed))| {
            let seed = seed + i as u64;
            match (fixed, spec.dtype) {
                (Some(a), _) => a,
                (None, d) if d.is_float() => HostArray::random(d, spec.shape.clone(), seed),
                (None, d) => {
                    let mut state = seed;
                    let n: usize = spec.shape.iter().product();
                    let values: Vec<f64> = (0..n)
                        .map(|_| match d {
                            DType::I8 => splitmix(&mut state) as i8 as f64,
                            DType::Bool => (splitmix(&mut state) & 1) as f64,
                            _ => splitmix(&mut state) as i32 as f64,
                        })
                        .collect();
                    HostArray::from_f64(d, spec.shape.clone(), &values)
                        .expect("the shape matches the values")
                }
            }
        })
        .collect())
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

fn build_all_to_all(p: &Params, _name: &str) -> Result<Built, RegistryError> {
    if p.usize("R")? % p.usize("devices")? != 0 {
        return Err(p.bad(
            "R",
            "a multiple of `devices` (x is one chunk of R / devices rows per device)",
        ));
    }
    build_ring(
        p,
        "R",
        |d| with_copy_type!(d, T => all_to_all_of::<T, RingMesh, Context>()),
    )
}

fn all_to_all_mesh_reference(
    _: &Params,
    name: &str,
    x: &[Vec<HostArray>],
) -> Result<Vec<Vec<Vec<f64>>>, RegistryError> {
    let shards = device_shards(name, x, 1, 0)?;
    Ok(all_to_all_reference(&shards)
        .iter()
        .map(|a| vec![a.to_f64_vec()])
        .collect())
}

fn build_ulysses_attention(p: &Params, _name: &str) -> Result<Built, RegistryError> {
    let (dtype, n) = (p.dtype()?, p.usize("devices")?);
    let (h, sl, d, block) = (
        p.usize("H")?,
        p.usize("SL")?,
        p.usize("D")?,
        p.usize("block")?,
    );
    if h % n != 0 {
        return Err(p.bad(
            "H",
            "a multiple of `devices` (each device attends H / devices heads)",
        ));
    }
    let causal = p.bool("causal")?;
    // The output alone of unpacked sequences, as the XLA program it is measured against
    // computes it.
    let def =
        with_float_type!(dtype, T => ulysses_attention_of::<T, RingMesh, Context>(block, causal.into(), Logits::default()))
            .without("lse")?
            .without("segment_ids")?;
    let spec = ArgSpec::new(dtype, [h, sl, d]);
    Ok(Built::on_mesh(def, vec![spec; 3], ring(p)?))
}

fn ulysses_attention_mesh_reference(
    p: &Params,
    name: &str,
    x: &[Vec<HostArray>],
) -> Result<Vec<Vec<Vec<f64>>>, RegistryError> {
    let [q, k, v] = [0, 1, 2].map(|i| device_shards(name, x, 3, i));
    Ok(
        ulysses_attention_reference(&q?, &k?, &v?, p.bool("causal")?)
            .into_iter()
            .map(|[out, _lse]| vec![out])
            .collect(),
    )
}

/// Every device's share of the products: `q k^T` and `p v` over its `H / devices` heads of
/// the whole sequence (half of the score matrix when causal).
fn ulysses_attention_flops(p: &Params, _: &str) -> Result<f64, RegistryError> {
    let n = p.usize("devices")? as f64;
    let (h, s, d) = (
        p.usize("H")? as f64,
        p.usize("SL")? as f64 * n,
        p.usize("D")? as f64,
    );
    let pairs = if p.bool("causal")? {
        s * (s + 1.0) / 2.0
    } else {
        s * s
    };
    Ok(4.0 * d * pairs * h / n)
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
    let def = with_float_type!(dtype, T => all_gather_matmul::<T, RingMesh, Context>(bt, bf));
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

/// The `[rows, C]` argument of the ring kernels, in the dtype parameter, on a ring of
/// `devices`; `def` gives the kernel for that dtype.
fn build_ring(
    p: &Params,
    rows: &str,
    def: impl FnOnce(DType) -> KernelDef,
) -> Result<Built, RegistryError> {
    let dtype = copy_dtype(p)?;
    let spec = ArgSpec::new(dtype, [p.usize(rows)?, p.usize("C")?]);
    Ok(Built::on_mesh(def(dtype), vec![spec], ring(p)?))
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

/// The dtype of the kernels that only copy.
const COPY_DTYPE: ParamInfo = ParamInfo::compile_time(
    "dtype",
    "f32",
    "element dtype: f32, bf16, i32 or i8 (bool: the TPU rules refuse it)",
);

const DEVICES: ParamInfo = ParamInfo::compile_time(
    "devices",
    "4",
    "devices of the ring (the mesh's `context` axis) the kernel runs on",
);

/// The kernels that move their own data: `gather_tiles`, then the ring kernels.
pub const KERNELS: &[KernelInfo] = &[
    KernelInfo {
        name: "gather_tiles",
        summary: "tiles of 8 rows of x[R,C] (left in HBM) in the order of a scalar-prefetched \
                  table, each step's copy double-buffered behind the one before",
        params: &[
            COPY_DTYPE,
            ParamInfo::size("G", "6", "tiles gathered (grid steps)", &[("tiles", 0)]),
            ParamInfo::size("R", "32", "rows of x (a multiple of 8)", &[("x", 0)]),
            ParamInfo::size("C", "128", "columns", &[("x", 1)]),
        ],
        build: build_gather_tiles,
        reference: Reference::Local(gather_tiles_ref),
        flops: no_flops,
        inputs: Some(copy_inputs),
        xla: None,
        check_inputs: None,
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
            // Tiles of 16 rows in bf16.
            Case {
                params: &[("dtype", "bf16"), ("R", "64")],
                tol: 1e-30,
            },
            Case {
                params: &[("dtype", "i32")],
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
            COPY_DTYPE,
            ParamInfo::size("R", "8", "rows", &[("x", 0)]),
            ParamInfo::size("C", "128", "columns", &[("x", 1)]),
        ],
        build: |p, _| build_ring(p, "R", |d| with_copy_type!(d, T => ring_shift_of::<T>())),
        reference: Reference::Mesh(ring_shift_mesh_reference),
        flops: no_flops,
        inputs: Some(copy_inputs),
        xla: Some(xla_ring_shift),
        check_inputs: None,
        cases: &[
            Case {
                params: &[],
                tol: 1e-30,
            },
            Case {
                params: &[("devices", "2"), ("R", "16")],
                tol: 1e-30,
            },
            Case {
                params: &[("dtype", "bf16")],
                tol: 1e-30,
            },
            Case {
                params: &[("dtype", "i32")],
                tol: 1e-30,
            },
            Case {
                params: &[("dtype", "i8"), ("devices", "2"), ("R", "32")],
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
            COPY_DTYPE,
            ParamInfo::size("S", "8", "rows per device", &[("x", 0)]),
            ParamInfo::size("C", "128", "columns", &[("x", 1)]),
        ],
        build: |p, _| {
            build_ring(
                p,
                "S",
                |d| with_copy_type!(d, T => ring_all_gather_of::<T>()),
            )
        },
        reference: Reference::Mesh(ring_all_gather_mesh_reference),
        flops: no_flops,
        inputs: Some(copy_inputs),
        xla: Some(xla_all_gather),
        check_inputs: None,
        cases: &[
            Case {
                params: &[],
                tol: 1e-30,
            },
            Case {
                params: &[("devices", "2"), ("S", "16"), ("C", "256")],
                tol: 1e-30,
            },
            // Slots of 8 rows, half a bf16 tile: libtpu copies them.
            Case {
                params: &[("dtype", "bf16")],
                tol: 1e-30,
            },
            Case {
                params: &[("dtype", "i32"), ("devices", "2"), ("S", "16")],
                tol: 1e-30,
            },
            Case {
                params: &[("dtype", "i8"), ("S", "32"), ("C", "256")],
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
            COPY_DTYPE,
            ParamInfo::size("S", "16", "rows per device (even)", &[("x", 0)]),
            ParamInfo::size("C", "128", "columns", &[("x", 1)]),
        ],
        build: build_all_gather,
        reference: Reference::Mesh(all_gather_mesh_reference),
        flops: no_flops,
        inputs: Some(copy_inputs),
        xla: Some(xla_all_gather),
        check_inputs: None,
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
            // Halves of 8 rows, half a bf16 tile: libtpu copies them.
            Case {
                params: &[("dtype", "bf16")],
                tol: 1e-30,
            },
            Case {
                params: &[
                    ("dtype", "bf16"),
                    ("devices", "2"),
                    ("S", "32"),
                    ("C", "256"),
                ],
                tol: 1e-30,
            },
            Case {
                params: &[("dtype", "i32")],
                tol: 1e-30,
            },
            Case {
                params: &[("dtype", "i8"), ("S", "64")],
                tol: 1e-30,
            },
        ],
        bench: &[&[("S", "{collective_size}"), ("C", "{collective_size}")]],
    },
    KernelInfo {
        name: "all_to_all",
        summary: "all-to-all of x[R,C] over a ring of devices with remote copies (chunk p of \
                  R/devices rows to device p; JAX's all_to_all on dim 0), every copy in \
                  flight at once; runs on `devices` devices",
        params: &[
            DEVICES,
            COPY_DTYPE,
            ParamInfo::size(
                "R",
                "64",
                "rows per device (a multiple of devices)",
                &[("x", 0)],
            ),
            ParamInfo::size("C", "128", "columns", &[("x", 1)]),
        ],
        build: build_all_to_all,
        reference: Reference::Mesh(all_to_all_mesh_reference),
        flops: no_flops,
        inputs: Some(copy_inputs),
        xla: Some(xla_all_to_all),
        check_inputs: None,
        // A copy: exact.
        cases: &[
            Case {
                params: &[],
                tol: 1e-30,
            },
            Case {
                params: &[("devices", "2"), ("R", "32"), ("C", "256")],
                tol: 1e-30,
            },
            // Chunks of 16 rows, one bf16 tile.
            Case {
                params: &[("dtype", "bf16")],
                tol: 1e-30,
            },
            Case {
                params: &[("dtype", "i32")],
                tol: 1e-30,
            },
            Case {
                params: &[("dtype", "i8"), ("R", "128")],
                tol: 1e-30,
            },
        ],
        bench: &[&[("R", "{collective_size}"), ("C", "{collective_size}")]],
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
        xla: Some(xla_all_gather_matmul),
        check_inputs: None,
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
    KernelInfo {
        name: "ulysses_attention",
        summary: "Ulysses attention forward in one kernel: q, k, v [H, SL, D] sequence shards \
                  exchanged for heads by remote copies overlapping the attention, the output \
                  sent back chunk by chunk; runs on `devices` devices",
        params: &[
            ParamInfo::compile_time("block", "8", "query rows and keys per block (divides SL)"),
            ParamInfo::compile_time("causal", "true", "causal over the whole sequence, or full"),
            DTYPE,
            DEVICES,
            ParamInfo::size(
                "H",
                "8",
                "heads (a multiple of devices)",
                &[("q", 0), ("k", 0), ("v", 0)],
            ),
            ParamInfo::size(
                "SL",
                "32",
                "rows of the sequence per device",
                &[("q", 1), ("k", 1), ("v", 1)],
            ),
            ParamInfo::size("D", "128", "head dim", &[("q", 2), ("k", 2), ("v", 2)]),
        ],
        build: build_ulysses_attention,
        reference: Reference::Mesh(ulysses_attention_mesh_reference),
        flops: ulysses_attention_flops,
        inputs: None,
        xla: Some(xla_ulysses_attention),
        check_inputs: None,
        cases: &[
            // f32 softmax and accumulation over at most 128 keys of |logit| < 12.
            Case {
                params: &[],
                tol: 1e-5,
            },
            Case {
                params: &[("causal", "false"), ("devices", "2"), ("H", "4")],
                tol: 1e-5,
            },
            // Outputs (|out| < 1) rounded to bf16.
            Case {
                params: &[("dtype", "bf16"), ("block", "16")],
                tol: 2e-2,
            },
        ],
        bench: &[&[
            ("block", "128"),
            ("H", "8"),
            ("SL", "{collective_size}"),
            ("D", "128"),
        ]],
    },
];

/// XLA's Ulysses attention as MaxText writes it, one partition per device: `all_to_all`
/// (heads for sequence), dense attention over the whole sequence (the `[H / devices, S, S]`
/// scores materialised, softmax in f32), `all_to_all` back.
fn xla_ulysses_attention(p: &Params, args: &[ArgSpec], devices: usize) -> Result<Module, HloError> {
    // `true` or `false`: the instance's build parsed it.
    let causal = p.get("causal") == "true";
    let dtype = args[0].dtype;
    let [h, sl, d] = [0, 1, 2].map(|i| args[0].shape[i] as i64);
    let (n, s) = (devices as i64, devices as i64 * sl);
    let groups = [group(devices)];
    let mut module = Module::new("xla_ulysses_attention");
    module.set_num_partitions(devices as u32)?;
    let mut f = module.func("main");
    let x: Vec<Value> = args
        .iter()
        .map(|a| f.arg(TensorType::new(vec![h, sl, d], a.dtype)))
        .collect::<Result<_, _>>()?;
    let gathered: Vec<Value> = x
        .iter()
        .map(|&t| f.all_to_all(t, 0, 1, &groups, Grouping::FlattenedIds))
        .collect::<Result<_, _>>()?;
    let out = dense_causal_attention(&mut f, &gathered, [h / n, s, d], causal)?;
    let out = f.convert(out, dtype)?;
    let out = f.all_to_all(out, 1, 0, &groups, Grouping::FlattenedIds)?;
    f.finish(&[out])?;
    Ok(module)
}

/// `softmax(q k^T / sqrt(D)) v` per head of `[heads, s, d]` q, k, v, causal where `causal`
/// (an iota comparison), in f32.
fn dense_causal_attention(
    f: &mut FuncBuilder<'_>,
    qkv: &[Value],
    [heads, s, d]: [i64; 3],
    causal: bool,
) -> Result<Value, HloError> {
    let batch = |lc: i64, rc: i64| DotDims::new([0], [0], [lc], [rc]);
    let scores_ty = TensorType::new(vec![heads, s, s], DType::F32);
    let raw = f.dot_general(qkv[0], qkv[1], &batch(2, 2), DType::F32, None)?;
    let scale = f.splat(1.0 / (d as f64).sqrt(), scores_ty.clone())?;
    let mut scores = f.mul(raw, scale)?;
    if causal {
        let pos = TensorType::new(vec![heads, s, s], DType::I32);
        let (qi, kj) = (f.iota(pos.clone(), 1)?, f.iota(pos, 2)?);
        let visible = f.compare(ComparisonDirection::Le, kj, qi)?;
        let hidden = f.splat(f64::NEG_INFINITY, scores_ty.clone())?;
        scores = f.select(visible, scores, hidden)?;
    }
    let rows = |f: &mut FuncBuilder<'_>, x: Value| f.broadcast_in_dim(x, &[heads, s, s], &[0, 1]);
    let top = f.reduce(scores, &[2], Reducer::Max)?;
    let top = rows(f, top)?;
    let e = f.sub(scores, top)?;
    let e = f.exp(e)?;
    let total = f.reduce(e, &[2], Reducer::Sum)?;
    let total = rows(f, total)?;
    let p = f.div(e, total)?;
    let v = f.convert(qkv[2], DType::F32)?;
    f.dot_general(p, v, &batch(2, 1), DType::F32, None)
}

/// XLA's `all_gather` over every device: one partition per device (`devices`), each with
/// its own `x`, every one getting the concatenation in device order.
fn xla_all_gather(_: &Params, args: &[ArgSpec], devices: usize) -> Result<Module, HloError> {
    spmd(args, devices, "xla_all_gather", |f, x| {
        f.all_gather(x[0], 0, &[group(devices)], Grouping::FlattenedIds)
    })
}

/// XLA's `all_to_all` over every device (`devices` partitions) on dim 0: device `d` gets
/// chunk `d` of every device's `x`, in device order.
fn xla_all_to_all(_: &Params, args: &[ArgSpec], devices: usize) -> Result<Module, HloError> {
    spmd(args, devices, "xla_all_to_all", |f, x| {
        f.all_to_all(x[0], 0, 0, &[group(devices)], Grouping::FlattenedIds)
    })
}

/// XLA's `all_gather` of the weight's row shards, then its dot: `x @ all_gather(w)` on every
/// device (`devices` partitions), f32 accumulation, output in the input dtype.
fn xla_all_gather_matmul(_: &Params, args: &[ArgSpec], devices: usize) -> Result<Module, HloError> {
    let dtype = args[0].dtype;
    spmd(args, devices, "xla_all_gather_matmul", |f, x| {
        let w = f.all_gather(x[1], 0, &[group(devices)], Grouping::FlattenedIds)?;
        let out = f.dot_general(x[0], w, &DotDims::contracting([1], [0]), DType::F32, None)?;
        f.convert(out, dtype)
    })
}

/// XLA's `collective_permute` around the ring: device `d` gets device `d - 1`'s `x`.
fn xla_ring_shift(_: &Params, args: &[ArgSpec], devices: usize) -> Result<Module, HloError> {
    let n = devices as i64;
    let pairs: Vec<(i64, i64)> = (0..n).map(|d| (d, (d + 1) % n)).collect();
    spmd(args, devices, "xla_ring_shift", |f, x| {
        f.collective_permute(x[0], &pairs, Grouping::FlattenedIds)
    })
}

#[cfg(test)]
mod tests {
    use tessera_dsl::KernelRules;
    use tessera_registry::{owned, KernelInfo};

    #[test]
    fn entries_are_complete() {
        tessera_registry::check_family(super::KERNELS);
    }

    fn entry(name: &str) -> &'static KernelInfo {
        super::KERNELS.iter().find(|k| k.name == name).unwrap()
    }

    /// The TPU rules' refusal of `name` at `params`, under which it builds.
    fn refusal(name: &str, params: &[(&str, &str)]) -> String {
        let inst = entry(name).instance(&owned(params)).unwrap();
        inst.instantiate(&KernelRules::tpu())
            .unwrap_err()
            .to_string()
    }

    /// A dtype the data path refuses is refused by the TPU rules with their sentence: bool
    /// by every copy kernel (libtpu: "Only arguments with ... bfloat16 or 32-bit element
    /// types are supported"), i8 by gather_tiles, whose tile goes through a vector reshape.
    #[test]
    fn the_tpu_rules_refuse_bool_and_an_i8_gather_of_tiles() {
        for name in [
            "gather_tiles",
            "ring_shift",
            "ring_all_gather",
            "all_gather",
            "all_to_all",
        ] {
            let e = refusal(name, &[("dtype", "bool")]);
            assert!(
                e.contains("holds bool, which Mosaic cannot keep in memory"),
                "{e}"
            );
        }
        let e = refusal("gather_tiles", &[("dtype", "i8"), ("R", "64")]);
        assert!(
            e.contains("Mosaic computes on 32-bit (and 16-bit) vectors, not i8"),
            "{e}"
        );
        // Every other dtype instantiates under the rules.
        for name in ["ring_shift", "ring_all_gather", "all_gather", "all_to_all"] {
            for dtype in ["f32", "bf16", "bfloat16", "i32", "i8"] {
                let inst = entry(name).instance(&owned(&[("dtype", dtype)])).unwrap();
                inst.instantiate(&KernelRules::tpu())
                    .unwrap_or_else(|e| panic!("{name} {dtype}: {e}"));
            }
        }
    }

    /// gather_tiles' tiles are the dtype's TPU tile of rows; R must hold whole ones.
    #[test]
    fn gather_tiles_take_whole_tiles_of_the_dtype() {
        let e = entry("gather_tiles")
            .instance(&owned(&[("dtype", "bf16"), ("R", "24")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("a multiple of 16"), "{e}");
        let e = entry("all_gather")
            .instance(&owned(&[("dtype", "f64")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("f32, bf16, i32, i8 or bool"), "{e}");
    }
}
