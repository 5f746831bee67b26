//! Array shapes, and the entry signature of a compiled program read from its optimized
//! `xla.HloModuleProto` (only the fields needed are declared, with `prost` derive).

use std::fmt;

use prost::Message;

use crate::element::ElementType;

/// Element type and dimensions of a dense array.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ArrayShape {
    /// Element type.
    pub element_type: ElementType,
    /// Dimensions, major to minor.
    pub dims: Vec<i64>,
}

impl fmt::Display for ArrayShape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("tensor<")?;
        for d in &self.dims {
            write!(f, "{d}x")?;
        }
        write!(f, "{}>", self.element_type)
    }
}

/// `xla.HloModuleProtoWithConfig` (subset): what plugins return as format `hlo_with_config`.
#[derive(Clone, PartialEq, Message)]
struct HloModuleProtoWithConfig {
    #[prost(message, optional, tag = "1")]
    hlo_module: Option<HloModuleProto>,
}

/// `xla.HloModuleProto` (subset).
#[derive(Clone, PartialEq, Message)]
struct HloModuleProto {
    #[prost(message, optional, tag = "4")]
    host_program_shape: Option<ProgramShapeProto>,
}

/// `xla.ProgramShapeProto` (subset).
#[derive(Clone, PartialEq, Message)]
struct ProgramShapeProto {
    #[prost(message, repeated, tag = "1")]
    parameters: Vec<ShapeProto>,
}

/// `xla.ShapeProto` (subset).
#[derive(Clone, PartialEq, Message)]
struct ShapeProto {
    #[prost(int32, tag = "2")]
    element_type: i32,
    #[prost(int64, repeated, tag = "3")]
    dimensions: Vec<i64>,
    #[prost(bool, repeated, tag = "6")]
    is_dynamic_dimension: Vec<bool>,
}

/// Maps an `xla.PrimitiveType` (not the same numbering as `PJRT_Buffer_Type`).
fn from_primitive_type(t: i32) -> Option<ElementType> {
    Some(match t {
        1 => ElementType::Pred,
        2 => ElementType::I8,
        4 => ElementType::I32,
        5 => ElementType::I64,
        6 => ElementType::U8,
        8 => ElementType::U32,
        10 => ElementType::F16,
        11 => ElementType::F32,
        12 => ElementType::F64,
        16 => ElementType::BF16,
        _ => return None,
    })
}

/// The entry parameters of a serialized `HloModuleProto` (or, `with_config`, of an
/// `HloModuleProtoWithConfig`), or `None` when they cannot be expressed as [`ArrayShape`]s
/// (tuples, dynamic dimensions, other element types, no program shape, undecodable bytes).
pub(crate) fn entry_parameters(bytes: &[u8], with_config: bool) -> Option<Vec<ArrayShape>> {
    let module = if with_config {
        HloModuleProtoWithConfig::decode(bytes).ok()?.hlo_module?
    } else {
        HloModuleProto::decode(bytes).ok()?
    };
    module
        .host_program_shape?
        .parameters
        .into_iter()
        .map(|p| {
            if p.is_dynamic_dimension.iter().any(|&d| d) {
                return None;
            }
            Some(ArrayShape {
                element_type: from_primitive_type(p.element_type)?,
                dims: p.dimensions,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_entry_parameters() {
        let module = HloModuleProto {
            host_program_shape: Some(ProgramShapeProto {
                parameters: vec![
                    ShapeProto {
                        element_type: 16,
                        dimensions: vec![2, 3],
                        is_dynamic_dimension: vec![],
                    },
                    ShapeProto {
                        element_type: 1,
                        dimensions: vec![],
                        is_dynamic_dimension: vec![],
                    },
                ],
            }),
        };
        let params = entry_parameters(&module.encode_to_vec(), false).unwrap();
        let wrapped = HloModuleProtoWithConfig {
            hlo_module: Some(module.clone()),
        };
        assert_eq!(
            entry_parameters(&wrapped.encode_to_vec(), true),
            Some(params.clone())
        );
        assert_eq!(params[0].to_string(), "tensor<2x3xbf16>");
        assert_eq!(
            params[1],
            ArrayShape {
                element_type: ElementType::Pred,
                dims: vec![]
            }
        );

        let tuple = HloModuleProto {
            host_program_shape: Some(ProgramShapeProto {
                parameters: vec![ShapeProto {
                    element_type: 13,
                    dimensions: vec![],
                    is_dynamic_dimension: vec![],
                }],
            }),
        };
        assert_eq!(entry_parameters(&tuple.encode_to_vec(), false), None);
        assert_eq!(entry_parameters(b"\xff\xff", false), None);
    }
}
