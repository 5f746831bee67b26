//! tessera-splash: splash attention kernels (see the splash issue).
