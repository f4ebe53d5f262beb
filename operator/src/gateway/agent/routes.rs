//! Routes proxied to the sandbox's agent (`exec`, `exec/stream`, `processes...`, `files...`, `patch`):
//! authorise, find the sandbox's endpoint and token in the caches, count the call as a heartbeat, and
//! stream the request to `status.agentEndpoint` and the answer back unchanged.
//!
//! One table, `table::ROUTES`, drives all of it: each row is a route's method and gateway path (the
//! agent serves it at `/v1` and the same suffix), its RBAC operation and answer timeout, and its
//! OpenAPI operation (summary, parameters, request and answer schemas, the latter the agent's wire
//! types of `orchard_api::agent`). `table::router` mounts every row on one generic proxy handler and
//! documents it from the same row; `table::recognise` finds a request's row before the router, and
//! [`serve_recognised`] serves it through the same request pipeline.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Query, RawPathParams, Request, State as AxumState};
use axum::http::{Method, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodFilter, on};
use utoipa::openapi::path::{
    HttpMethod, Operation as OpenApiOperation, OperationBuilder, Parameter, ParameterBuilder,
    ParameterIn, PathItem, PathsBuilder,
};
use utoipa::openapi::request_body::RequestBodyBuilder;
use utoipa::openapi::schema::{KnownFormat, ObjectBuilder, Schema, SchemaFormat, SchemaType, Type};
use utoipa::openapi::{ContentBuilder, Ref, RefOr, Required, ResponseBuilder};
use utoipa::{IntoParams, PartialSchema, ToSchema};
use utoipa_axum::router::UtoipaMethodRouter;

use crate::gateway::agent::paths::{self, SandboxPath, agent_target};
use crate::gateway::agent::proxy::{Target, answer_timeout};
use crate::gateway::auth::access::{Access, Operation};
use crate::gateway::auth::revalidate::Guard;
use crate::gateway::http::errors::{ApiError, ErrorBody};
use crate::gateway::http::pipeline::Pipeline;
use crate::gateway::objects::lookup::find_sandbox;
use crate::gateway::objects::names::{check_name, check_namespace};
use crate::gateway::state::paths::SANDBOX;
use crate::gateway::state::{ObjectPath, State};

/// How long an exec may run by default before the gateway gives up waiting (the agent's default
/// command timeout is 600 s); clients with longer commands set `X-Orchard-Timeout`.
pub(crate) const EXEC_ANSWER_TIMEOUT: Duration = Duration::from_secs(660);

/// Default wait for the agent's answer on every other route.
pub(crate) const QUICK_ANSWER_TIMEOUT: Duration = Duration::from_secs(60);

/// Longest `wait` of a process status long-poll (the agent's bound).
pub(crate) const MAX_LONG_POLL: Duration = Duration::from_secs(300);

/// Method of a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verb {
    /// GET.
    Get,
    /// POST.
    Post,
    /// PUT.
    Put,
    /// DELETE.
    Delete,
}

impl Verb {
    /// Whether `method` is this one.
    pub fn is(self, method: &Method) -> bool {
        *method
            == match self {
                Self::Get => Method::GET,
                Self::Post => Method::POST,
                Self::Put => Method::PUT,
                Self::Delete => Method::DELETE,
            }
    }

    fn filter(self) -> MethodFilter {
        match self {
            Self::Get => MethodFilter::GET,
            Self::Post => MethodFilter::POST,
            Self::Put => MethodFilter::PUT,
            Self::Delete => MethodFilter::DELETE,
        }
    }

    fn http_method(self) -> HttpMethod {
        match self {
            Self::Get => HttpMethod::Get,
            Self::Post => HttpMethod::Post,
            Self::Put => HttpMethod::Put,
            Self::Delete => HttpMethod::Delete,
        }
    }
}

