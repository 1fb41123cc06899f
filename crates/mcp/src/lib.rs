//! forkd's MCP client: server definitions in the `.mcp.json` format (`config`), the names their
//! tools get in a session's pool (`names`), the servers' processes and connections (`pool`, on
//! the official SDK, `rmcp`), and what a call's result becomes for the model (`output`).
//!
//! Knows nothing of the engine, the store or models: the engine resolves which servers a session
//! may use, asks the pool for their tools when the session is created, and calls them.

pub mod config;
pub mod names;
pub mod output;
pub mod pool;

pub use config::{ConfigError, McpFile, Origin, ServerDef, ServerSpec, Transport};
pub use output::{CallOutput, Image};
pub use pool::{Pool, PoolPaths, Server, ServerError, ServerTool};
