//! Shared pieces of the orchard-agent fuzz targets: scratch directories (`scratch`), the JSON request
//! harness that goes through the agent's own body extractor (`requests`), a unified-diff generator and
//! renderer for the patch targets (`diff`), and a model of how the kernel resolves a path, used as the
//! oracle of the path-protection targets (`resolve`).

pub mod diff;
pub mod requests;
pub mod resolve;
pub mod scratch;
