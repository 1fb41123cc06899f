//! The forkd daemon as a library: [`daemon::start`] assembles the store, the provider, the engine
//! and the gRPC server on a `FORKD_HOME`, so `forkd serve`, `forkd demo` and the integration tests
//! all start the same daemon.

pub mod daemon;
pub mod demo;
