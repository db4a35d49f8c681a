//! [`Context`]: the device an array lives on.

use std::fmt;

/// A kind of device. Only the CPU exists today; the enum is `non_exhaustive` so a CUDA device
/// can be added without breaking callers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum DeviceType {
    /// Host memory. Several `cpu(i)` contexts stand for several devices of one process, as in
    /// MXNet, so multi-device code runs (and is tested) on a CPU-only machine.
    Cpu,
}

/// A device: its type and index, e.g. `cpu(0)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Context {
    /// The kind of device.
    pub device_type: DeviceType,
    /// The index among devices of that kind.
    pub device_id: usize,
}

impl Context {
    /// The `id`-th CPU context.
    pub const fn cpu(id: usize) -> Context {
        Context { device_type: DeviceType::Cpu, device_id: id }
    }
}

impl Default for Context {
    fn default() -> Self {
        Context::cpu(0)
    }
}

impl fmt::Display for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.device_type {
            DeviceType::Cpu => write!(f, "cpu({})", self.device_id),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display() {
        assert_eq!(Context::cpu(1).to_string(), "cpu(1)");
        assert_eq!(Context::default(), Context::cpu(0));
    }
}
