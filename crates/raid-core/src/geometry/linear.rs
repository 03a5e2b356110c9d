//! TODO(geometry): linear mapping.

/// Placeholder: the geometry owner defines the fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinearGeometry {}