/// How long the gateway waits for the agent's answer unless `X-Orchard-Timeout` says otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnswerTimeout {
    /// A command runs to its end ([`EXEC_ANSWER_TIMEOUT`]).
    Exec,
    /// Anything quick, or streamed ([`QUICK_ANSWER_TIMEOUT`]).
    Quick,
    /// A status read that long-polls for `?wait=SECONDS` (at most 300): that wait plus the quick one.
    LongPoll,
}

/// `?wait=` of a process status read. The agent validates the whole query (and answers 400); the
/// gateway reads only the wait, and a query it cannot parse counts as no wait.
#[derive(Debug, Default, serde::Deserialize)]
struct LongPollQuery {
    /// Seconds to wait for the process to exit.
    wait: Option<f64>,
}

impl AnswerTimeout {
    /// The default wait for a request to `uri`.
    fn default_for(self, uri: &Uri) -> Duration {
        match self {
            Self::Exec => EXEC_ANSWER_TIMEOUT,
            Self::Quick => QUICK_ANSWER_TIMEOUT,
            Self::LongPoll => {
                let wait = Query::<LongPollQuery>::try_from_uri(uri)
                    .ok()
                    .and_then(|Query(query)| query.wait)
                    .filter(|wait| wait.is_finite() && *wait > 0.0)
                    .map_or(0.0, |wait| wait.min(MAX_LONG_POLL.as_secs_f64()));
                QUICK_ANSWER_TIMEOUT + Duration::from_secs_f64(wait)
            }
        }
    }
}

/// Schemas a schema refers to, collected into the document's components.
type Schemas = Vec<(String, RefOr<Schema>)>;

/// A body's schema: a reference to a named component (collected into `Schemas`) or an inline one.
type SchemaFn = fn(&mut Schemas) -> RefOr<Schema>;

/// A reference to `T`'s component schema (collected with the schemas it refers to).
pub(crate) fn named<T: ToSchema>(schemas: &mut Schemas) -> RefOr<Schema> {
    T::schemas(schemas);
    schemas.push((T::name().into_owned(), T::schema()));
    RefOr::Ref(Ref::from_schema_name(T::name()))
}

/// `T`'s schema, inline.
pub(crate) fn inline<T: PartialSchema>(_: &mut Schemas) -> RefOr<Schema> {
    T::schema()
}

/// An optional number of seconds (`X-Orchard-Timeout`): `number` or `null`.
pub(crate) fn optional_seconds(_: &mut Schemas) -> RefOr<Schema> {
    ObjectBuilder::new()
        .schema_type(SchemaType::Array(vec![Type::Number, Type::Null]))
        .format(Some(SchemaFormat::KnownFormat(KnownFormat::Double)))
        .into()
}

/// A body of some media type.
#[derive(Clone, Copy)]
pub struct Content {
    /// Media type.
    pub media_type: &'static str,
    /// Its schema.
    pub schema: SchemaFn,
}

pub(crate) const fn json(schema: SchemaFn) -> Content {
    Content {
        media_type: "application/json",
        schema,
    }
}

pub(crate) const fn bytes() -> Content {
    Content {
        media_type: "application/octet-stream",
        schema: inline::<Vec<u8>>,
    }
}

/// The gateway's error body ([`ErrorBody`]).
pub(crate) const ERROR: Content = json(named::<ErrorBody>);

/// One documented answer.
#[derive(Clone, Copy)]
pub struct Answer {
    /// HTTP status.
    pub status: u16,
    /// What it means ("" for none).
    pub description: &'static str,
    /// Its body.
    pub content: Content,
}

pub(crate) const fn answer(status: u16, description: &'static str, content: Content) -> Answer {
    Answer {
        status,
        description,
        content,
    }
}

pub(crate) const fn error(status: u16, description: &'static str) -> Answer {
    answer(status, description, ERROR)
}

/// Where a documented parameter goes.
#[derive(Clone, Copy)]
pub enum ParamIn {
    /// The query string.
    Query,
    /// A request header.
    Header,
}

