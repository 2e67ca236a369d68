//! The Azure provider of mcm-rs.
#![warn(missing_docs)]

pub mod resources;
pub mod spec;
