//! Helpers shared by the server's integration tests.

pub mod certs;
pub mod control_plane;
