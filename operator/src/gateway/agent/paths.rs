//! The paths of agent calls (pure): a gateway path `/v1/namespaces/{namespace}/sandboxes/{name}<suffix>`
//! split into its parts ([`split`]), recognised as a row of the route table ([`recognise`]), and the
//! agent's path for it ([`agent_target`]: the agent serves every route at `/v1<suffix>`, the table's
//! test checks). Recognising a call here lets the gateway send it to its proxy before the router
//! (`serve::handler`): agent calls are its busiest, an exec above all.

use axum::http::Method;

use crate::gateway::agent::routes::AgentRoute;
use crate::gateway::agent::table::ROUTES;
use crate::gateway::state::paths::SANDBOX;

/// The parts of a path under one sandbox, raw (still percent-encoded) as the request has them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SandboxPath<'a> {
    /// The namespace segment.
    pub namespace: &'a str,
    /// The sandbox name segment.
    pub name: &'a str,
    /// What follows the name: `/exec`, `/processes/p-1/signal`, or empty.
    pub suffix: &'a str,
}

/// `path` split into namespace, name and suffix, when it is a path under one sandbox.
pub fn split(path: &str) -> Option<SandboxPath<'_>> {
    // Segments are short: a plain scan for the next `/` beats a string search.
    let slash = |text: &str| text.bytes().position(|b| b == b'/');
    let rest = path.strip_prefix("/v1/namespaces/")?;
    let (namespace, rest) = rest.split_at(slash(rest)?);
    let rest = rest.strip_prefix("/sandboxes/")?;
    let (name, suffix) = rest.split_at(slash(rest).unwrap_or(rest.len()));
    Some(SandboxPath {
        namespace,
        name,
        suffix,
    })
}

/// Whether a `{...}` segment of a route template.
pub fn is_placeholder(segment: &str) -> bool {
    segment.starts_with('{') && segment.ends_with('}')
}

/// Whether `suffix` fits the route template's `template` suffix: the same segments, a placeholder
/// taking any segment but an empty one.
fn fits(template: &str, suffix: &str) -> bool {
    let (mut template, mut actual) = (template.split('/'), suffix.split('/'));
    loop {
        match (template.next(), actual.next()) {
            (None, None) => return true,
            (Some(t), Some(a)) if t == a || (is_placeholder(t) && !a.is_empty()) => {}
            _ => return false,
        }
    }
}

impl AgentRoute {
    /// The route's path after the sandbox's (`/exec`, `/processes/{id}/signal`).
    pub fn suffix(&self) -> &'static str {
        self.path.strip_prefix(SANDBOX).unwrap_or(self.path)
    }
}

/// The agent route of a request `method path` (pure). `None` for any other path, and for a path
/// whose namespace or name is empty or percent-encoded: the router takes those (and decodes).
pub fn recognise<'a>(
    method: &Method,
    path: &'a str,
) -> Option<(&'static AgentRoute, SandboxPath<'a>)> {
    let parts = split(path)?;
    let plain = |segment: &str| !segment.is_empty() && !segment.contains('%');
    if !plain(parts.namespace) || !plain(parts.name) {
        return None;
    }
    let route = ROUTES
        .iter()
        .find(|route| route.method.is(method) && fits(route.suffix(), parts.suffix))?;
    Some((route, parts))
}

/// The agent's path and query for a call whose gateway path has `suffix`: `/v1<suffix>` and the raw
/// query (pure).
pub fn agent_target(suffix: &str, query: Option<&str>) -> String {
    let query = query.filter(|q| !q.is_empty());
    let mut path = String::with_capacity(3 + suffix.len() + query.map_or(0, |q| q.len() + 1));
    path.push_str("/v1");
    path.push_str(suffix);
    if let Some(query) = query {
        path.push('?');
        path.push_str(query);
    }
    path
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::agent::routes::Verb;

    fn found(method: Method, path: &str) -> Option<&'static str> {
        recognise(&method, path).map(|(route, _)| route.path)
    }

    #[test]
    fn paths_split_into_namespace_name_and_suffix() {
        assert_eq!(
            split("/v1/namespaces/ns/sandboxes/s/processes/p-1/signal"),
            Some(SandboxPath {
                namespace: "ns",
                name: "s",
                suffix: "/processes/p-1/signal"
            })
        );
        assert_eq!(
            split("/v1/namespaces/ns/sandboxes/s").map(|p| p.suffix),
            Some("")
        );
        assert_eq!(split("/v1/namespaces/ns/rolloutgroups/g/wait"), None);
        assert_eq!(split("/healthz"), None);
    }

    #[test]
    fn every_row_is_recognised_from_a_path_of_its_template() {
        for route in ROUTES {
            let path = route
                .path
                .replace("{namespace}", "team-a")
                .replace("{name}", "sb-1")
                .replace("{id}", "p-7");
            let method = match route.method {
                Verb::Get => Method::GET,
                Verb::Post => Method::POST,
                Verb::Put => Method::PUT,
                Verb::Delete => Method::DELETE,
            };
            let (recognised, parts) = recognise(&method, &path).expect(route.path);
            assert!(
                std::ptr::eq(recognised, route),
                "{path} took {}",
                recognised.path
            );
            assert_eq!((parts.namespace, parts.name), ("team-a", "sb-1"));
        }
    }

    #[test]
    fn other_paths_are_left_to_the_router() {
        let exec = "/v1/namespaces/ns/sandboxes/s/exec";
        assert_eq!(found(Method::POST, exec), Some(ROUTES[0].path));
        assert_eq!(
            found(Method::GET, exec),
            None,
            "no such method: the router's 405"
        );
        for path in [
            "/v1/namespaces/ns/sandboxes/s",
            "/v1/namespaces/ns/sandboxes/s/wait",
            "/v1/namespaces/ns/sandboxes/s/exec/",
            "/v1/namespaces/ns/sandboxes/s/exec/more",
            "/v1/namespaces/ns/sandboxes/s/ex%65c",
            "/v1/namespaces/ns/sandboxes/s%2Dx/exec",
            "/v1/namespaces/n%73/sandboxes/s/exec",
            "/v1/namespaces//sandboxes/s/exec",
            "/v1/namespaces/ns/sandboxes//exec",
            "/v1/namespaces/ns/rolloutgroups/s/exec",
            "/healthz",
        ] {
            assert_eq!(found(Method::POST, path), None, "{path}");
        }
        assert_eq!(
            found(
                Method::POST,
                "/v1/namespaces/ns/sandboxes/s/processes//signal"
            ),
            None,
            "an empty id"
        );
        assert_eq!(
            found(
                Method::GET,
                "/v1/namespaces/ns/sandboxes/s/ports/8080/tunnel"
            ),
            None,
            "tunnels upgrade their connection: the router's"
        );
    }

    #[test]
    fn agent_paths_keep_the_suffix_and_the_raw_query() {
        assert_eq!(agent_target("/exec", None), "/v1/exec");
        assert_eq!(agent_target("/exec/stream", Some("")), "/v1/exec/stream");
        assert_eq!(
            agent_target("/processes/p%2D1", None),
            "/v1/processes/p%2D1"
        );
        assert_eq!(
            agent_target("/files", Some("path=a%20b.txt&mode=0644")),
            "/v1/files?path=a%20b.txt&mode=0644"
        );
    }
}
