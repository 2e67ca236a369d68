//! Decoding a provider spec as Go's `encoding/json` decodes it into a struct.
//!
//! Go matches an object's keys to a struct's fields case-insensitively (an exact match
//! preferred) and ignores keys it does not know; serde matches exactly. [`go_decode`] decodes
//! through a `Deserializer` that, wherever a struct is decoded, renames each key to the
//! field (or alias) it matches ignoring case, and reports the keys that match no field
//! ([`UnknownKey`]), with the nearest field's name. Maps keep their keys as they are. A `null`
//! leaves a field as it is, as in Go.

use std::cell::RefCell;
use std::fmt;

use serde::de::{
    self, DeserializeOwned, DeserializeSeed, IntoDeserializer, MapAccess, SeqAccess, Visitor,
};
use serde_json::{Map, Value};

/// A key of a spec that no field takes: Go ignores it, so do we, but it is reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownKey {
    /// Where, e.g. `providerSpec.disks[0].sizeGBs`.
    pub path: String,
    /// The field whose name is nearest, when one is near enough to be a likely typo.
    pub nearest: Option<String>,
    /// Another spelling of a key that is present as well (only the exact one counts).
    pub duplicate_of: Option<String>,
}

impl fmt::Display for UnknownKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.duplicate_of, &self.nearest) {
            (Some(d), _) => write!(f, "{}: ignored, {d} is given as well", self.path),
            (None, Some(n)) => write!(
                f,
                "{}: unknown field, ignored (did you mean {n}?)",
                self.path
            ),
            (None, None) => write!(f, "{}: unknown field, ignored", self.path),
        }
    }
}

/// A value decoded as Go decodes it, with the keys it ignored.
#[derive(Debug)]
pub struct GoDecoded<T> {
    /// The value.
    pub value: T,
    /// The keys no field took, in document order of their paths.
    pub unknown: Vec<UnknownKey>,
}

/// Decodes `value` into `T` as Go's `encoding/json` would decode it into the Go struct `T`
/// mirrors; `root` names the value in the paths of unknown keys (e.g. `providerSpec`).
pub fn go_decode<T: DeserializeOwned>(
    value: &Value,
    root: &str,
) -> Result<GoDecoded<T>, serde_json::Error> {
    let unknown = RefCell::new(Vec::new());
    let value = T::deserialize(GoValue {
        value: value.clone(),
        path: root.to_owned(),
        unknown: &unknown,
    })?;
    let mut unknown = unknown.into_inner();
    unknown.sort_by(|a, b| a.path.cmp(&b.path));
    unknown.dedup();
    Ok(GoDecoded { value, unknown })
}

/// The keys of `object` renamed to the `fields` they match as Go matches them: exactly, else
/// ignoring case (the first field in declaration order). Keys matching nothing, and a
/// second spelling of a key matched exactly, go to `unknown`. Pure.
pub fn match_keys(
    object: Map<String, Value>,
    fields: &[&'static str],
    path: &str,
    unknown: &mut Vec<UnknownKey>,
) -> Map<String, Value> {
    let mut out = Map::new();
    // Exact matches first: they win over another spelling of the same field.
    let (exact, rest): (Vec<_>, Vec<_>) = object
        .into_iter()
        .partition(|(k, _)| fields.contains(&k.as_str()));
    for (k, v) in exact {
        out.insert(k, v);
    }
    for (k, v) in rest {
        let here = format!("{path}.{k}");
        match fields.iter().find(|f| f.eq_ignore_ascii_case(&k)) {
            Some(f) if out.contains_key(*f) => unknown.push(UnknownKey {
                path: here,
                nearest: None,
                duplicate_of: Some((*f).to_owned()),
            }),
            Some(f) => {
                out.insert((*f).to_owned(), v);
            }
            None => unknown.push(UnknownKey {
                path: here,
                nearest: nearest(&k, fields),
                duplicate_of: None,
            }),
        }
    }
    out
}

/// The field nearest to `key` (edit distance ignoring case) when it is at most a third of the
/// key's length away. Pure.
pub fn nearest(key: &str, fields: &[&str]) -> Option<String> {
    let key = key.to_ascii_lowercase();
    fields
        .iter()
        .map(|f| (distance(&key, &f.to_ascii_lowercase()), *f))
        .filter(|(d, _)| *d <= (key.len() / 3).max(1))
        .min_by_key(|(d, _)| *d)
        .map(|(_, f)| f.to_owned())
}

/// Levenshtein distance. Pure.
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let cost = usize::from(ca != *cb);
            cur[j + 1] = (prev[j] + cost).min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

struct GoValue<'u> {
    value: Value,
    path: String,
    unknown: &'u RefCell<Vec<UnknownKey>>,
}

