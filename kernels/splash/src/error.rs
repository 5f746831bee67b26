//! Errors: each names the culprit and how to fix it.

use tessera_dsl::KernelError;

/// Why a splash attention could not be set up or run.
#[derive(Debug, thiserror::Error)]
pub enum SplashError {
    /// A block size that does not fit the sequence, its compute block or the TPU tiling.
    #[error("block sizes: {0}")]
    BlockSizes(String),
    /// Inputs of the wrong rank, shape, dtype or values.
    #[error("inputs: {0}")]
    Shape(String),
    /// A mask that cannot be used (bad parameters, wrong extent, wrong head count).
    #[error("mask: {0}")]
    Mask(String),
    /// An option out of range (scale, soft cap, mask value).
    #[error("options: {0}")]
    Options(String),
    /// A kernel failed to instantiate or run.
    #[error(transparent)]
    Kernel(#[from] KernelError),
    /// Building a StableHLO program around the kernels failed. (The message includes the
    /// cause, so it is not also a `source`: a chain printer would repeat it.)
    #[error("program: {0}")]
    Program(tessera_hlo::HloError),
    /// The backend that ran a kernel failed.
    #[error("backend: {0}")]
    Backend(String),
}

impl From<tessera_hlo::HloError> for SplashError {
    fn from(e: tessera_hlo::HloError) -> Self {
        SplashError::Program(e)
    }
}
