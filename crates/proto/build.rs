//! Generates forkd's gRPC code with a vendored `protoc`, so no machine needs one installed.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("../../proto");
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    // A `PROTOC` from the environment wins; otherwise the vendored binary. Passing it through
    // prost's config avoids mutating this process's environment.
    let protoc = match std::env::var_os("PROTOC") {
        Some(path) => PathBuf::from(path),
        None => protoc_bin_vendored::protoc_bin_path()?,
    };
    let mut config = tonic_prost_build::Config::new();
    config.protoc_executable(protoc);
    tonic_prost_build::configure()
        .file_descriptor_set_path(out.join("forkd_descriptor.bin"))
        .compile_with_config(
            config,
            &[root.join("forkd/v1/forkd.proto")],
            std::slice::from_ref(&root),
        )?;
    println!("cargo:rerun-if-changed={}", root.display());
    println!("cargo:rerun-if-env-changed=PROTOC");
    Ok(())
}
