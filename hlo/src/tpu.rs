//! Mosaic kernels inside StableHLO: `stablehlo.custom_call @tpu_custom_call`, the op through
//! which the TPU compiler (libtpu) receives a kernel. The kernel travels as a Mosaic MLIR
//! module (text), base64-encoded in the call's `backend_config` JSON:
//!
//! ```text
//! {"custom_call_config": {"body": "<base64 of the Mosaic module text>",
//!   "has_communication": true,               (kernels that do remote DMA)
//!   "collective_id": 0,                      (kernels that use the barrier semaphore)
//!   "cost_estimate": {"flops": .., "transcendentals": .., "bytes_accessed": ..,
//!                     "remote_bytes_transferred": ..},
//!   "needs_layout_passes": true},
//!  "scoped_memory_configs": [{"memory_space": 1, "offset": 0, "size": <VMEM limit>}]}
//! ```
//!
//! with `kernel_name` (the name the compiler's messages use) and row-major operand and
//! result layouts, which is what the Mosaic compiler assumes of its memrefs.

use base64::Engine;

use crate::builder::FuncBuilder;
use crate::error::HloError;
use crate::ops::{CustomCall, Op, OpKind, Region, Value};
use crate::print::quote;
use crate::types::TensorType;
use crate::{Func, Module};

/// The `call_target_name` of a Mosaic kernel.
pub const TPU_CUSTOM_CALL: &str = "tpu_custom_call";

/// The compiler's static cost of one kernel call, for XLA's scheduling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct CostEstimate {
    /// Floating-point operations.
    pub flops: u64,
    /// Transcendental operations (`exp`, `log`, ...).
    pub transcendentals: u64,
    /// Bytes read and written in HBM.
    pub bytes_accessed: u64,
    /// Bytes the kernel sends to other devices (remote DMA).
    pub remote_bytes_transferred: u64,
}

/// One Mosaic kernel call: the kernel module and what the TPU compiler needs to know about it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TpuCustomCall {
    /// The kernel's name (the `kernel_name` attribute; the compiler's messages use it).
    pub kernel_name: String,
    /// The Mosaic module, MLIR text.
    pub mosaic: String,
    /// Let the compiler infer the vector layouts (tessera's Mosaic leaves them out).
    pub needs_layout_passes: bool,
    /// The kernel does remote DMA (collectives inside the kernel).
    pub has_communication: bool,
    /// The id of the barrier semaphore the kernel uses (`tpu.sem_barrier`), if any. Any
    /// `Some` marks a kernel that needs one: [`FuncBuilder::tpu_custom_call`] replaces it
    /// with the program's id for the kernel (one per distinct kernel, from 0, in the order
    /// their first calls are built), so kernels that meet at a barrier never share one.
    pub collective_id: Option<u32>,
    /// The static cost, if known.
    pub cost_estimate: Option<CostEstimate>,
    /// The kernel's scoped VMEM limit in bytes (the compiler's default when `None`).
    pub vmem_limit_bytes: Option<u64>,
    /// String attributes the compiler carries along without using them
    /// (`mhlo.frontend_attributes`; they appear in its dumps of the call), e.g. tessera's
    /// schedule of the kernel's `when`s.
    pub frontend_attributes: Vec<(String, String)>,
    /// Results that are an operand's buffer (Pallas' `input_output_aliases`).
    pub output_operand_aliases: Vec<crate::OutputOperandAlias>,
}

impl TpuCustomCall {
    /// A call of the Mosaic module `mosaic` named `kernel_name`, with layout passes on and
    /// nothing else set.
    pub fn new(kernel_name: impl Into<String>, mosaic: impl Into<String>) -> Self {
        TpuCustomCall {
            kernel_name: kernel_name.into(),
            mosaic: mosaic.into(),
            needs_layout_passes: true,
            has_communication: false,
            collective_id: None,
            cost_estimate: None,
            vmem_limit_bytes: None,
            frontend_attributes: Vec::new(),
            output_operand_aliases: Vec::new(),
        }
    }

