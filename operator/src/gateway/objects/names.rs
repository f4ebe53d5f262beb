//! Namespaces and object names in gateway paths, checked before anything else is done with them
//! (pure). axum percent-decodes path parameters, and kube-rs puts names into API URLs as they are: a
//! name written `x%3Fy` would be authorised as `x?y` but fetch `x`. Every name Kubernetes can hold
//! is a DNS-1123 label (namespaces) or subdomain (objects), which needs no encoding at all, so
//! anything else is refused with 400 before it is authorised, looked up or sent anywhere.

use crate::gateway::http::errors::ApiError;

/// Longest namespace (a DNS-1123 label).
const MAX_LABEL: usize = 63;
/// Longest object name (a DNS-1123 subdomain).
const MAX_SUBDOMAIN: usize = 253;

/// Whether `text` is a DNS-1123 label: lower-case letters, digits and `-`, starting and ending with
/// a letter or digit, at most 63 characters.
pub fn is_dns_label(text: &str) -> bool {
    let bytes = text.as_bytes();
    let alphanumeric = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    !bytes.is_empty()
        && bytes.len() <= MAX_LABEL
        && bytes.first().is_some_and(alphanumeric)
        && bytes.last().is_some_and(alphanumeric)
        && bytes.iter().all(|b| alphanumeric(b) || *b == b'-')
}

/// Whether `text` is a DNS-1123 subdomain: dot-separated labels, at most 253 characters.
pub fn is_dns_subdomain(text: &str) -> bool {
    text.len() <= MAX_SUBDOMAIN && text.split('.').all(is_dns_label)
}

/// 400 unless `namespace` is a valid namespace name.
pub fn check_namespace(namespace: &str) -> Result<(), ApiError> {
    if is_dns_label(namespace) {
        return Ok(());
    }
    Err(ApiError::bad_request(format!(
        "`{}` is not a valid namespace name (lower-case letters, digits and '-', at most {MAX_LABEL} characters)",
        namespace.escape_debug()
    )))
}

/// 400 unless `name` is a valid object name.
pub fn check_name(name: &str) -> Result<(), ApiError> {
    if is_dns_subdomain(name) {
        return Ok(());
    }
    Err(ApiError::bad_request(format!(
        "`{}` is not a valid object name (lower-case letters, digits, '-' and '.', at most {MAX_SUBDOMAIN} characters)",
        name.escape_debug()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubernetes_names_pass() {
        for name in ["a", "sbx-1", "0", "g-10", &"a".repeat(63)] {
            assert!(is_dns_label(name), "{name}");
            assert!(check_name(name).is_ok());
            assert!(check_namespace(name).is_ok());
        }
        assert!(check_name("prompt.v2-1").is_ok());
    }

    #[test]
    fn anything_that_would_change_an_api_url_is_refused() {
        for name in [
            "", "x?y", "x/y", "x#y", "x%3Fy", "..", ".", "X", "x y", "-x", "x-", "x\n", "ä",
        ] {
            assert_eq!(check_name(name).unwrap_err().status, 400, "{name:?}");
            assert_eq!(check_namespace(name).unwrap_err().status, 400, "{name:?}");
        }
        assert!(check_namespace("a.b").is_err(), "namespaces are labels");
        assert!(!is_dns_label(&"a".repeat(64)));
        assert!(!is_dns_subdomain(&format!("{}.b", "a".repeat(252))));
        let message = check_name("x?y").unwrap_err().body.message;
        assert!(message.contains("x?y"), "{message}");
    }
}
