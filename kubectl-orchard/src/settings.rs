//! Connection settings, resolved as the Python SDK resolves them: flags first, then `ORCHARD_*`
//! environment variables, then the current kubeconfig context (its user's token, its namespace), then
//! the pod's service account, then the in-cluster defaults.
//!
//! [`resolve`] is pure: it gets the environment as a lookup function and the kubeconfig context
//! already read ([`crate::kubeconfig`] reads it, only when [`needs_kubeconfig`] says so).

use std::path::PathBuf;

use crate::error::{CliError, Result};

/// The gateway Service inside the cluster (the SDK's default).
pub const DEFAULT_GATEWAY_URL: &str = "http://orchard-operator-gateway.orchard-system.svc:8080";
/// Environment variable naming the gateway URL.
pub const ENV_GATEWAY_URL: &str = "ORCHARD_GATEWAY_URL";
/// Environment variable holding a bearer token.
pub const ENV_TOKEN: &str = "ORCHARD_TOKEN";
/// Environment variable naming a file that holds a bearer token.
pub const ENV_TOKEN_FILE: &str = "ORCHARD_TOKEN_FILE";
/// Environment variable naming the namespace.
pub const ENV_NAMESPACE: &str = "ORCHARD_NAMESPACE";
/// The pod's service account, when the plugin runs in a pod.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// The connection flags given on the command line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Flags {
    /// `--gateway`.
    pub gateway: Option<String>,
    /// `--token`.
    pub token: Option<String>,
    /// `-n` / `--namespace`.
    pub namespace: Option<String>,
}

/// A bearer token, or where to read it.
#[derive(Clone, PartialEq, Eq)]
pub enum Token {
    /// The token itself.
    Literal(String),
    /// A file holding it (read at use, trimmed).
    File(PathBuf),
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Literal(_) => write!(f, "Literal(<redacted>)"),
            Self::File(path) => write!(f, "File({})", path.display()),
        }
    }
}

impl Token {
    /// The token's text.
    pub fn read(&self) -> Result<String> {
        match self {
            Self::Literal(token) => Ok(token.trim().to_string()),
            Self::File(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| CliError::local(format!("token file {}", path.display()), e))?;
                let token = text.trim();
                if token.is_empty() {
                    return Err(CliError::Settings(format!(
                        "token file {} is empty",
                        path.display()
                    )));
                }
                Ok(token.to_string())
            }
        }
    }
}

/// What the current kubeconfig context offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeContext {
    /// The context's namespace.
    pub namespace: Option<String>,
    /// Its user's bearer token, or why there is none.
    pub token: std::result::Result<Token, String>,
}

/// What the pod's service account directory holds (nothing outside a pod).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServiceAccount {
    /// Its token file, when it exists.
    pub token_file: Option<PathBuf>,
    /// Its namespace.
    pub namespace: Option<String>,
}

/// Resolved settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// Gateway base URL, without a trailing `/`.
    pub gateway: String,
    /// Bearer token.
    pub token: Token,
    /// Namespace of the sandboxes.
    pub namespace: String,
}

/// Whether resolving needs the kubeconfig: no token, or no namespace, from flags and environment.
pub fn needs_kubeconfig(flags: &Flags, env: &dyn Fn(&str) -> Option<String>) -> bool {
    token_from_flags_or_env(flags, env).is_none()
        || namespace_from_flags_or_env(flags, env).is_none()
}

fn non_empty(value: Option<String>) -> Option<String> {
    value.filter(|v| !v.trim().is_empty())
}

fn token_from_flags_or_env(flags: &Flags, env: &dyn Fn(&str) -> Option<String>) -> Option<Token> {
    non_empty(flags.token.clone())
        .map(Token::Literal)
        .or_else(|| non_empty(env(ENV_TOKEN)).map(Token::Literal))
        .or_else(|| non_empty(env(ENV_TOKEN_FILE)).map(|path| Token::File(PathBuf::from(path))))
}

fn namespace_from_flags_or_env(
    flags: &Flags,
    env: &dyn Fn(&str) -> Option<String>,
) -> Option<String> {
    non_empty(flags.namespace.clone()).or_else(|| non_empty(env(ENV_NAMESPACE)))
}

