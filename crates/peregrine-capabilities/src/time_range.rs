//! time_range (in progress).
