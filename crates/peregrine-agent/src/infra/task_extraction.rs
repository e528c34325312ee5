//! task_extraction (in progress).
