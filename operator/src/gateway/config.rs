//! The gateway's flags (each with an environment variable), flattened into the operator's command
//! line by `app::config`.

/// Limits of the gateway: how long a client may take to send request headers, how many connections and
/// requests it serves at once, how long authentication and authorisation decisions are reused, and how
/// many TokenReviews unknown tokens may cost.
#[derive(clap::Args, Debug, Clone, PartialEq)]
pub struct GatewayLimits {
    /// Seconds a client has to send a request's headers, counted from the connection's first read (or the end of the previous response on a kept-alive connection); slower or idle connections are closed.
    #[arg(
        long,
        env = "ORCHARD_GATEWAY_HEADER_READ_TIMEOUT_SECONDS",
        default_value_t = 10
    )]
    pub gateway_header_read_timeout_seconds: u64,

    /// Most open gateway connections; further connections wait in the listen backlog until one closes (streams and waits count).
    #[arg(long, env = "ORCHARD_GATEWAY_MAX_CONNECTIONS", default_value_t = 4096)]
    pub gateway_max_connections: usize,

    /// Most requests handled at once (from arrival until the answer's head is sent; streamed bodies count only as connections); more are refused with 503 `Overloaded` and `Retry-After`.
    #[arg(
        long,
        env = "ORCHARD_GATEWAY_MAX_IN_FLIGHT_REQUESTS",
        default_value_t = 1024
    )]
    pub gateway_max_in_flight_requests: usize,

    /// Most `.../wait` requests handled at once: waits have a pool of their own, so callers waiting for sandboxes and groups never take the slots of other calls; more are refused with 503 `Overloaded` and `Retry-After`.
    #[arg(long, env = "ORCHARD_GATEWAY_MAX_WAITS", default_value_t = 1024)]
    pub gateway_max_waits: usize,

    /// Most port-forward tunnels open at once (each holds one client connection and one connection to an agent for its whole life); more are refused with 503 `Overloaded` and `Retry-After`.
    #[arg(long, env = "ORCHARD_GATEWAY_MAX_TUNNELS", default_value_t = 1024)]
    pub gateway_max_tunnels: usize,

    /// Most requests one caller (an authenticated user or ServiceAccount) may have in flight in each pool (waits, and everything else); beyond it that caller gets 429 `TooManyRequests` with `Retry-After` while others are still served.
    #[arg(
        long,
        env = "ORCHARD_GATEWAY_MAX_IN_FLIGHT_PER_CALLER",
        default_value_t = 768
    )]
    pub gateway_max_in_flight_per_caller: usize,

    /// Largest request body the gateway reads itself (create and result requests), in bytes; larger ones are refused with 413 before they are read. Bodies of calls proxied to agents are streamed, not read.
    #[arg(
        long,
        env = "ORCHARD_GATEWAY_MAX_BODY_BYTES",
        default_value_t = 1_048_576
    )]
    pub gateway_max_body_bytes: usize,

    /// Seconds an authorised caller has to send a whole request body the gateway reads itself; a slower body is answered 408 and its connection closed. Bodies are read only after the caller is authenticated and authorised.
    #[arg(
        long,
        env = "ORCHARD_GATEWAY_BODY_READ_TIMEOUT_SECONDS",
        default_value_t = 30
    )]
    pub gateway_body_read_timeout_seconds: u64,

    /// Bytes of request bodies one caller may have being read at once (counted by their announced length); beyond it that caller gets 429 `TooManyRequests`.
    #[arg(
        long,
        env = "ORCHARD_GATEWAY_BODY_BYTES_PER_CALLER",
        default_value_t = 8_388_608
    )]
    pub gateway_body_bytes_per_caller: usize,

    /// Seconds a TokenReview or SubjectAccessReview decision is reused; streams and waits re-check their caller at least this often.
    #[arg(
        long,
        env = "ORCHARD_GATEWAY_AUTH_CACHE_TTL_SECONDS",
        default_value_t = 10
    )]
    pub gateway_auth_cache_ttl_seconds: u64,

    /// TokenReviews per second for tokens the gateway has not seen valid, all clients together (0 = unlimited); beyond it callers get 429 with `Retry-After`.
    #[arg(long, env = "ORCHARD_GATEWAY_TOKEN_REVIEW_RATE", default_value_t = 20)]
    pub gateway_token_review_rate: u32,

    /// Burst of TokenReviews for unknown tokens, all clients together.
    #[arg(long, env = "ORCHARD_GATEWAY_TOKEN_REVIEW_BURST", default_value_t = 40)]
    pub gateway_token_review_burst: u32,

    /// TokenReviews per second for unknown tokens from one client IP (0 = unlimited).
    #[arg(
        long,
        env = "ORCHARD_GATEWAY_TOKEN_REVIEW_RATE_PER_CLIENT",
        default_value_t = 5
    )]
    pub gateway_token_review_rate_per_client: u32,

    /// Burst of TokenReviews for unknown tokens from one client IP.
    #[arg(
        long,
        env = "ORCHARD_GATEWAY_TOKEN_REVIEW_BURST_PER_CLIENT",
        default_value_t = 10
    )]
    pub gateway_token_review_burst_per_client: u32,

    /// SubjectAccessReviews per second one caller may cause by asking about objects whose decision is not cached (0 = unlimited); beyond it that caller gets 429 with `Retry-After`.
    #[arg(
        long,
        env = "ORCHARD_GATEWAY_ACCESS_REVIEW_RATE_PER_CALLER",
        default_value_t = 50
    )]
    pub gateway_access_review_rate_per_caller: u32,

    /// Burst of one caller's SubjectAccessReviews.
    #[arg(
        long,
        env = "ORCHARD_GATEWAY_ACCESS_REVIEW_BURST_PER_CALLER",
        default_value_t = 200
    )]
    pub gateway_access_review_burst_per_caller: u32,

    /// Audiences (comma-separated) the gateway asks TokenReview for; a token is accepted only if the API server confirms one of them. Empty: no audience is sent, so tokens for the API server itself (default ServiceAccount tokens) are accepted.
    #[arg(long, env = "ORCHARD_GATEWAY_TOKEN_AUDIENCES", default_value = "")]
    pub gateway_token_audiences: String,
}

impl GatewayLimits {
    /// The configured audiences, trimmed, without empty entries.
    pub fn audiences(&self) -> Vec<String> {
        self.gateway_token_audiences
            .split(',')
            .map(str::trim)
            .filter(|a| !a.is_empty())
            .map(str::to_string)
            .collect()
    }
}

impl Default for GatewayLimits {
    fn default() -> Self {
        // Same values as the flags' defaults, for tests and library users.
        #[derive(clap::Parser)]
        struct Flags {
            #[command(flatten)]
            limits: GatewayLimits,
        }
        <Flags as clap::Parser>::parse_from(["orchard-operator"]).limits
    }
}
