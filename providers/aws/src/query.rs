//! EC2's Query protocol, the request side: an action and its parameters, flattened the way
//! EC2 names them (`NetworkInterface.1.SecurityGroupId.2`), sent as a form-encoded body.
//!
//! The parameter names of every field the driver sends are checked against what the AWS SDK
//! for Rust put on the wire for the same specs (`tests/wire`, `tests/golden`), and every
//! request the driver makes runs against moto in the tests.

use std::fmt::Write as _;

/// The EC2 API version every request names.
pub const API_VERSION: &str = "2016-11-15";

/// One EC2 request: the action and its parameters, in the order they were set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Query {
    action: &'static str,
    params: Vec<(String, String)>,
}

impl Query {
    /// A request of `action` (`RunInstances`, ...) without parameters.
    pub fn new(action: &'static str) -> Query {
        Query {
            action,
            params: Vec::new(),
        }
    }

    /// The action.
    pub fn action(&self) -> &'static str {
        self.action
    }

    /// Sets `name` to `value`, replacing an earlier value of `name`.
    pub fn set(&mut self, name: impl Into<String>, value: impl ToString) -> &mut Self {
        let name = name.into();
        let value = value.to_string();
        match self.params.iter_mut().find(|(n, _)| *n == name) {
            Some(p) => p.1 = value,
            None => self.params.push((name, value)),
        }
        self
    }

    /// Sets `name` to `value` when there is one.
    pub fn opt(&mut self, name: impl Into<String>, value: Option<impl ToString>) -> &mut Self {
        if let Some(v) = value {
            self.set(name, v);
        }
        self
    }

    /// Sets `name` to `value` unless it is empty.
    pub fn non_empty(&mut self, name: impl Into<String>, value: &str) -> &mut Self {
        if !value.is_empty() {
            self.set(name, value);
        }
        self
    }

    /// Sets a list: `<name>.1`, `<name>.2`, ... (EC2 numbers list members from 1).
    pub fn list<'a>(&mut self, name: &str, values: impl IntoIterator<Item = &'a str>) -> &mut Self {
        for (i, v) in values.into_iter().enumerate() {
            self.set(format!("{name}.{}", i + 1), v);
        }
        self
    }

    /// Sets `Filter.N.Name` and `Filter.N.Value.M` of each filter.
    pub fn filters(&mut self, filters: &[Filter]) -> &mut Self {
        for (i, f) in filters.iter().enumerate() {
            let prefix = format!("Filter.{}", i + 1);
            self.set(format!("{prefix}.Name"), &f.name);
            self.list(
                &format!("{prefix}.Value"),
                f.values.iter().map(String::as_str),
            );
        }
        self
    }

    /// The value of `name`, if set.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The parameters, in the order they were set (without `Action` and `Version`).
    pub fn params(&self) -> &[(String, String)] {
        &self.params
    }

    /// The form-encoded body: `Action`, `Version`, then the parameters.
    pub fn body(&self) -> String {
        let mut out = String::new();
        let mut push = |name: &str, value: &str| {
            if !out.is_empty() {
                out.push('&');
            }
            encode_into(&mut out, name);
            out.push('=');
            encode_into(&mut out, value);
        };
        push("Action", self.action);
        push("Version", API_VERSION);
        for (n, v) in &self.params {
            push(n, v);
        }
        out
    }
}

/// A `DescribeInstances` filter: a name and the values any of which matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Filter {
    /// The filter's name (`tag-key`, `tag:Name`, `instance-state-name`, ...).
    pub name: String,
    /// Its values.
    pub values: Vec<String>,
}

/// Percent-encodes everything but RFC 3986's unreserved characters, as the SDK does.
fn encode_into(out: &mut String, s: &str) {
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_name_action_version_and_encode_values() {
        let mut q = Query::new("DescribeInstances");
        q.set("MaxResults", 5)
            .opt("NextToken", None::<&str>)
            .non_empty("Empty", "")
            .filters(&[Filter {
                name: "tag:Name".into(),
                values: vec!["a b&c=d/é".into(), "x".into()],
            }]);
        assert_eq!(
            q.body(),
            "Action=DescribeInstances&Version=2016-11-15&MaxResults=5&Filter.1.Name=tag%3AName\
             &Filter.1.Value.1=a%20b%26c%3Dd%2F%C3%A9&Filter.1.Value.2=x"
        );
        // Setting a name again replaces its value in place.
        q.set("MaxResults", 1000);
        assert_eq!(q.get("MaxResults"), Some("1000"));
        assert_eq!(q.params()[0].0, "MaxResults");
    }
}
