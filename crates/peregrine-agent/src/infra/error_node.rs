//! error_node (in progress).
