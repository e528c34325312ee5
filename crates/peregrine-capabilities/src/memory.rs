//! memory (in progress).
