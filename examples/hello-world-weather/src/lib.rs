//! The hello-world-weather example application (in progress).
