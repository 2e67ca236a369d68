//! Tags that mark the instances of a machine and a class, and the DescribeInstances
//! filters that find them.
//!
//! Instances are found by their `Name` tag (the machine name) and the class's
//! `kubernetes.io/cluster/<cluster>` and `kubernetes.io/role/<role>` tag keys.
//!
//! # Why one `tag-key` filter
//!
//! Real EC2 ANDs repeated `tag-key` filters, but moto folds filters with the same name into
//! one (the last wins). So the filters name only the **cluster** key server-side and the
//! driver checks the **role** key (and the cluster key again) client-side with
//! [`ClusterTags::matches`]: correct on both.

use std::collections::BTreeMap;

use aws_sdk_ec2::types::{Filter, ResourceType, Tag, TagSpecification};

/// Prefix of the tag key naming the cluster.
pub const CLUSTER_TAG_PREFIX: &str = "kubernetes.io/cluster/";
/// Prefix of the tag key naming the node role.
pub const ROLE_TAG_PREFIX: &str = "kubernetes.io/role/";
/// The tag holding the machine name.
pub const NAME_TAG: &str = "Name";
/// Instance states of instances that still exist (terminated and shutting-down do not count).
pub const LIVE_STATES: [&str; 4] = ["pending", "running", "stopping", "stopped"];

/// The cluster and role tag keys of a class.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterTags {
    /// The `kubernetes.io/cluster/<cluster>` key.
    pub cluster: String,
    /// The `kubernetes.io/role/<role>` key.
    pub role: String,
}

impl ClusterTags {
    /// The first cluster and role keys of `tags` (in key order), if both exist.
    pub fn from_tags(tags: &BTreeMap<String, String>) -> Option<ClusterTags> {
        let first = |prefix: &str| {
            tags.keys()
                .find(|k| k.starts_with(prefix) && k.len() > prefix.len())
                .cloned()
        };
        Some(ClusterTags {
            cluster: first(CLUSTER_TAG_PREFIX)?,
            role: first(ROLE_TAG_PREFIX)?,
        })
    }

    /// Whether an instance's tags carry both keys (the client-side half of the filter).
    pub fn matches(&self, tags: &[Tag]) -> bool {
        let has = |key: &str| tags.iter().any(|t| t.key() == Some(key));
        has(&self.cluster) && has(&self.role)
    }

    /// Filters for the live instances of the class: the cluster key and the live states.
    pub fn class_filters(&self) -> Vec<Filter> {
        vec![
            filter("tag-key", [self.cluster.as_str()]),
            filter("instance-state-name", LIVE_STATES),
        ]
    }

    /// Filters for the live instances of one machine: its `Name` tag, the cluster key and the
    /// live states.
    pub fn machine_filters(&self, machine_name: &str) -> Vec<Filter> {
        let mut filters = vec![filter(&format!("tag:{NAME_TAG}"), [machine_name])];
        filters.extend(self.class_filters());
        filters
    }
}

/// One filter with its values.
pub fn filter<'a>(name: &str, values: impl IntoIterator<Item = &'a str>) -> Filter {
    Filter::builder()
        .name(name)
        .set_values(Some(values.into_iter().map(String::from).collect()))
        .build()
}

/// The tags of a machine's resources: the class's tags plus `Name` = machine name (which
/// wins over a `Name` in the class).
pub fn resource_tags(class_tags: &BTreeMap<String, String>, machine_name: &str) -> Vec<Tag> {
    let mut tags = class_tags.clone();
    tags.insert(NAME_TAG.to_string(), machine_name.to_string());
    tags.into_iter()
        .map(|(k, v)| Tag::builder().key(k).value(v).build())
        .collect()
}

/// Tag specifications putting `tags` on the instance, its volumes and its network interfaces.
pub fn tag_specifications(tags: &[Tag]) -> Vec<TagSpecification> {
    [
        ResourceType::Instance,
        ResourceType::Volume,
        ResourceType::NetworkInterface,
    ]
    .into_iter()
    .map(|rt| {
        TagSpecification::builder()
            .resource_type(rt)
            .set_tags(Some(tags.to_vec()))
            .build()
    })
    .collect()
}

/// The value of the `Name` tag.
pub fn name_tag(tags: &[Tag]) -> Option<&str> {
    tags.iter()
        .find(|t| t.key() == Some(NAME_TAG))
        .and_then(|t| t.value())
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn class_tags() -> BTreeMap<String, String> {
        BTreeMap::from([
            ("kubernetes.io/cluster/shoot".into(), "1".into()),
            ("kubernetes.io/role/node".into(), "1".into()),
            ("Name".into(), "ignored".into()),
            ("team".into(), "a".into()),
        ])
    }

    fn tag(k: &str, v: &str) -> Tag {
        Tag::builder().key(k).value(v).build()
    }

    #[test]
    fn cluster_and_role_keys_come_from_the_class_tags() {
        let t = ClusterTags::from_tags(&class_tags()).unwrap();
        assert_eq!(t.cluster, "kubernetes.io/cluster/shoot");
        assert_eq!(t.role, "kubernetes.io/role/node");
        assert_eq!(ClusterTags::from_tags(&BTreeMap::new()), None);
    }

    #[test]
    fn machine_filters_use_one_tag_key_filter_and_live_states() {
        let t = ClusterTags::from_tags(&class_tags()).unwrap();
        let filters = t.machine_filters("m-1");
        let shown: Vec<(String, Vec<String>)> = filters
            .iter()
            .map(|f| (f.name().unwrap().to_string(), f.values().to_vec()))
            .collect();
        assert_eq!(
            shown,
            vec![
                ("tag:Name".into(), vec!["m-1".into()]),
                ("tag-key".into(), vec!["kubernetes.io/cluster/shoot".into()]),
                (
                    "instance-state-name".into(),
                    LIVE_STATES.iter().map(|s| s.to_string()).collect()
                ),
            ]
        );
        // Never two filters of the same name (moto would fold them).
        let mut names: Vec<_> = shown.iter().map(|(n, _)| n.clone()).collect();
        names.dedup();
        assert_eq!(names.len(), shown.len());
    }

    #[test]
    fn the_role_key_is_checked_client_side() {
        let t = ClusterTags::from_tags(&class_tags()).unwrap();
        let both = [
            tag("kubernetes.io/cluster/shoot", "1"),
            tag("kubernetes.io/role/node", "1"),
        ];
        assert!(t.matches(&both));
        assert!(!t.matches(&both[..1]));
        assert!(!t.matches(&[tag("kubernetes.io/role/node", "1")]));
    }

    #[test]
    fn resource_tags_carry_the_machine_name_on_instance_volumes_and_nics() {
        let tags = resource_tags(&class_tags(), "m-1");
        assert_eq!(name_tag(&tags), Some("m-1"));
        assert_eq!(tags.len(), 4);
        let specs = tag_specifications(&tags);
        let types: Vec<_> = specs.iter().map(|s| s.resource_type().cloned()).collect();
        assert_eq!(
            types,
            vec![
                Some(ResourceType::Instance),
                Some(ResourceType::Volume),
                Some(ResourceType::NetworkInterface)
            ]
        );
        assert!(specs.iter().all(|s| s.tags().len() == 4));
    }
}
