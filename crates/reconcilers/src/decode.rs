//! Watched objects decoded without what no store keeps.
//!
//! The API server sends every object with its managed fields: the server-side-apply record of
//! each writer, a tree of every field it set (`fieldsV1`), often the largest part of an
//! object. `k8s-openapi` decodes that tree into `serde_json::Value` maps, an allocation per
//! field, and the stores drop it right after. A profile of both controllers idle at 2000
//! machines put most of their allocations there, in the decoding of Node and Machine watch
//! events. [`Slim`] decodes a kind with the managed fields skipped in the input (read past,
//! never built); the informers watch through it.
//!
//! Nodes and Pods lose more in their stores ([`crate::informers::slim_node`],
//! [`mcm_drain::slim_pod`]): a Node's images, node info, capacity and allocatable, a Pod's
//! containers and most of its status. [`Slim`] skips those in the input too, with the same
//! lists of what is kept ([`NODE`], [`POD`]; a test holds the two in agreement), so a kubelet's
//! status update of a node with fifty images, or a pod's, builds none of what is dropped.

use std::any::TypeId;
use std::borrow::Cow;
use std::fmt;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use kube::runtime::watcher;
use serde::de::{
    self, DeserializeSeed, Deserializer, IgnoredAny, IntoDeserializer, MapAccess, Visitor,
};

/// `K`, decoded without `metadata.managedFields` (they are `None`), and for a Node or a Pod
/// without the parts of its spec and status its store drops ([`NODE`], [`POD`]); otherwise
/// the same kind, URL and object.
#[derive(Debug, Clone)]
pub(crate) struct Slim<K>(pub K);

impl<K: Resource> Resource for Slim<K> {
    type DynamicType = K::DynamicType;
    type Scope = K::Scope;

    fn kind(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::kind(dt)
    }
    fn group(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::group(dt)
    }
    fn version(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::version(dt)
    }
    fn api_version(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::api_version(dt)
    }
    fn plural(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        self.0.meta()
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        self.0.meta_mut()
    }
}

impl<'de, K: de::Deserialize<'de> + 'static> de::Deserialize<'de> for Slim<K> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        K::deserialize(Filtered {
            inner: deserializer,
            level: Level::root::<K>(),
        })
        .map(Slim)
    }
}

/// The watch event of the wrapped kind as one of the kind itself.
pub(crate) fn unwrap_event<K>(event: watcher::Event<Slim<K>>) -> watcher::Event<K> {
    match event {
        watcher::Event::Apply(o) => watcher::Event::Apply(o.0),
        watcher::Event::Delete(o) => watcher::Event::Delete(o.0),
        watcher::Event::Init => watcher::Event::Init,
        watcher::Event::InitApply(o) => watcher::Event::InitApply(o.0),
        watcher::Event::InitDone => watcher::Event::InitDone,
    }
}

/// What a kind's store keeps of its spec and status: every other entry of either is skipped.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Kept {
    pub spec: &'static [&'static str],
    pub status: &'static [&'static str],
}

/// What [`crate::informers::slim_node`] keeps of a Node.
pub(crate) const NODE: Kept = Kept {
    spec: &["providerID", "taints", "unschedulable"],
    status: &["conditions", "addresses", "volumesAttached"],
};

/// What [`mcm_drain::slim_pod`] keeps of a Pod.
pub(crate) const POD: Kept = Kept {
    spec: &[
        "nodeName",
        "volumes",
        "priority",
        "terminationGracePeriodSeconds",
    ],
    status: &["phase"],
};

/// Where in the object a value is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Level {
    /// The object of a kind whose spec and status are kept whole.
    Object,
    /// The object of a kind whose spec and status keep only some entries.
    Trimmed(&'static Kept),
    /// An object's `metadata`.
    Metadata,
    /// A trimmed kind's spec or status, with the entries it keeps.
    Keeping(&'static [&'static str]),
}

