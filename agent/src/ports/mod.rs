//! Port forwarding into the pod: `GET /v1/ports/{port}/tunnel` upgrades the HTTP connection to a raw
//! TCP stream connected to `127.0.0.1:{port}` (or `[::1]:{port}`) inside the pod. `request` holds the
//! pure checks (port, upgrade headers), `slots` the cap on open tunnels, `tunnel` the route and the
//! byte copying.

pub mod request;
pub mod slots;
pub mod tunnel;
