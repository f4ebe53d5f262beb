//! The gateway as an HTTP server: connections and their header-read timeout ([`server`]), what every
//! request goes through around its handler ([`pipeline`]), the request pools ([`in_flight`]), bodies read only after authorisation and within limits ([`body`],
//! [`unread_body`]), errors as JSON ([`errors`]), request metrics ([`metrics`]) and the OpenAPI
//! document ([`openapi`]).

pub mod body;
pub mod errors;
pub mod in_flight;
pub mod metrics;
pub mod openapi;
pub mod pipeline;
pub mod server;
pub mod unread_body;
