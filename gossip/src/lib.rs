//! Headroom's mesh transport and membership.
