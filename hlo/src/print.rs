//! Renders modules as MLIR text: `func.func` in its custom form, every op in the generic form
//! (`%0 = "stablehlo.add"(%a, %b) : (T, T) -> T`), which parses the same way across StableHLO
//! versions.

use std::fmt::Write as _;

use crate::module::{Func, Module};
use crate::ops::{ChannelHandle, CollectiveAttrs, CustomCall, Op, OpKind, Region, Sharding, Value};
use crate::TensorType;

/// Renders `m`; `shardy` prints a module with a mesh in Shardy's form (`sdy.mesh`, `@main`'s
/// body in an `sdy.manual_computation`), else shardings are GSPMD's `mhlo.sharding`.
pub(crate) fn render_module(m: &Module, shardy: bool) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "module @{} attributes {{mhlo.num_partitions = {} : i32, mhlo.num_replicas = {} : i32}} {{",
        symbol(m.name()),
        m.num_partitions(),
        m.num_replicas()
    );
    let mesh = if shardy && !m.mesh().is_empty() {
        let axes: Vec<String> = m
            .mesh()
            .iter()
            .map(|(name, size)| format!("{}={size}", quote(name)))
            .collect();
        let _ = writeln!(
            out,
            "  \"sdy.mesh\"() <{{mesh = #sdy.mesh<[{}]>, sym_name = \"{MESH}\"}}> : () -> ()",
            axes.join(", ")
        );
        Some(m.mesh())
    } else {
        None
    };
    for (i, f) in m.funcs().iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        let mut printer = FuncPrinter::new(f, &mut out);
        printer.aliases = m.output_aliases(&f.name);
        match mesh {
            // On a module with a mesh, @main takes and returns ManualSplit blocks only
            // (checked as it is built).
            Some(mesh) if f.name == "main" => printer.manual_computation(mesh),
            _ => printer.func(),
        }
    }
    out.push_str("}\n");
    out
}

/// The symbol of the module's `sdy.mesh`.
const MESH: &str = "mesh";

struct FuncPrinter<'a> {
    func: &'a Func,
    names: Vec<Option<String>>,
    next: usize,
    out: &'a mut String,
    /// `(argument, result)` pairs printed as `tf.aliasing_output`.
    aliases: Vec<(usize, usize)>,
}

impl<'a> FuncPrinter<'a> {
    fn new(func: &'a Func, out: &'a mut String) -> Self {
        FuncPrinter {
            func,
            names: vec![None; func.values.len()],
            next: 0,
            out,
            aliases: Vec::new(),
        }
    }

    /// The result argument `i` is aliased to, if any.
    fn alias_of(&self, i: usize) -> Option<usize> {
        self.aliases.iter().find(|&&(a, _)| a == i).map(|&(_, o)| o)
    }

    fn ty(&self, v: Value) -> &TensorType {
        &self.func.values[v.index()]
    }

    fn define(&mut self, v: Value) -> String {
        let name = format!("%{}", self.next);
        self.next += 1;
        self.names[v.index()] = Some(name.clone());
        name
    }

    fn fresh(&mut self) -> String {
        let name = format!("%{}", self.next);
        self.next += 1;
        name
    }

    fn name(&self, v: Value) -> String {
        self.names
            .get(v.index())
            .and_then(|n| n.clone())
            .unwrap_or_else(|| format!("%undefined{}", v.index()))
    }

    fn func(&mut self) {
        let f = self.func;
        let mut sig = String::new();
        for (i, &a) in f.body.args.iter().enumerate() {
            let name = format!("%arg{i}");
            self.names[a.index()] = Some(name.clone());
            if i > 0 {
                sig.push_str(", ");
            }
            let _ = write!(
                sig,
                "{name}: {}{}",
                self.ty(a),
                arg_attrs(
                    f.arg_shardings[i]
                        .as_ref()
                        .map(|s| { format!("mhlo.sharding = {}", quote(s.as_str())) }),
                    self.alias_of(i)
                )
            );
        }
        let results: Vec<String> = f
            .body
            .results
            .iter()
            .zip(&f.result_shardings)
            .map(|(&v, s)| format!("{}{}", self.ty(v), sharding_attr(s.as_ref())))
            .collect();
        self.header(&sig, &results);
        for op in &f.body.ops {
            self.op(op, 4);
        }
        self.terminator("func.return", &f.body.results, 4);
        self.out.push_str("  }\n");
    }

