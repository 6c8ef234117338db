//! Generates the ragplane.v1 client from the repository's protos at build time.
//!
//! protox parses and links the .proto files in Rust, so building needs neither a system
//! `protoc` nor a vendored binary; the well-known types (google/protobuf/struct.proto) are
//! built into protox.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let include = manifest.join("../../protos");
    let files: Vec<PathBuf> = ["common", "embed", "index", "search", "memory", "admin"]
        .iter()
        .map(|n| include.join(format!("ragplane/v1/{n}.proto")))
        .collect();
    for f in &files {
        println!("cargo:rerun-if-changed={}", f.display());
    }
    let fds = protox::compile(&files, [&include])?;
    tonic_prost_build::configure()
        .build_server(false)
        .compile_fds(fds)?;
    Ok(())
}
