//! The cap on open tunnels: a semaphore with a permit per tunnel, held for the tunnel's life.

use std::sync::Arc;

use tokio::sync::Semaphore;

/// Most tunnels open at once (429 beyond).
pub const MAX_TUNNELS: usize = 512;

/// The tunnels' permits.
pub fn tunnel_slots() -> Arc<Semaphore> {
    Arc::new(Semaphore::new(MAX_TUNNELS))
}