    fn header(&mut self, args: &str, results: &[String]) {
        let ret = if results.is_empty() {
            String::new()
        } else {
            format!(" -> ({})", results.join(", "))
        };
        let vis = if self.func.public {
            "public"
        } else {
            "private"
        };
        let _ = writeln!(
            self.out,
            "  func.func {vis} @{}({args}){ret} {{",
            symbol(&self.func.name)
        );
    }

    /// The function over global tensors (each argument and result a [`Sharding::ManualSplit`]
    /// block), its body in an `sdy.manual_computation` over every axis of `mesh`.
    ///
    /// Measured on the XLA CPU plugin (xla-cpu-pjrt 0.0.1, StableHLO 1.13.3): this form
    /// compiles with `use_shardy_partitioner` ("Using Shardy for XLA SPMD propagation") and
    /// computes bit for bit what the GSPMD `{manual}` form does (collectives' numerics test
    /// runs both); it also takes size-1 mesh axes, a one-device mesh, `func.call` inside the
    /// body, and the generic or the custom op syntax. Without Shardy the plugin rejects it
    /// (RET_CHECK in spmd_partitioner.cc: "a custom call named 'xla.sdy.*' ... Shardy was then
    /// disabled"). The `{manual}` form compiled with Shardy on falls back to GSPMD ("Module
    /// has GSPMD attrs or ops, but Shardy is enabled") and warns that GSPMD sharding
    /// propagation is deprecated, which is why a module with a mesh prints this form.
    fn manual_computation(&mut self, mesh: &[(String, u32)]) {
        let f = self.func;
        let global = |ty: &TensorType, s: &Option<Sharding>| -> (TensorType, String) {
            let axes: &[Option<String>] = match s {
                Some(Sharding::ManualSplit(axes)) => axes,
                _ => &[],
            };
            let mut g = ty.clone();
            let mut dims = Vec::with_capacity(ty.rank());
            for (d, size) in g.dims.iter_mut().enumerate() {
                match axes.get(d).and_then(Option::as_ref) {
                    Some(a) => {
                        // Fits: the global element count was checked when the function was
                        // built.
                        *size *= mesh.iter().find(|(n, _)| n == a).map_or(1, |&(_, k)| k) as i64;
                        dims.push(format!("{{{}}}", quote(a)));
                    }
                    None => dims.push("{}".to_string()),
                }
            }
            (g, format!("<@{MESH}, [{}]>", dims.join(", ")))
        };
        let blocks = |values: &[Value], shardings: &[Option<Sharding>]| {
            let values = values.iter().zip(shardings);
            values
                .map(|(&v, s)| global(self.ty(v), s))
                .collect::<Vec<_>>()
        };
        let ins = blocks(&f.body.args, &f.arg_shardings);
        let outs = blocks(&f.body.results, &f.result_shardings);
        let declare = |(ty, sharding): &(TensorType, String)| {
            format!("{ty} {{sdy.sharding = #sdy.sharding{sharding}}}")
        };
        let sig: Vec<String> = ins
            .iter()
            .enumerate()
            .map(|(i, g)| {
                let attrs = arg_attrs(
                    Some(format!("sdy.sharding = #sdy.sharding{}", g.1)),
                    self.alias_of(i),
                );
                format!("%arg{i}: {}{attrs}", g.0)
            })
            .collect();
        let results: Vec<String> = outs.iter().map(declare).collect();
        self.header(&sig.join(", "), &results);

        let per_value = |v: &[(TensorType, String)]| {
            let items: Vec<&str> = v.iter().map(|(_, s)| s.as_str()).collect();
            format!("#sdy.sharding_per_value<[{}]>", items.join(", "))
        };
        let types = |v: &[(TensorType, String)]| {
            let items: Vec<String> = v.iter().map(|(t, _)| t.to_string()).collect();
            items.join(", ")
        };
        let manual_axes: Vec<String> = mesh.iter().map(|(n, _)| quote(n)).collect();
        let operands: Vec<String> = (0..ins.len()).map(|i| format!("%arg{i}")).collect();
        let result = match outs.len() {
            0 => String::new(),
            1 => "%manual = ".to_string(),
            n => format!("%manual:{n} = "),
        };
        let _ = writeln!(
            self.out,
            "    {result}\"sdy.manual_computation\"({}) <{{in_shardings = {}, manual_axes = \
             #sdy<manual_axes{{{}}}>, out_shardings = {}}}> ({{",
            operands.join(", "),
            per_value(&ins),
            manual_axes.join(", "),
            per_value(&outs)
        );
        if !f.body.args.is_empty() {
            let locals: Vec<String> = f
                .body
                .args
                .iter()
                .enumerate()
                .map(|(i, &a)| {
                    let name = format!("%local{i}");
                    self.names[a.index()] = Some(name.clone());
                    format!("{name}: {}", self.ty(a))
                })
                .collect();
            let _ = writeln!(self.out, "    ^bb0({}):", locals.join(", "));
        }
        for op in &f.body.ops {
            self.op(op, 6);
        }
        self.terminator("sdy.return", &f.body.results, 6);
        let out_types = if outs.len() == 1 {
            types(&outs)
        } else {
            format!("({})", types(&outs))
        };
        let _ = writeln!(self.out, "    }}) : ({}) -> {out_types}", types(&ins));
        let returned: Vec<String> = match outs.len() {
            1 => vec!["%manual".to_string()],
            n => (0..n).map(|i| format!("%manual#{i}")).collect(),
        };
        let _ = writeln!(
            self.out,
            "    \"func.return\"({}) : ({}) -> ()",
            returned.join(", "),
            types(&outs)
        );
        self.out.push_str("  }\n");
    }

