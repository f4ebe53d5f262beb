//! What each gateway route asks of RBAC (pure): the SubjectAccessReview attributes on `orchard.dev`
//! resources, and the 403 message naming the missing permission. `docs/API.md` has the same table.

use std::fmt;

/// A resource the gateway authorises against (API group `orchard.dev`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Resource {
    /// `sandboxes`.
    Sandboxes,
    /// `rolloutgroups`.
    RolloutGroups,
    /// `sandboxsnapshots`.
    SandboxSnapshots,
}

impl Resource {
    /// Plural resource name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Sandboxes => "sandboxes",
            Self::RolloutGroups => "rolloutgroups",
            Self::SandboxSnapshots => "sandboxsnapshots",
        }
    }
}

/// One operation of the gateway, named by what it does (the route table maps HTTP routes to these).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    /// `POST .../sandboxes`.
    CreateSandbox,
    /// `GET .../sandboxes`.
    ListSandboxes,
    /// `GET .../sandboxes/{name}` and `.../wait`.
    GetSandbox,
    /// `DELETE .../sandboxes/{name}`.
    DeleteSandbox,
    /// `exec`, `exec/stream`, `processes...` and `patch`: running code or changing files by diff.
    Exec,
    /// `GET ports/{port}/tunnel`: a TCP tunnel to a port inside the sandbox.
    PortForward,
    /// `GET files` and `files/list`.
    ReadFiles,
    /// `PUT files` and `DELETE files`.
    WriteFiles,
    /// `POST heartbeat`.
    Heartbeat,
    /// `PUT network`: replace `spec.network` of a running sandbox.
    SetNetwork,
    /// `POST result`.
    RecordResult,
    /// `GET token`: the agent's address and token, for direct calls.
    AgentToken,
    /// `POST .../rolloutgroups`.
    CreateRolloutGroup,
    /// `GET .../rolloutgroups`.
    ListRolloutGroups,
    /// `GET .../rolloutgroups/{name}` and `.../wait`.
    GetRolloutGroup,
    /// `DELETE .../rolloutgroups/{name}`.
    DeleteRolloutGroup,
    /// `POST .../sandboxsnapshots`.
    CreateSnapshot,
    /// `GET .../sandboxsnapshots`.
    ListSnapshots,
    /// `GET .../sandboxsnapshots/{name}` and `.../wait`.
    GetSnapshot,
    /// `DELETE .../sandboxsnapshots/{name}`.
    DeleteSnapshot,
}

/// The attributes of one SubjectAccessReview (group `orchard.dev`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Access {
    /// Kubernetes verb: `get`, `list`, `create`, `delete`.
    pub verb: &'static str,
    /// Resource.
    pub resource: Resource,
    /// Subresource (`exec`, `portforward`, `files`, `heartbeat`, `network`, `result`, `token`) or empty.
    pub subresource: &'static str,
    /// Namespace of the request.
    pub namespace: String,
    /// Object name, empty for collection routes (create, list).
    pub name: String,
}

impl Access {
    /// What `operation` on `namespace`/`name` needs.
    pub fn of(operation: Operation, namespace: &str, name: &str) -> Self {
        use Operation::*;
        let (verb, resource, subresource) = match operation {
            CreateSandbox => ("create", Resource::Sandboxes, ""),
            ListSandboxes => ("list", Resource::Sandboxes, ""),
            GetSandbox => ("get", Resource::Sandboxes, ""),
            DeleteSandbox => ("delete", Resource::Sandboxes, ""),
            Exec => ("create", Resource::Sandboxes, "exec"),
            PortForward => ("create", Resource::Sandboxes, "portforward"),
            ReadFiles => ("get", Resource::Sandboxes, "files"),
            WriteFiles => ("create", Resource::Sandboxes, "files"),
            Heartbeat => ("create", Resource::Sandboxes, "heartbeat"),
            SetNetwork => ("update", Resource::Sandboxes, "network"),
            RecordResult => ("create", Resource::Sandboxes, "result"),
            AgentToken => ("get", Resource::Sandboxes, "token"),
            CreateRolloutGroup => ("create", Resource::RolloutGroups, ""),
            ListRolloutGroups => ("list", Resource::RolloutGroups, ""),
            GetRolloutGroup => ("get", Resource::RolloutGroups, ""),
            DeleteRolloutGroup => ("delete", Resource::RolloutGroups, ""),
            CreateSnapshot => ("create", Resource::SandboxSnapshots, ""),
            ListSnapshots => ("list", Resource::SandboxSnapshots, ""),
            GetSnapshot => ("get", Resource::SandboxSnapshots, ""),
            DeleteSnapshot => ("delete", Resource::SandboxSnapshots, ""),
        };
        let name = match operation {
            CreateSandbox | ListSandboxes | CreateRolloutGroup | ListRolloutGroups
            | CreateSnapshot | ListSnapshots => String::new(),
            _ => name.to_string(),
        };
        Self {
            verb,
            resource,
            subresource,
            namespace: namespace.to_string(),
            name,
        }
    }