impl Level {
    /// The level of an object of kind `K`.
    fn root<K: 'static>() -> Level {
        let kind = TypeId::of::<K>();
        if kind == TypeId::of::<Node>() {
            Level::Trimmed(&NODE)
        } else if kind == TypeId::of::<Pod>() {
            Level::Trimmed(&POD)
        } else {
            Level::Object
        }
    }

    /// The level of the value under `key` at this level, if it is filtered at all.
    fn below(self, key: &str) -> Option<Level> {
        match (self, key) {
            (Level::Object | Level::Trimmed(_), "metadata") => Some(Level::Metadata),
            (Level::Trimmed(kept), "spec") => Some(Level::Keeping(kept.spec)),
            (Level::Trimmed(kept), "status") => Some(Level::Keeping(kept.status)),
            _ => None,
        }
    }

    /// Whether the entry `key` at this level is skipped.
    fn skips(self, key: &str) -> bool {
        match self {
            Level::Metadata => key == "managedFields",
            Level::Keeping(kept) => !kept.contains(&key),
            Level::Object | Level::Trimmed(_) => false,
        }
    }
}

/// A deserializer whose maps at `level` pass through [`FilteredMap`]; everything else is the
/// inner deserializer's.
struct Filtered<D> {
    inner: D,
    level: Level,
}

/// Forwards the named `deserialize_*` methods to the inner deserializer unchanged.
macro_rules! forward_unfiltered {
    ($($method:ident($($arg:ident: $ty:ty),*)),* $(,)?) => {
        $(
            fn $method<V: Visitor<'de>>(self, $($arg: $ty,)* visitor: V) -> Result<V::Value, D::Error> {
                self.inner.$method($($arg,)* visitor)
            }
        )*
    };
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for Filtered<D> {
    type Error = D::Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        let level = self.level;
        self.inner.deserialize_any(FilteredVisitor {
            inner: visitor,
            level,
        })
    }
    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        let level = self.level;
        self.inner.deserialize_map(FilteredVisitor {
            inner: visitor,
            level,
        })
    }
    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        let level = self.level;
        self.inner.deserialize_struct(
            name,
            fields,
            FilteredVisitor {
                inner: visitor,
                level,
            },
        )
    }
    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        let level = self.level;
        self.inner.deserialize_option(FilteredVisitor {
            inner: visitor,
            level,
        })
    }

    forward_unfiltered! {
        deserialize_bool(), deserialize_i8(), deserialize_i16(), deserialize_i32(),
        deserialize_i64(), deserialize_i128(), deserialize_u8(), deserialize_u16(),
        deserialize_u32(), deserialize_u64(), deserialize_u128(), deserialize_f32(),
        deserialize_f64(), deserialize_char(), deserialize_str(), deserialize_string(),
        deserialize_bytes(), deserialize_byte_buf(), deserialize_unit(), deserialize_seq(),
        deserialize_identifier(), deserialize_ignored_any(),
        deserialize_unit_struct(name: &'static str),
        deserialize_newtype_struct(name: &'static str),
        deserialize_tuple(len: usize),
        deserialize_tuple_struct(name: &'static str, len: usize),
        deserialize_enum(name: &'static str, variants: &'static [&'static str]),
    }

    fn is_human_readable(&self) -> bool {
        self.inner.is_human_readable()
    }
}

/// A visitor that hands the inner visitor a filtered map (or, for an option, a filtered
/// deserializer of its value); every other input unchanged.
struct FilteredVisitor<V> {
    inner: V,
    level: Level,
}

/// Forwards the named `visit_*` methods of plain values to the inner visitor.
macro_rules! forward_visits {
    ($($method:ident($ty:ty)),* $(,)?) => {
        $(
            fn $method<E: de::Error>(self, v: $ty) -> Result<Self::Value, E> {
                self.inner.$method(v)
            }
        )*
    };
}

impl<'de, V: Visitor<'de>> Visitor<'de> for FilteredVisitor<V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.expecting(f)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        self.inner.visit_map(FilteredMap {
            inner: map,
            level: self.level,
            value_level: None,
        })
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        self.inner.visit_some(Filtered {
            inner: d,
            level: self.level,
        })
    }
    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        self.inner.visit_none()
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        self.inner.visit_unit()
    }
    fn visit_seq<A: de::SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        self.inner.visit_seq(seq)
    }
    fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        self.inner.visit_newtype_struct(d)
    }
    fn visit_enum<A: de::EnumAccess<'de>>(self, data: A) -> Result<Self::Value, A::Error> {
        self.inner.visit_enum(data)
    }
    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
        self.inner.visit_borrowed_str(v)
    }
    fn visit_borrowed_bytes<E: de::Error>(self, v: &'de [u8]) -> Result<Self::Value, E> {
        self.inner.visit_borrowed_bytes(v)
    }

    forward_visits! {
        visit_bool(bool), visit_i8(i8), visit_i16(i16), visit_i32(i32), visit_i64(i64),
        visit_i128(i128), visit_u8(u8), visit_u16(u16), visit_u32(u32), visit_u64(u64),
        visit_u128(u128), visit_f32(f32), visit_f64(f64), visit_char(char),
        visit_str(&str), visit_string(String), visit_bytes(&[u8]), visit_byte_buf(Vec<u8>),
    }
}

