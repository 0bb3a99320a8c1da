//! Helpers shared by the server's integration tests (each uses some of them).
#![allow(dead_code)]

pub mod certs;
pub mod control_plane;
