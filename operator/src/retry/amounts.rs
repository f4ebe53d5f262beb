//! The resource amounts of one attempt (pure), counted with `plumbing::quantity`.

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::plumbing::quantity::{cpu_text, memory_text};

/// Resource amounts of one attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Amounts {
    /// Memory in bytes.
    pub memory: u64,
    /// CPU in millicores.
    pub cpu: u64,
}

impl Amounts {
    /// The memory as a quantity: whole GiB or MiB when it is, else bytes.
    pub fn memory_quantity(&self) -> Quantity {
        Quantity(memory_text(self.memory))
    }

    /// The CPU as a quantity: whole cores when it is, else millicores.
    pub fn cpu_quantity(&self) -> Quantity {
        Quantity(cpu_text(self.cpu))
    }
}