    fn terminator(&mut self, name: &str, values: &[Value], indent: usize) {
        let names: Vec<String> = values.iter().map(|&v| self.name(v)).collect();
        let types: Vec<String> = values.iter().map(|&v| self.ty(v).to_string()).collect();
        let _ = writeln!(
            self.out,
            "{:indent$}\"{name}\"({}) : ({}) -> ()",
            "",
            names.join(", "),
            types.join(", ")
        );
    }

    fn op(&mut self, op: &Op, indent: usize) {
        if matches!(op.kind, OpKind::PartitionId | OpKind::ReplicaId) {
            // The op yields ui32; tessera values are i32, so a convert follows.
            let raw = self.fresh();
            let _ = writeln!(
                self.out,
                "{:indent$}{raw} = \"{}\"() : () -> tensor<ui32>",
                "",
                op.kind.name()
            );
            let r = self.define(op.results[0]);
            let ty = self.ty(op.results[0]).to_string();
            let _ = writeln!(
                self.out,
                "{:indent$}{r} = \"stablehlo.convert\"({raw}) : (tensor<ui32>) -> {ty}",
                ""
            );
            return;
        }
        let results: Vec<String> = op.results.iter().map(|&v| self.define(v)).collect();
        let operands: Vec<String> = op.operands.iter().map(|&v| self.name(v)).collect();
        let _ = write!(self.out, "{:indent$}", "");
        if !results.is_empty() {
            let _ = write!(self.out, "{} = ", results.join(", "));
        }
        let _ = write!(self.out, "\"{}\"({})", op.kind.name(), operands.join(", "));
        if !op.regions.is_empty() {
            self.out.push_str(" (");
            for (i, r) in op.regions.iter().enumerate() {
                if i > 0 {
                    self.out.push_str(", ");
                }
                self.region(r, indent);
            }
            self.out.push(')');
        }
        let attrs = attributes(&op.kind, op.results.len());
        if !attrs.is_empty() {
            let _ = write!(self.out, " {{{}}}", attrs.join(", "));
        }
        let in_types: Vec<String> = op
            .operands
            .iter()
            .map(|&v| self.ty(v).to_string())
            .collect();
        let out_types: Vec<String> = op.results.iter().map(|&v| self.ty(v).to_string()).collect();
        let out_types = if out_types.len() == 1 {
            out_types[0].clone()
        } else {
            format!("({})", out_types.join(", "))
        };
        let _ = writeln!(self.out, " : ({}) -> {out_types}", in_types.join(", "));
    }