/// Resolves the settings (pure). `kube` is the current kubeconfig context, or why it could not be
/// read (`None`: not read because not needed).
pub fn resolve(
    flags: &Flags,
    env: &dyn Fn(&str) -> Option<String>,
    kube: Option<&std::result::Result<KubeContext, String>>,
    service_account: &ServiceAccount,
) -> Result<Settings> {
    let gateway = gateway_url(
        non_empty(flags.gateway.clone())
            .or_else(|| non_empty(env(ENV_GATEWAY_URL)))
            .as_deref()
            .unwrap_or(DEFAULT_GATEWAY_URL),
    )?;
    let context = kube.and_then(|k| k.as_ref().ok());
    let token = match token_from_flags_or_env(flags, env) {
        Some(token) => token,
        None => match (context.map(|c| &c.token), &service_account.token_file) {
            (Some(Ok(token)), _) => token.clone(),
            (_, Some(file)) => Token::File(file.clone()),
            (Some(Err(why)), None) => return Err(missing_token(why)),
            (None, None) => {
                let why = match kube {
                    Some(Err(why)) => why.clone(),
                    _ => "no kubeconfig".to_string(),
                };
                return Err(missing_token(&why));
            }
        },
    };
    let namespace = namespace_from_flags_or_env(flags, env)
        .or_else(|| non_empty(context.and_then(|c| c.namespace.clone())))
        .or_else(|| non_empty(service_account.namespace.clone()))
        .unwrap_or_else(|| "default".to_string());
    Ok(Settings {
        gateway,
        token,
        namespace,
    })
}

fn missing_token(why: &str) -> CliError {
    CliError::Settings(format!(
        "no token for the gateway: pass --token or set {ENV_TOKEN} (or {ENV_TOKEN_FILE}); the kubeconfig gave none: {why}"
    ))
}

/// Checks a gateway URL and drops its trailing `/` (pure).
pub fn gateway_url(text: &str) -> Result<String> {
    let url = reqwest::Url::parse(text).map_err(|e| {
        CliError::Settings(format!(
            "gateway URL `{text}` is not a URL ({e}): pass --gateway or set {ENV_GATEWAY_URL}, e.g. http://localhost:8080"
        ))
    })?;
    match url.scheme() {
        "http" => {}
        "https" => {
            return Err(CliError::Settings(format!(
                "gateway URL `{text}`: this build of kubectl-orchard speaks plain HTTP only; reach the gateway over http (e.g. `kubectl -n orchard-system port-forward svc/orchard-operator-gateway 8080:8080` and --gateway http://localhost:8080)"
            )));
        }
        other => {
            return Err(CliError::Settings(format!(
                "gateway URL `{text}` has scheme `{other}`: pass --gateway or set {ENV_GATEWAY_URL} to an http:// URL"
            )));
        }
    }
    if url.host_str().is_none() {
        return Err(CliError::Settings(format!(
            "gateway URL `{text}` has no host: pass --gateway or set {ENV_GATEWAY_URL}"
        )));
    }
    Ok(text.trim_end_matches('/').to_string())
}

