//! [`StoreType`]: the store type names `create` accepts.

use std::fmt;

use super::Error;

/// The names [`create`](super::create) accepts, for error messages.
pub(crate) const VALID_NAMES: &str =
    "local, device, local_update_cpu, local_allreduce_cpu, local_allreduce_device, dist_sync, dist_async, dist_device_sync (and dist, dist_sync_device)";

/// A store type, parsed from its name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreType {
    /// In-process, values summed on the CPU (`local`, `local_update_cpu`, `local_allreduce_cpu`).
    Local,
    /// In-process, multi-device reduction (`device`, `local_allreduce_device`); accepts gradient
    /// compression.
    Device,
    /// Distributed, synchronous (`dist_sync`, `dist`).
    DistSync,
    /// Distributed, asynchronous (`dist_async`).
    DistAsync,
    /// Distributed, synchronous, devices reduced on the worker first (`dist_device_sync`,
    /// `dist_sync_device`).
    DistDeviceSync,
}

impl StoreType {
    /// Parses a (case-insensitive) store type name.
    pub fn parse(name: &str) -> Result<StoreType, Error> {
        Ok(match name.to_ascii_lowercase().as_str() {
            "local" | "local_update_cpu" | "local_allreduce_cpu" => StoreType::Local,
            "device" | "local_allreduce_device" => StoreType::Device,
            "dist_sync" | "dist" => StoreType::DistSync,
            "dist_async" => StoreType::DistAsync,
            "dist_device_sync" | "dist_sync_device" => StoreType::DistDeviceSync,
            _ => return Err(Error::UnknownStoreType { name: name.to_string(), valid: VALID_NAMES }),
        })
    }

    /// Whether this is a distributed type.
    pub fn is_dist(self) -> bool {
        matches!(self, StoreType::DistSync | StoreType::DistAsync | StoreType::DistDeviceSync)
    }
}

impl fmt::Display for StoreType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            StoreType::Local => "local",
            StoreType::Device => "device",
            StoreType::DistSync => "dist_sync",
            StoreType::DistAsync => "dist_async",
            StoreType::DistDeviceSync => "dist_device_sync",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(StoreType::parse("local_allreduce_cpu").unwrap(), StoreType::Local);
        assert_eq!(StoreType::parse("Local_Allreduce_Device").unwrap(), StoreType::Device);
        assert_eq!(StoreType::parse("dist").unwrap(), StoreType::DistSync);
        let err = StoreType::parse("foo").unwrap_err().to_string();
        assert!(err.contains("foo") && err.contains("local_allreduce_device"), "{err}");
    }
}
