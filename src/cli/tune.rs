//! `tessera tune --target tpu:TOPOLOGY attention ...` and `... kernel NAME ...`: block sizes
//! chosen without hardware. Every candidate the TPU rules allow within the VMEM limit (the
//! kernels are built under [`Lowering::tpu`]'s rules, which check the tiling and the VMEM
//! each kernel needs) is compiled by libtpu, and ranked by the cycles per TensorCore read
//! from libtpu's own bundles ([`tessera::tpu::cost`], `tessera compile`'s measure: DMA waits
//! and MXU stalls left out). Each candidate's figures are cached on disk under tessera's cache
//! dir (`tune/`), one file per kernel, shape, dtype, chip and libtpu version, so a second run
//! compiles nothing.
//!
//! Splash attention is tuned as the step runs it: each candidate `(bq, bkv)` is compiled as
//! the forward blocks and as the backward (dq/dkv or fused) blocks of one forward + backward
//! program, and the forward and the backward are ranked separately (splash takes separate
//! blocks for each).

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tessera::dsl::{DType, Lowering};
use tessera::registry;
use tessera::splash::{splash_program, BlockSizes, Dims, Mask, Pass, SplashAttention};
use tessera::tpu::cost::KernelCost;
use tessera::tpu::TpuTopology;

use super::{compute_dtype, parse_param, positive};

/// Arguments of `tessera tune`.
#[derive(Args, Debug)]
pub struct TuneArgs {
    /// The TPU topology to compile for, `tpu:TOPOLOGY` (e.g. `tpu:v5p:2x2x1`).
    #[arg(long)]
    pub target: String,
    /// The scoped VMEM budget the kernels are checked against and compiled with, in KiB
    /// (default: the TPU rules' 16 MiB).
    #[arg(long, value_name = "KIB", value_parser = positive)]
    pub vmem_limit_kib: Option<usize>,
    /// The largest block tried (a power of two).
    #[arg(long, default_value_t = 2048, value_parser = positive)]
    pub max_block: usize,
    /// The smallest block tried (a power of two).
    #[arg(long, default_value_t = 128, value_parser = positive)]
    pub min_block: usize,
    /// Compile every candidate again, ignoring (and then replacing) the cached figures.
    #[arg(long)]
    pub no_cache: bool,
    #[command(subcommand)]
    pub what: TuneWhat,
}

/// What `tessera tune` tunes.
#[derive(Subcommand, Debug)]
pub enum TuneWhat {
    /// Splash attention (causal): its forward blocks and its backward blocks.
    Attention(AttentionShape),
    /// A registered kernel (see `tessera kernels`): its compile-time block parameters.
    Kernel {
        /// Kernel name.
        name: String,
        /// A parameter held fixed, NAME=VALUE (repeatable): sizes, dtype, ...
        #[arg(long = "param", short = 'p', value_parser = parse_param)]
        params: Vec<(String, String)>,
        /// The compile-time parameters to tune (repeatable; default: every compile-time
        /// parameter whose default is a number and that is not given with -p).
        #[arg(long = "tune")]
        tune: Vec<String>,
    },
}

/// The attention a tune compiles: `batch x heads x q_len` queries against `kv_len` keys.
#[derive(Args, Debug, Clone)]
pub struct AttentionShape {
    #[arg(long, default_value_t = 1, value_parser = positive)]
    pub batch: usize,
    #[arg(long, default_value_t = 8, value_parser = positive)]
    pub heads: usize,
    /// Key/value heads (default: the query heads).
    #[arg(long, value_parser = positive)]
    pub kv_heads: Option<usize>,
    #[arg(long, default_value_t = 4096, value_parser = positive)]
    pub seq_len: usize,
    /// Keys (default: --seq-len).
    #[arg(long, value_parser = positive)]
    pub kv_len: Option<usize>,
    #[arg(long, default_value_t = 128, value_parser = positive)]
    pub head_dim: usize,
    #[arg(long, default_value = "bf16", value_parser = compute_dtype)]
    pub dtype: DType,
    /// Tune the fused backward kernel (dq, dk, dv in one) instead of the dq and dkv kernels.
    #[arg(long)]
    pub fused_bwd: bool,
    /// The causal mask's offset: queries see this many keys ahead (a call whose queries sit
    /// after its keys, e.g. an all-gather shard's: its key length minus its query length).
    #[arg(long, default_value_t = 0)]
    pub causal_offset: i64,
}