/// The pod's service account, read from [`SERVICE_ACCOUNT_DIR`].
pub fn service_account() -> ServiceAccount {
    let dir = PathBuf::from(SERVICE_ACCOUNT_DIR);
    let token = dir.join("token");
    ServiceAccount {
        token_file: token.is_file().then_some(token),
        namespace: std::fs::read_to_string(dir.join("namespace"))
            .ok()
            .map(|text| text.trim().to_string()),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |key| map.get(key).cloned()
    }

    fn kube(
        token: Option<&str>,
        namespace: Option<&str>,
    ) -> std::result::Result<KubeContext, String> {
        Ok(KubeContext {
            namespace: namespace.map(str::to_string),
            token: token
                .map(|t| Token::Literal(t.to_string()))
                .ok_or_else(|| "user has no token".to_string()),
        })
    }

    #[test]
    fn flags_win_over_environment_and_kubeconfig() {
        let flags = Flags {
            gateway: Some("http://flag:1/".into()),
            token: Some("flag-token".into()),
            namespace: Some("flag-ns".into()),
        };
        let env = env_of(&[
            (ENV_GATEWAY_URL, "http://env:2"),
            (ENV_TOKEN, "env-token"),
            (ENV_NAMESPACE, "env-ns"),
        ]);
        assert!(!needs_kubeconfig(&flags, &env));
        let kube = kube(Some("kube-token"), Some("kube-ns"));
        let settings = resolve(&flags, &env, Some(&kube), &ServiceAccount::default()).unwrap();
        assert_eq!(settings.gateway, "http://flag:1");
        assert_eq!(settings.token, Token::Literal("flag-token".into()));
        assert_eq!(settings.namespace, "flag-ns");
    }

    #[test]
    fn environment_wins_over_kubeconfig() {
        let env = env_of(&[
            (ENV_GATEWAY_URL, "http://env:2"),
            (ENV_TOKEN_FILE, "/run/token"),
            (ENV_NAMESPACE, "env-ns"),
        ]);
        let kube = kube(Some("kube-token"), Some("kube-ns"));
        let settings = resolve(
            &Flags::default(),
            &env,
            Some(&kube),
            &ServiceAccount::default(),
        )
        .unwrap();
        assert_eq!(settings.gateway, "http://env:2");
        assert_eq!(settings.token, Token::File("/run/token".into()));
        assert_eq!(settings.namespace, "env-ns");
        // ORCHARD_TOKEN before ORCHARD_TOKEN_FILE.
        let both = env_of(&[(ENV_TOKEN, "t"), (ENV_TOKEN_FILE, "/run/token")]);
        let settings = resolve(
            &Flags::default(),
            &both,
            Some(&kube),
            &ServiceAccount::default(),
        )
        .unwrap();
        assert_eq!(settings.token, Token::Literal("t".into()));
    }

    #[test]
    fn kubeconfig_then_service_account_then_defaults() {
        let env = env_of(&[]);
        assert!(needs_kubeconfig(&Flags::default(), &env));
        let kube_ctx = kube(Some("kube-token"), Some("kube-ns"));
        let settings = resolve(
            &Flags::default(),
            &env,
            Some(&kube_ctx),
            &ServiceAccount::default(),
        )
        .unwrap();
        assert_eq!(settings.gateway, DEFAULT_GATEWAY_URL);
        assert_eq!(settings.token, Token::Literal("kube-token".into()));
        assert_eq!(settings.namespace, "kube-ns");

        let pod = ServiceAccount {
            token_file: Some("/sa/token".into()),
            namespace: Some("sa-ns".into()),
        };
        let unreadable: std::result::Result<KubeContext, String> = Err("no kubeconfig".into());
        let settings = resolve(&Flags::default(), &env, Some(&unreadable), &pod).unwrap();
        assert_eq!(settings.token, Token::File("/sa/token".into()));
        assert_eq!(settings.namespace, "sa-ns");

        let token_only = Flags {
            token: Some("t".into()),
            ..Flags::default()
        };
        let no_namespace = kube(None, None);
        let settings = resolve(
            &token_only,
            &env,
            Some(&no_namespace),
            &ServiceAccount::default(),
        )
        .unwrap();
        assert_eq!(settings.namespace, "default");
    }

    #[test]
    fn a_missing_token_names_the_flag_and_the_variable() {
        let env = env_of(&[]);
        let no_token = kube(None, Some("ns"));
        let error = resolve(
            &Flags::default(),
            &env,
            Some(&no_token),
            &ServiceAccount::default(),
        )
        .unwrap_err()
        .line();
        assert!(error.contains("--token"), "{error}");
        assert!(error.contains(ENV_TOKEN), "{error}");
        assert!(error.contains("user has no token"), "{error}");
        assert_eq!(error.lines().count(), 1);
    }

    #[test]
    fn gateway_urls_are_checked() {
        assert_eq!(gateway_url("http://gw:8080/").unwrap(), "http://gw:8080");
        for bad in ["gw:8080", "ftp://gw", "https://gw", "not a url", ""] {
            let error = gateway_url(bad).unwrap_err().line();
            assert!(
                error.contains("--gateway") || error.contains("http"),
                "{error}"
            );
        }
        let error = resolve(
            &Flags {
                gateway: Some("nope".into()),
                token: Some("t".into()),
                namespace: Some("n".into()),
            },
            &env_of(&[]),
            None,
            &ServiceAccount::default(),
        )
        .unwrap_err()
        .line();
        assert!(error.contains("--gateway") && error.contains(ENV_GATEWAY_URL));
    }
}