    fn region(&mut self, r: &Region, indent: usize) {
        self.out.push_str("{\n");
        if !r.args.is_empty() {
            let args: Vec<String> = r
                .args
                .iter()
                .map(|&a| {
                    let n = self.define(a);
                    format!("{n}: {}", self.ty(a))
                })
                .collect();
            let _ = writeln!(self.out, "{:indent$}^bb0({}):", "", args.join(", "));
        }
        for op in &r.ops {
            self.op(op, indent + 2);
        }
        self.terminator("stablehlo.return", &r.results, indent + 2);
        let _ = write!(self.out, "{:indent$}}}", "");
    }
}

/// The attribute dictionary entries of an op, in a fixed order.
fn attributes(kind: &OpKind, num_results: usize) -> Vec<String> {
    match kind {
        OpKind::Constant(lit) => vec![format!("value = {}", lit.to_mlir())],
        OpKind::Unary(_)
        | OpKind::Binary(_)
        | OpKind::Select
        | OpKind::Clamp
        | OpKind::Convert
        | OpKind::Reshape
        | OpKind::OptimizationBarrier
        | OpKind::DynamicUpdateSlice
        | OpKind::While
        | OpKind::Case
        | OpKind::If
        | OpKind::PartitionId
        | OpKind::ReplicaId => vec![],
        OpKind::Compare {
            direction,
            compare_type,
        } => vec![
            format!(
                "compare_type = #stablehlo<comparison_type {}>",
                compare_type.as_str()
            ),
            format!(
                "comparison_direction = #stablehlo<comparison_direction {}>",
                direction.as_str()
            ),
        ],
        OpKind::Iota { dimension } => vec![format!("iota_dimension = {dimension} : i64")],
        OpKind::BroadcastInDim {
            broadcast_dimensions,
        } => {
            vec![format!(
                "broadcast_dimensions = {}",
                i64_array(broadcast_dimensions)
            )]
        }
        OpKind::Transpose { permutation } => {
            vec![format!("permutation = {}", i64_array(permutation))]
        }
        OpKind::Reverse { dimensions } | OpKind::Reduce { dimensions } => {
            vec![format!("dimensions = {}", i64_array(dimensions))]
        }
        OpKind::Slice {
            start_indices,
            limit_indices,
            strides,
        } => vec![
            format!("limit_indices = {}", i64_array(limit_indices)),
            format!("start_indices = {}", i64_array(start_indices)),
            format!("strides = {}", i64_array(strides)),
        ],
        OpKind::DynamicSlice { slice_sizes } => {
            vec![format!("slice_sizes = {}", i64_array(slice_sizes))]
        }
        OpKind::GatherRows { row_dims } => {
            let mut slice_sizes = vec![1];
            slice_sizes.extend_from_slice(row_dims);
            vec![
                format!(
                    "dimension_numbers = #stablehlo.gather<{}collapsed_slice_dims = [0], \
                     start_index_map = [0], index_vector_dim = 1>",
                    window_dims("offset_dims", row_dims.len())
                ),
                "indices_are_sorted = false".to_string(),
                format!("slice_sizes = {}", i64_array(&slice_sizes)),
            ]
        }
        OpKind::ScatterAddRows { row_dims } => vec![
            "indices_are_sorted = false".to_string(),
            format!(
                "scatter_dimension_numbers = #stablehlo.scatter<{}inserted_window_dims = [0], \
                 scatter_dims_to_operand_dims = [0], index_vector_dim = 1>",
                window_dims("update_window_dims", row_dims.len())
            ),
            "unique_indices = false".to_string(),
        ],
        OpKind::Concatenate { dimension } => vec![format!("dimension = {dimension} : i64")],
        OpKind::Pad {
            low,
            high,
            interior,
        } => vec![
            format!("edge_padding_high = {}", i64_array(high)),
            format!("edge_padding_low = {}", i64_array(low)),
            format!("interior_padding = {}", i64_array(interior)),
        ],
        OpKind::DotGeneral { dims, precision } => {
            let mut fields = Vec::new();
            for (name, list) in [
                ("lhs_batching_dimensions", &dims.lhs_batch),
                ("rhs_batching_dimensions", &dims.rhs_batch),
                ("lhs_contracting_dimensions", &dims.lhs_contracting),
                ("rhs_contracting_dimensions", &dims.rhs_contracting),
            ] {
                if !list.is_empty() {
                    fields.push(format!("{name} = {}", bracket_list(list)));
                }
            }
            let mut attrs = vec![format!(
                "dot_dimension_numbers = #stablehlo.dot<{}>",
                fields.join(", ")
            )];
            if let Some([a, b]) = precision {
                attrs.push(format!(
                    "precision_config = [#stablehlo<precision {}>, #stablehlo<precision {}>]",
                    a.as_str(),
                    b.as_str()
                ));
            }
            attrs
        }
        OpKind::CustomCall(c) => custom_call_attrs(c, num_results),
        OpKind::Call { callee } => vec![format!("callee = @{}", symbol(callee))],
        OpKind::AllToAll {
            split_dimension,
            concat_dimension,
            split_count,
            attrs,
        } => {
            let mut v = channel_attr(attrs.channel);
            v.push(format!("concat_dimension = {concat_dimension} : i64"));
            v.push(format!(
                "replica_groups = {}",
                replica_groups(&attrs.replica_groups)
            ));
            v.push(format!("split_count = {split_count} : i64"));
            v.push(format!("split_dimension = {split_dimension} : i64"));
            v
        }
        OpKind::AllGather {
            all_gather_dim,
            attrs,
        } => {
            let mut v = vec![format!("all_gather_dim = {all_gather_dim} : i64")];
            v.extend(group_attrs(attrs, None));
            v
        }
        OpKind::CollectivePermute {
            source_target_pairs,
            channel,
        } => {
            let mut v = channel_attr(*channel);
            let pairs: Vec<Vec<i64>> = source_target_pairs
                .iter()
                .map(|&(s, t)| vec![s, t])
                .collect();
            v.push(format!("source_target_pairs = {}", i64_matrix(&pairs, 2)));
            v
        }
        OpKind::AllReduce { attrs } => group_attrs(attrs, None),
        OpKind::ReduceScatter {
            scatter_dimension,
            attrs,
        } => group_attrs(
            attrs,
            Some(format!("scatter_dimension = {scatter_dimension} : i64")),
        ),
    }
}

