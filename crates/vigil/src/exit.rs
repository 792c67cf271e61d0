//! Exit codes: the core's outcome types (`vigil_core::outcome`), re-exported for the binary.

pub use vigil_core::outcome::*;