/// A documented query or header parameter (the path parameters come from [`ObjectPath`] or
/// [`ProcessPath`]). The agent reads query parameters; the gateway passes the query on unchanged.
#[derive(Clone, Copy)]
pub struct Param {
    /// Name.
    pub name: &'static str,
    /// Query or header.
    pub location: ParamIn,
    /// Whether it is required.
    pub required: bool,
    /// Its schema.
    pub schema: SchemaFn,
    /// What it does.
    pub description: &'static str,
}

pub(crate) const fn query(
    name: &'static str,
    required: bool,
    schema: SchemaFn,
    description: &'static str,
) -> Param {
    Param {
        name,
        location: ParamIn::Query,
        required,
        schema,
        description,
    }
}

/// One agent route.
pub struct AgentRoute {
    /// Method (the same at the agent).
    pub method: Verb,
    /// Gateway path template (axum and OpenAPI syntax), under one sandbox; the agent serves it at
    /// `/v1` and the same suffix ([`agent_target`]).
    pub path: &'static str,
    /// The RBAC check.
    pub operation: Operation,
    /// Default answer timeout ([`AnswerTimeout::Quick`] unless given).
    pub timeout: AnswerTimeout,
    /// OpenAPI `operationId`.
    pub operation_id: &'static str,
    /// OpenAPI summary.
    pub summary: &'static str,
    /// Query and header parameters (none unless given).
    pub params: &'static [Param],
    /// Request body (none unless given).
    pub request: Option<Content>,
    /// Answers.
    pub answers: &'static [Answer],
}

/// Defaults of a row's optional fields (`timeout`, `params`, `request`), taken with `..DEFAULTS`.
/// The other fields here are placeholders: every row sets them (the table test checks).
pub(crate) const DEFAULTS: AgentRoute = AgentRoute {
    method: Verb::Get,
    path: "",
    operation: Operation::Exec,
    timeout: AnswerTimeout::Quick,
    operation_id: "",
    summary: "",
    params: &[],
    request: None,
    answers: &[],
};

/// Path parameters of one process or session (documentation; the handler reads every path parameter).
#[derive(serde::Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct ProcessPath {
    /// Namespace.
    pub namespace: String,
    /// Sandbox name.
    pub name: String,
    /// Process or session id.
    pub id: String,
}

impl AgentRoute {
    /// The route's path after the sandbox's (`/exec`, `/processes/{id}/signal`).
    pub fn suffix(&self) -> &'static str {
        self.path.strip_prefix(SANDBOX).unwrap_or(self.path)
    }

    /// Whether the path carries a process or session `{id}` (documented with [`ProcessPath`]).
    fn has_process_id(&self) -> bool {
        self.path.contains("{id}")
    }

    /// The OpenAPI operation of this route; referenced schemas are added to `schemas`.
    fn openapi_operation(&self, schemas: &mut Schemas) -> OpenApiOperation {
        let path_params = if self.has_process_id() {
            ProcessPath::into_params(|| Some(ParameterIn::Path))
        } else {
            ObjectPath::into_params(|| Some(ParameterIn::Path))
        };
        let mut operation = OperationBuilder::new()
            .tag("agent")
            .operation_id(Some(self.operation_id))
            .summary(Some(self.summary));
        for parameter in path_params {
            operation = operation.parameter(parameter);
        }
        for param in self.params {
            operation = operation.parameter(param.openapi(schemas));
        }
        if let Some(content) = self.request {
            operation = operation.request_body(Some(
                RequestBodyBuilder::new()
                    .content(
                        content.media_type,
                        ContentBuilder::new()
                            .schema(Some((content.schema)(schemas)))
                            .build(),
                    )
                    .required(Some(Required::True))
                    .build(),
            ));
        }
        for answer in self.answers {
            let response = ResponseBuilder::new()
                .description(answer.description)
                .content(
                    answer.content.media_type,
                    ContentBuilder::new()
                        .schema(Some((answer.content.schema)(schemas)))
                        .build(),
                )
                .build();
            operation = operation.response(answer.status.to_string(), response);
        }
        operation.build()
    }

    /// The route as `utoipa-axum` mounts it: its schemas, its documented path and its handler.
    pub(crate) fn method_router(&'static self) -> UtoipaMethodRouter<State> {
        let mut schemas = Schemas::new();
        let operation = self.openapi_operation(&mut schemas);
        let paths = PathsBuilder::new()
            .path(
                self.path,
                PathItem::new(self.method.http_method(), operation),
            )
            .build();
        let handler = on(
            self.method.filter(),
            move |AxumState(state): AxumState<State>, params: RawPathParams, request: Request| async move {
                // The path's parameters as axum found them (percent-decoded), without collecting them.
                let param = |key: &str| {
                    params
                        .iter()
                        .find_map(|(name, value)| (name == key).then_some(value))
                        .ok_or_else(|| {
                            ApiError::internal(format!("route {} has no {{{key}}}", self.path))
                        })
                };
                let uri = request.uri().clone();
                let suffix = paths::split(uri.path())
                    .ok_or_else(|| unroutable(&uri))?
                    .suffix;
                let path = SandboxPath {
                    namespace: param("namespace")?,
                    name: param("name")?,
                    suffix,
                };
                proxy(&state, self, path, request).await
            },
        );
        (schemas, paths, handler)
    }
}