/// The block sizes a search tries on one axis: the powers of two from `min` to `max` that
/// divide `len`.
pub fn block_ladder(len: usize, min: usize, max: usize) -> Vec<usize> {
    let mut out = Vec::new();
    let mut b = min.next_power_of_two();
    while b <= max {
        if len % b == 0 {
            out.push(b);
        }
        b *= 2;
    }
    out
}

/// What a tune compiles: splash's causal attention of `dims` (`offset`: the queries see
/// `offset` keys ahead, JAX's `CausalMask(offset)`: a call whose queries sit after its keys),
/// its dtype and its backward kernels.
#[derive(Debug, Clone, Copy)]
pub struct AttentionCase {
    pub dims: Dims,
    pub offset: i64,
    pub dtype: DType,
    pub fused: bool,
}

/// `causal`, or `causal(offset=N)`.
pub fn causal_name(offset: i64) -> String {
    match offset {
        0 => "causal".into(),
        n => format!("causal(offset={n})"),
    }
}

/// Splash's attention of `case` at forward and backward blocks `(bq, bkv)`, or why the TPU
/// rules refuse it (tiling, or the VMEM one of its kernels needs over `kernels`' limit).
fn splash_candidate(
    case: AttentionCase,
    kernels: &Lowering,
    (bq, bkv): (usize, usize),
) -> Result<tessera::hlo::Module> {
    let AttentionCase {
        dims,
        offset,
        dtype,
        fused,
    } = case;
    let attn = SplashAttention::new(
        Mask::Causal { offset },
        dims,
        dtype,
        BlockSizes::uniform(bq, bkv).with_fused_bwd(fused),
        Default::default(),
        kernels.clone(),
    )?;
    Ok(splash_program(
        &attn,
        Pass::ForwardBackward,
        Default::default(),
    )?)
}

/// Every `(bq, bkv)` the TPU rules of `kernels` allow for `case` (tiling and VMEM), among the
/// powers of two from `min` to `max` that divide the lengths, and the programs to compile.
pub fn attention_candidates(
    case: AttentionCase,
    kernels: &Lowering,
    (min, max): (usize, usize),
) -> Vec<((usize, usize), tessera::hlo::Module)> {
    let mut out = Vec::new();
    for bq in block_ladder(case.dims.q_len, min, max) {
        for bkv in block_ladder(case.dims.kv_len, min, max) {
            if let Ok(program) = splash_candidate(case, kernels, (bq, bkv)) {
                out.push(((bq, bkv), program));
            }
        }
    }
    out
}

/// One compiled candidate: its kernels' cycles per core, split by what a block choice
/// governs (`fwd`: the forward's kernels; `bwd`: the others), and their scoped VMEM; or why
/// libtpu refused it.
#[derive(Debug, Clone, PartialEq)]
pub struct Measured {
    /// The candidate's parameters, e.g. `bq=512 bkv=1024` or `BM=128 BN=256 BK=512`.
    pub label: String,
    pub result: std::result::Result<[u64; 4], String>,
}

impl Measured {
    fn to_json(&self) -> Value {
        match &self.result {
            Ok([fwd, bwd, fwd_vmem, bwd_vmem]) => json!({
                "fwd_cycles": fwd, "bwd_cycles": bwd,
                "fwd_vmem_bytes": fwd_vmem, "bwd_vmem_bytes": bwd_vmem,
            }),
            Err(why) => json!({ "refused": why }),
        }
    }

    /// The figures as cached: measured on the program whose text hashes to `program`.
    fn cache_entry(&self, program: &str) -> Value {
        let mut v = self.to_json();
        v["program_sha256"] = json!(program);
        v
    }

    /// The figures cached for `label`, if they were measured on the program whose text hashes
    /// to `program` (a kernel that changed since is measured again).
    fn from_json(label: &str, program: &str, v: &Value) -> Option<Self> {
        if v.get("program_sha256")?.as_str()? != program {
            return None;
        }
        let result = match v.get("refused") {
            Some(why) => Err(why.as_str()?.to_string()),
            None => {
                let n = |k: &str| v.get(k)?.as_u64();
                Ok([
                    n("fwd_cycles")?,
                    n("bwd_cycles")?,
                    n("fwd_vmem_bytes")?,
                    n("bwd_vmem_bytes")?,
                ])
            }
        };
        Some(Measured {
            label: label.to_string(),
            result,
        })
    }
}

