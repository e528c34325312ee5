//! respond (in progress).
