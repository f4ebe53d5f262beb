//! The current kubeconfig context: its namespace and its user's bearer token (`token`, `tokenFile`,
//! or an exec credential plugin run through kube's own support).

use std::path::PathBuf;

use bytes::Bytes;
use http_body_util::Empty;
use hyper::header::{AUTHORIZATION, HeaderValue};
use hyper::{Request, Response};
use kube::client::ConfigExt;
use kube::config::{AuthInfo, KubeConfigOptions, Kubeconfig};
use secrecy::ExposeSecret;
use tower::{Layer, ServiceExt};

use crate::settings::{KubeContext, Token};

/// How the current context's user authenticates (pure view of the kubeconfig).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credential {
    /// A bearer token, or a file holding one.
    Token(Token),
    /// Something only kube's client can turn into a header: an exec plugin or an auth provider.
    Plugin,
    /// Nothing the gateway can use (a client certificate, basic auth, no user); why.
    Unusable(String),
}

/// The current context's namespace and credential in `config` (pure).
pub fn current_context(config: &Kubeconfig) -> Result<(Option<String>, Credential), String> {
    let name = config
        .current_context
        .as_deref()
        .ok_or_else(|| "the kubeconfig has no current context".to_string())?;
    let context = config
        .contexts
        .iter()
        .find(|c| c.name == name)
        .and_then(|c| c.context.as_ref())
        .ok_or_else(|| format!("the kubeconfig has no context named `{name}`"))?;
    let namespace = context.namespace.clone();
    let Some(user) = context.user.as_deref() else {
        return Ok((
            namespace,
            Credential::Unusable(format!("context `{name}` names no user")),
        ));
    };
    let auth = config
        .auth_infos
        .iter()
        .find(|a| a.name == user)
        .and_then(|a| a.auth_info.as_ref());
    let credential = match auth {
        None => Credential::Unusable(format!("the kubeconfig has no user named `{user}`")),
        Some(info) => credential_of(user, info),
    };
    Ok((namespace, credential))
}

fn credential_of(user: &str, info: &AuthInfo) -> Credential {
    if let Some(token) = &info.token {
        return Credential::Token(Token::Literal(token.expose_secret().to_string()));
    }
    if let Some(file) = &info.token_file {
        return Credential::Token(Token::File(PathBuf::from(file)));
    }
    if info.exec.is_some() || info.auth_provider.is_some() {
        return Credential::Plugin;
    }
    let how = if info.client_certificate.is_some() || info.client_certificate_data.is_some() {
        "a client certificate"
    } else if info.username.is_some() {
        "a user name and password"
    } else {
        "nothing the gateway accepts"
    };
    Credential::Unusable(format!(
        "user `{user}` authenticates with {how}; the gateway needs a bearer token"
    ))
}

/// Reads the kubeconfig (`KUBECONFIG` or `~/.kube/config`) and resolves the current context; an
/// exec credential plugin is run through kube's client support.
pub async fn load() -> Result<KubeContext, String> {
    let config = Kubeconfig::read().map_err(|e| format!("cannot read the kubeconfig: {e}"))?;
    let (namespace, credential) = current_context(&config)?;
    let token = match credential {
        Credential::Token(token) => Ok(token),
        Credential::Unusable(why) => Err(why),
        Credential::Plugin => plugin_token().await.map(Token::Literal),
    };
    Ok(KubeContext { namespace, token })
}

/// The bearer token kube's client would send for the current context (runs its exec plugin).
async fn plugin_token() -> Result<String, String> {
    let config = kube::Config::from_kubeconfig(&KubeConfigOptions::default())
        .await
        .map_err(|e| format!("cannot load the kubeconfig's credentials: {e}"))?;
    let layer = config
        .auth_layer()
        .map_err(|e| format!("the kubeconfig's credential plugin failed: {e}"))?
        .ok_or_else(|| "the kubeconfig's user gives no token".to_string())?;
    // A service that answers with the header the auth layer put on the request.
    let capture = tower::service_fn(|request: Request<Empty<Bytes>>| async move {
        Ok::<_, tower::BoxError>(Response::new(request.headers().get(AUTHORIZATION).cloned()))
    });
    let header = layer
        .layer(capture)
        .oneshot(Request::new(Empty::new()))
        .await
        .map_err(|e| format!("the kubeconfig's credential plugin failed: {e}"))?
        .into_body()
        .ok_or_else(|| "the kubeconfig's credential plugin gave no token".to_string())?;
    bearer_token(&header)
}

/// The token of an `Authorization: Bearer` header value (pure).
fn bearer_token(header: &HeaderValue) -> Result<String, String> {
    header
        .to_str()
        .ok()
        .and_then(|value| value.strip_prefix("Bearer "))
        .map(|token| token.trim().to_string())
        .filter(|token| !token.is_empty())
        .ok_or_else(|| "the kubeconfig's credentials are not a bearer token".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(yaml: &str) -> Kubeconfig {
        Kubeconfig::from_yaml(yaml).expect("kubeconfig YAML")
    }

    const CLUSTER: &str = "
apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: 'https://127.0.0.1:6443'}
";

    #[test]
    fn the_current_contexts_token_and_namespace() {
        let kc = config(&format!(
            "{CLUSTER}
contexts:
- name: a
  context: {{cluster: c, user: alice, namespace: rl}}
- name: b
  context: {{cluster: c, user: bob}}
current-context: a
users:
- name: alice
  user: {{token: alice-token}}
- name: bob
  user: {{tokenFile: /tmp/bob}}
"
        ));
        assert_eq!(
            current_context(&kc).unwrap(),
            (
                Some("rl".to_string()),
                Credential::Token(Token::Literal("alice-token".into()))
            )
        );
        let mut kc = kc;
        kc.current_context = Some("b".into());
        assert_eq!(
            current_context(&kc).unwrap(),
            (None, Credential::Token(Token::File("/tmp/bob".into())))
        );
        kc.current_context = Some("gone".into());
        assert!(current_context(&kc).unwrap_err().contains("`gone`"));
    }

    #[test]
    fn plugins_and_unusable_users() {
        let kc = config(&format!(
            "{CLUSTER}
contexts:
- name: a
  context: {{cluster: c, user: cloud}}
- name: b
  context: {{cluster: c, user: cert}}
current-context: a
users:
- name: cloud
  user:
    exec: {{apiVersion: client.authentication.k8s.io/v1, command: get-token}}
- name: cert
  user: {{client-certificate: /tmp/c.crt, client-key: /tmp/c.key}}
"
        ));
        assert_eq!(current_context(&kc).unwrap().1, Credential::Plugin);
        let mut kc = kc;
        kc.current_context = Some("b".into());
        match current_context(&kc).unwrap().1 {
            Credential::Unusable(why) => assert!(why.contains("client certificate"), "{why}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn bearer_headers() {
        assert_eq!(
            bearer_token(&HeaderValue::from_static("Bearer abc")).unwrap(),
            "abc"
        );
        assert!(bearer_token(&HeaderValue::from_static("Basic abc")).is_err());
        assert!(bearer_token(&HeaderValue::from_static("Bearer ")).is_err());
    }
}
