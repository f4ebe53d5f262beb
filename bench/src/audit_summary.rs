//! Who wrote what (pure): the API server's audit log of writes (`ControlPlane::audit_log`, metadata
//! level, one JSON event per line) summed per sender, verb, resource and answer code, for the
//! benchmarks' "every write per sandbox" tables.

use std::collections::BTreeMap;

use serde_json::Value;

/// One row: who, what, how it was answered, how many.
#[derive(Debug, Clone, PartialEq)]
pub struct WriteRow {
    /// The sender, shortened (`operator`, `garbage collector`, `node`, ...).
    pub who: String,
    /// `verb resource[/subresource]`, e.g. `delete pods`.
    pub what: String,
    /// HTTP code of the answer.
    pub code: u16,
    /// Requests.
    pub count: u64,
}

/// A readable name for an audit event's user (pure).
pub fn sender(username: &str, user_agent: &str) -> String {
    let name = username
        .strip_prefix("system:serviceaccount:kube-system:")
        .map(|controller| controller.replace('-', " "));
    match name {
        Some(controller) => controller,
        None if username.starts_with("system:node:") => "node".into(),
        None if username == "system:kube-scheduler" || user_agent.starts_with("kube-scheduler") => {
            "scheduler".into()
        }
        None if user_agent.starts_with("kwok") => "KWOK (the nodes)".into(),
        None if user_agent.starts_with("orchard-bench") => "benchmark driver".into(),
        None if user_agent.starts_with("orchard-operator") => "operator".into(),
        None if user_agent.starts_with("orchard-local-node") => "node (the hollow node)".into(),
        None if user_agent.starts_with("kube-controller-manager") => {
            "kube-controller-manager".into()
        }
        None => format!(
            "{username} ({})",
            user_agent.split('/').next().unwrap_or("")
        ),
    }
}

/// Whether `verb` writes.
fn is_write(verb: &str) -> bool {
    matches!(
        verb,
        "create" | "update" | "patch" | "delete" | "deletecollection"
    )
}

/// The writes in `log` (audit events, one per line; lines that are not events are skipped), summed by
/// sender, verb, resource and code, most frequent first (pure).
pub fn summarize(log: &str) -> Vec<WriteRow> {
    summarize_requests(log, "", false)
}

/// The requests in `log` received at or after `since` (an RFC 3339 UTC time as the API server writes
/// it; empty: all), writes only unless `reads`, summed like [`summarize`] (pure).
pub fn summarize_requests(log: &str, since: &str, reads: bool) -> Vec<WriteRow> {
    let mut counts: BTreeMap<(String, String, u16), u64> = BTreeMap::new();
    for event in log
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
    {
        let Some(verb) = event["verb"].as_str() else {
            continue;
        };
        if !reads && !is_write(verb) {
            continue;
        }
        if event["requestReceivedTimestamp"].as_str().unwrap_or("") < since {
            continue;
        }
        let resource = event["objectRef"]["resource"].as_str().unwrap_or("?");
        let what = match event["objectRef"]["subresource"].as_str() {
            Some(sub) => format!("{verb} {resource}/{sub}"),
            None => format!("{verb} {resource}"),
        };
        let who = sender(
            event["user"]["username"].as_str().unwrap_or(""),
            event["userAgent"].as_str().unwrap_or(""),
        );
        let code = event["responseStatus"]["code"]
            .as_u64()
            .and_then(|c| u16::try_from(c).ok())
            .unwrap_or(0);
        *counts.entry((who, what, code)).or_default() += 1;
    }
    let mut rows: Vec<WriteRow> = counts
        .into_iter()
        .map(|((who, what, code), count)| WriteRow {
            who,
            what,
            code,
            count,
        })
        .collect();
    rows.sort_by(|a, b| b.count.cmp(&a.count).then(a.who.cmp(&b.who)));
    rows
}

