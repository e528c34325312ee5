//! clarify (in progress).
