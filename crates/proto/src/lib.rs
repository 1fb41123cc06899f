//! forkd's gRPC API, generated from `proto/forkd/v1/forkd.proto`. Nothing but generated code:
//! conversions to and from the domain live in `forkd-server` (and in `forkctl` for display).

/// `forkd.v1`: the service, its messages and enums.
pub mod v1 {
    #![allow(clippy::all, clippy::pedantic, missing_docs)]
    tonic::include_proto!("forkd.v1");

    /// The encoded file descriptor set, for server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("forkd_descriptor");
}
