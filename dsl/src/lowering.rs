//! Lowerings: the rules a kernel is checked against and how it becomes part of a StableHLO
//! program.
//!
//! - [`Lowering::portable`] (and any rules with [`KernelLowering::Inline`]): the kernel is
//!   expanded into plain StableHLO ([`crate::stablehlo::lower_into`]), so the program runs on
//!   any PJRT backend (the XLA CPU plugin here).
//! - [`Lowering::tpu`]: the kernel is lowered to Mosaic ([`crate::mosaic::lower`]) and called
//!   through one `stablehlo.custom_call @tpu_custom_call`, which the TPU compiler (libtpu)
//!   compiles; the TPU rules are checked first, so what tessera can know (tiling, VMEM,
//!   dtypes) is refused before the compiler sees the kernel.

use tessera_hlo::{self as hlo, FuncBuilder, HloError, TensorType, TpuCustomCall};

use crate::error::{KernelError, Problem, ProblemKind};
use crate::ir::{Kernel, Loc, OperandRole};
use crate::mosaic::{ArgValues, KernelSchedule};
use crate::rules::KernelRules;

/// The frontend attribute of a Mosaic call holding its [`KernelSchedule`] as JSON.
pub const SCHEDULE_ATTRIBUTE: &str = "tessera_schedule";

/// How an instantiated kernel becomes ops of a StableHLO program.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum KernelLowering {
    /// Expanded inline into StableHLO loops (runs on any backend).
    #[default]
    Inline,
    /// A Mosaic module in a `tpu_custom_call` (compiles for TPU only).
    Mosaic,
}

/// Whether a Mosaic call carries a `cost_estimate` for XLA.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum KernelCostEstimates {
    /// Each call carries tessera's count of its work ([`crate::mosaic::CostEstimate`]): XLA's
    /// scheduler and libtpu's cost analysis of the whole program price the call by it.
    #[default]
    Counted,
    /// Calls carry none, as Pallas calls made without a `cost_estimate` (JAX's splash among
    /// them, so MaxText's steps): libtpu's cost analysis then prices the call at next to
    /// nothing (measured, libtpu 0.0.42.1: JAX's splash forward alone, v5p, S=4096, 8 heads:
    /// no flops, 0.9 us). Only for comparing whole-program estimates with such programs.
    Omitted,
}

/// How a program's kernels are built: the rules they are checked against, whether they
/// enter the program inline or as Mosaic custom calls, and what those calls tell XLA of
/// their cost.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Lowering {
    pub rules: KernelRules,
    pub kernels: KernelLowering,
    pub cost_estimates: KernelCostEstimates,
}

impl Lowering {
    /// Portable StableHLO: no TPU rules, kernels inlined.
    pub fn portable() -> Self {
        Lowering {
            rules: KernelRules::portable(),
            kernels: KernelLowering::Inline,
            cost_estimates: KernelCostEstimates::Counted,
        }
    }

    /// TPU: the TPU rules, kernels as Mosaic custom calls.
    pub fn tpu() -> Self {
        Lowering {
            rules: KernelRules::tpu(),
            kernels: KernelLowering::Mosaic,
            cost_estimates: KernelCostEstimates::Counted,
        }
    }

    /// Kernels inlined, checked against `rules` (e.g. the TPU rules on the CPU backend, so a
    /// kernel tested here stays valid for TPU).
    pub fn inline(rules: KernelRules) -> Self {
        Lowering {
            rules,
            kernels: KernelLowering::Inline,
            cost_estimates: KernelCostEstimates::Counted,
        }
    }

    /// Whether kernels become `tpu_custom_call`s.
    pub fn is_tpu(&self) -> bool {
        self.kernels == KernelLowering::Mosaic
    }

    /// The instantiated kernel `k` alone in a module: `@main` takes its arguments (scalar
    /// prefetch and inputs, in order) and returns its outputs, the kernel lowered as
    /// [`Lowering::lower_into`] lowers it (for [`Lowering::tpu`], one `tpu_custom_call`).
    pub fn lower_module(&self, k: &Kernel) -> Result<hlo::Module, KernelError> {
        crate::stablehlo::module_with(k, |k, f, args| {
            self.lower_into(k, f, args, CallFacts::default())
        })
    }

