//! Label selector matching (Kubernetes `LabelSelectorAsSelector` semantics) without I/O.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// Whether `labels` match `selector`.
///
/// Like the Go controllers, a missing or empty selector matches **nothing** (a set with an
/// empty selector must never claim every machine of the namespace). Unknown operators never
/// match.
pub(crate) fn selector_matches(
    selector: Option<&LabelSelector>,
    labels: Option<&BTreeMap<String, String>>,
) -> bool {
    let Some(selector) = selector else {
        return false;
    };
    let empty = BTreeMap::new();
    let labels = labels.unwrap_or(&empty);
    let match_labels = selector.match_labels.as_ref().filter(|m| !m.is_empty());
    let expressions = selector
        .match_expressions
        .as_ref()
        .filter(|e| !e.is_empty());
    if match_labels.is_none() && expressions.is_none() {
        return false;
    }
    if let Some(ml) = match_labels
        && ml.iter().any(|(k, v)| labels.get(k) != Some(v))
    {
        return false;
    }
    expressions.into_iter().flatten().all(|e| {
        let values = e.values.as_deref().unwrap_or(&[]);
        match e.operator.as_str() {
            "In" => labels.get(&e.key).is_some_and(|v| values.contains(v)),
            "NotIn" => labels.get(&e.key).is_none_or(|v| !values.contains(v)),
            "Exists" => labels.contains_key(&e.key),
            "DoesNotExist" => !labels.contains_key(&e.key),
            _ => false,
        }
    })
}

/// Whether every label of `subset` is present with the same value in `labels` (the "fully
/// labeled" test of a machine against its set's template labels). An empty subset matches.
pub(crate) fn labels_contain(
    labels: Option<&BTreeMap<String, String>>,
    subset: Option<&BTreeMap<String, String>>,
) -> bool {
    let empty = BTreeMap::new();
    let labels = labels.unwrap_or(&empty);
    subset
        .into_iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn empty_selector_matches_nothing() {
        let l = labels(&[("a", "b")]);
        assert!(!selector_matches(None, Some(&l)));
        assert!(!selector_matches(Some(&LabelSelector::default()), Some(&l)));
    }

    #[test]
    fn match_labels_and_expressions() {
        let sel = LabelSelector {
            match_labels: Some(labels(&[("name", "md")])),
            match_expressions: Some(vec![
                LabelSelectorRequirement {
                    key: "zone".into(),
                    operator: "In".into(),
                    values: Some(vec!["a".into(), "b".into()]),
                },
                LabelSelectorRequirement {
                    key: "gone".into(),
                    operator: "DoesNotExist".into(),
                    values: None,
                },
            ]),
        };
        assert!(selector_matches(
            Some(&sel),
            Some(&labels(&[("name", "md"), ("zone", "a")]))
        ));
        assert!(!selector_matches(
            Some(&sel),
            Some(&labels(&[("name", "md"), ("zone", "c")]))
        ));
        assert!(!selector_matches(
            Some(&sel),
            Some(&labels(&[("name", "md"), ("zone", "a"), ("gone", "x")]))
        ));
        assert!(!selector_matches(Some(&sel), None));
    }

    #[test]
    fn subset() {
        let l = labels(&[("a", "1"), ("b", "2")]);
        assert!(labels_contain(Some(&l), Some(&labels(&[("a", "1")]))));
        assert!(!labels_contain(Some(&l), Some(&labels(&[("a", "2")]))));
        assert!(labels_contain(Some(&l), None));
    }
}
