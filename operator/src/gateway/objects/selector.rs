//! Label selectors of list routes (`?labelSelector=`), parsed like kubectl's (pure): `k=v`, `k==v`,
//! `k!=v`, `k`, `!k`, `k in (a,b)`, `k notin (a,b)`, comma-separated (all must match).

use std::collections::{BTreeMap, BTreeSet};

use kube::core::{Expression, Selector, SelectorExt};

/// A parsed selector.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LabelSelector(Vec<Expression>);

impl LabelSelector {
    /// Whether `labels` satisfy every expression.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let selector: Selector = self.0.iter().cloned().collect();
        selector.matches(labels)
    }
}

/// Splits on commas that are not inside parentheses.
fn split_terms(text: &str) -> Result<Vec<&str>, String> {
    let mut terms = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth < 0 {
                    return Err("unbalanced `)`".into());
                }
            }
            ',' if depth == 0 => {
                terms.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err("unbalanced `(`".into());
    }
    terms.push(&text[start..]);
    Ok(terms)
}

fn valid_key(key: &str) -> Result<String, String> {
    let key = key.trim();
    if key.is_empty()
        || !key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
    {
        return Err(format!("`{key}` is not a label key"));
    }
    Ok(key.to_string())
}

fn set_of(values: &str) -> Result<BTreeSet<String>, String> {
    let inner = values
        .trim()
        .strip_prefix('(')
        .and_then(|v| v.strip_suffix(')'))
        .ok_or_else(|| format!("`{values}` must be a parenthesised list such as (a,b)"))?;
    Ok(inner
        .split(',')
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect())
}

fn parse_term(term: &str) -> Result<Expression, String> {
    let term = term.trim();
    if let Some(key) = term.strip_prefix('!') {
        return Ok(Expression::DoesNotExist(valid_key(key)?));
    }
    if let Some((key, value)) = term.split_once("!=") {
        return Ok(Expression::NotEqual(
            valid_key(key)?,
            value.trim().to_string(),
        ));
    }
    if let Some((key, value)) = term.split_once("==").or_else(|| term.split_once('=')) {
        return Ok(Expression::Equal(valid_key(key)?, value.trim().to_string()));
    }
    let words: Vec<&str> = term.splitn(3, ' ').filter(|w| !w.is_empty()).collect();
    if let Some(position) = term.find(" notin ") {
        let (key, rest) = term.split_at(position);
        return Ok(Expression::NotIn(valid_key(key)?, set_of(&rest[7..])?));
    }
    if let Some(position) = term.find(" in ") {
        let (key, rest) = term.split_at(position);
        return Ok(Expression::In(valid_key(key)?, set_of(&rest[4..])?));
    }
    if words.len() == 1 {
        return Ok(Expression::Exists(valid_key(words[0])?));
    }
    Err(format!("cannot parse `{term}`"))
}

/// Parses a selector; an empty string selects everything.
pub fn parse(text: &str) -> Result<LabelSelector, String> {
    if text.trim().is_empty() {
        return Ok(LabelSelector::default());
    }
    let invalid = |e: String| format!("invalid labelSelector `{text}`: {e}");
    split_terms(text)
        .map_err(invalid)?
        .into_iter()
        .filter(|t| !t.trim().is_empty())
        .map(parse_term)
        .collect::<Result<Vec<_>, _>>()
        .map(LabelSelector)
        .map_err(invalid)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn equality_existence_and_sets() {
        let l = labels(&[
            ("app", "web"),
            ("tier", "a"),
            ("orchard.dev/rollout-group", "g1"),
        ]);
        for (selector, expected) in [
            ("", true),
            ("app=web", true),
            ("app==web", true),
            ("app=db", false),
            ("app!=db", true),
            ("app", true),
            ("!app", false),
            ("!missing", true),
            ("tier in (a,b)", true),
            ("tier in (b)", false),
            ("tier notin (b, c)", true),
            ("app=web,tier in (a, b),orchard.dev/rollout-group=g1", true),
            ("app=web,tier=b", false),
        ] {
            let parsed = parse(selector).unwrap_or_else(|e| panic!("{selector}: {e}"));
            assert_eq!(parsed.matches(&l), expected, "{selector}");
        }
    }

    #[test]
    fn garbage_is_rejected_with_the_selector() {
        for bad in ["app in a,b", "tier in (a", "a b c", "=x", "bad key!=1"] {
            let err = parse(bad).unwrap_err();
            assert!(err.contains("invalid labelSelector"), "{bad}: {err}");
        }
    }
}
