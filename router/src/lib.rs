//! The Headroom router node as a library.
