//! TODO(geometry): raid10 mapping.

/// Placeholder: the geometry owner defines the fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Raid10Geometry {}
