//! orchestrator (in progress).
