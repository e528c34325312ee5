//! Peregrine's control-system layer (reference §5.4, §5.6): the [`ControlSystem`] connector
//! trait every backend implements (read, write with verification, monitor, metadata), typed
//! channel values and readings, typed errors classified into the framework's severities, the
//! channel-limits database and the write gates every write passes in order — the master
//! switch, the limits, (the approval, asked by the capability), the write, the readback — and
//! the deterministic mock connector, the default of a control assistant with no setup.
//!
//! Invariant: a write that a gate stops never reaches a connector, and a stop is reported as
//! such ([`ControlError::is_block`]), never retried around.

pub mod connector;
#[cfg(feature = "epics")]
pub mod epics;
pub mod error;
pub mod gate;
pub mod journal;
pub mod limits;
pub mod mock;
pub mod value;

pub use connector::{ControlSystem, DynControlSystem, Monitor, SharedControlSystem};
pub use error::{ControlError, Violation};
pub use gate::{ChannelLocks, LimitsCheck, PartialWrite, PlannedWrite, WriteGate, WriteOutcome, WriteSettings};
pub use journal::{JournalState, WriteJournal};
pub use limits::{ChannelLimits, ChannelVerification, LimitsDatabase, LimitsError, canonical_address};
pub use mock::{MockControlSystem, MockSettings};
pub use value::{AlarmSeverity, ChannelMetadata, ChannelValue, Reading, Verification, VerificationLevel};
