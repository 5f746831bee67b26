//! Compile options, serialized as the `xla.CompileOptionsProto` that PJRT expects.
//!
//! Only the fields tessera sets are declared (with `prost` derive, no `protoc`); protobuf
//! ignores nothing it is not sent, so the plugin sees defaults for everything else. Field
//! numbers are those of `xla/pjrt/proto/compile_options.proto` and `xla/xla_data.proto`.

use prost::Message;

use crate::error::{CompileOptionsError, Error, Result};

/// Which device runs which (replica, partition) of a program: `ids[partition][replica]` is the
/// device id (`PJRT_DeviceDescription_Id`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceAssignment {
    replicas: usize,
    partitions: usize,
    ids: Vec<Vec<i64>>,
}

impl DeviceAssignment {
    /// An explicit assignment; `ids[partition][replica]` is a device id. Fails if the table is
    /// not `partitions x replicas`, is empty, or names a device twice.
    pub fn new(ids: Vec<Vec<i64>>) -> Result<Self> {
        let partitions = ids.len();
        let replicas = ids.first().map_or(0, Vec::len);
        if partitions == 0 || replicas == 0 {
            return Err(Error::InvalidCompileOptions(
                CompileOptionsError::EmptyAssignment,
            ));
        }
        if let Some((p, row)) = ids
            .iter()
            .enumerate()
            .find(|(_, row)| row.len() != replicas)
        {
            return Err(Error::InvalidCompileOptions(
                CompileOptionsError::RaggedAssignment {
                    row: p,
                    replicas: row.len(),
                    first_row: replicas,
                },
            ));
        }
        let mut seen: Vec<i64> = ids.iter().flatten().copied().collect();
        seen.sort_unstable();
        if let Some(w) = seen.windows(2).find(|w| w[0] == w[1]) {
            return Err(Error::InvalidCompileOptions(
                CompileOptionsError::DuplicateDevice { device: w[0] },
            ));
        }
        if let Some(&neg) = seen.first().filter(|&&d| d < 0) {
            return Err(Error::InvalidCompileOptions(
                CompileOptionsError::NegativeDevice { device: neg },
            ));
        }
        Ok(Self {
            replicas,
            partitions,
            ids,
        })
    }

    /// Devices `0..replicas*partitions` in order: partition `p`, replica `r` runs on device
    /// `p * replicas + r`.
    pub fn sequential(replicas: usize, partitions: usize) -> Result<Self> {
        let ids = (0..partitions)
            .map(|p| (0..replicas).map(|r| (p * replicas + r) as i64).collect())
            .collect();
        Self::new(ids)
    }

    /// Number of replicas.
    pub fn replicas(&self) -> usize {
        self.replicas
    }

    /// Number of partitions (computations).
    pub fn partitions(&self) -> usize {
        self.partitions
    }

    /// `ids()[partition][replica]` is a device id.
    pub fn ids(&self) -> &[Vec<i64>] {
        &self.ids
    }
}

/// Options of one compile: the fields of `xla.ExecutableBuildOptionsProto` tessera uses.
///
/// The two multi-device forms (see `notes/pjrt-runtime.md`):
/// * replicas: [`CompileOptions::replicated`], module attribute `mhlo.num_replicas = N`,
///   collectives with `replica_groups`;
/// * manual partitions (what `shard_map` emits): [`CompileOptions::manual_partitions`],
///   module attribute `mhlo.num_partitions = N`, arguments/results with
///   `mhlo.sharding = "{manual}"` (GSPMD's form, what compiles for TPU), or, with
///   [`CompileOptions::with_shardy`], Shardy's form (`sdy.mesh`, `sdy.manual_computation`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompileOptions {
    /// Number of replicas (>= 1).
    pub num_replicas: usize,
    /// Number of partitions (>= 1).
    pub num_partitions: usize,
    /// Run the SPMD partitioner (required for `num_partitions > 1`).
    pub use_spmd_partitioning: bool,
    /// Use Shardy instead of GSPMD: for modules in Shardy's form (`sdy.mesh`,
    /// `sdy.manual_computation`); a module with `mhlo.sharding` attributes falls back to GSPMD.
    pub use_shardy_partitioner: bool,
    /// Explicit device assignment; `None` lets the plugin choose (for a client compile).
    pub device_assignment: Option<DeviceAssignment>,
    /// XLA debug options for this compile, by name (`xla_cpu_use_xnnpack`, ...), applied over
    /// the plugin's defaults (`CompileOptionsProto.env_option_overrides`, what `XLA_FLAGS`
    /// would set, without touching the process environment). An unknown name fails the
    /// compile.
    pub xla_options: Vec<(String, XlaOption)>,
}