/// A map at `level`: entries it [`Level::skips`] are read past; the value under a key with a
/// level [`Level::below`] it is filtered at that level.
struct FilteredMap<A> {
    inner: A,
    level: Level,
    value_level: Option<Level>,
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for FilteredMap<A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        mut seed: K,
    ) -> Result<Option<K::Value>, A::Error> {
        loop {
            let key = self.inner.next_key_seed(KeySeed {
                seed,
                level: self.level,
            })?;
            match key {
                None => return Ok(None),
                Some(Key::Skipped(returned)) => {
                    self.inner.next_value::<IgnoredAny>()?;
                    seed = returned;
                }
                Some(Key::Kept(value, below)) => {
                    self.value_level = below;
                    return Ok(Some(value));
                }
            }
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, A::Error> {
        match self.value_level.take() {
            Some(level) => self.inner.next_value_seed(FilteredSeed { seed, level }),
            None => self.inner.next_value_seed(seed),
        }
    }

    fn size_hint(&self) -> Option<usize> {
        self.inner.size_hint()
    }
}

/// A key read by [`KeySeed`]: skipped (with the seed back, unused), or the inner seed's value
/// with the level of the value under it.
enum Key<S, T> {
    Skipped(S),
    Kept(T, Option<Level>),
}

/// Reads a map key as a string, decides on it, and hands it to the inner seed when kept.
struct KeySeed<S> {
    seed: S,
    level: Level,
}

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for KeySeed<S> {
    type Value = Key<S, S::Value>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(self)
    }
}

impl<S> KeySeed<S> {
    fn decide<'de, E: de::Error>(
        self,
        key: &str,
        give: impl FnOnce(S) -> Result<S::Value, E>,
    ) -> Result<Key<S, S::Value>, E>
    where
        S: DeserializeSeed<'de>,
    {
        if self.level.skips(key) {
            return Ok(Key::Skipped(self.seed));
        }
        let below = self.level.below(key);
        give(self.seed).map(|v| Key::Kept(v, below))
    }
}

impl<'de, S: DeserializeSeed<'de>> Visitor<'de> for KeySeed<S> {
    type Value = Key<S, S::Value>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string key")
    }

    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
        self.decide(v, |seed| {
            seed.deserialize(de::value::BorrowedStrDeserializer::new(v))
        })
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        self.decide(v, |seed| seed.deserialize(v.into_deserializer()))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
        if self.level.skips(&v) {
            return Ok(Key::Skipped(self.seed));
        }
        let below = self.level.below(&v);
        self.seed
            .deserialize(v.into_deserializer())
            .map(|value| Key::Kept(value, below))
    }
}

