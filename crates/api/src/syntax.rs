//! Kubernetes label syntax: keys (qualified names with an optional DNS-subdomain prefix) and
//! values, as the API server validates them. Used wherever labels or taints are checked
//! before they are stored (the admission webhook, providers' node templates).

/// Why a label key or value is not valid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LabelSyntaxError {
    /// The part before `/` is not a DNS subdomain.
    #[error(
        "{key:?}: the prefix must be a DNS subdomain (lower-case alphanumerics, '-' and '.', at most 253 characters)"
    )]
    Prefix {
        /// The key.
        key: String,
    },
    /// The name (after the prefix) is empty, too long or has other characters.
    #[error(
        "{key:?} is not a valid label key: at most 63 alphanumerics, '-', '_' or '.', beginning and ending with an alphanumeric, after an optional DNS-subdomain prefix and '/'"
    )]
    Name {
        /// The key.
        key: String,
    },
    /// The value is too long or has other characters.
    #[error(
        "{value:?} is not a valid label value: empty, or at most 63 alphanumerics, '-', '_' or '.', beginning and ending with an alphanumeric"
    )]
    Value {
        /// The value.
        value: String,
    },
}

/// Checks a label (or taint) key.
pub fn label_key(key: &str) -> Result<(), LabelSyntaxError> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if prefix.is_some_and(|p| !dns_subdomain(p)) {
        return Err(LabelSyntaxError::Prefix { key: key.into() });
    }
    if name.is_empty() || name.len() > 63 || !name_chars(name) {
        return Err(LabelSyntaxError::Name { key: key.into() });
    }
    Ok(())
}

/// Checks a label (or taint) value.
pub fn label_value(value: &str) -> Result<(), LabelSyntaxError> {
    if value.is_empty() || (value.len() <= 63 && name_chars(value)) {
        Ok(())
    } else {
        Err(LabelSyntaxError::Value {
            value: value.into(),
        })
    }
}

fn name_chars(s: &str) -> bool {
    let b = s.as_bytes();
    b.first().is_some_and(u8::is_ascii_alphanumeric)
        && b.last().is_some_and(u8::is_ascii_alphanumeric)
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

fn dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|part| {
            let b = part.as_bytes();
            b.first()
                .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
                && b.last()
                    .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
                && b.iter()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_values() {
        for ok in [
            "node.kubernetes.io/role",
            "worker",
            "kubernetes.io/hostname",
            "a",
        ] {
            assert_eq!(label_key(ok), Ok(()), "{ok}");
        }
        for bad in ["Example.com/x", "/x", "x/", "-a.io/x", &"a".repeat(64)] {
            assert!(label_key(bad).is_err(), "{bad}");
        }
        assert!(matches!(
            label_key("Upper.io/a"),
            Err(LabelSyntaxError::Prefix { .. })
        ));
        for ok in ["", "v1.2_3-x", "a"] {
            assert_eq!(label_value(ok), Ok(()), "{ok}");
        }
        for bad in ["-x", "x-", "a b", &"a".repeat(64)] {
            assert!(label_value(bad).is_err(), "{bad}");
        }
    }
}
