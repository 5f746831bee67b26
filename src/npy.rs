//! `.npy` files in and out of host arrays (float32, int32, int8 and bool files). numpy has no
//! bf16: bf16 arrays are written as float32 (exactly), and a uint16 file is read as raw bf16
//! bit patterns (what `x.astype(ml_dtypes.bfloat16).view(np.uint16)` saves).

use std::io::{BufReader, BufWriter};
use std::path::{Path, PathBuf};

use npyz::WriterBuilder;
use tessera_dsl::array::ArrayData;
use tessera_dsl::HostArray;

/// A `.npy` file that could not be read or written, naming the file.
#[derive(Debug, thiserror::Error)]
#[error("{}: {message}", path.display())]
pub struct NpyError {
    pub path: PathBuf,
    pub message: String,
}

fn fail(path: &Path, message: impl ToString) -> NpyError {
    NpyError {
        path: path.to_path_buf(),
        message: message.to_string(),
    }
}

/// Reads a C-ordered `.npy` file of float32, int32, int8, bool, or uint16 (raw bf16 bits).
pub fn read_npy(path: &Path) -> Result<HostArray, NpyError> {
    let file = std::fs::File::open(path).map_err(|e| fail(path, format!("cannot open: {e}")))?;
    let npy = npyz::NpyFile::new(BufReader::new(file))
        .map_err(|e| fail(path, format!("not a valid .npy file: {e}")))?;
    if npy.order() != npyz::Order::C {
        return Err(fail(
            path,
            "Fortran-ordered arrays are not supported; save with np.ascontiguousarray",
        ));
    }
    let shape: Vec<usize> = npy.shape().iter().map(|&d| d as usize).collect();
    let descr = npy.dtype().descr();
    let read_err = |e: std::io::Error| fail(path, format!("cannot read the data: {e}"));
    let data = match descr.as_str() {
        "'<f4'" => ArrayData::F32(npy.into_vec::<f32>().map_err(read_err)?),
        "'<i4'" => ArrayData::I32(npy.into_vec::<i32>().map_err(read_err)?),
        "'|i1'" => ArrayData::I8(npy.into_vec::<i8>().map_err(read_err)?),
        "'|b1'" => ArrayData::Bool(npy.into_vec::<bool>().map_err(read_err)?),
        "'<u2'" => ArrayData::BF16(
            npy.into_vec::<u16>()
                .map_err(read_err)?
                .into_iter()
                .map(half::bf16::from_bits)
                .collect(),
        ),
        other => {
            return Err(fail(
                path,
                format!("dtype {other} is not supported; save as float32, int32, int8, bool or uint16 bf16 bits (e.g. x.astype(np.float32))"),
            ))
        }
    };
    HostArray::new(shape, data).map_err(|e| fail(path, e))
}

/// Writes `a` as a C-ordered `.npy` file (bf16 as float32).
pub fn write_npy(path: &Path, a: &HostArray) -> Result<(), NpyError> {
    let file =
        std::fs::File::create(path).map_err(|e| fail(path, format!("cannot create: {e}")))?;
    let shape: Vec<u64> = a.shape().iter().map(|&d| d as u64).collect();
    let mut out = BufWriter::new(file);
    let io = |e: std::io::Error| fail(path, format!("cannot write: {e}"));
    macro_rules! write_all {
        ($t:ty, $iter:expr) => {{
            let mut w = npyz::WriteOptions::<$t>::new()
                .default_dtype()
                .shape(&shape)
                .writer(&mut out)
                .begin_nd()
                .map_err(io)?;
            w.extend($iter).map_err(io)?;
            w.finish().map_err(io)?;
        }};
    }
    match a.data() {
        ArrayData::F32(v) => write_all!(f32, v.iter().copied()),
        ArrayData::BF16(v) => write_all!(f32, v.iter().map(|x| x.to_f32())),
        ArrayData::I32(v) => write_all!(i32, v.iter().copied()),
        ArrayData::I8(v) => write_all!(i8, v.iter().copied()),
        ArrayData::Bool(v) => write_all!(bool, v.iter().copied()),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_every_supported_dtype() {
        let dir = std::env::temp_dir().join(format!("tessera-npy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let arrays = [
            HostArray::f32([2, 3], vec![1.0, -2.5, 3.0, f32::INFINITY, 0.0, 7.25]).unwrap(),
            HostArray::i32([3], vec![1, -2, i32::MAX]).unwrap(),
            HostArray::new([2], ArrayData::I8(vec![-128, 127])).unwrap(),
            HostArray::new([2, 1], ArrayData::Bool(vec![true, false])).unwrap(),
        ];
        for (i, a) in arrays.iter().enumerate() {
            let p = dir.join(format!("{i}.npy"));
            write_npy(&p, a).unwrap();
            assert_eq!(&read_npy(&p).unwrap(), a);
        }
        let bf = HostArray::from_f64(tessera_dsl::DType::BF16, [2], &[1.5, -3.0]).unwrap();
        let p = dir.join("bf16.npy");
        write_npy(&p, &bf).unwrap();
        assert_eq!(
            read_npy(&p).unwrap(),
            HostArray::f32([2], vec![1.5, -3.0]).unwrap()
        );
        // uint16 files are raw bf16 bits: 0x3FC0 = 1.5, 0xC040 = -3.0.
        let p = dir.join("bits.npy");
        let mut w = npyz::WriteOptions::<u16>::new()
            .default_dtype()
            .shape(&[2])
            .writer(BufWriter::new(std::fs::File::create(&p).unwrap()))
            .begin_nd()
            .unwrap();
        w.extend([0x3FC0u16, 0xC040]).unwrap();
        w.finish().unwrap();
        assert_eq!(read_npy(&p).unwrap(), bf);
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn errors_name_the_file() {
        let missing = Path::new("/nonexistent/x.npy");
        let e = read_npy(missing).unwrap_err().to_string();
        assert!(e.starts_with("/nonexistent/x.npy: cannot open"), "{e}");
        let dir = std::env::temp_dir().join(format!("tessera-npy-bad-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let bad = dir.join("bad.npy");
        std::fs::write(&bad, b"not numpy").unwrap();
        let e = read_npy(&bad).unwrap_err().to_string();
        assert!(e.contains("not a valid .npy file"), "{e}");
        std::fs::remove_dir_all(&dir).ok();
    }
}