/// The inner seed, given a [`Filtered`] deserializer at `level`.
struct FilteredSeed<S> {
    seed: S,
    level: Level,
}

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for FilteredSeed<S> {
    type Value = S::Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        self.seed.deserialize(Filtered {
            inner: d,
            level: self.level,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::informers::slim_node;
    use k8s_openapi::api::core::v1::{Node, Pod};
    use mcm_api::Machine;
    use serde_json::json;

    fn managed_fields() -> serde_json::Value {
        json!([{
            "manager": "kubelet", "operation": "Update", "apiVersion": "v1",
            "time": "2026-01-01T00:00:00Z", "fieldsType": "FieldsV1",
            "fieldsV1": { "f:status": { "f:conditions": { "k:{\"type\":\"Ready\"}": { ".": {} } } } }
        }])
    }

    fn node_json() -> serde_json::Value {
        json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {
                "name": "n1", "resourceVersion": "7",
                "labels": { "a": "b", "managedFields": "a label of that name is kept" },
                "annotations": { "c": "d" },
                "managedFields": managed_fields(),
                "finalizers": ["f"]
            },
            // Every field of a Node's spec and status (v1.36), kept or not.
            "spec": {
                "providerID": "local:///n1", "taints": [{ "key": "k", "effect": "NoSchedule" }],
                "unschedulable": true, "podCIDR": "10.0.0.0/24", "podCIDRs": ["10.0.0.0/24"],
                "externalID": "x", "configSource": { "configMap": {
                    "name": "c", "namespace": "kube-system", "kubeletConfigKey": "k" } }
            },
            "status": {
                "conditions": [{ "type": "Ready", "status": "True" }],
                "addresses": [{ "type": "InternalIP", "address": "10.0.0.1" }],
                "volumesAttached": [{ "name": "v", "devicePath": "/dev/v" }],
                "volumesInUse": ["v"],
                "allocatable": { "cpu": "2" }, "capacity": { "cpu": "2", "memory": "4Gi" },
                "daemonEndpoints": { "kubeletEndpoint": { "Port": 10250 } },
                "images": [{ "names": ["registry.example/app@sha256:0", "app:1"], "sizeBytes": 7 }],
                "nodeInfo": {
                    "architecture": "amd64", "bootID": "b", "containerRuntimeVersion": "c",
                    "kernelVersion": "k", "kubeProxyVersion": "", "kubeletVersion": "v",
                    "machineID": "m", "operatingSystem": "linux", "osImage": "o",
                    "systemUUID": "s"
                },
                "phase": "Running", "config": { "error": "e" },
                "runtimeHandlers": [{ "name": "runc" }],
                "features": { "supplementalGroupsPolicy": true }
            }
        })
    }

    #[test]
    fn a_node_decodes_as_its_store_keeps_it() {
        let text = node_json().to_string();
        let direct: Node = serde_json::from_str(&text).unwrap();
        assert_eq!(
            direct.metadata.managed_fields.as_ref().map(Vec::len),
            Some(1)
        );
        let status = direct.status.clone().unwrap();
        assert!(status.images.is_some() && status.node_info.is_some());
        assert!(direct.spec.as_ref().unwrap().pod_cidr.is_some());
        let filtered: Slim<Node> = serde_json::from_str(&text).unwrap();
        let mut expected = direct;
        slim_node(&mut expected);
        // What the input skipped is exactly what the store drops: NODE and slim_node agree.
        assert_eq!(filtered.0, expected);
        let kept = filtered.0.status.as_ref().unwrap();
        assert!(kept.conditions.is_some() && kept.addresses.is_some());
        assert!(kept.volumes_attached.is_some());
        // Only the metadata's entry is skipped: a label of that name stays.
        assert_eq!(
            filtered.0.metadata.labels.as_ref().unwrap()["managedFields"],
            "a label of that name is kept"
        );
    }

    #[test]
    fn a_pod_decodes_as_its_store_keeps_it() {
        let value = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": "p", "namespace": "ns", "managedFields": managed_fields(),
                "ownerReferences": [{ "apiVersion": "apps/v1", "kind": "ReplicaSet",
                    "name": "r", "uid": "u", "controller": true }]
            },
            "spec": {
                "nodeName": "n1", "priority": 5, "terminationGracePeriodSeconds": 30,
                "volumes": [{ "name": "v", "emptyDir": {} }],
                "containers": [{ "name": "c", "image": "app:1",
                    "env": [{ "name": "A", "value": "1" }] }],
                "serviceAccountName": "sa",
                "tolerations": [{ "key": "k", "operator": "Exists" }]
            },
            "status": {
                "phase": "Running", "podIP": "10.1.0.1", "hostIP": "10.0.0.1",
                "qosClass": "BestEffort",
                "conditions": [{ "type": "Ready", "status": "True" }],
                "containerStatuses": [{ "name": "c", "ready": true, "restartCount": 0,
                    "image": "app:1", "imageID": "sha256:0" }]
            }
        });
        let direct: Pod = serde_json::from_value(value.clone()).unwrap();
        assert!(!direct.spec.as_ref().unwrap().containers.is_empty());
        let filtered: Slim<Pod> = serde_json::from_slice(value.to_string().as_bytes()).unwrap();
        let mut expected = direct;
        mcm_drain::slim_pod(&mut expected);
        // What the input skipped is exactly what the store drops: POD and slim_pod agree.
        assert_eq!(filtered.0, expected);
        let spec = filtered.0.spec.as_ref().unwrap();
        assert_eq!(spec.node_name.as_deref(), Some("n1"));
        assert_eq!(spec.volumes.as_ref().map(Vec::len), Some(1));
        assert_eq!(
            filtered.0.metadata.owner_references.as_ref().map(Vec::len),
            Some(1)
        );
    }

    #[test]
    fn a_machine_decodes_without_its_managed_fields_from_bytes_and_from_a_value() {
        let value = json!({
            "apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "Machine",
            "metadata": { "name": "m1", "namespace": "ns", "managedFields": managed_fields() },
            "spec": { "class": { "kind": "MachineClass", "name": "c" }, "providerID": "p" },
            "status": { "currentStatus": { "phase": "Running" } }
        });
        let direct: Machine = serde_json::from_value(value.clone()).unwrap();
        assert!(direct.metadata.managed_fields.is_some());
        // A Machine's spec and status are kept whole.
        assert!(direct.status.is_some());
        let mut expected = direct;
        expected.metadata.managed_fields = None;
        // From bytes (borrowed keys, as a watch decodes) and from a Value (owned keys).
        let from_bytes: Slim<Machine> =
            serde_json::from_slice(value.to_string().as_bytes()).unwrap();
        let from_value: Slim<Machine> = serde_json::from_value(value).unwrap();
        assert_eq!(from_bytes.0, expected);
        assert_eq!(from_value.0, expected);
    }

    #[test]
    fn a_watch_event_decodes_its_object_without_managed_fields_whatever_the_key_order() {
        for event in [
            format!(r#"{{"type":"MODIFIED","object":{}}}"#, node_json()),
            format!(r#"{{"object":{},"type":"MODIFIED"}}"#, node_json()),
        ] {
            let e: kube::core::WatchEvent<Slim<Node>> = serde_json::from_str(&event).unwrap();
            let kube::core::WatchEvent::Modified(node) = e else {
                panic!("not a modification: {event}");
            };
            assert_eq!(node.0.metadata.managed_fields, None);
            assert_eq!(node.0.metadata.name.as_deref(), Some("n1"));
            assert_eq!(node.0.metadata.finalizers, Some(vec!["f".to_string()]));
            let status = node.0.status.unwrap();
            assert!(status.conditions.is_some());
            assert!(status.node_info.is_none() && status.images.is_none());
        }
    }

    #[test]
    fn bad_input_is_refused_as_the_kind_refuses_it() {
        let mut value = node_json();
        value["metadata"]["labels"] = json!("not a map");
        let direct = serde_json::from_value::<Node>(value.clone()).unwrap_err();
        let filtered = serde_json::from_value::<Slim<Node>>(value).unwrap_err();
        assert_eq!(filtered.to_string(), direct.to_string());
    }

    #[test]
    fn the_wrapper_is_the_same_kind_at_the_same_url() {
        assert_eq!(Slim::<Node>::url_path(&(), None), Node::url_path(&(), None));
        assert_eq!(
            Slim::<Machine>::url_path(&(), Some("ns")),
            Machine::url_path(&(), Some("ns"))
        );
        assert_eq!(Slim::<Node>::kind(&()), "Node");
    }
}