/// The figures of every candidate of one kernel, shape, dtype, chip and libtpu, on disk.
struct TuneCache {
    path: Option<PathBuf>,
    entries: BTreeMap<String, Value>,
}

/// The libtpu a compile uses, as a cache key: the wheel's requirement, or the library the
/// user named (`TESSERA_LIBTPU`) with its size and modification time.
fn libtpu_identity() -> Result<String> {
    use tessera::runtime::provision;
    if let Some(path) = std::env::var_os(provision::LIBTPU_ENV).filter(|p| !p.is_empty()) {
        let meta = std::fs::metadata(&path)
            .with_context(|| format!("reading {}", PathBuf::from(&path).display()))?;
        let modified = meta
            .modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_secs());
        return Ok(format!(
            "{}-{}-{modified}",
            PathBuf::from(&path).display(),
            meta.len()
        ));
    }
    Ok(provision::libtpu_wheel()?.requirement())
}

impl TuneCache {
    /// The cache of `key` (kernel, shape, dtype, chip; libtpu's identity is added), empty
    /// when `fresh`.
    fn open(key: &str, fresh: bool) -> Result<Self> {
        let key = format!("{key}_{}", libtpu_identity()?);
        let file: String = key
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || "-_.=".contains(c) {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let dir = tessera::runtime::provision::default_cache_dir()?.join("tune");
        let path = dir.join(format!("{file}.json"));
        let entries = match std::fs::read_to_string(&path) {
            Ok(text) if !fresh => match serde_json::from_str(&text) {
                Ok(Value::Object(o)) => o.into_iter().collect(),
                _ => BTreeMap::new(),
            },
            _ => BTreeMap::new(),
        };
        Ok(TuneCache {
            path: Some(path),
            entries,
        })
    }

    fn get(&self, label: &str, program: &str) -> Option<Measured> {
        Measured::from_json(label, program, self.entries.get(label)?)
    }

    /// Records `m`, measured on the program whose text hashes to `program`, and writes the
    /// file (each candidate kept as soon as it is measured).
    fn put(&mut self, m: &Measured, program: &str) -> Result<()> {
        self.entries.insert(m.label.clone(), m.cache_entry(program));
        if let Some(path) = &self.path {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("creating {}", dir.display()))?;
            }
            let text = serde_json::to_string_pretty(&Value::Object(
                self.entries.clone().into_iter().collect(),
            ))?;
            std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
        }
        Ok(())
    }
}

/// Cycles per core and scoped VMEM of the kernels of one compile: `[fwd cycles, bwd cycles,
/// fwd VMEM, bwd VMEM]`, the forward being the kernels `is_fwd` names.
fn split_costs(costs: &[KernelCost], is_fwd: impl Fn(&str) -> bool) -> [u64; 4] {
    let mut out = [0u64; 4];
    for c in costs {
        let (cycles, vmem) = if is_fwd(&c.kernel) { (0, 2) } else { (1, 3) };
        out[cycles] += c.cycles_per_core;
        out[vmem] = out[vmem].max(c.scoped_vmem_bytes.unwrap_or(0).max(0) as u64);
    }
    out
}

