//! classifier (in progress).
