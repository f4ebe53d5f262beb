//! The paths of agent calls (pure): a gateway path `/v1/namespaces/{namespace}/sandboxes/{name}<suffix>`
//! split into its parts ([`split`]), its suffix matched against a route's ([`fits`]; the table finds
//! a request's row with it), and the agent's path for it ([`agent_target`]: the agent serves every
//! route at `/v1<suffix>`, the table's test checks).

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
fn is_placeholder(segment: &str) -> bool {
    segment.starts_with('{') && segment.ends_with('}')
}

/// Whether `suffix` fits the route template's `template` suffix: the same segments, a placeholder
/// taking any segment but an empty one.
pub fn fits(template: &str, suffix: &str) -> bool {
    let (mut template, mut actual) = (template.split('/'), suffix.split('/'));
    loop {
        match (template.next(), actual.next()) {
            (None, None) => return true,
            (Some(t), Some(a)) if t == a || (is_placeholder(t) && !a.is_empty()) => {}
            _ => return false,
        }
    }
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
    fn suffixes_fit_templates_segment_by_segment() {
        assert!(fits("/exec", "/exec"));
        assert!(fits("/processes/{id}/signal", "/processes/p-1/signal"));
        assert!(
            !fits("/processes/{id}/signal", "/processes//signal"),
            "an empty id"
        );
        assert!(!fits("/exec", "/exec/"));
        assert!(!fits("/exec", "/exec/more"));
        assert!(
            !fits("/exec", "/ex%65c"),
            "matched as sent, like the router"
        );
        assert!(!fits("/exec/stream", "/exec"));
        assert!(!fits("/exec", ""));
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