/// The value of an XLA debug option in [`CompileOptions::xla_options`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum XlaOption {
    Bool(bool),
    Int(i64),
    Str(String),
}

impl Default for CompileOptions {
    fn default() -> Self {
        Self::single_device()
    }
}

impl CompileOptions {
    /// One replica, one partition, plugin-chosen device.
    pub fn single_device() -> Self {
        Self {
            num_replicas: 1,
            num_partitions: 1,
            use_spmd_partitioning: false,
            use_shardy_partitioner: false,
            device_assignment: None,
            xla_options: Vec::new(),
        }
    }

    /// `n` replicas on devices `0..n`, no SPMD partitioning.
    pub fn replicated(n: usize) -> Result<Self> {
        Ok(Self {
            num_replicas: n,
            num_partitions: 1,
            use_spmd_partitioning: false,
            use_shardy_partitioner: false,
            device_assignment: Some(DeviceAssignment::sequential(n, 1)?),
            xla_options: Vec::new(),
        })
    }

    /// `n` manual partitions on devices `0..n`, SPMD partitioning on (the `shard_map` form).
    pub fn manual_partitions(n: usize) -> Result<Self> {
        Ok(Self {
            num_replicas: 1,
            num_partitions: n,
            use_spmd_partitioning: true,
            use_shardy_partitioner: false,
            device_assignment: Some(DeviceAssignment::sequential(1, n)?),
            xla_options: Vec::new(),
        })
    }

    /// Sets [`CompileOptions::use_shardy_partitioner`].
    pub fn with_shardy(mut self, shardy: bool) -> Self {
        self.use_shardy_partitioner = shardy;
        self
    }

    /// Adds an XLA debug option ([`CompileOptions::xla_options`]).
    pub fn with_xla_option(mut self, name: impl Into<String>, value: XlaOption) -> Self {
        self.xla_options.push((name.into(), value));
        self
    }

    /// Sets [`CompileOptions::device_assignment`].
    pub fn with_device_assignment(mut self, assignment: DeviceAssignment) -> Self {
        self.device_assignment = Some(assignment);
        self
    }

    /// Number of devices the program runs on: `num_replicas * num_partitions`.
    pub fn device_count(&self) -> usize {
        self.num_replicas.saturating_mul(self.num_partitions)
    }

    /// Checks consistency.
    pub fn validate(&self) -> Result<()> {
        if self.num_replicas == 0 || self.num_partitions == 0 {
            return Err(Error::InvalidCompileOptions(
                CompileOptionsError::NoDevices {
                    replicas: self.num_replicas,
                    partitions: self.num_partitions,
                },
            ));
        }
        if i32::try_from(self.device_count()).is_err() {
            return Err(Error::InvalidCompileOptions(
                CompileOptionsError::TooManyDevices,
            ));
        }
        if let Some(a) = &self.device_assignment {
            if a.replicas != self.num_replicas || a.partitions != self.num_partitions {
                return Err(Error::InvalidCompileOptions(
                    CompileOptionsError::AssignmentSize {
                        assigned_replicas: a.replicas,
                        assigned_partitions: a.partitions,
                        replicas: self.num_replicas,
                        partitions: self.num_partitions,
                    },
                ));
            }
        }
        Ok(())
    }

    /// Serializes to `xla.CompileOptionsProto` bytes (after [`CompileOptions::validate`]).
    pub fn to_proto_bytes(&self) -> Result<Vec<u8>> {
        self.validate()?;
        let device_assignment = self
            .device_assignment
            .as_ref()
            .map(|a| DeviceAssignmentProto {
                // Cannot truncate: validate() bounded replicas * partitions by i32::MAX.
                replica_count: a.replicas as i32,
                computation_count: a.partitions as i32,
                computation_devices: a
                    .ids
                    .iter()
                    .map(|row| ComputationDevice {
                        replica_device_ids: row.clone(),
                    })
                    .collect(),
            });
        let env_option_overrides = self
            .xla_options
            .iter()
            .map(|(name, value)| {
                let value = match value {
                    XlaOption::Bool(b) => OverrideValue::Bool(*b),
                    XlaOption::Int(i) => OverrideValue::Int(*i),
                    XlaOption::Str(s) => OverrideValue::String(s.clone()),
                };
                (name.clone(), OptionOverrideProto { value: Some(value) })
            })
            .collect();
        let proto = CompileOptionsProto {
            env_option_overrides,
            executable_build_options: Some(ExecutableBuildOptionsProto {
                device_ordinal: -1,
                num_replicas: self.num_replicas as i64,
                num_partitions: self.num_partitions as i64,
                use_spmd_partitioning: self.use_spmd_partitioning,
                device_assignment,
                use_shardy_partitioner: self.use_shardy_partitioner,
            }),
        };
        Ok(proto.encode_to_vec())
    }
}

