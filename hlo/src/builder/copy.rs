//! Copies of a region's ops with fresh values: autodiff re-emits a loop body in the loop it
//! rewrites and in the loop of its backward.

use std::collections::HashMap;
use std::rc::Rc;

use super::FuncBuilder;
use crate::autodiff::{Counterparts, VjpSpan};
use crate::ops::{ChannelHandle, CollectiveAttrs, Op, OpKind, Region, Value};
use crate::HloError;

impl FuncBuilder<'_> {
    /// Emits a copy of `region`'s ops into the region being built, its arguments replaced by
    /// `args` (values it captures stay the same), and returns the copies of the values it
    /// yields. Nested regions are copied too; collectives get channels of their own; the
    /// custom-VJP spans built in the region are registered again over the copies.
    pub(crate) fn copy_region(
        &mut self,
        region: &Region,
        args: &[Value],
    ) -> Result<Vec<Value>, HloError> {
        Ok(self.copy_region_with(region, args, &HashMap::new())?.0)
    }

    /// [`FuncBuilder::copy_region`], where the ops of the copy read each value of `region`
    /// that `saved` holds as its saved value rather than as its copy (the copy is still
    /// emitted; the backward's rules read the saved value too, and pruning drops the copy
    /// once nothing else reads it: see `kept_copies`). Also returns the copy of every value
    /// of `region`.
    pub(crate) fn copy_region_with(
        &mut self,
        region: &Region,
        args: &[Value],
        saved: &HashMap<Value, Value>,
    ) -> Result<(Vec<Value>, HashMap<Value, Value>), HloError> {
        let mut map: HashMap<Value, Value> = region
            .args
            .iter()
            .copied()
            .zip(args.iter().copied())
            .collect();
        let results = self.copy_into(region, &mut map, saved)?;
        for (v, copy) in map.iter_mut() {
            if saved.contains_key(v) {
                *copy = self.kept_copies[copy];
            }
        }
        Ok((results, map))
    }

    fn copy_into(
        &mut self,
        region: &Region,
        map: &mut HashMap<Value, Value>,
        saved: &HashMap<Value, Value>,
    ) -> Result<Vec<Value>, HloError> {
        let offset = self.frame().ops.len();
        for op in &region.ops {
            self.copy_op(op, map, saved)?;
        }
        let mapped = |v: &Value| *map.get(v).unwrap_or(v);
        let spans = region
            .args
            .first()
            .and_then(|a| self.region_spans.get(a))
            .cloned()
            .unwrap_or_default();
        // The copies of the region's values (and of those of the enclosing regions copied
        // so far), for the rules of its spans, which may have captured some of them.
        let copies = (!spans.is_empty()).then(|| Rc::new(map.clone()));
        for span in spans {
            let counterparts = match &copies {
                Some(copies) if span.counterparts.is_empty() => copies.clone(),
                // A copy of a copy: what the earlier copies stood in for reads as this copy.
                _ => {
                    let mut c: Counterparts = map.clone();
                    c.extend(span.counterparts.iter().map(|(&k, v)| (k, mapped(v))));
                    Rc::new(c)
                }
            };
            // A span's outputs are what its ops compute, also where the body reads a saved
            // value in their place.
            let outputs = span
                .outputs
                .iter()
                .map(|v| {
                    let v = mapped(v);
                    *self.kept_copies.get(&v).unwrap_or(&v)
                })
                .collect();
            self.frame_mut().spans.push(VjpSpan {
                rule: span.rule,
                inputs: span.inputs.iter().map(mapped).collect(),
                outputs,
                ops: span.ops.start + offset..span.ops.end + offset,
                counterparts,
            });
        }
        Ok(region.results.iter().map(mapped).collect())
    }

    fn copy_op(
        &mut self,
        op: &Op,
        map: &mut HashMap<Value, Value>,
        saved: &HashMap<Value, Value>,
    ) -> Result<(), HloError> {
        let operands = op
            .operands
            .iter()
            .map(|v| *map.get(v).unwrap_or(v))
            .collect();
        let mut regions = Vec::with_capacity(op.regions.len());
        for r in &op.regions {
            let types = r
                .args
                .iter()
                .map(|&a| self.value_type(a).cloned())
                .collect::<Result<Vec<_>, _>>()?;
            let (copy, _) = self.region(op.kind.name(), "copy", &types, false, |b, args| {
                map.extend(r.args.iter().copied().zip(args.iter().copied()));
                b.copy_into(r, map, saved)
            })?;
            regions.push(copy);
        }
        let types = op
            .results
            .iter()
            .map(|&v| self.value_type(v).cloned())
            .collect::<Result<Vec<_>, _>>()?;
        let kind = self.fresh_channels(&op.kind);
        let results = self.emit(kind, operands, types, regions);
        for (&v, copy) in op.results.iter().zip(results) {
            match saved.get(&v) {
                Some(&save) => {
                    map.insert(v, save);
                    self.kept_copies.insert(save, copy);
                    self.kept_saves.insert(copy, save);
                }
                None => {
                    map.insert(v, copy);
                }
            }
        }
        Ok(())
    }

    /// `kind` with a new channel where it has one (a module's channels are unique).
    fn fresh_channels(&mut self, kind: &OpKind) -> OpKind {
        let mut kind = kind.clone();
        let mut renew = |c: &mut Option<ChannelHandle>| {
            if c.is_some() {
                *c = Some(self.module.alloc_channel());
            }
        };
        match &mut kind {
            OpKind::AllToAll { attrs, .. }
            | OpKind::AllGather { attrs, .. }
            | OpKind::AllReduce { attrs }
            | OpKind::ReduceScatter { attrs, .. } => {
                let CollectiveAttrs { channel, .. } = attrs;
                renew(channel);
            }
            OpKind::CollectivePermute { channel, .. } => renew(channel),
            _ => {}
        }
        kind
    }
}