/// `name = [1, ..., rank], ` for the result dims of a row gather or the update dims of a
/// row scatter (dim 0 holds the `[N]` indices), or nothing for rows of no dims (MLIR leaves
/// an empty list out).
fn window_dims(name: &str, rank: usize) -> String {
    if rank == 0 {
        return String::new();
    }
    let dims: Vec<i64> = (1..=rank as i64).collect();
    format!("{name} = {}, ", bracket_list(&dims))
}

/// `channel_handle`, `replica_groups`, `extra` (e.g. `scatter_dimension`),
/// `use_global_device_ids`: alphabetical, as MLIR prints them.
fn group_attrs(attrs: &CollectiveAttrs, extra: Option<String>) -> Vec<String> {
    let mut v = channel_attr(attrs.channel);
    v.push(format!(
        "replica_groups = {}",
        replica_groups(&attrs.replica_groups)
    ));
    v.extend(extra);
    if attrs.use_global_device_ids {
        v.push("use_global_device_ids".to_string());
    }
    v
}

fn channel_attr(channel: Option<ChannelHandle>) -> Vec<String> {
    channel
        .map(|c| {
            format!(
                "channel_handle = #stablehlo.channel_handle<handle = {}, type = {}>",
                c.handle, c.kind
            )
        })
        .into_iter()
        .collect()
}

fn custom_call_attrs(c: &CustomCall, num_results: usize) -> Vec<String> {
    let mut v = vec![format!("api_version = {} : i32", c.api_version.as_i32())];
    if !c.backend_config.is_empty() {
        v.push(format!("backend_config = {}", quote(&c.backend_config)));
    }
    v.push(format!("call_target_name = {}", quote(&c.call_target_name)));
    if c.has_side_effect {
        v.push("has_side_effect = true".to_string());
    }
    if let Some(l) = &c.operand_layouts {
        v.push(format!("operand_layouts = {}", layouts(l)));
    }
    if !c.output_operand_aliases.is_empty() {
        let aliases: Vec<String> = c
            .output_operand_aliases
            .iter()
            .map(|a| {
                let out = if num_results > 1 { format!("[{}]", a.output) } else { "[]".to_string() };
                format!(
                    "#stablehlo.output_operand_alias<output_tuple_indices = {out}, operand_index = {}, operand_tuple_indices = []>",
                    a.operand
                )
            })
            .collect();
        v.push(format!("output_operand_aliases = [{}]", aliases.join(", ")));
    }
    if let Some(l) = &c.result_layouts {
        v.push(format!("result_layouts = {}", layouts(l)));
    }
    if let Some(s) = &c.sharding {
        v.push(format!("mhlo.sharding = {}", quote(s.as_str())));
    }
    for (name, value) in &c.extra_attrs {
        v.push(format!("{name} = {value}"));
    }
    v
}