/// The markdown table of `rows` per sandbox of `sandboxes`, with the total (pure).
pub fn table(rows: &[WriteRow], sandboxes: usize) -> String {
    let n = sandboxes.max(1) as f64;
    let mut text = String::from("| sender | write | answer | per sandbox |\n|---|---|---|---|\n");
    for row in rows {
        text.push_str(&format!(
            "| {} | {} | {} | {:.2} |\n",
            row.who,
            row.what,
            row.code,
            row.count as f64 / n
        ));
    }
    let total: u64 = rows.iter().map(|r| r.count).sum();
    text.push_str(&format!("| **all** | | | **{:.2}** |\n", total as f64 / n));
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_before_the_start_are_left_out_and_components_are_named() {
        let log = [
            r#"{"verb":"get","requestReceivedTimestamp":"2026-11-29T07:00:00.100000Z","user":{"username":"admin"},"userAgent":"kube-scheduler/v1.36.3","objectRef":{"resource":"pods"},"responseStatus":{"code":200}}"#,
            r#"{"verb":"patch","requestReceivedTimestamp":"2026-11-29T07:00:01.000000Z","user":{"username":"admin"},"userAgent":"kwok/v0.8.0","objectRef":{"resource":"pods","subresource":"status"},"responseStatus":{"code":200}}"#,
            r#"{"verb":"create","requestReceivedTimestamp":"2026-11-29T07:00:02.000000Z","user":{"username":"admin"},"userAgent":"orchard-bench","objectRef":{"resource":"sandboxes"},"responseStatus":{"code":201}}"#,
        ]
        .join("\n");
        let rows = summarize_requests(&log, "2026-11-29T07:00:00.500000Z", true);
        assert_eq!(rows.len(), 2, "{rows:?}");
        assert!(
            rows.iter()
                .any(|r| r.who == "KWOK (the nodes)" && r.what == "patch pods/status")
        );
        assert!(rows.iter().any(|r| r.who == "benchmark driver"));
        let all = summarize_requests(&log, "", true);
        assert!(
            all.iter()
                .any(|r| r.who == "scheduler" && r.what == "get pods")
        );
        assert_eq!(summarize_requests(&log, "", false).len(), 2, "writes only");
    }

    #[test]
    fn writes_are_summed_by_sender_and_answer() {
        let log = [
            r#"{"verb":"delete","user":{"username":"system:serviceaccount:kube-system:generic-garbage-collector"},"userAgent":"kube-controller-manager/v1.34","objectRef":{"resource":"pods"},"responseStatus":{"code":200}}"#,
            r#"{"verb":"delete","user":{"username":"system:serviceaccount:kube-system:generic-garbage-collector"},"userAgent":"kube-controller-manager/v1.34","objectRef":{"resource":"pods"},"responseStatus":{"code":200}}"#,
            r#"{"verb":"delete","user":{"username":"system:node:n1"},"userAgent":"kubelet","objectRef":{"resource":"pods"},"responseStatus":{"code":404}}"#,
            r#"{"verb":"patch","user":{"username":"admin"},"userAgent":"orchard-operator/0.1","objectRef":{"resource":"sandboxes","subresource":"status"},"responseStatus":{"code":200}}"#,
            r#"{"verb":"get","user":{"username":"admin"},"objectRef":{"resource":"pods"},"responseStatus":{"code":200}}"#,
            "not json",
        ]
        .join("\n");
        let rows = summarize(&log);
        assert_eq!(rows.len(), 3);
        assert_eq!(
            rows[0],
            WriteRow {
                who: "generic garbage collector".into(),
                what: "delete pods".into(),
                code: 200,
                count: 2
            }
        );
        assert!(rows.iter().any(|r| r.who == "node" && r.code == 404));
        assert!(
            rows.iter()
                .any(|r| r.who == "operator" && r.what == "patch sandboxes/status")
        );
        assert_eq!(summarize_requests(&log, "", true).len(), 4, "the GET too");
        let shown = table(&rows, 2);
        assert!(
            shown.contains("| generic garbage collector | delete pods | 200 | 1.00 |"),
            "{shown}"
        );
        assert!(shown.contains("**2.00**"), "{shown}");
    }
}