macro_rules! delegate {
    ($($method:ident)*) => {
        $(
            fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
                self.value.$method(visitor)
            }
        )*
    };
}

impl<'de, 'u> de::Deserializer<'de> for GoValue<'u> {
    type Error = serde_json::Error;

    delegate! {
        deserialize_bool deserialize_i8 deserialize_i16 deserialize_i32 deserialize_i64
        deserialize_i128 deserialize_u8 deserialize_u16 deserialize_u32 deserialize_u64
        deserialize_u128 deserialize_f32 deserialize_f64 deserialize_char deserialize_str
        deserialize_string deserialize_bytes deserialize_byte_buf deserialize_unit
        deserialize_identifier deserialize_ignored_any
    }

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self.value {
            Value::Object(_) => self.deserialize_map(visitor),
            Value::Array(_) => self.deserialize_seq(visitor),
            other => other.deserialize_any(visitor),
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        if self.value.is_null() {
            visitor.visit_none()
        } else {
            visitor.visit_some(self)
        }
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.value.deserialize_unit_struct(name, visitor)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self.value {
            Value::Array(items) => {
                let len = items.len();
                let mut seq = GoSeq {
                    items: items.into_iter().enumerate(),
                    path: self.path,
                    unknown: self.unknown,
                };
                let value = visitor.visit_seq(&mut seq)?;
                match seq.items.len() {
                    0 => Ok(value),
                    _ => Err(de::Error::invalid_length(len, &"fewer elements in array")),
                }
            }
            other => other.deserialize_seq(visitor),
        }
    }

    fn deserialize_tuple<V: Visitor<'de>>(
        self,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self.value {
            Value::Object(map) => visitor.visit_map(GoMap {
                entries: map.into_iter(),
                value: None,
                path: self.path,
                unknown: self.unknown,
            }),
            other => other.deserialize_map(visitor),
        }
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        match self.value {
            Value::Object(map) => {
                let mut matched =
                    match_keys(map, fields, &self.path, &mut self.unknown.borrow_mut());
                // Go: a JSON null leaves a field as it is (its zero value, or nil for a
                // pointer, slice or map), so a null is a key not given.
                matched.retain(|_, v| !v.is_null());
                visitor.visit_map(GoMap {
                    entries: matched.into_iter(),
                    value: None,
                    path: self.path,
                    unknown: self.unknown,
                })
            }
            other => other.deserialize_struct(name, fields, visitor),
        }
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.value.deserialize_enum(name, variants, visitor)
    }
}

struct GoSeq<'u> {
    items: std::iter::Enumerate<std::vec::IntoIter<Value>>,
    path: String,
    unknown: &'u RefCell<Vec<UnknownKey>>,
}

impl<'de, 'u> SeqAccess<'de> for GoSeq<'u> {
    type Error = serde_json::Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Self::Error> {
        match self.items.next() {
            Some((i, value)) => seed
                .deserialize(GoValue {
                    value,
                    path: format!("{}[{i}]", self.path),
                    unknown: self.unknown,
                })
                .map(Some),
            None => Ok(None),
        }
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.items.len())
    }
}

struct GoMap<'u> {
    entries: serde_json::map::IntoIter,
    value: Option<(String, Value)>,
    path: String,
    unknown: &'u RefCell<Vec<UnknownKey>>,
}