fn layouts(ls: &[Vec<i64>]) -> String {
    let items: Vec<String> = ls
        .iter()
        .map(|l| {
            if l.is_empty() {
                "dense<> : tensor<0xindex>".to_string()
            } else {
                format!("dense<{}> : tensor<{}xindex>", bracket_list(l), l.len())
            }
        })
        .collect();
    format!("[{}]", items.join(", "))
}

/// ` {sharding, tf.aliasing_output = N : i32}` of an argument; empty without either.
fn arg_attrs(sharding: Option<String>, alias: Option<usize>) -> String {
    let attrs: Vec<String> = sharding
        .into_iter()
        .chain(alias.map(|o| format!("tf.aliasing_output = {o} : i32")))
        .collect();
    if attrs.is_empty() {
        String::new()
    } else {
        format!(" {{{}}}", attrs.join(", "))
    }
}

fn sharding_attr(s: Option<&Sharding>) -> String {
    s.map(|s| format!(" {{mhlo.sharding = {}}}", quote(s.as_str())))
        .unwrap_or_default()
}

/// `array<i64: 1, 2>` (DenseI64ArrayAttr); `array<i64>` when empty.
fn i64_array(v: &[i64]) -> String {
    if v.is_empty() {
        "array<i64>".to_string()
    } else {
        let items: Vec<String> = v.iter().map(|x| x.to_string()).collect();
        format!("array<i64: {}>", items.join(", "))
    }
}

/// `[1, 2]`.
fn bracket_list(v: &[i64]) -> String {
    let items: Vec<String> = v.iter().map(|x| x.to_string()).collect();
    format!("[{}]", items.join(", "))
}

fn replica_groups(groups: &[Vec<i64>]) -> String {
    i64_matrix(groups, groups.first().map_or(0, |g| g.len()))
}

/// `dense<[[0, 1], [2, 3]]> : tensor<2x2xi64>`.
fn i64_matrix(rows: &[Vec<i64>], cols: usize) -> String {
    let body: Vec<String> = rows.iter().map(|r| bracket_list(r)).collect();
    format!(
        "dense<[{}]> : tensor<{}x{}xi64>",
        body.join(", "),
        rows.len(),
        cols
    )
}

/// An MLIR string literal: `"` and `\` escaped, other non-printable bytes as `\XX`.
pub(crate) fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for b in s.bytes() {
        match b {
            b'"' => out.push_str("\\\""),
            b'\\' => out.push_str("\\\\"),
            0x20..=0x7E => out.push(b as char),
            _ => {
                let _ = write!(out, "\\{b:02X}");
            }
        }
    }
    out.push('"');
    out
}

/// A symbol name: bare when it is an identifier, else a quoted string.
fn symbol(name: &str) -> String {
    let mut chars = name.chars();
    let bare = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '$' | '.'));
    if bare {
        name.to_string()
    } else {
        quote(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_and_symbols() {
        assert_eq!(quote("a\"b\\c\n"), "\"a\\\"b\\\\c\\0A\"");
        assert_eq!(symbol("main"), "main");
        assert_eq!(symbol("my.fn_2"), "my.fn_2");
        assert_eq!(symbol("2x"), "\"2x\"");
        assert_eq!(symbol("a b"), "\"a b\"");
        assert_eq!(i64_array(&[]), "array<i64>");
        assert_eq!(i64_array(&[1, 0]), "array<i64: 1, 0>");
        assert_eq!(
            replica_groups(&[vec![0, 1], vec![2, 3]]),
            "dense<[[0, 1], [2, 3]]> : tensor<2x2xi64>"
        );
    }
}
