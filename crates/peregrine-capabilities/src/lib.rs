//! Peregrine's built-in capabilities: `memory` (per-user memory in the agent data directory,
//! saves approved first, also offered to task extraction as a data source) and
//! `time_range_parsing` (timezone-aware ranges in the facility's zone), and the control-system
//! capabilities `channel_read` and `channel_write` (writes behind the gates of
//! `peregrine-control`).

use std::sync::Arc;

use chrono::{DateTime, Utc};

pub mod control;
pub mod memory;
pub mod time_range;

pub use control::{
    CHANNEL_ADDRESSES, CHANNEL_READ_CAPABILITY, CHANNEL_VALUES, CHANNEL_WRITE_APPROVAL, CHANNEL_WRITE_CAPABILITY, CHANNEL_WRITE_RESULTS,
    ChannelAddresses, ChannelPrompts, ChannelReadCapability, ChannelReading, ChannelValues, ChannelWriteCapability, ChannelWriteResult,
    ChannelWriteResults, DefaultChannelPrompts,
};
pub use memory::{
    DefaultMemoryPrompts, MEMORY_CAPABILITY, MEMORY_CONTEXT, MEMORY_SAVE_APPROVAL, MemoryCapability, MemoryContentExtraction,
    MemoryContext, MemoryEntry, MemoryError, MemoryOperation, MemoryOperationClassification, MemoryPrompts, MemoryStore,
    USER_MEMORY_SOURCE, UserMemoryDataSource,
};
pub use time_range::{
    DefaultTimeRangePrompts, TIME_RANGE, TIME_RANGE_CAPABILITY, TimeRangeCapability, TimeRangeContext, TimeRangeError, TimeRangeOutput,
    TimeRangePrompts, parse_datetime,
};

/// Where a capability reads the current time; replaceable so tests are deterministic.
pub type Clock = Arc<dyn Fn() -> DateTime<Utc> + Send + Sync>;