    /// The `backend_config` JSON. Every value is a number, a bool or base64 (no character
    /// needs escaping), so it is written directly.
    pub fn backend_config(&self) -> String {
        let body = base64::engine::general_purpose::STANDARD.encode(self.mosaic.as_bytes());
        let mut json = format!("{{\"custom_call_config\": {{\"body\": \"{body}\"");
        if self.has_communication {
            json.push_str(", \"has_communication\": true");
        }
        if let Some(id) = self.collective_id {
            json.push_str(&format!(", \"collective_id\": {id}"));
        }
        if let Some(c) = self.cost_estimate {
            json.push_str(&format!(
                ", \"cost_estimate\": {{\"flops\": {}, \"transcendentals\": {}, \
                 \"bytes_accessed\": {}, \"remote_bytes_transferred\": {}}}",
                c.flops, c.transcendentals, c.bytes_accessed, c.remote_bytes_transferred
            ));
        }
        if self.needs_layout_passes {
            json.push_str(", \"needs_layout_passes\": true");
        }
        json.push('}');
        // The VMEM limit is a backend setting beside the kernel's config.
        if let Some(limit) = self.vmem_limit_bytes {
            json.push_str(&format!(
                ", \"scoped_memory_configs\": [{{\"memory_space\": 1, \"offset\": 0, \
                 \"size\": {limit}}}]"
            ));
        }
        json.push('}');
        json
    }

    /// The custom call's attributes for operands and results of these ranks (row-major
    /// layouts).
    pub fn to_custom_call(&self, operand_ranks: &[usize], result_ranks: &[usize]) -> CustomCall {
        let mut c = CustomCall::new(TPU_CUSTOM_CALL);
        c.backend_config = self.backend_config();
        c.operand_layouts = Some(operand_ranks.iter().map(|&r| row_major(r)).collect());
        c.result_layouts = Some(result_ranks.iter().map(|&r| row_major(r)).collect());
        c.extra_attrs = vec![("kernel_name".into(), quote(&self.kernel_name))];
        c.output_operand_aliases = self.output_operand_aliases.clone();
        if !self.frontend_attributes.is_empty() {
            let attrs: Vec<String> = self
                .frontend_attributes
                .iter()
                .map(|(name, value)| format!("{name} = {}", quote(value)))
                .collect();
            c.extra_attrs.push((
                "mhlo.frontend_attributes".into(),
                format!("{{{}}}", attrs.join(", ")),
            ));
        }
        c
    }
}

/// The minor-to-major order of a row-major array of rank `rank`: `[rank-1, .., 1, 0]`.
fn row_major(rank: usize) -> Vec<i64> {
    (0..rank as i64).rev().collect()
}

impl FuncBuilder<'_> {
    /// Calls the Mosaic kernel `call` on `operands` (whole arrays) with results of
    /// `result_types`: one `stablehlo.custom_call @tpu_custom_call`.
    pub fn tpu_custom_call(
        &mut self,
        call: &TpuCustomCall,
        operands: &[Value],
        result_types: &[TensorType],
    ) -> Result<Vec<Value>, HloError> {
        if call.kernel_name.is_empty() {
            return Err(HloError::attr(
                "stablehlo.custom_call",
                "kernel_name",
                "a Mosaic kernel needs a name",
            ));
        }
        let operand_ranks = operands
            .iter()
            .map(|&v| Ok(self.value_type(v)?.dims.len()))
            .collect::<Result<Vec<_>, HloError>>()?;
        let result_ranks: Vec<usize> = result_types.iter().map(|t| t.dims.len()).collect();
        // Kernels that meet at the barrier semaphore need an id of their own in the program
        // (Pallas' `collective_id`); the program numbers them rather than their authors.
        let mut call = call.clone();
        if call.collective_id.is_some() {
            call.collective_id = Some(self.module_mut().collective_id(&call.mosaic));
        }
        self.custom_call(
            call.to_custom_call(&operand_ranks, &result_ranks),
            operands,
            result_types,
        )
    }
}