impl Param {
    fn openapi(&self, schemas: &mut Schemas) -> Parameter {
        ParameterBuilder::new()
            .name(self.name)
            .parameter_in(match self.location {
                ParamIn::Query => ParameterIn::Query,
                ParamIn::Header => ParameterIn::Header,
            })
            .required(if self.required {
                Required::True
            } else {
                Required::False
            })
            .description(Some(self.description))
            .schema(Some((self.schema)(schemas)))
            .build()
    }
}

/// Serves `request`, a call to `route` recognised before the router (`table::recognise`), through
/// `pipeline` as the router serves its routes.
pub async fn serve_recognised(
    state: State,
    pipeline: Arc<Pipeline>,
    route: &'static AgentRoute,
    request: Request,
) -> Response {
    pipeline
        .run(route.path, request, |request| async {
            let uri = request.uri().clone();
            match paths::split(uri.path()) {
                Some(path) => proxy(&state, route, path, request).await.into_response(),
                None => unroutable(&uri).into_response(),
            }
        })
        .await
}

fn unroutable(uri: &Uri) -> ApiError {
    ApiError::internal(format!("unroutable path {}", uri.path()))
}

/// Sends `request` to the agent of the sandbox its `path` names after authorising the route's
/// operation.
async fn proxy(
    state: &State,
    route: &AgentRoute,
    path: SandboxPath<'_>,
    request: Request,
) -> Result<Response, ApiError> {
    let SandboxPath {
        namespace,
        name,
        suffix,
    } = path;
    check_namespace(namespace)?;
    check_name(name)?;
    let (parts, body) = request.into_parts();
    let access = Access::of(route.operation, namespace, name);
    state.auth.authorize(&parts.headers, &access).await?;
    let timeout = answer_timeout(&parts.headers, route.timeout.default_for(&parts.uri))?;
    let sandbox = find_sandbox(
        &state.deps.client,
        &state.deps.reads.sandboxes,
        &state.recent_deletes,
        namespace,
        name,
    )
    .await?;
    let agent = state.agent_access(&sandbox).await?;
    let path = agent_target(suffix, parts.uri.query());
    state.heartbeats.activity(&sandbox);
    let target = Target {
        namespace,
        name,
        agent,
    };
    // The caller is checked again while the agent works and while an exec stream streams.
    let guard = Guard::new(state, &parts.headers, &access);
    let response = guard
        .run(
            state
                .proxy
                .forward(&target, parts.method, path, &parts.headers, body, timeout),
        )
        .await?;
    let ndjson = is_ndjson(&response);
    if !ndjson && !is_long_download(&response) {
        return Ok(response);
    }
    let (parts, body) = response.into_parts();
    Ok(Response::from_parts(parts, guard.stream(body, ndjson)))
}

