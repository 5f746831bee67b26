//! Shared helpers of the collectives tests: a host-side reference written independently of
//! the crate (plain index arithmetic on `f32` arrays), and conversions to device buffers.
#![allow(dead_code)]

use tessera_collectives::{DimSpec, MeshShape, PartitionSpec};
use tessera_hlo::{DType, HostArray};
use tessera_runtime::{Client, HostBuffer};

/// The process-wide CPU client with `n` devices.
pub fn client(n: usize) -> Client {
    Client::cpu_shared(n).unwrap_or_else(|e| panic!("cannot create a {n}-device CPU client: {e}"))
}

/// A dense row-major `f32` array.
#[derive(Debug, Clone, PartialEq)]
pub struct Arr {
    pub dims: Vec<usize>,
    pub data: Vec<f32>,
}

impl Arr {
    pub fn from_fn(dims: &[usize], mut f: impl FnMut(&[usize]) -> f32) -> Arr {
        let n: usize = dims.iter().product();
        let mut data = Vec::with_capacity(n);
        let mut idx = vec![0; dims.len()];
        for _ in 0..n {
            data.push(f(&idx));
            for k in (0..dims.len()).rev() {
                idx[k] += 1;
                if idx[k] < dims[k] {
                    break;
                }
                idx[k] = 0;
            }
        }
        Arr {
            dims: dims.to_vec(),
            data,
        }
    }

    /// Random integers in [-16, 16]: exact in bf16, and so are sums of up to 8 of them.
    pub fn random(dims: &[usize], rng: &mut fastrand::Rng) -> Arr {
        Arr::from_fn(dims, |_| rng.i32(-16..=16) as f32)
    }

    pub fn zeros(dims: &[usize]) -> Arr {
        Arr::from_fn(dims, |_| 0.0)
    }

    pub fn at(&self, idx: &[usize]) -> f32 {
        let mut o = 0;
        for (k, &i) in idx.iter().enumerate() {
            assert!(i < self.dims[k]);
            o = o * self.dims[k] + i;
        }
        self.data[o]
    }

    /// Block `i` of `parts` equal blocks along `dim`.
    pub fn block(&self, dim: usize, parts: usize, i: usize) -> Arr {
        assert_eq!(self.dims[dim] % parts, 0);
        let len = self.dims[dim] / parts;
        let mut dims = self.dims.clone();
        dims[dim] = len;
        Arr::from_fn(&dims, |idx| {
            let mut g = idx.to_vec();
            g[dim] += i * len;
            self.at(&g)
        })
    }

    pub fn add(&self, other: &Arr) -> Arr {
        assert_eq!(self.dims, other.dims);
        Arr {
            dims: self.dims.clone(),
            data: self
                .data
                .iter()
                .zip(&other.data)
                .map(|(a, b)| a + b)
                .collect(),
        }
    }

    pub fn dot(&self, other: &Arr) -> f64 {
        assert_eq!(self.dims, other.dims);
        self.data
            .iter()
            .zip(&other.data)
            .map(|(&a, &b)| f64::from(a) * f64::from(b))
            .sum()
    }

    pub fn dims_i64(&self) -> Vec<i64> {
        self.dims.iter().map(|&d| d as i64).collect()
    }
}

/// Mesh coordinates of a device id (row-major).
pub fn coords(device: usize, sizes: &[usize]) -> Vec<usize> {
    let mut c = vec![0; sizes.len()];
    let mut rest = device;
    for k in (0..sizes.len()).rev() {
        c[k] = rest % sizes[k];
        rest /= sizes[k];
    }
    c
}

/// Mesh-axis index of each dim's split (`None`: replicated).
pub fn axes_of<M: MeshShape>(spec: &PartitionSpec) -> Vec<Option<usize>> {
    spec.dims()
        .iter()
        .map(|d| match d {
            DimSpec::Replicated => None,
            DimSpec::Split(a) => Some(M::AXES.iter().position(|x| x == a).unwrap()),
        })
        .collect()
}

/// The block of `global` that the device at `coords` holds under `spec`.
pub fn local(global: &Arr, spec: &[Option<usize>], sizes: &[usize], coords: &[usize]) -> Arr {
    let mut a = global.clone();
    for (dim, s) in spec.iter().enumerate() {
        if let Some(axis) = *s {
            a = a.block(dim, sizes[axis], coords[axis]);
        }
    }
    a
}

pub fn to_buffer(a: &Arr, dtype: DType) -> HostBuffer {
    let values: Vec<f64> = a.data.iter().map(|&x| f64::from(x)).collect();
    let array = HostArray::from_f64(dtype, a.dims.clone(), &values).unwrap();
    HostBuffer::from_array(&array).unwrap()
}

pub fn from_buffer(b: &HostBuffer) -> Arr {
    let array = b.to_array().unwrap();
    Arr {
        dims: array.shape().to_vec(),
        data: array.to_f32_vec(),
    }
}