impl Module {
    /// The `kernel_name`s of the Mosaic kernels (`tpu_custom_call`s) in this module, in
    /// program order, each once.
    pub fn tpu_kernel_names(&self) -> Vec<String> {
        let mut names: Vec<String> = Vec::new();
        for call in self.tpu_calls() {
            if !names.contains(&call.name) {
                names.push(call.name);
            }
        }
        names
    }

    /// For each distinct Mosaic kernel of this module (by name; its first call), a one-device
    /// module whose `main` takes that call's operands as arguments and returns its results.
    /// Compiled alone, each tells whether the compiler accepts that kernel: how a failed
    /// program's error is traced to the kernel that caused it.
    pub fn tpu_kernel_programs(&self) -> Result<Vec<(String, Module)>, HloError> {
        let mut programs: Vec<(String, Module)> = Vec::new();
        for call in self.tpu_calls() {
            if programs.iter().any(|(n, _)| *n == call.name) {
                continue;
            }
            let mut m = Module::new("kernel");
            let mut f = m.func("main");
            let args = call
                .operands
                .into_iter()
                .map(|t| f.arg(t))
                .collect::<Result<Vec<_>, _>>()?;
            let outs = f.custom_call(call.spec, &args, &call.results)?;
            f.finish(&outs)?;
            programs.push((call.name, m));
        }
        Ok(programs)
    }

    /// The Mosaic kernels of this module as `(kernel name, Mosaic module text)`, each distinct
    /// body once, in program order (decoded from the calls' `backend_config`).
    pub fn tpu_kernel_bodies(&self) -> Result<Vec<(String, String)>, HloError> {
        let mut bodies: Vec<(String, String)> = Vec::new();
        for call in self.tpu_calls() {
            let text = mosaic_body(&call.spec.backend_config).ok_or_else(|| {
                HloError::attr(
                    TPU_CUSTOM_CALL,
                    "backend_config",
                    format!("kernel `{}` has no readable Mosaic body", call.name),
                )
            })?;
            if !bodies.iter().any(|(n, t)| *n == call.name && *t == text) {
                bodies.push((call.name, text));
            }
        }
        Ok(bodies)
    }

    /// Every `tpu_custom_call` of the module, in program order.
    fn tpu_calls(&self) -> Vec<Call> {
        let mut calls = Vec::new();
        for f in self.funcs() {
            collect_calls(f, f.body(), &mut calls);
        }
        calls
    }
}

/// The Mosaic text in a `backend_config` written by [`TpuCustomCall::backend_config`].
fn mosaic_body(config: &str) -> Option<String> {
    let start = config.find("\"body\": \"")? + "\"body\": \"".len();
    let len = config[start..].find('"')?;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(&config[start..start + len])
        .ok()?;
    String::from_utf8(bytes).ok()
}

/// A `tpu_custom_call` found in a module.
struct Call {
    name: String,
    spec: CustomCall,
    operands: Vec<TensorType>,
    results: Vec<TensorType>,
}

fn collect_calls(f: &Func, region: &Region, calls: &mut Vec<Call>) {
    for op in &region.ops {
        if let (Some(name), OpKind::CustomCall(spec)) = (kernel_name(op), &op.kind) {
            // Every value of a finished function has a type.
            let types = |vs: &[Value]| {
                vs.iter()
                    .filter_map(|v| f.value_type(*v).cloned())
                    .collect()
            };
            calls.push(Call {
                name,
                spec: spec.clone(),
                operands: types(&op.operands),
                results: types(&op.results),
            });
        }
        for r in &op.regions {
            collect_calls(f, r, calls);
        }
    }
}

fn kernel_name(op: &Op) -> Option<String> {
    let OpKind::CustomCall(c) = &op.kind else {
        return None;
    };
    if c.call_target_name != TPU_CUSTOM_CALL {
        return None;
    }
    let (_, quoted) = c.extra_attrs.iter().find(|(n, _)| n == "kernel_name")?;
    Some(unquote(quoted))
}