    /// The instantiated kernel `k`, which runs on a device mesh, alone in a manually
    /// partitioned module of one partition per device: `@main` takes and returns each
    /// device's arrays (for [`Lowering::tpu`], one `tpu_custom_call` per device, which
    /// communicates with the others; inline, the SPMD lowering of
    /// [`crate::stablehlo::lower_into_spmd`]).
    pub fn lower_module_spmd(&self, k: &Kernel) -> Result<hlo::Module, KernelError> {
        crate::stablehlo::module_spmd_with(k, |k, f, args| self.lower_into_spmd(k, f, args))
    }

    /// Lowers the instantiated kernel `k`, which runs on a device mesh, into the manually
    /// partitioned function `f` is building (one partition per device of `k`'s mesh, e.g. a
    /// model's SPMD step), applied to this device's `args`; returns its output arrays. Inline,
    /// [`crate::stablehlo::lower_into_spmd`] (remote copies as `collective_permute`s); for
    /// [`Lowering::tpu`], one `tpu_custom_call` per device, which communicates with the
    /// others.
    pub fn lower_into_spmd(
        &self,
        k: &Kernel,
        f: &mut FuncBuilder<'_>,
        args: &[hlo::Value],
    ) -> Result<Vec<hlo::Value>, KernelError> {
        match self.kernels {
            KernelLowering::Inline => crate::stablehlo::lower_into_spmd(k, f, args),
            KernelLowering::Mosaic => self.custom_call(k, f, args, CallFacts::default()),
        }
    }

    /// Lowers the instantiated kernel `k` into the function `f` is building, applied to
    /// `args` (its scalar-prefetch and input arrays, in declaration order); returns its
    /// output arrays. `facts` are what the caller knows of this call beyond the kernel
    /// ([`CallFacts::default`]: nothing); a Mosaic call uses them, inline lowering ignores
    /// them.
    pub fn lower_into(
        &self,
        k: &Kernel,
        f: &mut FuncBuilder<'_>,
        args: &[hlo::Value],
        facts: CallFacts<'_>,
    ) -> Result<Vec<hlo::Value>, KernelError> {
        match self.kernels {
            KernelLowering::Inline => crate::stablehlo::lower_into(k, f, args),
            KernelLowering::Mosaic => self.custom_call(k, f, args, facts),
        }
    }

    /// What the `tpu_custom_call` of the instantiated kernel `k` is made of: the Mosaic
    /// module with the custom call's config (cost estimate, scoped VMEM limit), the order of
    /// its operands and its result types. [`Lowering::lower_into`] emits exactly this call;
    /// tools that build the call themselves (the `tessera-jax` package's TPU lowering rule)
    /// take it from here, with the same `facts`.
    pub fn mosaic_call(&self, k: &Kernel, facts: CallFacts<'_>) -> Result<MosaicCall, KernelError> {
        let schedule = KernelSchedule::of_kernel(k, facts.known);
        let mut mosaic = crate::mosaic::lower(k)?;
        if facts.active_grid_steps.is_some() {
            mosaic.cost = crate::mosaic::cost_estimate(k, facts.active_grid_steps);
        }
        // The call takes the scalar-prefetch tables first, then the inputs (the order of the
        // Mosaic function's parameters); the kernel's arguments follow its declaration order.
        let roles: Vec<OperandRole> = k
            .operands
            .iter()
            .map(|o| o.role)
            .filter(|r| matches!(r, OperandRole::Input | OperandRole::ScalarPrefetch))
            .collect();
        if mosaic.operands.len() != roles.len() {
            return Err(internal(
                k,
                format!(
                    "the kernel takes {} arrays, its Mosaic call {}",
                    roles.len(),
                    mosaic.operands.len()
                ),
            ));
        }
        let operand_order = crate::mosaic::call_operand_order(k);
        // An output aliasing an input is that operand's buffer in the call.
        let arg_refs = k.all_argument_refs();
        let output_operand_aliases = k
            .operands_with(OperandRole::Output)
            .enumerate()
            .filter_map(|(output, (_, o))| {
                let arg = arg_refs.iter().position(|&a| Some(a) == o.aliases)?;
                let operand = operand_order.iter().position(|&i| i == arg)?;
                Some(hlo::OutputOperandAlias { output, operand })
            })
            .collect();
        let results: Vec<TensorType> = mosaic
            .results
            .iter()
            .map(|o| {
                TensorType::new(
                    o.shape.iter().map(|&d| d as i64).collect::<Vec<_>>(),
                    o.dtype,
                )
            })
            .collect();
        let call = TpuCustomCall {
            cost_estimate: match self.cost_estimates {
                KernelCostEstimates::Counted => Some(hlo::CostEstimate {
                    flops: mosaic.cost.flops,
                    transcendentals: mosaic.cost.transcendentals,
                    bytes_accessed: mosaic.cost.bytes_accessed,
                    remote_bytes_transferred: mosaic.cost.remote_bytes,
                }),
                KernelCostEstimates::Omitted => None,
            },
            // Mosaic's own bound of what the kernel keeps in VMEM, or the rules' budget when
            // that is larger.
            vmem_limit_bytes: Some(
                mosaic
                    .vmem_limit_bytes
                    .max(self.rules.vmem_limit_bytes.unwrap_or(0)) as u64,
            ),
            frontend_attributes: vec![(SCHEDULE_ATTRIBUTE.into(), schedule.to_json())],
            has_communication: mosaic.has_communication,
            collective_id: mosaic.collective_id,
            output_operand_aliases,
            ..TpuCustomCall::new(mosaic.name, mosaic.text)
        };
        Ok(MosaicCall {
            call,
            operand_order,
            results,
        })
    }