/// `xla.CompileOptionsProto` (subset).
#[derive(Clone, PartialEq, Message)]
struct CompileOptionsProto {
    #[prost(message, optional, tag = "3")]
    executable_build_options: Option<ExecutableBuildOptionsProto>,
    #[prost(btree_map = "string, message", tag = "7")]
    env_option_overrides: std::collections::BTreeMap<String, OptionOverrideProto>,
}

/// `xla.OptionOverrideProto`.
#[derive(Clone, PartialEq, Message)]
struct OptionOverrideProto {
    #[prost(oneof = "OverrideValue", tags = "1, 2, 3")]
    value: Option<OverrideValue>,
}

/// `xla.OptionOverrideProto.value`.
#[derive(Clone, PartialEq, prost::Oneof)]
enum OverrideValue {
    #[prost(string, tag = "1")]
    String(String),
    #[prost(bool, tag = "2")]
    Bool(bool),
    #[prost(int64, tag = "3")]
    Int(i64),
}

/// `xla.ExecutableBuildOptionsProto` (subset).
#[derive(Clone, PartialEq, Message)]
struct ExecutableBuildOptionsProto {
    #[prost(int64, tag = "1")]
    device_ordinal: i64,
    #[prost(int64, tag = "4")]
    num_replicas: i64,
    #[prost(int64, tag = "5")]
    num_partitions: i64,
    #[prost(bool, tag = "6")]
    use_spmd_partitioning: bool,
    #[prost(message, optional, tag = "9")]
    device_assignment: Option<DeviceAssignmentProto>,
    #[prost(bool, tag = "19")]
    use_shardy_partitioner: bool,
}

/// `xla.DeviceAssignmentProto`.
#[derive(Clone, PartialEq, Message)]
struct DeviceAssignmentProto {
    #[prost(int32, tag = "1")]
    replica_count: i32,
    #[prost(int32, tag = "2")]
    computation_count: i32,
    #[prost(message, repeated, tag = "3")]
    computation_devices: Vec<ComputationDevice>,
}

/// `xla.DeviceAssignmentProto.ComputationDevice`.
#[derive(Clone, PartialEq, Message)]
struct ComputationDevice {
    #[prost(int64, repeated, tag = "1")]
    replica_device_ids: Vec<i64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_known_bytes() {
        // Hand-decoded expectation: field 3 (len-delimited) holding device_ordinal=-1,
        // num_replicas=1, num_partitions=2, use_spmd_partitioning=true, device_assignment
        // {1, 2, [{[0]}, {[1]}]}.
        let bytes = CompileOptions::manual_partitions(2)
            .unwrap()
            .to_proto_bytes()
            .unwrap();
        let mut expected = vec![0x1a];
        let mut inner = vec![0x08];
        inner.extend_from_slice(&[0xff; 9]);
        inner.push(0x01);
        inner.extend_from_slice(&[0x20, 0x01, 0x28, 0x02, 0x30, 0x01]);
        let da = [
            0x08, 0x01, 0x10, 0x02, 0x1a, 0x03, 0x0a, 0x01, 0x00, 0x1a, 0x03, 0x0a, 0x01, 0x01,
        ];
        inner.push(0x4a);
        inner.push(da.len() as u8);
        inner.extend_from_slice(&da);
        expected.push(inner.len() as u8);
        expected.extend_from_slice(&inner);
        assert_eq!(bytes, expected);
    }

    #[test]
    fn shardy_flag_is_field_19() {
        let bytes = CompileOptions::single_device()
            .with_shardy(true)
            .to_proto_bytes()
            .unwrap();
        // Field 19, varint: key = (19 << 3) | 0 = 152 = 0x98 0x01.
        assert!(bytes.windows(3).any(|w| w == [0x98, 0x01, 0x01]));
    }

    #[test]
    fn rejects_inconsistent_options() {
        assert!(CompileOptions::replicated(0).is_err());
        assert!(DeviceAssignment::new(vec![vec![0, 1], vec![2]]).is_err());
        assert!(DeviceAssignment::new(vec![vec![0], vec![0]]).is_err());
        assert!(DeviceAssignment::new(vec![vec![-1]]).is_err());
        let mut o = CompileOptions::manual_partitions(4).unwrap();
        o.num_partitions = 2;
        assert!(matches!(
            o.to_proto_bytes(),
            Err(Error::InvalidCompileOptions(_))
        ));
    }
}
