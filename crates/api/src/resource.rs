//! `kube::Resource` implementations shared by the four root types.
//!
//! The root types are written by hand (not with `#[derive(CustomResource)]`) so that all four
//! kinds, including `MachineClass` which has no `spec`, follow the same rules: `apiVersion` and
//! `kind` are real fields (always serialized, defaulted when absent), `spec` is defaulted when
//! absent like Go's zero value, and the CRDs are assembled in one place ([`crate::crds`]).

/// Implements `kube::Resource` (namespaced, static type information) for a root type with
/// `metadata: ObjectMeta`, and `Default` with the right `apiVersion`/`kind`.
macro_rules! impl_root_resource {
    ($ty:ident, $kind:literal, $plural:literal) => {
        impl ::kube::Resource for $ty {
            type DynamicType = ();
            type Scope = ::k8s_openapi::NamespaceResourceScope;

            fn kind(_: &()) -> ::std::borrow::Cow<'_, str> {
                ::std::borrow::Cow::Borrowed($kind)
            }

            fn group(_: &()) -> ::std::borrow::Cow<'_, str> {
                ::std::borrow::Cow::Borrowed($crate::GROUP)
            }

            fn version(_: &()) -> ::std::borrow::Cow<'_, str> {
                ::std::borrow::Cow::Borrowed($crate::VERSION)
            }

            fn api_version(_: &()) -> ::std::borrow::Cow<'_, str> {
                ::std::borrow::Cow::Borrowed($crate::API_VERSION)
            }

            fn plural(_: &()) -> ::std::borrow::Cow<'_, str> {
                ::std::borrow::Cow::Borrowed($plural)
            }

            fn meta(&self) -> &::k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &self.metadata
            }

            fn meta_mut(
                &mut self,
            ) -> &mut ::k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &mut self.metadata
            }
        }

        impl $ty {
            /// The `kind` of this resource.
            pub const KIND: &'static str = $kind;
            /// The plural resource name (used in URLs and the CRD name).
            pub const PLURAL: &'static str = $plural;

            fn default_api_version() -> String {
                $crate::API_VERSION.to_owned()
            }

            fn default_kind() -> String {
                $kind.to_owned()
            }
        }
    };
}

pub(crate) use impl_root_resource;
