//! Installs the project's CRDs from `crds/*.yaml` with server-side apply, as a platform engineer
//! would, and waits until the API server serves them.

use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use serde::Deserialize;

use crate::error::{E2eError, Result};

/// Reads every CRD document from the YAML files in `dir`.
pub fn read_crds(dir: &Path) -> Result<Vec<CustomResourceDefinition>> {
    let mut crds = Vec::new();
    let mut paths: Vec<_> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    paths.sort();
    for path in paths {
        let text = std::fs::read_to_string(&path)?;
        for document in serde_yaml::Deserializer::from_str(&text) {
            let crd = CustomResourceDefinition::deserialize(document)
                .map_err(|e| E2eError::Setup(format!("{}: not a CRD: {e}", path.display())))?;
            crds.push(crd);
        }
    }
    Ok(crds)
}

/// Applies the CRDs in `dir` (server-side apply) and waits for each to be Established.
pub async fn install(client: &Client, dir: &Path) -> Result<Vec<String>> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut names = Vec::new();
    for crd in read_crds(dir)? {
        let name = crd
            .metadata
            .name
            .clone()
            .ok_or_else(|| E2eError::Setup("CRD without a name".into()))?;
        api.patch(
            &name,
            &PatchParams::apply("orchard-e2e").force(),
            &Patch::Apply(&crd),
        )
        .await?;
        names.push(name);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    for name in &names {
        loop {
            let crd = api.get(name).await?;
            let established = crd.status.and_then(|s| s.conditions).is_some_and(|cs| {
                cs.iter()
                    .any(|c| c.type_ == "Established" && c.status == "True")
            });
            if established {
                break;
            }
            if Instant::now() > deadline {
                return Err(E2eError::NotReady {
                    component: format!("CRD {name}"),
                    seconds: 30,
                    detail: "not Established".into(),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok(names)
}