    fn custom_call(
        &self,
        k: &Kernel,
        f: &mut FuncBuilder<'_>,
        args: &[hlo::Value],
        facts: CallFacts<'_>,
    ) -> Result<Vec<hlo::Value>, KernelError> {
        let MosaicCall {
            call,
            operand_order,
            results,
        } = self.mosaic_call(k, facts)?;
        let args = &crate::stablehlo::with_flags_init(k, f, args)?;
        if operand_order.len() != args.len() {
            return Err(internal(
                k,
                format!(
                    "the kernel takes {} arrays, but {} were given",
                    operand_order.len(),
                    args.len()
                ),
            ));
        }
        let operands: Vec<hlo::Value> = operand_order.iter().map(|&i| args[i]).collect();
        f.tpu_custom_call(&call, &operands, &results)
            .map_err(|e: HloError| internal(k, e.to_string()))
    }
}

/// What the caller of [`Lowering::lower_into`] knows about one call of a kernel beyond its
/// IR. A Mosaic call uses these facts; inline lowering ignores them.
#[derive(Debug, Clone, Copy, Default)]
pub struct CallFacts<'a> {
    /// The grid steps that do work, where the caller knows it (splash, from its block
    /// tables: the steps of skipped blocks do nothing): the Mosaic call's cost estimate
    /// counts the work of that many steps instead of every step. `None`: every step.
    pub active_grid_steps: Option<u64>,
    /// Host values of some arguments, aligned with the call's arguments (splash's block
    /// tables): the Mosaic call carries its [`KernelSchedule`] (how often each top-level
    /// `when` runs), evaluated with these values, in its `tessera_schedule` frontend
    /// attribute, which reading the compiled kernel's cost uses. Empty: none known.
    pub known: &'a [ArgValues<'a>],
}

/// A kernel's `tpu_custom_call`, as [`Lowering::mosaic_call`] builds it.
#[derive(Debug, Clone, PartialEq)]
pub struct MosaicCall {
    /// The Mosaic module, kernel name and custom-call config
    /// ([`TpuCustomCall::backend_config`] is the call's `backend_config` JSON).
    pub call: TpuCustomCall,
    /// The call's operands as indices into the kernel's arguments (scalar prefetch and
    /// inputs in declaration order): the scalar-prefetch tables first, then the inputs. For
    /// a kernel with run-time checks the last index is one past the caller's arguments: the
    /// zeros its check flags start from (`i32[steps, 128]`, [`crate::checks`]), which the
    /// caller makes; the call's last result is then the flags.
    pub operand_order: Vec<usize>,
    /// The call's result types: the kernel's outputs, in order.
    pub results: Vec<TensorType>,
}

impl Default for Lowering {
    fn default() -> Self {
        Lowering::inline(KernelRules::default())
    }
}

impl From<KernelRules> for Lowering {
    /// Kernels inlined, checked against these rules.
    fn from(rules: KernelRules) -> Self {
        Lowering::inline(rules)
    }
}

fn internal(k: &Kernel, message: String) -> KernelError {
    KernelError::new(
        &k.name,
        vec![Problem {
            kind: ProblemKind::Lower,
            subject: "tpu_custom_call".into(),
            message: format!(
                "embedding the Mosaic kernel failed (a tessera bug; please report it): {message}"
            ),
            loc: Some(Loc::internal()),
        }],
    )
}
