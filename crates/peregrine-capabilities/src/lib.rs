//! Peregrine's built-in capabilities: `memory` (per-user memory in the agent data directory,
//! saves approved first, also offered to task extraction as a data source) and
//! `time_range_parsing` (timezone-aware ranges in the facility's zone).

pub mod memory;
pub mod time_range;