/// The inverse of [`quote`] for the names it produces.
fn unquote(quoted: &str) -> String {
    let inner = quoted
        .strip_prefix('"')
        .and_then(|s| s.strip_suffix('"'))
        .unwrap_or(quoted);
    let mut out = Vec::with_capacity(inner.len());
    let bytes = inner.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 1 < bytes.len() {
            let next = bytes[i + 1];
            if next == b'"' || next == b'\\' {
                out.push(next);
                i += 2;
                continue;
            }
            if let Some(b) = inner
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
            {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DType;

    #[test]
    fn backend_config_carries_the_module_and_options() {
        let mut call = TpuCustomCall::new("add \"one\"", "module {}\n");
        assert_eq!(
            call.backend_config(),
            r#"{"custom_call_config": {"body": "bW9kdWxlIHt9Cg==", "needs_layout_passes": true}}"#
        );
        call.has_communication = true;
        call.cost_estimate = Some(CostEstimate {
            flops: 10,
            transcendentals: 2,
            bytes_accessed: 64,
            remote_bytes_transferred: 0,
        });
        call.vmem_limit_bytes = Some(1 << 20);
        assert_eq!(
            call.backend_config(),
            "{\"custom_call_config\": {\"body\": \"bW9kdWxlIHt9Cg==\", \"has_communication\": \
             true, \"cost_estimate\": {\"flops\": 10, \"transcendentals\": 2, \
             \"bytes_accessed\": 64, \"remote_bytes_transferred\": 0}, \
             \"needs_layout_passes\": true}, \"scoped_memory_configs\": [{\"memory_space\": 1, \
             \"offset\": 0, \"size\": 1048576}]}"
        );
    }

    #[test]
    fn custom_call_text_has_layouts_and_kernel_name() {
        let mut m = Module::new("k");
        let mut f = m.func("main");
        let x = f.arg(TensorType::new([8, 128], DType::F32)).unwrap();
        let s = f.arg(TensorType::new([4], DType::I32)).unwrap();
        let call = TpuCustomCall {
            frontend_attributes: vec![("note".into(), "{\"a\": 1}".into())],
            ..TpuCustomCall::new("scale \"x\"\n", "module {}")
        };
        let y = f
            .tpu_custom_call(&call, &[s, x], &[TensorType::new([2, 8, 128], DType::BF16)])
            .unwrap();
        f.finish(&y).unwrap();
        let text = m.to_mlir();
        assert!(
            text.contains(
                "operand_layouts = [dense<[0]> : tensor<1xindex>, dense<[1, 0]> : tensor<2xindex>]"
            ),
            "{text}"
        );
        assert!(
            text.contains("result_layouts = [dense<[2, 1, 0]> : tensor<3xindex>]"),
            "{text}"
        );
        assert!(text.contains(r#"kernel_name = "scale \"x\"\0A""#), "{text}");
        assert!(
            text.contains(r#"mhlo.frontend_attributes = {note = "{\"a\": 1}"}"#),
            "{text}"
        );
        assert!(
            text.contains(r#"call_target_name = "tpu_custom_call""#),
            "{text}"
        );
        assert_eq!(m.tpu_kernel_names(), vec!["scale \"x\"\n".to_string()]);
        let programs = m.tpu_kernel_programs().unwrap();
        assert_eq!(programs.len(), 1);
        let alone = programs[0].1.to_mlir();
        assert!(
            alone.contains("@main(%arg0: tensor<4xi32>, %arg1: tensor<8x128xf32>)"),
            "{alone}"
        );
        assert!(
            alone.contains(r#"kernel_name = "scale \"x\"\0A""#),
            "{alone}"
        );
    }

    #[test]
    fn a_kernel_needs_a_name() {
        let mut m = Module::new("k");
        let mut f = m.func("main");
        let x = f.arg(TensorType::new([8], DType::F32)).unwrap();
        let call = TpuCustomCall::new("", "module {}");
        let err = f
            .tpu_custom_call(&call, &[x], &[TensorType::new([8], DType::F32)])
            .unwrap_err();
        assert!(err.to_string().contains("kernel_name"), "{err}");
    }
}
