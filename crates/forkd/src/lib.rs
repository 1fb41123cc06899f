//! The forkd daemon as a library: [`daemon::start`] assembles the store, the provider, the engine
//! and the gRPC server on a `FORKD_HOME`, so `forkd serve`, `forkd demo` and the integration tests
//! all start the same daemon; [`config`] resolves `forkd serve`'s settings from flags, the
//! environment and `$FORKD_HOME/config.toml`; [`report`] words an error for the person who ran
//! `forkd`.

pub mod config;
pub mod daemon;
pub mod demo;
mod metrics;
pub mod report;
pub mod telemetry;
