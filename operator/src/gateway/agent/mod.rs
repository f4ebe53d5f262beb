//! Calls to a sandbox's agent: the route table (one entry per agent route, for the router, the
//! OpenAPI document and the calls recognised before the router: [`table`], [`routes`]), their paths
//! ([`paths`]), and the proxy that forwards them to the pod IP with the sandbox's token ([`proxy`]),
//! the endpoints and tokens already found per version of a sandbox and its pod ([`access_memo`]),
//! and port-forward tunnels, upgraded connections spliced to the agent's ([`tunnel`]).

pub mod access_memo;
pub mod paths;
pub mod proxy;
pub mod routes;
pub mod table;
pub mod tunnel;