impl<'de, 'u> MapAccess<'de> for GoMap<'u> {
    type Error = serde_json::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Self::Error> {
        match self.entries.next() {
            Some((k, v)) => {
                let key = seed.deserialize(k.clone().into_deserializer()).map(Some);
                self.value = Some((k, v));
                key
            }
            None => Ok(None),
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(
        &mut self,
        seed: V,
    ) -> Result<V::Value, Self::Error> {
        let (k, v) = self
            .value
            .take()
            .ok_or_else(|| de::Error::custom("a value without its key"))?;
        let path = format!("{}.{k}", self.path);
        seed.deserialize(GoValue {
            value: v,
            path,
            unknown: self.unknown,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;
    use serde_json::json;
    use std::collections::BTreeMap;

    #[derive(Debug, Deserialize, PartialEq, Default)]
    #[serde(rename_all = "camelCase")]
    struct Nic {
        #[serde(default)]
        disable_external_ip: bool,
        #[serde(default)]
        subnetwork: String,
    }

    #[derive(Debug, Deserialize, PartialEq, Default)]
    #[serde(rename_all = "camelCase")]
    struct Spec {
        #[serde(default)]
        network_interfaces: Vec<Nic>,
        #[serde(default)]
        labels: BTreeMap<String, String>,
        #[serde(default, alias = "sizeGB")]
        size_gb: i64,
        #[serde(default)]
        nic: Option<Nic>,
        #[serde(default, rename = "APIVersion")]
        api_version: Option<String>,
    }

    #[test]
    fn keys_match_as_go_matches_them() {
        let d: GoDecoded<Spec> = go_decode(
            &json!({
                "networkInterfaces": [{ "disableExternalIP": true, "Subnetwork": "s" }],
                "labels": { "Role": "x" },
                "sizeGB": 50,
                "nic": { "DISABLEEXTERNALIP": true },
                "apiVersion": "v1",
                "disableExternalIPs": true,
            }),
            "providerSpec",
        )
        .unwrap();
        assert_eq!(
            d.value.network_interfaces,
            vec![Nic {
                disable_external_ip: true,
                subnetwork: "s".into()
            }]
        );
        assert_eq!(
            d.value.labels,
            BTreeMap::from([("Role".to_string(), "x".to_string())]),
            "map keys as they are"
        );
        assert_eq!(d.value.size_gb, 50);
        assert!(d.value.nic.unwrap().disable_external_ip);
        assert_eq!(d.value.api_version.as_deref(), Some("v1"));
        assert_eq!(
            d.unknown,
            vec![UnknownKey {
                path: "providerSpec.disableExternalIPs".into(),
                nearest: None,
                duplicate_of: None
            }]
        );
    }

    #[test]
    fn an_exact_key_wins_over_another_spelling() {
        let d: GoDecoded<Nic> = go_decode(
            &json!({ "disableExternalIp": true, "DisableExternalIP": false }),
            "n",
        )
        .unwrap();
        assert!(d.value.disable_external_ip);
        assert_eq!(
            d.unknown[0].duplicate_of.as_deref(),
            Some("disableExternalIp")
        );
    }

    #[test]
    fn the_nearest_field_is_named() {
        let d: GoDecoded<Nic> = go_decode(&json!({ "subnetwrk": "s" }), "n").unwrap();
        assert_eq!(d.unknown[0].nearest.as_deref(), Some("subnetwork"));
        assert_eq!(
            d.unknown[0].to_string(),
            "n.subnetwrk: unknown field, ignored (did you mean subnetwork?)"
        );
    }

    #[test]
    fn a_null_leaves_the_field_as_go_leaves_it() {
        let d: GoDecoded<Spec> = go_decode(
            &json!({
                "networkInterfaces": [{ "subnetwork": null, "disableExternalIP": null }],
                "labels": null,
                "sizeGB": null,
                "nic": null,
                "apiVersion": null,
            }),
            "providerSpec",
        )
        .unwrap();
        assert_eq!(d.value.network_interfaces, vec![Nic::default()]);
        assert_eq!(
            d.value,
            Spec {
                network_interfaces: vec![Nic::default()],
                ..Spec::default()
            }
        );
        assert!(d.unknown.is_empty());
    }

    #[test]
    fn type_errors_are_serde_s() {
        assert!(go_decode::<Nic>(&json!({ "disableExternalIP": "yes" }), "n").is_err());
    }
}

/// Checking a spec type against the JSON keys of the Go struct it mirrors.
///
/// The keys come as data (`<path>\t<go type>` lines under a `[spec]` header, paths like
/// `disks[].labels{}`: `[]` a slice element, `{}` a map value), e.g. read from a provider's
/// `*_provider_spec.go`. [`coverage::document`] builds one spec that sets every key, with a value of its
/// Go type; [`coverage::missing_keys`] decodes it and returns the keys the Rust type would ignore.
pub mod coverage {
    use serde::de::DeserializeOwned;
    use serde_json::{Map, Value, json};

    /// The `(path, go type)` lines of the `[spec]` section of `text`. Pure.
    pub fn spec_keys(text: &str) -> Vec<(String, String)> {
        let mut in_spec = false;
        let mut out = Vec::new();
        for line in text.lines() {
            let line = line.trim_end();
            if line.starts_with('[') && line.ends_with(']') && !line.contains('\t') {
                in_spec = line == "[spec]";
                continue;
            }
            if !in_spec || line.starts_with('#') || line.is_empty() {
                continue;
            }
            if let Some((path, ty)) = line.split_once('\t') {
                out.push((path.trim().to_owned(), ty.trim().to_owned()));
            }
        }
        out
    }

    /// A value of the Go type `ty` (`*bool`, `[]string`, `map[string]string`, a struct name):
    /// containers of structs are left for their keys' lines to fill. Pure.
    pub fn sample(ty: &str) -> Value {
        let ty = ty.trim_start_matches('*');
        if let Some(elem) = ty.strip_prefix("[]") {
            return match sample(elem) {
                Value::Object(_) => json!([{}]),
                v => json!([v]),
            };
        }
        if let Some(rest) = ty.strip_prefix("map[") {
            let elem = rest.split_once(']').map_or("", |(_, e)| e);
            return match sample(elem) {
                Value::Object(_) => json!({ "k": {} }),
                v => json!({ "k": v }),
            };
        }
        match ty {
            "bool" => json!(true),
            "string" => json!("x"),
            t if t.starts_with("int") || t.starts_with("uint") => json!(1),
            t if t.starts_with("float") => json!(1.5),
            _ => json!({}),
        }
    }

    /// One spec setting every key of `keys` ([`spec_keys`]), `overrides` (path → value) taking
    /// the place of [`sample`] where a key's Go type allows values the Rust type refuses (an
    /// enum, say). Pure.
    pub fn document(keys: &[(String, String)], overrides: &[(&str, Value)]) -> Value {
        let mut root = Value::Object(Map::new());
        for (path, ty) in keys {
            if path.ends_with("[]") || path.ends_with("{}") {
                continue;
            }
            let value = overrides
                .iter()
                .find(|(p, _)| p == path)
                .map_or_else(|| sample(ty), |(_, v)| v.clone());
            insert(&mut root, path, value);
        }
        root
    }

    /// Sets `value` at `path` below `root`, through the first element of each `[]` and the
    /// `k` entry of each `{}`; keeps what is there. Pure.
    fn insert(root: &mut Value, path: &str, value: Value) {
        let mut node = root;
        let segments: Vec<&str> = path.split('.').collect();
        for (i, seg) in segments.iter().enumerate() {
            let last = i + 1 == segments.len();
            let (key, hops) = split_hops(seg);
            let Some(obj) = node.as_object_mut() else {
                return;
            };
            if last && hops.is_empty() {
                obj.entry(key.to_owned()).or_insert(value);
                return;
            }
            let mut here = obj
                .entry(key.to_owned())
                .or_insert_with(|| match hops.first() {
                    Some('[') => json!([{}]),
                    Some(_) => json!({ "k": {} }),
                    None => json!({}),
                });
            for hop in &hops {
                here = match (hop, here) {
                    ('[', Value::Array(items)) => {
                        if items.is_empty() {
                            items.push(json!({}));
                        }
                        &mut items[0]
                    }
                    ('{', Value::Object(map)) => map.entry("k").or_insert_with(|| json!({})),
                    _ => return,
                };
            }
            if last {
                return;
            }
            node = here;
        }
    }

    /// `disks[]` → (`disks`, `['[']`); `labels{}` → (`labels`, `['{']`). Pure.
    fn split_hops(seg: &str) -> (&str, Vec<char>) {
        let mut key = seg;
        let mut hops = Vec::new();
        loop {
            if let Some(k) = key.strip_suffix("[]") {
                hops.insert(0, '[');
                key = k;
            } else if let Some(k) = key.strip_suffix("{}") {
                hops.insert(0, '{');
                key = k;
            } else {
                return (key, hops);
            }
        }
    }

    /// The keys of the Go spec in `text` that decoding [`document`] into `S` ignores (their
    /// paths, as [`super::UnknownKey`] names them, without the root); a value `S` refuses is
    /// the decode error.
    pub fn missing_keys<S: DeserializeOwned>(
        text: &str,
        overrides: &[(&str, Value)],
    ) -> Result<Vec<String>, serde_json::Error> {
        let doc = document(&spec_keys(text), overrides);
        let decoded = super::go_decode::<S>(&doc, "")?;
        Ok(decoded
            .unknown
            .into_iter()
            .map(|u| u.path.trim_start_matches('.').to_owned())
            .collect())
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn a_document_sets_every_key_with_a_value_of_its_type() {
            let text = "# c\n[spec]\nAPIVersion\tstring\ndisks\t[]*Disk\ndisks[].sizeGb\tint64\n\
                        disks[].labels\tmap[string]string\ndisks[].labels{}\tstring\n\
                        tags\t[]string\ntags[]\tstring\ngpu\t*Gpu\ngpu.count\tint64\n\
                        [secret]\nuserData\tx\n";
            let keys = spec_keys(text);
            assert_eq!(keys.len(), 9);
            assert_eq!(
                document(&keys, &[("gpu.count", json!(2))]),
                json!({
                    "APIVersion": "x",
                    "disks": [{ "sizeGb": 1, "labels": { "k": "x" } }],
                    "tags": ["x"],
                    "gpu": { "count": 2 },
                })
            );
        }
    }
}