/// Compiles (or reads from the cache) each candidate program.
fn measure(
    tpu: &TpuTopology,
    cache: &mut TuneCache,
    candidates: Vec<(String, tessera::hlo::Module)>,
    is_fwd: &dyn Fn(&str) -> bool,
) -> Result<(Vec<Measured>, usize)> {
    let mut rows = Vec::new();
    let mut compiled = 0;
    for (label, program) in candidates {
        // The kernels' Mosaic modules are in the program's text: figures measured before a
        // kernel changed do not match it.
        let digest: String = Sha256::digest(program.to_string().as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        if let Some(m) = cache.get(&label, &digest) {
            rows.push(m);
            continue;
        }
        compiled += 1;
        let result = match tpu.compile(&program) {
            Ok(report) => match report.kernel_costs {
                Some(costs) => Ok(split_costs(&costs, is_fwd)),
                None => bail!(
                    "libtpu was loaded without its dumps, so the candidates' cycles cannot be \
                     read; `tessera tune` asks for them at start (is LIBTPU_INIT_ARGS naming an \
                     unwritable --xla_jf_dump_to?)"
                ),
            },
            Err(e) => Err(e.to_string().lines().next().unwrap_or_default().to_string()),
        };
        let m = Measured { label, result };
        cache.put(&m, &digest)?;
        rows.push(m);
    }
    Ok((rows, compiled))
}

/// A tune's outcome: every candidate, and the best for the forward and the backward.
#[derive(Debug, Clone)]
pub struct Tuned {
    pub rows: Vec<Measured>,
    /// Index into `rows` of the fewest forward cycles, and of the fewest backward cycles.
    pub best_fwd: usize,
    pub best_bwd: usize,
    /// Candidates compiled now (the others came from the cache).
    pub compiled: usize,
}

fn rank(rows: Vec<Measured>, compiled: usize, what: &str) -> Result<Tuned> {
    let best = |i: usize| {
        rows.iter()
            .enumerate()
            .filter_map(|(n, r)| Some((n, r.result.as_ref().ok()?[i])))
            .min_by_key(|&(n, c)| (c, n))
            .map(|(n, _)| n)
    };
    let (Some(best_fwd), Some(best_bwd)) = (best(0), best(1)) else {
        bail!(
            "no candidate block size of {what} compiled ({} tried); raise --vmem-limit-kib or \
             widen --min-block/--max-block",
            rows.len()
        );
    };
    Ok(Tuned {
        rows,
        best_fwd,
        best_bwd,
        compiled,
    })
}

/// The best splash blocks for `case` on `tpu` (see the module docs): forward `(bq, bkv)` and
/// backward `(bq_dkv, bkv_dkv)` among [`attention_candidates`].
pub fn tune_attention(
    tpu: &TpuTopology,
    kernels: &Lowering,
    case: AttentionCase,
    range: (usize, usize),
    fresh: bool,
) -> Result<(Tuned, Vec<(usize, usize)>)> {
    let AttentionCase {
        dims,
        offset,
        dtype,
        fused,
    } = case;
    let key = format!(
        "splash_causal{offset}_{}_B{}_H{}_KV{}_Q{}_K{}_D{}_{}_{}_vmem{}",
        if fused { "fused" } else { "dq_dkv" },
        dims.batch,
        dims.heads,
        dims.kv_heads,
        dims.q_len,
        dims.kv_len,
        dims.head_dim,
        dtype.name(),
        tpu.topology(),
        kernels.rules.vmem_limit_bytes.unwrap_or(0)
    );
    let mut cache = TuneCache::open(&key, fresh)?;
    let candidates = attention_candidates(case, kernels, range);
    let blocks: Vec<(usize, usize)> = candidates.iter().map(|(b, _)| *b).collect();
    let labelled = candidates
        .into_iter()
        .map(|((bq, bkv), p)| (format!("bq={bq} bkv={bkv}"), p))
        .collect();
    let (rows, compiled) = measure(tpu, &mut cache, labelled, &|k| k.starts_with("splash_fwd"))?;
    Ok((rank(rows, compiled, "splash attention")?, blocks))
}

/// The kernels' `lowering` with the VMEM budget of `--vmem-limit-kib`, checked against the
/// target's VMEM as `tessera compile` checks it.
fn tpu_lowering(kib: Option<usize>, target: &TpuTopology) -> Result<Lowering> {
    let mut kernels = Lowering::tpu();
    if let Some(kib) = kib {
        let bytes = super::compile::vmem_limit("--vmem-limit-kib", kib, 1 << 10, target)?;
        kernels.rules = kernels.rules.with_vmem_limit(bytes);
    }
    Ok(kernels)
}

/// `--min-block` and `--max-block`: powers of two (the search doubles from one to the
/// other), the smaller first.
fn block_range(a: &TuneArgs) -> Result<(usize, usize)> {
    for (flag, block) in [("--min-block", a.min_block), ("--max-block", a.max_block)] {
        if !block.is_power_of_two() {
            bail!(
                "{flag} {block} is not a power of two; the search tries powers of two \
                 (e.g. {flag} {})",
                block.next_power_of_two()
            );
        }
    }
    if a.min_block > a.max_block {
        bail!(
            "--min-block {} is above --max-block {}; give the smaller bound first",
            a.min_block,
            a.max_block
        );
    }
    Ok((a.min_block, a.max_block))
}

fn print_table(t: &Tuned, fwd_name: &str, bwd_name: Option<&str>) {
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    match bwd_name {
        Some(bwd) => outln!(
            "{:<24} {:>14} {:>14} {:>10} {:>10}",
            "blocks",
            format!("{fwd_name} cyc"),
            format!("{bwd} cyc"),
            "fwd MiB",
            "bwd MiB"
        ),
        None => outln!("{:<24} {:>14} {:>10}", "blocks", "cycles/core", "VMEM MiB"),
    }
    for (i, r) in t.rows.iter().enumerate() {
        let mark = match (bwd_name, i == t.best_fwd, i == t.best_bwd) {
            (None, true, _) => " <- best",
            (Some(_), true, true) => " <- fwd, bwd",
            (Some(_), true, false) => " <- fwd",
            (Some(_), false, true) => " <- bwd",
            _ => "",
        };
        match (&r.result, bwd_name) {
            (Ok([f, b, fv, bv]), Some(_)) => outln!(
                "{:<24} {:>14} {:>14} {:>10.2} {:>10.2}{mark}",
                r.label,
                f,
                b,
                mib(*fv),
                mib(*bv)
            ),
            (Ok([f, _, fv, _]), None) => {
                outln!("{:<24} {:>14} {:>10.2}{mark}", r.label, f, mib(*fv))
            }
            (Err(why), _) => outln!("{:<24} refused by libtpu: {why}", r.label),
        }
    }
}

/// `tessera tune`.
pub fn tune(a: &TuneArgs) -> Result<()> {
    let tpu = TpuTopology::parse(&a.target)?;
    let kernels = tpu_lowering(a.vmem_limit_kib, &tpu)?;
    let range = block_range(a)?;
    match &a.what {
        TuneWhat::Attention(s) => {
            let dims = Dims {
                batch: s.batch,
                heads: s.heads,
                kv_heads: s.kv_heads.unwrap_or(s.heads),
                q_len: s.seq_len,
                kv_len: s.kv_len.unwrap_or(s.seq_len),
                head_dim: s.head_dim,
                head_dim_v: s.head_dim,
            };
            let case = AttentionCase {
                dims,
                offset: s.causal_offset,
                dtype: s.dtype,
                fused: s.fused_bwd,
            };
            let (t, blocks) = tune_attention(&tpu, &kernels, case, range, a.no_cache)?;
            outln!(
                "splash attention ({}) {} B={} H={} KV={} Q={} K={} D={} on {}: {} \
                 candidates the TPU rules allow, {} compiled now (the rest cached), cycles per \
                 TensorCore from libtpu's bundles",
                causal_name(s.causal_offset),
                s.dtype.name(),
                dims.batch,
                dims.heads,
                dims.kv_heads,
                dims.q_len,
                dims.kv_len,
                dims.head_dim,
                tpu.topology(),
                t.rows.len(),
                t.compiled
            );
            print_table(
                &t,
                "fwd",
                Some(if s.fused_bwd { "fused bwd" } else { "dq+dkv" }),
            );
            let (fwd, bwd) = (blocks[t.best_fwd], blocks[t.best_bwd]);
            outln!(
                "choice: --sa-block-q {} --sa-block-kv {} --sa-block-q-dkv {} --sa-block-kv-dkv {}",
                fwd.0,
                fwd.1,
                bwd.0,
                bwd.1
            );
            outln!(
                "{}",
                json!({
                    "topology": tpu.topology(),
                    "kernel": "splash",
                    "candidates": t.rows.iter().map(|r| json!({"blocks": r.label, "cost": r.to_json()})).collect::<Vec<_>>(),
                    "block_q": fwd.0, "block_kv": fwd.1,
                    "block_q_dkv": bwd.0, "block_kv_dkv": bwd.1,
                })
            );
        }
        TuneWhat::Kernel { name, params, tune } => {
            let info = registry::find(name)?;
            let tuned: Vec<&str> = if tune.is_empty() {
                info.params
                    .iter()
                    .filter(|p| {
                        !p.is_size()
                            && p.default.parse::<usize>().is_ok()
                            && !params.iter().any(|(k, _)| k == p.name)
                    })
                    .map(|p| p.name)
                    .collect()
            } else {
                tune.iter().map(String::as_str).collect()
            };
            if tuned.is_empty() {
                bail!("kernel `{name}` has no numeric compile-time parameter to tune; name one with --tune");
            }
            let candidates = kernel_candidates(info, params, &tuned, range, &kernels)?;
            let mut fixed: Vec<String> = params.iter().map(|(k, v)| format!("{k}={v}")).collect();
            fixed.sort();
            let key = format!(
                "{name}_{}_{}_vmem{}",
                fixed.join("_"),
                tpu.topology(),
                kernels.rules.vmem_limit_bytes.unwrap_or(0)
            );
            let mut cache = TuneCache::open(&key, a.no_cache)?;
            let (rows, compiled) = measure(&tpu, &mut cache, candidates, &|_| true)?;
            let t = rank(rows, compiled, name)?;
            outln!(
                "{name} ({}) on {}: {} candidates of {} the TPU rules allow, {} compiled now \
                 (the rest cached), cycles per TensorCore from libtpu's bundles",
                if fixed.is_empty() {
                    "defaults".into()
                } else {
                    fixed.join(" ")
                },
                tpu.topology(),
                t.rows.len(),
                tuned.join(", "),
                t.compiled
            );
            print_table(&t, "", None);
            let best = &t.rows[t.best_fwd].label;
            outln!("choice: {best}");
            outln!(
                "{}",
                json!({
                    "topology": tpu.topology(),
                    "kernel": name,
                    "candidates": t.rows.iter().map(|r| json!({"params": r.label, "cost": r.to_json()})).collect::<Vec<_>>(),
                    "choice": best,
                })
            );
        }
    }
    Ok(())
}

/// Every assignment of the powers of two in `range` to the `tuned` parameters of `info`
/// (the others as `fixed` gives them) that builds under the TPU rules of `kernels` (tiling,
/// divisibility and VMEM), labelled `P=v ...`, with its one-kernel program.
pub fn kernel_candidates(
    info: &'static registry::KernelInfo,
    fixed: &[(String, String)],
    tuned: &[&str],
    (min, max): (usize, usize),
    kernels: &Lowering,
) -> Result<Vec<(String, tessera::hlo::Module)>> {
    for t in tuned {
        if !info.params.iter().any(|p| p.name == *t && !p.is_size()) {
            bail!(
                "`{t}` is not a compile-time parameter of `{}`; see `tessera kernels`",
                info.name
            );
        }
    }
    // Every power of two up to `max` divides the next power of two from it.
    let values = block_ladder(max.next_power_of_two(), min, max);
    let mut out = Vec::new();
    let mut choice = vec![0usize; tuned.len()];
    'all: loop {
        let mut given = fixed.to_vec();
        given.extend(
            tuned
                .iter()
                .zip(&choice)
                .map(|(t, &i)| (t.to_string(), values[i].to_string())),
        );
        if let Ok((def, args)) = info.build(&given) {
            if let Ok(kernel) = def.instantiate(&args, &kernels.rules) {
                if let Ok(program) = kernels.lower_module(&kernel) {
                    let label = tuned
                        .iter()
                        .zip(&choice)
                        .map(|(t, &i)| format!("{t}={}", values[i]))
                        .collect::<Vec<_>>()
                        .join(" ");
                    out.push((label, program));
                }
            }
        }
        for slot in choice.iter_mut().rev() {
            *slot += 1;
            if *slot < values.len() {
                continue 'all;
            }
            *slot = 0;
        }
        break;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use tessera::dsl::{DType, Lowering};
    use tessera::splash::{BlockSizes, Dims, Mask, SplashAttention};

    use super::{attention_candidates, block_ladder, kernel_candidates, AttentionCase, Measured};

    /// Cached figures count only for the program they were measured on.
    #[test]
    fn cached_figures_are_kept_per_program() {
        for result in [Ok([1, 2, 3, 4]), Err("refused".to_string())] {
            let m = Measured {
                label: "bq=512 bkv=512".into(),
                result,
            };
            let v = m.cache_entry("abc");
            assert_eq!(Measured::from_json(&m.label, "abc", &v), Some(m.clone()));
            assert_eq!(Measured::from_json(&m.label, "abd", &v), None);
        }
        // Figures cached before programs were hashed are measured again.
        let old = serde_json::json!({"fwd_cycles": 1, "bwd_cycles": 2, "fwd_vmem_bytes": 3,
                                     "bwd_vmem_bytes": 4});
        assert_eq!(Measured::from_json("bq=512 bkv=512", "abc", &old), None);
    }

    fn dims(q_len: usize, kv_len: usize) -> Dims {
        Dims {
            batch: 1,
            heads: 2,
            kv_heads: 2,
            q_len,
            kv_len,
            head_dim: 128,
            head_dim_v: 128,
        }
    }

    #[test]
    fn the_ladder_is_the_powers_of_two_that_divide() {
        assert_eq!(block_ladder(1024, 128, 2048), [128, 256, 512, 1024]);
        assert_eq!(block_ladder(768, 128, 2048), [128, 256]);
        assert_eq!(block_ladder(4096, 100, 1000), [128, 256, 512]);
        assert!(block_ladder(96, 128, 2048).is_empty());
    }

    /// The candidates are exactly the ladder's pairs that splash accepts under the TPU rules,
    /// and a smaller VMEM budget removes the large blocks (their kernels need more).
    #[test]
    fn candidates_are_the_blocks_the_tpu_rules_allow() {
        let tpu = Lowering::tpu();
        let d = dims(1024, 2048);
        let case = AttentionCase {
            dims: d,
            offset: 1024,
            dtype: DType::BF16,
            fused: false,
        };
        let found: Vec<(usize, usize)> = attention_candidates(case, &tpu, (128, 2048))
            .into_iter()
            .map(|(b, _)| b)
            .collect();
        let mut expected = Vec::new();
        for bq in [128, 256, 512, 1024] {
            for bkv in [128, 256, 512, 1024, 2048] {
                let ok = SplashAttention::new(
                    Mask::Causal { offset: 1024 },
                    d,
                    DType::BF16,
                    BlockSizes::uniform(bq, bkv),
                    Default::default(),
                    tpu.clone(),
                )
                .is_ok();
                if ok {
                    expected.push((bq, bkv));
                }
            }
        }
        let (q, kv): (Vec<usize>, Vec<usize>) = found.iter().copied().unzip();
        assert!(
            q.iter().all(|b| [128, 256, 512, 1024].contains(b)),
            "{found:?}"
        );
        assert!(kv.iter().all(|b| 2048 % b == 0), "{found:?}");
        // Within 16 MiB every pair the shape rules accept also fits.
        assert_eq!(found, expected);
        let mut small = Lowering::tpu();
        small.rules = small.rules.with_vmem_limit(1 << 20);
        let fit: Vec<(usize, usize)> = attention_candidates(case, &small, (128, 2048))
            .into_iter()
            .map(|(b, _)| b)
            .collect();
        assert!(!fit.is_empty() && fit.len() < found.len(), "{fit:?}");
        assert!(fit.iter().all(|c| found.contains(c)));
        assert!(!fit.contains(&(1024, 2048)), "{fit:?}");
    }

    /// The matmul kernel's block parameters: every combination that divides the sizes.
    #[test]
    fn matmul_candidates_divide_the_sizes() {
        let info = tessera::registry::find("matmul").unwrap();
        let fixed: Vec<(String, String)> =
            [("M", "256"), ("N", "512"), ("K", "256"), ("dtype", "bf16")]
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
        let found: Vec<String> = kernel_candidates(
            info,
            &fixed,
            &["BM", "BN", "BK"],
            (128, 1024),
            &Lowering::tpu(),
        )
        .unwrap()
        .into_iter()
        .map(|(label, _)| label)
        .collect();
        assert!(
            found.contains(&"BM=256 BN=512 BK=256".to_string()),
            "{found:?}"
        );
        assert!(
            found.contains(&"BM=128 BN=128 BK=128".to_string()),
            "{found:?}"
        );
        assert!(
            !found
                .iter()
                .any(|l| l.contains("BM=512") || l.contains("BN=1024")),
            "{found:?}"
        );
        assert_eq!(found.len(), 2 * 3 * 2, "{found:?}");
        let e = kernel_candidates(info, &fixed, &["M"], (128, 1024), &Lowering::tpu()).unwrap_err();
        assert!(
            e.to_string().contains("not a compile-time parameter"),
            "{e}"
        );
    }
}