/// Answers shorter than this are sent whole without re-checking their caller: they are done within
/// moments, and a check costs a task per answer.
const REVALIDATED_BODY_BYTES: u64 = 1 << 20;

/// Whether an answer may stream long enough to outlive its caller's access: a download of unknown
/// length or of at least [`REVALIDATED_BODY_BYTES`] (cut off, like an exec stream, once access is
/// revoked).
fn is_long_download(response: &Response) -> bool {
    response
        .headers()
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .is_none_or(|length| length >= REVALIDATED_BODY_BYTES)
}

/// Whether an answer is an NDJSON event stream (`exec/stream`).
fn is_ndjson(response: &Response) -> bool {
    response
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/x-ndjson"))
}

#[cfg(test)]
mod tests {
    use crate::gateway::agent::table::{ROUTES, sandbox_path};
    use std::collections::HashSet;

    use super::*;

    fn route(method: Verb, path: &str) -> &'static AgentRoute {
        ROUTES
            .iter()
            .find(|route| route.method == method && route.path == path)
            .unwrap_or_else(|| panic!("{method:?} {path} not in the table"))
    }

    #[test]
    fn downloads_of_unknown_or_large_length_are_re_checked() {
        let answer = |length: Option<&str>| {
            let mut response = Response::new(axum::body::Body::empty());
            if let Some(length) = length {
                response
                    .headers_mut()
                    .insert(axum::http::header::CONTENT_LENGTH, length.parse().unwrap());
            }
            response
        };
        assert!(is_long_download(&answer(None)), "chunked: any length");
        assert!(is_long_download(&answer(Some("1048576"))));
        assert!(!is_long_download(&answer(Some("1048575"))));
        assert!(!is_long_download(&answer(Some("12"))));
    }

    #[test]
    fn the_table_is_consistent() {
        let mut seen = HashSet::new();
        for route in ROUTES {
            assert!(
                seen.insert((route.method, route.path)),
                "{:?} {} twice",
                route.method,
                route.path
            );
            assert!(route.path.starts_with(sandbox_path!("/")), "{}", route.path);
            assert!(!route.answers.is_empty(), "{}", route.path);
            assert!(!route.operation_id.is_empty() && !route.summary.is_empty());
        }
        assert_eq!(seen.len(), 28);
    }

    #[test]
    fn a_session_signal_needs_what_a_run_needs() {
        let run = route(Verb::Post, sandbox_path!("/sessions/{id}/run"));
        let signal = route(Verb::Post, sandbox_path!("/sessions/{id}/signal"));
        assert_eq!(signal.operation, run.operation);
        assert_eq!(signal.operation, Operation::Exec);
    }

    #[test]
    fn long_polls_get_their_wait_added_to_the_answer_timeout() {
        let timeout = |uri: &str| AnswerTimeout::LongPoll.default_for(&uri.parse::<Uri>().unwrap());
        assert_eq!(timeout("/p"), QUICK_ANSWER_TIMEOUT);
        assert_eq!(
            timeout("/p?output=false&wait=30"),
            QUICK_ANSWER_TIMEOUT + Duration::from_secs(30)
        );
        assert_eq!(
            timeout("/p?wait=0.5"),
            QUICK_ANSWER_TIMEOUT + Duration::from_millis(500)
        );
        assert_eq!(
            timeout("/p?wait=9999"),
            QUICK_ANSWER_TIMEOUT + Duration::from_secs(300)
        );
        assert_eq!(
            timeout("/p?wait=1e300"),
            QUICK_ANSWER_TIMEOUT + Duration::from_secs(300)
        );
        assert_eq!(timeout("/p?wait=x"), QUICK_ANSWER_TIMEOUT);
        assert_eq!(timeout("/p?wait=-3"), QUICK_ANSWER_TIMEOUT);
        assert_eq!(
            AnswerTimeout::Exec.default_for(&"/p?wait=30".parse::<Uri>().unwrap()),
            EXEC_ANSWER_TIMEOUT
        );
    }
}
