//! Controller owner references: finding an object's controller and pointing at one.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Resource;

/// The controller among `refs` (the reference with `controller: true`), if any.
pub fn controller_ref(refs: &[OwnerReference]) -> Option<&OwnerReference> {
    refs.iter().find(|r| r.controller == Some(true))
}

/// The controller owner reference of an object, if it has one.
pub fn controller_of(meta: &ObjectMeta) -> Option<&OwnerReference> {
    controller_ref(meta.owner_references.as_deref().unwrap_or_default())
}

/// The controller owner reference pointing at `owner` (with `blockOwnerDeletion`), as a
/// MachineSet puts on its Machines and a MachineDeployment on its MachineSets.
pub fn controller_reference<K: Resource<DynamicType = ()>>(owner: &K) -> OwnerReference {
    let meta = owner.meta();
    OwnerReference {
        api_version: K::api_version(&()).into_owned(),
        kind: K::kind(&()).into_owned(),
        name: meta.name.clone().unwrap_or_default(),
        uid: meta.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MachineSet;

    fn reference(name: &str, controller: Option<bool>) -> OwnerReference {
        OwnerReference {
            name: name.into(),
            controller,
            ..OwnerReference::default()
        }
    }

    #[test]
    fn finds_the_controller() {
        let mut meta = ObjectMeta::default();
        assert_eq!(controller_of(&meta), None);
        meta.owner_references = Some(vec![
            reference("a", None),
            reference("b", Some(false)),
            reference("c", Some(true)),
        ]);
        assert_eq!(controller_of(&meta).map(|r| r.name.as_str()), Some("c"));
    }

    #[test]
    fn points_at_the_owner() {
        let mut set = MachineSet::default();
        set.metadata.name = Some("s".into());
        set.metadata.uid = Some("u".into());
        let r = controller_reference(&set);
        assert_eq!(r.api_version, crate::API_VERSION);
        assert_eq!(r.kind, MachineSet::KIND);
        assert_eq!((r.name.as_str(), r.uid.as_str()), ("s", "u"));
        assert_eq!(
            (r.controller, r.block_owner_deletion),
            (Some(true), Some(true))
        );
    }
}