    /// `sandboxes/exec`, or `sandboxes` without a subresource.
    pub fn resource_path(&self) -> String {
        if self.subresource.is_empty() {
            self.resource.as_str().to_string()
        } else {
            format!("{}/{}", self.resource.as_str(), self.subresource)
        }
    }

    /// The 403 message: `user alice cannot create sandboxes/exec in namespace b`.
    pub fn denied_message(&self, user: &str, reason: Option<&str>) -> String {
        let mut message = format!(
            "user {user} cannot {} {} in namespace {}",
            self.verb,
            self.resource_path(),
            self.namespace
        );
        if let Some(reason) = reason.map(str::trim).filter(|r| !r.is_empty()) {
            message.push_str(&format!(" ({reason})"));
        }
        message.push_str(&format!(
            "; grant it with a Role rule {{apiGroups: [\"orchard.dev\"], resources: [\"{}\"], verbs: [\"{}\"]}}",
            self.resource_path(),
            self.verb
        ));
        message
    }
}

impl fmt::Display for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} in {}",
            self.verb,
            self.resource_path(),
            self.namespace
        )?;
        if !self.name.is_empty() {
            write!(f, " ({})", self.name)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_map_to_documented_rbac_attributes() {
        let cases = [
            (Operation::CreateSandbox, "create", "sandboxes", "", ""),
            (Operation::ListSandboxes, "list", "sandboxes", "", ""),
            (Operation::GetSandbox, "get", "sandboxes", "", "s"),
            (Operation::DeleteSandbox, "delete", "sandboxes", "", "s"),
            (Operation::Exec, "create", "sandboxes", "exec", "s"),
            (
                Operation::PortForward,
                "create",
                "sandboxes",
                "portforward",
                "s",
            ),
            (Operation::ReadFiles, "get", "sandboxes", "files", "s"),
            (Operation::WriteFiles, "create", "sandboxes", "files", "s"),
            (
                Operation::Heartbeat,
                "create",
                "sandboxes",
                "heartbeat",
                "s",
            ),
            (
                Operation::RecordResult,
                "create",
                "sandboxes",
                "result",
                "s",
            ),
            (Operation::AgentToken, "get", "sandboxes", "token", "s"),
            (Operation::SetNetwork, "update", "sandboxes", "network", "s"),
            (
                Operation::CreateRolloutGroup,
                "create",
                "rolloutgroups",
                "",
                "",
            ),
            (
                Operation::ListRolloutGroups,
                "list",
                "rolloutgroups",
                "",
                "",
            ),
            (Operation::GetRolloutGroup, "get", "rolloutgroups", "", "s"),
            (
                Operation::DeleteRolloutGroup,
                "delete",
                "rolloutgroups",
                "",
                "s",
            ),
            (
                Operation::CreateSnapshot,
                "create",
                "sandboxsnapshots",
                "",
                "",
            ),
            (Operation::ListSnapshots, "list", "sandboxsnapshots", "", ""),
            (Operation::GetSnapshot, "get", "sandboxsnapshots", "", "s"),
            (
                Operation::DeleteSnapshot,
                "delete",
                "sandboxsnapshots",
                "",
                "s",
            ),
        ];
        for (operation, verb, resource, subresource, name) in cases {
            let access = Access::of(operation, "ns", "s");
            assert_eq!(access.verb, verb, "{operation:?}");
            assert_eq!(access.resource.as_str(), resource, "{operation:?}");
            assert_eq!(access.subresource, subresource, "{operation:?}");
            assert_eq!(access.name, name, "{operation:?}");
            assert_eq!(access.namespace, "ns");
        }
    }

    #[test]
    fn denial_names_user_verb_resource_and_namespace() {
        let access = Access::of(Operation::Exec, "b", "s");
        let message = access.denied_message("alice", Some(""));
        assert!(
            message.starts_with("user alice cannot create sandboxes/exec in namespace b;"),
            "{message}"
        );
        assert!(
            message.contains("resources: [\"sandboxes/exec\"]"),
            "{message}"
        );
        let with_reason = access.denied_message("alice", Some("no RBAC policy matched"));
        assert!(
            with_reason.contains("(no RBAC policy matched)"),
            "{with_reason}"
        );
        assert_eq!(
            Access::of(Operation::ListSandboxes, "a", "").to_string(),
            "list sandboxes in a"
        );
    }
}
