//! The operator's agent-token key: one Secret in the operator's namespace, created by the first
//! replica that finds none and read by every replica at start. Replicas racing to create it agree:
//! the loser of the create reads the winner's key.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};

use crate::plumbing::error::{Error, Result};
use crate::plumbing::operator_key::OperatorKey;
use orchard_api::{MANAGED_BY, MANAGED_BY_LABEL};

/// Name of the key Secret in the operator's namespace.
pub const TOKEN_KEY_SECRET: &str = "orchard-agent-token-key";
/// Key of the key material in that Secret.
pub const TOKEN_KEY_FIELD: &str = "key";

/// The key Secret with fresh material (pure but for the material the caller draws).
pub fn key_secret(namespace: &str, material: &[u8]) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(TOKEN_KEY_SECRET.to_string()),
            namespace: Some(namespace.to_string()),
            labels: Some(BTreeMap::from([(
                MANAGED_BY_LABEL.to_string(),
                MANAGED_BY.to_string(),
            )])),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(
            TOKEN_KEY_FIELD.to_string(),
            ByteString(material.to_vec()),
        )])),
        type_: Some("Opaque".to_string()),
        immutable: Some(true),
        ..Secret::default()
    }
}

/// The key held by `secret`, or why it holds none (pure).
pub fn key_of(secret: &Secret) -> Result<OperatorKey> {
    let material = secret
        .data
        .as_ref()
        .and_then(|d| d.get(TOKEN_KEY_FIELD))
        .ok_or_else(|| {
            Error::Config(format!(
                "Secret {}/{} has no `{TOKEN_KEY_FIELD}`: delete it to let the operator create a new key (every running sandbox then needs recreating)",
                secret.namespace().unwrap_or_default(),
                secret.name_any()
            ))
        })?;
    OperatorKey::new(&material.0).map_err(|err| {
        Error::Config(format!(
            "Secret {}/{}: {err}",
            secret.namespace().unwrap_or_default(),
            secret.name_any()
        ))
    })
}

/// Reads the key from `namespace`, creating it when there is none.
pub async fn load_or_create(client: &Client, namespace: &str) -> Result<OperatorKey> {
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    if let Some(secret) = api.get_opt(TOKEN_KEY_SECRET).await? {
        return key_of(&secret);
    }
    let material: [u8; 32] = rand::random();
    match api
        .create(&PostParams::default(), &key_secret(namespace, &material))
        .await
    {
        Ok(created) => {
            tracing::info!(
                namespace,
                secret = TOKEN_KEY_SECRET,
                "created the agent-token key"
            );
            key_of(&created)
        }
        // Another replica created it first: use theirs.
        Err(kube::Error::Api(status)) if status.code == 409 => {
            key_of(&api.get(TOKEN_KEY_SECRET).await?)
        }
        Err(err) => Err(err.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_secret_round_trips_and_bad_ones_say_what_to_do() {
        let secret = key_secret("orchard-system", &[3; 32]);
        assert_eq!(secret.immutable, Some(true));
        let key = key_of(&secret).unwrap();
        assert_eq!(key.id(), OperatorKey::new(&[3; 32]).unwrap().id());

        let short = key_secret("orchard-system", &[3; 8]);
        assert!(
            key_of(&short)
                .unwrap_err()
                .to_string()
                .contains("at least 32")
        );

        let mut empty = secret;
        empty.data = None;
        let error = key_of(&empty).unwrap_err().to_string();
        assert!(error.contains("delete it"), "{error}");
    }
}
