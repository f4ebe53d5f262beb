//! The API server's refusals of a Pod creation that are not errors of the operator (pure): a full
//! ResourceQuota (retried) and an admission rejection (final).

/// Why the API server's refusal of a Pod creation is a ResourceQuota that is full, or `None` (pure).
pub fn quota_refusal(code: u16, message: &str) -> Option<String> {
    (code == 403 && message.contains("exceeded quota")).then(|| {
        format!("{message}; the pod is created once the quota has room (raise the ResourceQuota or wait for other pods to end)")
    })
}

/// Why the API server's refusal of a Pod creation will not go away by retrying, or `None` when it
/// may (pure): Pod Security admission (403 "violates PodSecurity") and validation (422). Other 403s
/// (the operator's own RBAC, a quota) are retried: an administrator can fix them.
pub fn admission_rejection(code: u16, message: &str) -> Option<String> {
    let permanent = (code == 403 && message.contains("violates PodSecurity")) || code == 422;
    permanent.then(|| {
        if message.contains("violates PodSecurity") {
            format!(
                "{message}; set spec.security.profile: Restricted (or label the namespace with a laxer pod-security.kubernetes.io/enforce level)"
            )
        } else {
            message.to_string()
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_full_quota_is_a_quota_refusal() {
        assert!(quota_refusal(403, "exceeded quota: compute").is_some());
        assert!(quota_refusal(403, "pods is forbidden: User cannot create").is_none());
        assert!(quota_refusal(422, "exceeded quota").is_none());
    }

    #[test]
    fn pod_security_rejections_are_permanent_other_refusals_are_not() {
        let psa = admission_rejection(
            403,
            "pods \"s\" is forbidden: violates PodSecurity \"restricted:latest\": runAsNonRoot != true",
        )
        .expect("permanent");
        assert!(psa.contains("violates PodSecurity"), "{psa}");
        assert!(psa.contains("spec.security.profile: Restricted"), "{psa}");
        assert!(admission_rejection(422, "Pod \"s\" is invalid").is_some());
        assert_eq!(
            admission_rejection(403, "pods is forbidden: User cannot create resource"),
            None
        );
        assert_eq!(admission_rejection(403, "exceeded quota: compute"), None);
        assert_eq!(admission_rejection(500, "violates PodSecurity"), None);
    }
}
